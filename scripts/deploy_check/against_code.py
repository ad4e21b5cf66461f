"""The checks only we can make: the rendered manifests against the code they
deploy. Each returns a list of problems; its docstring's first paragraph is
what deploy-check prints."""

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

from .egress import opens, policies_selecting, selects
from .render import DEPLOY, ROOT, dig, ident

OURS = ("webhook-ingest", "outbox-relay", "ops-console")
# Read by the OpenTelemetry SDK or the log filter, not by clap.
ALWAYS_ACCEPTED = re.compile(r"^(OTEL_[A-Z0-9_]+|RUST_LOG)$")
# Variables a command cannot start without (clap cannot say: they are
# required by one subcommand and not another, or checked after parsing).
REQUIRED = {
    ("webhook-ingest", ()): ["DATABASE_URL", "WEBHOOK_SECRETS"],
    ("webhook-ingest", ("serve",)): ["DATABASE_URL", "WEBHOOK_SECRETS"],
    ("webhook-ingest", ("migrate",)): ["DATABASE_URL"],
    ("outbox-relay", ()): ["DATABASE_URL", "FULFILMENT_URL", "EMAIL_URL"],
    # Off unless CONSOLE_LISTEN_ADDR names an address; no sign-in without the token.
    ("ops-console", ()): ["DATABASE_URL", "CONSOLE_LISTEN_ADDR", "CONSOLE_TOKEN"],
}
COUNT_DUE_SQL = ROOT / "crates/outbox-relay/sql/count_due.sql"
# Where the console's HTTP server is built: its shutdown_timeout is the
# console's shutdown budget.
CONSOLE_SERVER = ROOT / "crates/ops-console/src/server.rs"
RUNBOOK, DOCKERFILE = DEPLOY / "RUNBOOK.md", DEPLOY / "Dockerfile"
# Test helpers, not what the binaries run.
NOT_SHIPPED = ("testkit", "simulator")
HEALTHZ, READYZ, METRICS = "/healthz", "/readyz", "/metrics"
# What each binary is when it serves (no subcommand, or `serve`), and the
# variable of the traffic port of those that take traffic.
SERVING = {"webhook-ingest": "ingest", "outbox-relay": "relay", "ops-console": "console"}
TRAFFIC_ADDR = {"ingest": "INGEST_LISTEN_ADDR", "console": "CONSOLE_LISTEN_ADDR"}
SECRET = object()


@cache
def cli(binary: str, subcommand: tuple[str, ...] = ()) -> tuple[dict | None, str | None]:
    """({NAME: its default or None}, None) from `--help`, or (None, why not)."""
    exe = Path(os.environ.get("DEPLOY_CHECK_BINDIR") or ROOT / "target/debug").resolve() / binary
    command = " ".join([binary, *subcommand])
    if not exe.exists():
        return None, f"{exe} is not built: run `cargo build --workspace --bins` (make build) first"
    # A clean environment: clap prints the value of a variable that is set ([env: NAME=value]).
    done = subprocess.run([str(exe), *subcommand, "--help"], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    if done.returncode != 0:
        return None, f"`{command} --help` exited {done.returncode}: {done.stderr.strip()[:300]}"
    flat = " ".join(done.stdout.split())  # so wrapped help parses like unwrapped help
    variables = dict(re.findall(r"\[env: ([A-Za-z_]\w*)(?:=[^\]]*)?\](?: \[default: ([^\]]*)\])?", flat))
    return (variables, None) if variables else (None, f"`{command} --help` lists no [env: NAME] (clap `env`?)")


def find(objs: list[dict], kind: str, name: str | None = None, namespace: str | None = None) -> list[dict]:
    return [o for o in objs if o.get("kind") == kind and (name is None or o["metadata"].get("name") == name)
            and o["metadata"].get("namespace") == namespace]


def port_of(addr: str | None) -> int | None:
    m = re.search(r":(\d+)$", addr or "")
    return int(m.group(1)) if m else None


@dataclass
class Ours:  # one of our containers in a render
    owner: dict
    pod: dict  # the pod spec
    container: dict
    binary: str
    subcommand: tuple[str, ...]
    tag: str  # the image's
    role: str  # ingest, relay or console when it serves; the subcommand's name otherwise
    where: str
    ns: str | None
    labels: dict  # the pods'
    env: dict[str, object]  # NAME -> value (str), SECRET, or None for a value the kubelet fills in

    def value(self, name: str) -> str | None:
        """The variable as the binary sees it: set in the manifest, else its default."""
        if name in self.env:
            return self.env[name] if isinstance(self.env[name], str) else None
        return (cli(self.binary, self.subcommand)[0] or {}).get(name)

    def port(self, port) -> int | None:
        """A port of the container, by number or name."""
        return port if isinstance(port, int) else next(
            (p.get("containerPort") for p in self.container.get("ports") or [] if p.get("name") == port), None)


def ours(objs: list[dict]) -> list[Ours]:
    out = []
    for obj in objs:
        spec, ns = obj.get("spec") or {}, obj["metadata"].get("namespace")
        if obj["kind"] == "CronJob":
            spec = (spec.get("jobTemplate") or {}).get("spec") or {}
        pod = (spec.get("template") or {}).get("spec") or {}
        for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
            binary, _, tag = c.get("image", "").split("@")[0].rsplit("/", 1)[-1].partition(":")
            args = [str(a) for a in c.get("args") or []] + ["-"]
            sub = tuple(args[:next(i for i, a in enumerate(args) if a[:1] == "-")])
            env: dict[str, object] = {}
            for source in c.get("envFrom") or []:
                for cm in find(objs, "ConfigMap", (source.get("configMapRef") or {}).get("name"), ns):
                    env.update({source.get("prefix", "") + k: v for k, v in (cm.get("data") or {}).items()})
            for e in c.get("env") or []:
                env[e["name"]] = str(e["value"]) if "value" in e else (
                    SECRET if "secretKeyRef" in (e.get("valueFrom") or {}) else None)
            if binary in OURS:
                role = SERVING[binary] if sub in ((), ("serve",)) else "-".join(sub)
                where = f"{ident(obj)} container {c.get('name')} (`{' '.join([binary, *sub])}`)"
                out.append(Ours(obj, pod, c, binary, sub, tag, role, where, ns,
                                dig(spec, "template", "metadata", "labels") or {}, env))
    return out


def check_env(objs: list[dict], containers: list[Ours]) -> list[str]:
    """env: every variable is in the binary's --help, the required ones are set"""
    problems = []
    for oc in containers:
        accepted, why = cli(oc.binary, oc.subcommand)
        if accepted is None:
            problems.append(f"{oc.where}: cannot check its variables: {why}")
            continue
        explicit = {e.get("name") for e in oc.container.get("env") or []}
        problems += [f"{oc.where} sets {name}{'' if name in explicit else ' through envFrom (a generated ConfigMap)'}"
                     f", which `{' '.join([oc.binary, *oc.subcommand])} --help` does not list"
                     for name in sorted(oc.env) if name not in accepted and not ALWAYS_ACCEPTED.match(name)]
        problems += [f"{oc.where} does not set {name}, which it cannot start without"
                     for name in REQUIRED.get((oc.binary, oc.subcommand), []) if name not in oc.env]
    return problems


def check_ports_and_probes(objs: list[dict], containers: list[Ours]) -> list[str]:
    """ports, probes and scrapes match the admin server"""
    problems = []
    servers = [oc for oc in containers if oc.role in SERVING.values()]  # one-off commands listen on nothing
    for oc in servers:
        want = {"admin": port_of(oc.value("ADMIN_LISTEN_ADDR"))}
        if oc.role in TRAFFIC_ADDR:
            want["http"] = port_of(oc.value(TRAFFIC_ADDR[oc.role]))
        problems += [f"{oc.where}: containerPort `{name}` is {oc.port(name)}, the binary listens on {port}"
                     for name, port in want.items() if port is None or oc.port(name) != port]
        for probe, path in (("livenessProbe", HEALTHZ), ("readinessProbe", READYZ)):
            get = dig(oc.container, probe, "httpGet") or {}
            if get.get("path") != path or oc.port(get.get("port")) != want["admin"]:
                problems.append(f"{oc.where}: {probe} {get}: not an httpGet of {path} on port {want['admin']}")
    for sm, services in scraped(objs):
        problems += [] if services else [f"{ident(sm)}: selects no Service"]
        for ep in sm["spec"].get("endpoints") or []:
            if ep.get("path", METRICS) != METRICS:
                problems.append(f"{ident(sm)}: scrapes {ep.get('path')}, the admin server serves {METRICS}")
            for svc, oc in [(s, oc) for s in services for oc in servers if oc.ns == s["metadata"].get("namespace")
                            and selects({"matchLabels": s["spec"].get("selector")}, oc.labels)]:
                port = next((p for p in svc["spec"].get("ports") or [] if p.get("name") == ep.get("port")), {})
                if oc.port(port.get("targetPort", port.get("port"))) != port_of(oc.value("ADMIN_LISTEN_ADDR")):
                    problems.append(f"{ident(sm)} scrapes {ident(svc)} port `{ep.get('port')}`, not {oc.where}'s admin")
    return problems


def scraped(objs: list[dict]) -> list[tuple[dict, list[dict]]]:
    """Each ServiceMonitor, and the Services it selects."""
    return [(sm, [s for s in find(objs, "Service", namespace=sm["metadata"].get("namespace"))
                  if selects(sm["spec"].get("selector"), s["metadata"].get("labels"))])
            for sm in objs if sm.get("kind") == "ServiceMonitor"]


def check_grace(objs: list[dict], containers: list[Ours]) -> list[str]:
    """grace periods cover the shutdown budgets"""
    problems = []
    for oc in containers:
        grace = oc.pod.get("terminationGracePeriodSeconds", 30)
        if oc.role == "ingest":
            deadline_ms = oc.value("INGEST_DEADLINE_MS")
            pause = dig(oc.container, "lifecycle", "preStop", "sleep", "seconds")
            if pause is None:  # the image has no shell
                problems.append(f"{oc.where}: no preStop `sleep`: requests routed while the endpoint goes are refused")
            if not str(deadline_ms).isdigit() or grace < (pause or 0) + math.ceil(int(deadline_ms) / 1000):
                problems.append(f"{oc.where}: terminationGracePeriodSeconds {grace} < preStop {pause} s + "
                                f"INGEST_DEADLINE_MS {deadline_ms} ms (in-flight requests are cut)")
        elif oc.role == "relay":
            timeout_ms = oc.value("RELAY_HTTP_TIMEOUT_MS")
            if not str(timeout_ms).isdigit() or not grace > int(timeout_ms) / 1000 + 1:
                problems.append(f"{oc.where}: terminationGracePeriodSeconds {grace} must exceed "
                                f"RELAY_HTTP_TIMEOUT_MS {timeout_ms} ms + 1 s (calls in flight are cut)")
        elif oc.role == "console":
            # How long the console's HTTP server waits for requests in flight on SIGTERM.
            budget = re.search(r"\.shutdown_timeout\(\s*(\d+)\s*\)", CONSOLE_SERVER.read_text())
            if budget is None or not grace > int(budget.group(1)) + 1:
                problems.append(f"{oc.where}: terminationGracePeriodSeconds {grace} must exceed the HTTP server's "
                                f"`.shutdown_timeout({budget and budget.group(1)})` + 1 s, in "
                                f"{CONSOLE_SERVER.relative_to(ROOT)} (requests in flight are cut)")
    return problems


def check_console(objs: list[dict], containers: list[Ours]) -> list[str]:
    """the console: one replica, Recreate, no autoscaler; URL and token from Secrets; cookie HTTPS-only; pages
    admitted from named pods only (the auth proxy)

    One pod: its sign-ins live in the process's memory (behind two, operators
    are signed out at random). Pages from the auth proxy's pods only: not even
    an Ingress pointed at its Service by mistake skips the proxy's sign-in."""
    problems = []
    for oc in [c for c in containers if c.role == "console"]:
        owner, spec = oc.owner, oc.owner.get("spec") or {}
        strategy = dig(spec, "strategy", "type") or "RollingUpdate"
        if owner.get("kind") != "Deployment" or spec.get("replicas") != 1 or strategy != "Recreate":
            problems.append(f"{oc.where}: {spec.get('replicas')} replicas, {strategy}: not 1, Recreate (stops the old)")
        for scaler in [o for o in objs if o.get("kind") in ("HorizontalPodAutoscaler", "ScaledObject")]:
            ref = scaler["spec"].get("scaleTargetRef") or {}
            if ref.get("name") == owner["metadata"].get("name") and ref.get("kind", "Deployment") == owner.get("kind"):
                problems.append(f"{ident(scaler)} scales {oc.where}, which must stay at one pod")
        problems += [f"{oc.where}: {name} is not from a Secret (env[].valueFrom.secretKeyRef)"
                     for name in ("DATABASE_URL", "CONSOLE_TOKEN") if name in oc.env and oc.env[name] is not SECRET]
        listen = oc.value("CONSOLE_LISTEN_ADDR")
        host = (listen or "").rsplit(":", 1)[0].strip("[]")
        if oc.value("CONSOLE_COOKIE") == "plain-http" and not (host in ("localhost", "::1") or host.startswith("127.")):
            problems.append(f"{oc.where}: CONSOLE_COOKIE=plain-http on {listen}: the session cookie would go in clear")
        port = port_of(listen)
        name = next((p.get("name") for p in oc.container.get("ports") or [] if p.get("containerPort") == port), None)
        policies = policies_selecting(objs, oc.ns, oc.labels, "Ingress")
        problems += [] if policies else [f"{oc.where}: no NetworkPolicy selects its pods for Ingress"]
        problems += [f"{ident(p)}: ingress[{i}] to the console's pages ({port}) admits more than named pods "
                     "(podSelector.matchLabels): only the auth proxy's pods may reach the pages"
                     for p in policies for i, rule in enumerate(p["spec"].get("ingress") or [])
                     if port is not None and opens(rule, port, name) and not (rule.get("from") and all(
                         (peer.get("podSelector") or {}).get("matchLabels") for peer in rule["from"]))]
    return problems


def check_keda_query(objs: list[dict], containers: list[Ours]) -> list[str]:
    """KEDA query = crates/outbox-relay/sql/count_due.sql"""
    want = " ".join(COUNT_DUE_SQL.read_text().split()).rstrip(";").strip()
    return [f"{ident(so)}: the postgresql query differs from {COUNT_DUE_SQL.relative_to(ROOT)}:\n"
            f"            trigger: {got}\n            relay:   {want}"
            for so in objs if so.get("kind") == "ScaledObject"
            for t in so["spec"].get("triggers") or [] if t.get("type") == "postgresql"
            for got in [" ".join(str((t.get("metadata") or {}).get("query", "")).split()).rstrip(";").strip()]
            if got != want]


REGISTER = re.compile(r'\.register\(\s*"([a-zA-Z_:][\w:]*)"\s*,\s*"(?:[^"\\]|\\.)*"\s*,\s*(?:\w+\.)*(\w+)\.clone\(\)')
LABEL_SET = re.compile(r"EncodeLabelSet[^\]]*\)\]\s*(?:#\[[^\]]*\]\s*)*pub struct \w+ \{(.*?)\}", re.S)
METRIC_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
SUFFIXES = {"Histogram": ("_bucket", "_sum", "_count"), "Counter": ("_total",), "Gauge": ("",)}


@cache
def code_metrics() -> tuple[set[str], set[str], set[str]]:
    """(the series our binaries expose, their label names, the string literals
    in the shipped code: where a label value comes from)."""
    sources = [p.read_text() for p in sorted(ROOT.glob("crates/*/src/**/*.rs"))
               if p.relative_to(ROOT).parts[1] not in NOT_SHIPPED]
    series, labels, text = set(), set(), "\n".join(sources)
    for source in sources:
        for name, field in REGISTER.findall(source):
            m = re.search(rf"^\s*pub {field}:\s*(.+)$", source, re.M)  # the struct field: its type
            kind = next((k for k in SUFFIXES if m and k in m.group(1)), None)
            series |= {name + s for s in SUFFIXES.get(kind, ("", "_total", "_bucket", "_sum", "_count"))}
    for body in LABEL_SET.findall(text):
        labels |= set(re.findall(r"pub (\w+):", body))
    # re.S: a backslash that continues a Rust string on the next line is one
    # escape, not the end of the literal (which would pair every later quote
    # wrongly).
    literals = set(re.findall(r'"((?:[^"\\]|\\.)*)"', text, re.S))
    # process::metrics::register(.., "<service>_build_info", ..): a collector's gauge.
    return series | {name for name in literals if re.fullmatch(r"[a-z_]+_build_info", name)}, labels, literals


def unknown_metrics(where: str, expr: str) -> list[str]:
    """The product's metrics an expression names that the binaries do not register."""
    series = sorted(code_metrics()[0])
    return [f"{where}: `{metric}` is not a series the binaries register (near: "
            f"{difflib.get_close_matches(metric, series, 2)})" for metric, _ in METRIC_SELECTOR.findall(expr)
            if metric.startswith(("webhook_", "outbox_")) and metric not in series]


def check_alerts(objs: list[dict], containers: list[Ours]) -> list[str]:
    """alerts and the Grafana dashboard use the code's metrics and label values; RUNBOOK sections and runbook_url
    anchors; the dashboard's JSON, $datasource and $namespace

    Jobs too are Services a ServiceMonitor scrapes; runbook_url is what
    Alertmanager, Grafana and PagerDuty show as a link, so absolute (they
    resolve nothing relative). That each query returns data on a live stack
    is tests/e2e/prometheus.rs's to prove."""
    series, labels, literals = code_metrics()
    problems = [] if series else ["found no `registry.register(\"name\", ...)` in crates/*/src: update REGISTER"]
    jobs = {s["metadata"]["name"] for _, services in scraped(objs) for s in services}
    headings = re.findall(r"^##+ (.+)$", RUNBOOK.read_text(), re.M)
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-") for h in headings}
    for rule_obj in [o for o in objs if o.get("kind") == "PrometheusRule"]:
        for rule in [r for g in rule_obj["spec"].get("groups") or [] for r in g.get("rules") or []]:
            name, expr = f"{ident(rule_obj)} {rule.get('alert') or rule.get('record')}", str(rule.get("expr", ""))
            problems += unknown_metrics(name, expr)
            for metric, selector in METRIC_SELECTOR.findall(expr):
                for label, op, value in MATCHER.findall(selector):
                    if metric == "up" and label == "job" and op == "=" and value not in jobs:
                        problems.append(f"{name}: job=\"{value}\" is no Service a ServiceMonitor scrapes ({jobs})")
                    problems += [f"{name}: {metric}{{{label}=\"{v}\"}}: no \"{v}\" in the code, so never exported"
                                 for v in (value.split("|") if op in ("=~", "!~") else [value])
                                 if metric in series and label in labels and v not in literals]
            if not rule.get("alert"):
                continue
            alert, annotations = rule["alert"].lower(), rule.get("annotations") or {}
            prose = " ".join(str(v) for k, v in annotations.items() if k != "runbook_url")
            problems += [f"{name}: deploy/RUNBOOK.md has no heading #{link} (the alert's, or one it links)"
                         for link in [alert] + re.findall(r"RUNBOOK\.md#([a-z0-9-]+)", prose) if link not in anchors]
            url = urlsplit(str(annotations.get("runbook_url") or ""))
            if url.scheme not in ("https", "http") or not url.netloc or not url.path.endswith("/RUNBOOK.md") \
                    or url.fragment != alert:
                problems.append(f"{name}: runbook_url {url.geturl()!r} is not an absolute http(s) URL to RUNBOOK.md#"
                                f"{alert} (the overlay's RUNBOOK_URL: components/monitoring/kustomization.yaml)")
    for cm in [o for o in objs if (o["metadata"].get("labels") or {}).get("grafana_dashboard")]:
        for key, text in (cm.get("data") or {}).items():
            try:
                dashboard = json.loads(text)
            except json.JSONDecodeError as e:
                problems.append(f"{ident(cm)} {key}: not JSON: {e}")
                continue
            variables = {v.get("name") for v in (dashboard.get("templating") or {}).get("list") or []}
            if not {"datasource", "namespace"} <= variables:
                problems.append(f"{ident(cm)} {key}: has the variables {variables}, not `datasource` and `namespace`")
            for panel in [p for p in dashboard.get("panels") or [] if p.get("type") != "row"]:
                title = f"{ident(cm)} {key} panel {panel.get('title')!r}"
                for expr in [str(t.get("expr")) for t in panel.get("targets") or []]:
                    problems += [] if "$namespace" in expr else [f"{title}: {expr!r} is not limited to $namespace"]
                    problems += unknown_metrics(title, expr)
    return problems


def check_release(objs: list[dict], containers: list[Ours]) -> list[str]:
    """the migration runs the deployed release; the version label is the images' tag; no Secret rendered

    The release (overlays/prod/release) sets the images and the version label
    side by side; Secrets are the operator's (from *.example.yaml)."""
    problems = [f"{ident(s)} is rendered: Secrets are created by the operator, never listed in a kustomization"
                for s in objs if s.get("kind") == "Secret"]
    images = {role: {oc.container.get("image") for oc in containers if oc.role == role} 
              for role in ("migrate", "ingest")}
    if all(images.values()) and images["migrate"] != images["ingest"]:
        problems.append(f"the migration runs {sorted(images['migrate'])}, webhook-ingest {sorted(images['ingest'])}")
    tags = {oc.tag for oc in containers} - {""}
    versions = {str(o["metadata"].get("labels", {}).get("app.kubernetes.io/version")) for o in objs}
    if tags and tags != versions:
        problems.append(f"app.kubernetes.io/version {sorted(versions)} is not the images' tag {sorted(tags)}")
    return problems


def check_dockerfile(objs: list[dict], containers: list[Ours]) -> list[str]:
    """deploy/Dockerfile runs each binary as the manifests' uid

    The stage each image is built from (its target: the binary's name) runs
    that binary, as the non-root uid the manifests give it."""
    parts = re.split(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?.*$", DOCKERFILE.read_text(), flags=re.M | re.I)
    stages = {name: (base, body) for base, name, body in zip(parts[1::3], parts[2::3], parts[3::3])}

    def last(stage: str, instruction: str) -> str:
        """Its last USER or ENTRYPOINT, else its base stage's."""
        base, body = stages.get(stage, (None, ""))
        found = re.findall(rf"^{instruction}\s+(.+)$", body, re.M)
        return found[-1] if found else last(base, instruction) if base in stages else ""
    problems = []
    for binary in OURS:
        user, entrypoint = last(binary, "USER"), last(binary, "ENTRYPOINT")
        # The container's securityContext over the pod's.
        uids = {((oc.pod.get("securityContext") or {}) | (oc.container.get("securityContext") or {})).get("runAsUser")
                for oc in containers if oc.binary == binary}
        if not user.split(":")[0].isdigit() or user.split(":")[0] == "0" or uids - {int(user.split(":")[0])}:
            problems.append(f"deploy/Dockerfile stage {binary}: USER `{user}`, not the manifests' non-root uid {uids}")
        if f'/usr/local/bin/{binary}"' not in entrypoint:
            problems.append(f"deploy/Dockerfile stage {binary}: ENTRYPOINT {entrypoint!r}, not /usr/local/bin/{binary}")
    return problems
