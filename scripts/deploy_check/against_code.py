"""The checks only we can make: the rendered manifests against the code they
deploy. Each returns a list of problems; its docstring is the title printed."""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

from .egress import opens, selects
from .render import ROOT, dig, ident

# What each binary is when it serves (no subcommand, or `serve`); one-off commands listen on nothing.
SERVING = {"webhook-ingest": "ingest", "outbox-relay": "relay", "ops-console": "console"}
TRAFFIC_ADDR = {"ingest": "INGEST_LISTEN_ADDR", "console": "CONSOLE_LISTEN_ADDR"}
# Read by the OpenTelemetry SDK or the log filter, not by clap.
ALWAYS_ACCEPTED = re.compile(r"^(OTEL_[A-Z0-9_]+|RUST_LOG)$")
COUNT_DUE_SQL = ROOT / "crates/outbox-relay/sql/count_due.sql"
CONSOLE_SERVER = ROOT / "crates/ops-console/src/server.rs"  # its .shutdown_timeout(N)


@cache
def cli(binary: str, subcommand: tuple[str, ...]) -> tuple[dict | None, str | None]:
    """({NAME: its default or None}, None) from `--help`, or (None, why not)."""
    exe = Path(os.environ.get("DEPLOY_CHECK_BINDIR") or ROOT / "target/debug").resolve() / binary
    if not exe.exists():
        return None, f"{exe} is not built: run `make build` first"
    # A clean environment: clap prints the value of a variable that is set.
    done = subprocess.run([str(exe), *subcommand, "--help"], capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    flat = " ".join(done.stdout.split())  # wrapped help parses like unwrapped help
    env = dict(re.findall(r"\[env: ([A-Za-z_]\w*)(?:=[^\]]*)?\](?: \[default: ([^\]]*)\])?", flat))
    if done.returncode != 0 or not env:
        return None, f"`{exe.name} {' '.join(subcommand)} --help` lists no [env: NAME]: {done.stderr[:300]}"
    return env, None


def find(objs: list[dict], kind: str, namespace: str | None, name: str | None = None) -> list[dict]:
    return [o for o in objs if o.get("kind") == kind and name in (None, o["metadata"].get("name"))
            and o["metadata"].get("namespace") == namespace]


def port_of(addr: str | None) -> int | None:
    m = re.search(r":(\d+)$", addr or "")
    return int(m.group(1)) if m else None


def admin(oc: Ours) -> int | None:
    return port_of(oc.value("ADMIN_LISTEN_ADDR"))


@dataclass
class Ours:  # one of our containers in a render
    owner: dict
    pod: dict  # the pod spec
    container: dict
    binary: str
    subcommand: tuple[str, ...]
    role: str  # ingest, relay or console when it serves; the subcommand's name otherwise
    where: str
    ns: str | None
    labels: dict  # the pods'
    env: dict[str, str | None]  # NAME -> value, or None: from a Secret or the kubelet

    def value(self, name: str) -> str | None:
        """The variable as the binary sees it: set in the manifest, else its default."""
        if name in self.env:
            return self.env[name]
        return (cli(self.binary, self.subcommand)[0] or {}).get(name)

    def port(self, port) -> int | None:
        """A port of the container, by number or name."""
        return port if isinstance(port, int) else next((p.get("containerPort") for p in
                                                        self.container.get("ports") or []
                                                        if p.get("name") == port), None)


def ours(objs: list[dict]) -> list[Ours]:
    out = []
    for obj in objs:
        spec, ns = obj.get("spec") or {}, obj["metadata"].get("namespace")
        if obj["kind"] == "CronJob":
            spec = dig(spec, "jobTemplate", "spec") or {}
        pod = dig(spec, "template", "spec") or {}
        for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
            binary = c.get("image", "").split("@")[0].rsplit("/", 1)[-1].partition(":")[0]
            if binary not in SERVING:
                continue
            args = [str(a) for a in c.get("args") or []] + ["-"]
            sub = tuple(args[:next(i for i, a in enumerate(args) if a[:1] == "-")])
            env: dict[str, str | None] = {}
            for source in c.get("envFrom") or []:
                for cm in find(objs, "ConfigMap", ns, dig(source, "configMapRef", "name")):
                    env.update({source.get("prefix", "") + k: v for k, v in (cm.get("data") or {}).items()})
            env.update({e["name"]: str(e["value"]) if "value" in e else None for e in c.get("env") or []})
            role = SERVING[binary] if sub in ((), ("serve",)) else "-".join(sub)
            where = f"{ident(obj)} container {c.get('name')} (`{' '.join([binary, *sub])}`)"
            labels = dig(spec, "template", "metadata", "labels") or {}
            out.append(Ours(obj, pod, c, binary, sub, role, where, ns, labels, env))
    return out


def check_env(objs: list[dict], containers: list[Ours]) -> list[str]:
    """env: every variable is in the binary's --help"""
    problems = []
    for oc in containers:
        accepted, why = cli(oc.binary, oc.subcommand)
        problems += [f"{oc.where}: cannot check its variables: {why}"] if why else [
            f"{oc.where} sets {name}, which its --help does not list" for name in sorted(oc.env)
            if name not in accepted and not ALWAYS_ACCEPTED.match(name)]
    return problems


def check_ports_and_probes(objs: list[dict], containers: list[Ours]) -> list[str]:
    """ports, probes and scrapes match the admin server"""
    problems = []
    servers = [oc for oc in containers if oc.role in SERVING.values()]
    for oc in servers:
        want = {"admin": admin(oc)}
        if oc.role in TRAFFIC_ADDR:
            want["http"] = port_of(oc.value(TRAFFIC_ADDR[oc.role]))
        problems += [f"{oc.where}: containerPort `{name}` is {oc.port(name)}, the binary listens on {port}"
                     for name, port in want.items() if port is None or oc.port(name) != port]
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            get = dig(oc.container, probe, "httpGet") or {}
            if get.get("path") != path or oc.port(get.get("port")) != want["admin"]:
                problems.append(f"{oc.where}: {probe} {get}, not {path} on port {want['admin']}")
    for sm in [o for o in objs if o.get("kind") == "ServiceMonitor"]:
        services = [s for s in find(objs, "Service", sm["metadata"].get("namespace"))
                    if selects(sm["spec"].get("selector"), s["metadata"].get("labels"))]
        for ep in sm["spec"].get("endpoints") or []:
            if ep.get("path", "/metrics") != "/metrics":
                problems.append(f"{ident(sm)}: scrapes {ep.get('path')}, the admin server serves /metrics")
            for svc, oc in [(s, oc) for s in services for oc in servers if oc.ns == s["metadata"].get(
                    "namespace") and selects({"matchLabels": s["spec"].get("selector")}, oc.labels)]:
                port = next((p for p in svc["spec"].get("ports") or [] if p["name"] == ep.get("port")), {})
                if oc.port(port.get("targetPort", port.get("port"))) != admin(oc):
                    problems.append(f"{ident(sm)} scrapes {ident(svc)} port `{ep.get('port')}`, not the "
                                    f"admin port of {oc.where}")
    return problems


def check_grace(objs: list[dict], containers: list[Ours]) -> list[str]:
    """grace periods cover the shutdown budgets"""
    problems = []
    shutdown = re.search(r"\.shutdown_timeout\(\s*(\d+)\s*\)", CONSOLE_SERVER.read_text())
    for oc in containers:
        grace = oc.pod.get("terminationGracePeriodSeconds", 30)
        if oc.role == "ingest":  # the endpoint goes during the preStop pause; then requests in flight end
            deadline = oc.value("INGEST_DEADLINE_MS")
            pause = dig(oc.container, "lifecycle", "preStop", "sleep", "seconds")
            if pause is None or not str(deadline).isdigit() or grace < pause + math.ceil(int(deadline) / 1e3):
                problems.append(f"{oc.where}: terminationGracePeriodSeconds {grace} < preStop sleep "
                                f"{pause} s + INGEST_DEADLINE_MS {deadline} ms")
        elif oc.role in ("relay", "console"):  # the calls, or the requests, in flight end
            console = shutdown and f"{shutdown[1]}000"
            budget = oc.value("RELAY_HTTP_TIMEOUT_MS") if oc.role == "relay" else console
            if not str(budget).isdigit() or not grace > int(budget) / 1000 + 1:
                problems.append(f"{oc.where}: terminationGracePeriodSeconds {grace} must exceed {budget} ms +"
                                f" 1 s (RELAY_HTTP_TIMEOUT_MS, or the console's .shutdown_timeout)")
    return problems


def check_console(objs: list[dict], containers: list[Ours]) -> list[str]:
    """the console: one pod (its sign-ins live in its memory); URL and token from Secrets; its pages
    reachable from named pods only (the auth proxy: not even an Ingress by mistake skips its sign-in)"""
    problems = []
    for oc in [c for c in containers if c.role == "console"]:
        spec = oc.owner.get("spec") or {}
        strategy = dig(spec, "strategy", "type") or "RollingUpdate"
        if oc.owner.get("kind") != "Deployment" or spec.get("replicas") != 1 or strategy != "Recreate":
            problems.append(f"{oc.where}: {spec.get('replicas')} replicas, {strategy}: not 1, Recreate")
        problems += [f"{ident(s)} scales {oc.where}, which must stay at one pod" for s in objs
                     if s.get("kind") in ("HorizontalPodAutoscaler", "ScaledObject")
                     and dig(s, "spec", "scaleTargetRef", "name") == oc.owner["metadata"].get("name")]
        problems += [f"{oc.where}: {name} is not from a Secret" for name in ("DATABASE_URL", "CONSOLE_TOKEN")
                     if oc.env.get(name) is not None]
        port = port_of(oc.value("CONSOLE_LISTEN_ADDR"))
        policies = [p for p in objs if p.get("kind") == "NetworkPolicy" and p["metadata"].get("namespace") == oc.ns
                    and selects(p["spec"].get("podSelector"), oc.labels)
                    and "Ingress" in (p["spec"].get("policyTypes") or ["Ingress"])]
        rules = [r for p in policies for r in p["spec"].get("ingress") or [] if port and opens(r, port, "http")]
        if not policies or any(not r.get("from") or any(not dig(peer, "podSelector", "matchLabels")
                                                         for peer in r["from"]) for r in rules):
            problems.append(f"{oc.where}: its pages ({port}) admit more than named pods (podSelector.matchLabels)")
    return problems


def check_keda_query(objs: list[dict], containers: list[Ours]) -> list[str]:
    """KEDA query = crates/outbox-relay/sql/count_due.sql"""
    def normal(sql: str) -> str:
        return " ".join(sql.split()).rstrip(";").strip()
    return [f"{ident(so)}: the postgresql query differs from {COUNT_DUE_SQL.name}: {got!r}"
            for so in objs if so.get("kind") == "ScaledObject"
            for t in so["spec"].get("triggers") or [] if t.get("type") == "postgresql"
            for got in [normal(str(dig(t, "metadata", "query")))] if got != normal(COUNT_DUE_SQL.read_text())]


REGISTER = re.compile(r'\.register\(\s*"([a-zA-Z_:][\w:]*)"\s*,\s*"(?:[^"\\]|\\.)*"\s*,\s*'
                      r"(?:\w+\.)*(\w+)\.clone\(\)")
LABEL_SET = re.compile(r"EncodeLabelSet[^\]]*\)\]\s*(?:#\[[^\]]*\]\s*)*pub struct \w+ \{(.*?)\}", re.S)
METRIC_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
SUFFIXES = {"Histogram": ("_bucket", "_sum", "_count"), "Counter": ("_total",), "Gauge": ("",)}


@cache
def code_metrics() -> tuple[set[str], set[str], set[str]]:
    """(the series the binaries expose, their label names, the string literals of
    the shipped code: where a label value comes from)."""
    sources = [p.read_text() for p in sorted(ROOT.glob("crates/*/src/**/*.rs"))
               if p.relative_to(ROOT).parts[1] not in ("testkit", "simulator")]  # not shipped
    series, text = set(), "\n".join(sources)
    for source in sources:
        for name, field in REGISTER.findall(source):
            m = re.search(rf"^\s*pub {field}:\s*(.+)$", source, re.M)  # the struct field: its type
            kind = next((k for k in SUFFIXES if m and k in m.group(1)), None)
            series |= {name + s for s in SUFFIXES.get(kind, ("", "_total", "_bucket", "_sum", "_count"))}
    labels = {label for body in LABEL_SET.findall(text) for label in re.findall(r"pub (\w+):", body)}
    # re.S: a backslash continuing a Rust string on the next line is one escape.
    literals = set(re.findall(r'"((?:[^"\\]|\\.)*)"', text, re.S))
    # process::metrics::register(.., "<service>_build_info", ..): a collector's gauge.
    return series | {s for s in literals if re.fullmatch(r"[a-z_]+_build_info", s)}, labels, literals


def check_alerts(objs: list[dict], containers: list[Ours]) -> list[str]:
    """alerts and the Grafana dashboard use the code's metrics and label values; each alert has its
    RUNBOOK section, and its runbook_url (the link Alertmanager shows) is absolute, at that section"""
    series, labels, literals = code_metrics()
    problems = [] if series else ['no `.register("name", ...)` in crates/*/src: update REGISTER']
    exprs = [(f"{ident(o)} {r.get('alert') or r.get('record')}", str(r.get("expr")))
             for o in objs if o.get("kind") == "PrometheusRule"
             for g in o["spec"].get("groups") or [] for r in g.get("rules") or []]
    for cm in [o for o in objs if (o["metadata"].get("labels") or {}).get("grafana_dashboard")]:
        for key, text in (cm.get("data") or {}).items():
            try:
                panels = json.loads(text).get("panels") or []
            except json.JSONDecodeError as e:
                problems.append(f"{ident(cm)} {key}: not JSON: {e}")
                continue
            exprs += [(f"{ident(cm)} {key} panel {p.get('title')!r}", str(t.get("expr")))
                      for p in panels for t in p.get("targets") or []]
    for where, expr in exprs:
        for metric, selector in METRIC_SELECTOR.findall(expr):
            if metric.startswith(("webhook_", "outbox_")) and metric not in series:
                problems.append(f"{where}: `{metric}` is not a series the binaries register "
                                f"(near: {difflib.get_close_matches(metric, sorted(series), 2)})")
            for label, op, value in MATCHER.findall(selector):
                problems += [f'{where}: {metric}{{{label}="{v}"}}: no "{v}" in the code, so never exported'
                             for v in (value.split("|") if op in ("=~", "!~") else [value])
                             if metric in series and label in labels and v not in literals]
    headings = re.findall(r"^##+ (.+)$", (ROOT / "deploy/RUNBOOK.md").read_text(), re.M)
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-") for h in headings}
    for o in [o for o in objs if o.get("kind") == "PrometheusRule"]:
        for rule in [r for g in o["spec"].get("groups") or [] for r in g.get("rules") or [] if r.get("alert")]:
            alert, url = rule["alert"].lower(), urlsplit(str(dig(rule, "annotations", "runbook_url") or ""))
            if alert not in anchors:
                problems.append(f"{ident(o)} {rule['alert']}: deploy/RUNBOOK.md has no heading #{alert}")
            if url.scheme not in ("https", "http") or not url.netloc or not url.path.endswith("/RUNBOOK.md") \
                    or url.fragment != alert:
                problems.append(f"{ident(o)} {rule['alert']}: runbook_url {url.geturl()!r} is not an absolute "
                                f"http(s) URL to RUNBOOK.md#{alert}")
    return problems
