"""The checks only we can make: the rendered manifests against the code they
deploy. Each returns a list of problems (empty: passed)."""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from .binaries import OURS, REQUIRED, Binaries, Cli
from .cnpg import opens, policies_selecting
from .render import DEPLOY, ROOT
from .validate import ident

COUNT_DUE_SQL = ROOT / "crates/outbox-relay/sql/count_due.sql"
# Where the console's HTTP server is built: its shutdown_timeout is the
# console's shutdown budget.
CONSOLE_SERVER = ROOT / "crates/ops-console/src/server.rs"
RUNBOOK = DEPLOY / "RUNBOOK.md"
DOCKERFILE = DEPLOY / "Dockerfile"
# Test helpers, not what the binaries run.
NOT_SHIPPED = ("testkit", "simulator")
HEALTHZ, READYZ, METRICS = "/healthz", "/readyz", "/metrics"
# What each binary is when it serves (no subcommand, or `serve`), and the
# variable of the traffic port of those that take traffic.
SERVING = {"webhook-ingest": "ingest", "outbox-relay": "relay", "ops-console": "console"}
TRAFFIC_ADDR = {"ingest": "INGEST_LISTEN_ADDR", "console": "CONSOLE_LISTEN_ADDR"}


def shipped_sources() -> str:
    return "\n".join(p.read_text() for p in sorted(ROOT.glob("crates/*/src/**/*.rs"))
                     if p.relative_to(ROOT).parts[1] not in NOT_SHIPPED)


# --------------------------------------------------------------------------
# Our containers in a render


def pod_spec(obj: dict) -> dict | None:
    spec = obj.get("spec") or {}
    if obj.get("kind") == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    template = spec.get("template")
    return (template.get("spec") or {}) if isinstance(template, dict) else None


def pod_labels(obj: dict) -> dict:
    return (((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}


@dataclass
class Ours:
    owner: dict
    pod: dict  # the pod spec
    container: dict
    binary: str
    subcommand: tuple[str, ...]
    cli: Cli | None
    problem: str | None  # why there is no Cli

    @property
    def where(self) -> str:
        return f"{ident(self.owner)} container {self.container.get('name')} (`{' '.join([self.binary, *self.subcommand])}`)"

    @property
    def role(self) -> str:
        """ingest, relay or console when it serves; the subcommand's name otherwise."""
        if self.subcommand in ((), ("serve",)):
            return SERVING[self.binary]
        return "-".join(self.subcommand)

    def env(self, objs: list[dict]) -> dict[str, object]:
        """NAME -> value (str), SECRET, or None for a value the kubelet fills in."""
        out: dict[str, object] = {}
        ns = self.owner["metadata"].get("namespace")
        for source in self.container.get("envFrom") or []:
            ref = source.get("configMapRef") or {}
            for cm in find(objs, "ConfigMap", ref.get("name"), ns):
                out.update({source.get("prefix", "") + k: v for k, v in (cm.get("data") or {}).items()})
        for e in self.container.get("env") or []:
            if "value" in e:
                out[e["name"]] = str(e["value"])
            elif "secretKeyRef" in (e.get("valueFrom") or {}):
                out[e["name"]] = SECRET
            else:
                out[e["name"]] = None
        return out

    def value(self, objs: list[dict], name: str) -> str | None:
        """The variable as the binary sees it: set in the manifest, else its default."""
        v = self.env(objs).get(name)
        if isinstance(v, str):
            return v
        return self.cli.variables.get(name) if (self.cli and name not in self.env(objs)) else None


SECRET = object()


def find(objs: list[dict], kind: str, name: str | None = None, namespace: str | None = None) -> list[dict]:
    return [o for o in objs if o.get("kind") == kind and (name is None or o["metadata"].get("name") == name)
            and o["metadata"].get("namespace") == namespace]


def ours(objs: list[dict], binaries: Binaries) -> list[Ours]:
    out = []
    for obj in objs:
        spec = pod_spec(obj)
        for c in (spec or {}).get("initContainers", []) + (spec or {}).get("containers", []):
            binary = c.get("image", "").split("@")[0].rsplit("/", 1)[-1].split(":")[0]
            if binary not in OURS:
                continue
            sub = []
            for a in map(str, c.get("args") or []):
                if a.startswith("-"):
                    break
                sub.append(a)
            cli, problem = binaries.cli(binary, tuple(sub))
            out.append(Ours(obj, spec, c, binary, tuple(sub), cli, problem))
    return out


def port_of(addr: str | None) -> int | None:
    m = re.search(r":(\d+)$", addr or "")
    return int(m.group(1)) if m else None


def is_loopback(addr: str | None) -> bool:
    """127.0.0.1:8080, [::1]:8080: an address only this host reaches."""
    host = (addr or "").rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def int_of(raw: str | None) -> int | None:
    try:
        return int(str(raw).strip()) if raw is not None else None
    except ValueError:
        return None


def container_port(container: dict, port) -> int | None:
    if isinstance(port, int):
        return port
    return next((p.get("containerPort") for p in container.get("ports") or [] if p.get("name") == port), None)


# --------------------------------------------------------------------------
# The checks


def check_env(objs: list[dict], containers: list[Ours]) -> list[str]:
    """Every variable set is one the binary's --help lists; the required ones are set."""
    problems = []
    for oc in containers:
        if oc.cli is None:
            problems.append(f"{oc.where}: cannot check its variables: {oc.problem}")
            continue
        for source in oc.container.get("envFrom") or []:
            if "secretRef" in source:
                problems.append(f"{oc.where}: envFrom Secret {source['secretRef'].get('name')} hides which variables "
                                "it sets: use env[].valueFrom.secretKeyRef per variable")
            elif not find(objs, "ConfigMap", (source.get("configMapRef") or {}).get("name"), oc.owner["metadata"].get("namespace")):
                problems.append(f"{oc.where}: envFrom ConfigMap {source.get('configMapRef')} is not in the render")
        env = oc.env(objs)
        explicit = {e.get("name") for e in oc.container.get("env") or []}
        for name in sorted(env):
            if not oc.cli.accepts(name):
                via = "" if name in explicit else " through envFrom (a generated ConfigMap: the .env file or literals)"
                problems.append(f"{oc.where} sets {name}{via}, which `{oc.cli.command} --help` does not list")
        problems += [f"{oc.where} does not set {name}, which it cannot start without"
                     for name in REQUIRED.get((oc.binary, oc.subcommand), []) if name not in env]
    return problems


def check_ports_and_probes(objs: list[dict], containers: list[Ours]) -> list[str]:
    """Container ports are where the binary listens; probes and ServiceMonitors
    hit the admin server's paths on its port."""
    problems = []
    code = shipped_sources()
    for path in (HEALTHZ, READYZ, METRICS):
        if f'"{path}"' not in code:
            problems.append(f"no crate serves {path} any more: update deploy-check and the manifests")
    admin_ports = {}
    for oc in containers:
        if oc.role not in SERVING.values():
            continue  # one-off commands listen on nothing
        want = {"admin": port_of(oc.value(objs, "ADMIN_LISTEN_ADDR"))}
        if oc.role in TRAFFIC_ADDR:
            want["http"] = port_of(oc.value(objs, TRAFFIC_ADDR[oc.role]))
        named = {p.get("name"): p.get("containerPort") for p in oc.container.get("ports") or []}
        for name, port in want.items():
            if port is None:
                problems.append(f"{oc.where}: cannot tell which port `{name}` should be (listen address unknown)")
            elif named.get(name) != port:
                problems.append(f"{oc.where}: containerPort `{name}` is {named.get(name)}, the binary listens on {port}")
        admin_ports[id(oc.owner)] = (oc, want["admin"])
        for probe, path in (("livenessProbe", HEALTHZ), ("readinessProbe", READYZ)):
            get = (oc.container.get(probe) or {}).get("httpGet")
            if not get:
                problems.append(f"{oc.where}: {probe} should be an httpGet of {path} on the admin port")
                continue
            if get.get("path") != path:
                problems.append(f"{oc.where}: {probe} path is {get.get('path')}, the admin server serves {path}")
            if container_port(oc.container, get.get("port")) != want["admin"]:
                problems.append(f"{oc.where}: {probe} port {get.get('port')} is not the admin port {want['admin']}")
    for sm in [o for o in objs if o.get("kind") == "ServiceMonitor"]:
        ns = sm["metadata"].get("namespace")
        services = [s for s in find(objs, "Service", namespace=ns) if selects(sm["spec"].get("selector"), s["metadata"].get("labels"))]
        if not services:
            problems.append(f"{ident(sm)}: selects no Service")
        for ep in sm["spec"].get("endpoints") or []:
            if ep.get("path", METRICS) != METRICS:
                problems.append(f"{ident(sm)}: scrapes {ep.get('path')}, the admin server serves {METRICS}")
            for svc in services:
                port = next((p for p in svc["spec"].get("ports") or [] if p.get("name") == ep.get("port")), None)
                if port is None:
                    problems.append(f"{ident(sm)}: port `{ep.get('port')}` is not a named port of {ident(svc)}")
                    continue
                for oc, admin in admin_ports.values():
                    if oc.owner["metadata"].get("namespace") == ns and selects({"matchLabels": svc["spec"].get("selector")}, pod_labels(oc.owner)):
                        if container_port(oc.container, port.get("targetPort", port.get("port"))) != admin:
                            problems.append(f"{ident(sm)} scrapes {ident(svc)} port {ep.get('port')}, which is not {oc.where}'s admin port {admin}")
    return problems


def selects(selector: dict | None, labels: dict | None) -> bool:
    if not selector or set(selector) - {"matchLabels"}:
        return False  # only matchLabels is used here
    return all((labels or {}).get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def check_grace(objs: list[dict], containers: list[Ours]) -> list[str]:
    """terminationGracePeriodSeconds covers each service's shutdown budget as configured."""
    problems = []
    for oc in containers:
        grace = oc.pod.get("terminationGracePeriodSeconds", 30)
        if oc.role == "ingest":
            deadline_ms = int_of(oc.value(objs, "INGEST_DEADLINE_MS"))
            pre_stop = (oc.container.get("lifecycle") or {}).get("preStop") or {}
            pause = (pre_stop.get("sleep") or {}).get("seconds")
            if pause is None:
                problems.append(f"{oc.where}: needs a preStop `sleep` (the image has no shell): requests routed "
                                "while the endpoint is being removed would be refused")
                pause = 0
            if deadline_ms is None:
                problems.append(f"{oc.where}: INGEST_DEADLINE_MS unknown")
            elif grace < pause + math.ceil(deadline_ms / 1000):
                problems.append(f"{oc.where}: terminationGracePeriodSeconds {grace} < preStop {pause} s + "
                                f"INGEST_DEADLINE_MS {deadline_ms} ms (in-flight requests are cut)")
        elif oc.role == "relay":
            timeout_ms = int_of(oc.value(objs, "RELAY_HTTP_TIMEOUT_MS"))
            lease = int_of(oc.value(objs, "RELAY_LEASE_SECS"))
            if timeout_ms is None:
                problems.append(f"{oc.where}: RELAY_HTTP_TIMEOUT_MS unknown")
                continue
            if not grace > timeout_ms / 1000 + 1:
                problems.append(f"{oc.where}: terminationGracePeriodSeconds {grace} must exceed "
                                f"RELAY_HTTP_TIMEOUT_MS/1000 + 1 = {timeout_ms / 1000 + 1:g} s (calls in flight are cut)")
            if lease is None or not lease * 1000 > timeout_ms:
                problems.append(f"{oc.where}: RELAY_LEASE_SECS {lease} must exceed RELAY_HTTP_TIMEOUT_MS {timeout_ms} ms "
                                "(the binary refuses to start)")
        elif oc.role == "console":
            budget = console_shutdown_secs()
            if budget is None:
                problems.append(f"{CONSOLE_SERVER.relative_to(ROOT)}: no `.shutdown_timeout(N)` on the HTTP server: "
                                "update deploy-check (the console's shutdown budget)")
            elif not grace > budget + 1:
                problems.append(f"{oc.where}: terminationGracePeriodSeconds {grace} must exceed the HTTP server's "
                                f"shutdown_timeout {budget} s + 1 (requests in flight are cut)")
    return problems


def console_shutdown_secs() -> int | None:
    """How long the console's HTTP server waits for requests in flight on
    SIGTERM, as crates/ops-console/src/server.rs builds it."""
    if not CONSOLE_SERVER.is_file():
        return None
    m = re.search(r"\.shutdown_timeout\(\s*(\d+)\s*\)", CONSOLE_SERVER.read_text())
    return int(m.group(1)) if m else None


# The console's variables that must come from a Secret, never a ConfigMap.
CONSOLE_SECRETS = ("DATABASE_URL", "CONSOLE_TOKEN")


def check_console(objs: list[dict], containers: list[Ours]) -> list[str]:
    """The operator's console: one pod, never two (its sign-ins live in the
    process's memory: behind two, operators are signed out at random), so
    one replica, Recreate and no autoscaler; its database URL and token from
    Secrets; its session cookie HTTPS-only unless it listens on loopback;
    its pages admitted by the NetworkPolicies from named pods only (the auth
    proxy) and routed by no Ingress."""
    problems = []
    for oc in [c for c in containers if c.role == "console"]:
        owner, meta = oc.owner, oc.owner["metadata"]
        ns, spec = meta.get("namespace"), oc.owner.get("spec") or {}
        if owner.get("kind") != "Deployment":
            problems.append(f"{oc.where}: a {owner.get('kind')}, not a Deployment of one replica")
        else:
            if spec.get("replicas") != 1:
                problems.append(f"{oc.where}: replicas {spec.get('replicas')}, not 1: the sign-ins live in one "
                                "process's memory, and a second pod signs operators out at random")
            strategy = (spec.get("strategy") or {}).get("type", "RollingUpdate")
            if strategy != "Recreate":
                problems.append(f"{oc.where}: strategy {strategy}: a rollout would run two pods side by side "
                                "(Recreate stops the old one first)")
        for scaler in find(objs, "HorizontalPodAutoscaler", namespace=ns) + find(objs, "ScaledObject", namespace=ns):
            ref = (scaler.get("spec") or {}).get("scaleTargetRef") or {}
            if ref.get("name") == meta.get("name") and ref.get("kind", "Deployment") == owner.get("kind"):
                problems.append(f"{ident(scaler)} scales {oc.where}, which must stay at one pod")
        env = oc.env(objs)
        for name in CONSOLE_SECRETS:
            if name in env and env[name] is not SECRET:
                problems.append(f"{oc.where}: {name} is not from a Secret (env[].valueFrom.secretKeyRef)")
        listen = oc.value(objs, "CONSOLE_LISTEN_ADDR")
        if oc.value(objs, "CONSOLE_COOKIE") == "plain-http" and not is_loopback(listen):
            problems.append(f"{oc.where}: CONSOLE_COOKIE=plain-http while it listens on {listen}: the session "
                            "cookie would travel over plain HTTP (secure)")
        labels = pod_labels(owner)
        port = port_of(listen)
        port_name = next((p.get("name") for p in oc.container.get("ports") or [] if p.get("containerPort") == port), None)
        policies = policies_selecting(objs, ns, labels, "Ingress")
        if not policies:
            problems.append(f"{oc.where}: no NetworkPolicy selects its pods for Ingress: any pod reaches its pages")
        for p in policies:
            for i, rule in enumerate((p.get("spec") or {}).get("ingress") or []):
                if port is None or not opens(rule, port, port_name):
                    continue
                where = f"{ident(p)}: ingress[{i}] to the console's pages ({port})"
                peers = rule.get("from") or []
                if not peers:
                    problems.append(f"{where} admits any source: name the auth proxy's pods")
                for peer in peers:
                    if not ((peer.get("podSelector") or {}).get("matchLabels") or {}):
                        problems.append(f"{where} admits {sorted(peer)} without naming pods (podSelector.matchLabels): "
                                        "only the auth proxy's pods may reach the pages")
        for ing in find(objs, "Ingress", namespace=ns):
            ing_spec = ing.get("spec") or {}
            backends = [ing_spec.get("defaultBackend") or {}] + [
                path.get("backend") or {} for r in ing_spec.get("rules") or []
                for path in (r.get("http") or {}).get("paths") or []]
            for backend in backends:
                name = (backend.get("service") or {}).get("name")
                for svc in find(objs, "Service", name, ns) if name else []:
                    selector = (svc.get("spec") or {}).get("selector")
                    if selector and selects({"matchLabels": selector}, labels):
                        problems.append(f"{ident(ing)} routes to {ident(svc)}, the console's pods: browsers must "
                                        "come through the auth proxy (route to it instead)")
    return problems


def normalise_sql(sql: str) -> str:
    return re.sub(r"\s+", " ", sql).strip().rstrip(";").strip()


def check_keda_query(objs: list[dict]) -> list[str]:
    """KEDA counts due rows with the relay's own statement."""
    want = normalise_sql(COUNT_DUE_SQL.read_text()) if COUNT_DUE_SQL.is_file() else None
    problems = []
    for so in [o for o in objs if o.get("kind") == "ScaledObject"]:
        for t in so["spec"].get("triggers") or []:
            if t.get("type") != "postgresql":
                continue
            if want is None:
                return [f"{COUNT_DUE_SQL.relative_to(ROOT)} is missing: the relay's count query is the reference"]
            got = normalise_sql(str((t.get("metadata") or {}).get("query", "")))
            if got != want:
                problems.append(f"{ident(so)}: the postgresql query differs from {COUNT_DUE_SQL.relative_to(ROOT)}:\n"
                                f"            trigger: {got}\n            relay:   {want}")
    return problems


REGISTER = re.compile(r'\.register\(\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"\s*,\s*"(?:[^"\\]|\\.)*"\s*,\s*(?:\w+\.)*(\w+)\.clone\(\)')
LABEL_SET = re.compile(r"EncodeLabelSet[^\]]*\)\]\s*(?:#\[[^\]]*\]\s*)*pub struct \w+ \{(.*?)\}", re.S)
METRIC_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def code_metrics() -> tuple[set[str], set[str], set[str]]:
    """(the series our binaries expose, their label names, the string literals
    in the shipped code: where a label value comes from)."""
    series, labels = set(), set()
    for path in sorted(ROOT.glob("crates/*/src/**/*.rs")):
        if path.relative_to(ROOT).parts[1] in NOT_SHIPPED:
            continue
        text = path.read_text()
        for name, field in REGISTER.findall(text):
            m = re.search(rf"^\s*pub {field}:\s*(.+)$", text, re.M)  # the struct field: its type
            kind = m.group(1) if m else ""
            if "Histogram" in kind:
                series |= {name + s for s in ("_bucket", "_sum", "_count")}
            elif "Counter" in kind:
                series.add(name + "_total")
            elif "Gauge" in kind:
                series.add(name)
            else:
                series |= {name + s for s in ("", "_total", "_bucket", "_sum", "_count")}
        for body in LABEL_SET.findall(text):
            labels |= set(re.findall(r"pub (\w+):", body))
    sources = shipped_sources()
    # re.S: a backslash that continues a Rust string on the next line is one
    # escape, not the end of the literal (which would pair every later quote
    # wrongly).
    literals = set(re.findall(r'"((?:[^"\\]|\\.)*)"', sources, re.S))
    # process::metrics::register(.., "<service>_build_info", ..): a collector's gauge.
    series |= {name for name in literals if re.fullmatch(r"[a-z_]+_build_info", name)}
    return series, labels, literals


def check_alerts(objs: list[dict]) -> list[str]:
    """Rules name metrics the code exports, label values the code sets, jobs a
    ServiceMonitor scrapes; each alert has its RUNBOOK section."""
    problems = []
    series, labels, literals = code_metrics()
    if not series:
        problems.append("found no `registry.register(\"name\", ...)` in crates/*/src: update deploy-check's REGISTER")
    scraped = {s["metadata"]["name"] for sm in objs if sm.get("kind") == "ServiceMonitor"
               for s in find(objs, "Service", namespace=sm["metadata"].get("namespace"))
               if selects(sm["spec"].get("selector"), s["metadata"].get("labels"))}
    runbook = RUNBOOK.read_text() if RUNBOOK.is_file() else ""
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^##+ (.+)$", runbook, re.M)}
    for rule_obj in [o for o in objs if o.get("kind") == "PrometheusRule"]:
        for group in rule_obj["spec"].get("groups") or []:
            for rule in group.get("rules") or []:
                name = f"{ident(rule_obj)} {rule.get('alert') or rule.get('record')}"
                for m in METRIC_SELECTOR.finditer(str(rule.get("expr", ""))):
                    metric, selector = m.group(1), m.group(2) or ""
                    if metric.startswith(("webhook_", "outbox_")) and metric not in series:
                        near = difflib.get_close_matches(metric, sorted(series), 2)
                        problems.append(f"{name}: `{metric}` is not a series the binaries register"
                                        + (f" (did you mean {' or '.join(near)}?)" if near else ""))
                    for label, op, value in MATCHER.findall(selector):
                        if metric == "up" and label == "job" and op == "=" and value not in scraped:
                            problems.append(f"{name}: job=\"{value}\" is not a Service a ServiceMonitor scrapes ({sorted(scraped)})")
                        if metric in series and label in labels:
                            for v in value.split("|") if op in ("=~", "!~") else [value]:
                                if v not in literals:
                                    problems.append(f"{name}: {metric}{{{label}=\"{v}\"}}: no \"{v}\" in the code, so never exported")
                if rule.get("alert"):
                    if rule["alert"].lower() not in anchors:
                        problems.append(f"{name}: no `## {rule['alert']}` section in deploy/RUNBOOK.md")
                    prose = [v for k, v in (rule.get("annotations") or {}).items() if k != "runbook_url"]
                    for link in re.findall(r"RUNBOOK\.md#([a-z0-9-]+)", " ".join(prose)):
                        if link not in anchors:
                            problems.append(f"{name}: links RUNBOOK.md#{link}, which is no heading")
                    problems += [f"{name}: {p}" for p in runbook_url_problems(rule, anchors)]
    return problems


def runbook_url_problems(rule: dict, anchors: set[str]) -> list[str]:
    """The alert's runbook_url: what Alertmanager, Grafana and PagerDuty show as
    a link, so absolute (they resolve nothing relative), to deploy/RUNBOOK.md
    (as the overlay's RUNBOOK_URL says where it is served), at the alert's
    own section."""
    url = str((rule.get("annotations") or {}).get("runbook_url") or "")
    if not url:
        return ["no runbook_url annotation"]
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.netloc:
        return [f"runbook_url {url!r} is not an absolute http(s) URL (is the overlay's ConfigMap `runbook`, "
                "RUNBOOK_URL, replaced into it? see components/monitoring/kustomization.yaml)"]
    problems = []
    if not parts.path.endswith("/RUNBOOK.md"):
        problems.append(f"runbook_url {url!r} does not lead to a RUNBOOK.md")
    if parts.fragment != rule["alert"].lower():
        problems.append(f"runbook_url {url!r} is not at #{rule['alert'].lower()}, the alert's own section")
    elif parts.fragment not in anchors:
        problems.append(f"runbook_url {url!r}: deploy/RUNBOOK.md has no such heading")
    return problems


def check_dashboard(objs: list[dict]) -> list[str]:
    """Each Grafana dashboard shipped (a ConfigMap labelled grafana_dashboard):
    JSON with a uid, every panel on the `$datasource` variable, every query
    for one `$namespace`, and the product's metrics it names exported by the
    code (that each query returns data on a live stack is
    tests/e2e/prometheus.rs's to prove)."""
    problems = []
    series, _, _ = code_metrics()
    for cm in [o for o in objs if o.get("kind") == "ConfigMap"
               and ((o.get("metadata") or {}).get("labels") or {}).get("grafana_dashboard")]:
        for key, text in (cm.get("data") or {}).items():
            where = f"{ident(cm)} {key}"
            try:
                dashboard = json.loads(text)
            except json.JSONDecodeError as e:
                problems.append(f"{where}: not JSON: {e}")
                continue
            if not dashboard.get("uid"):
                problems.append(f"{where}: no uid (Grafana would make one per import)")
            variables = {v.get("name") for v in (dashboard.get("templating") or {}).get("list") or []}
            for needed in ("datasource", "namespace"):
                if needed not in variables:
                    problems.append(f"{where}: no `{needed}` variable")
            panels = [p for p in dashboard.get("panels") or [] if p.get("type") != "row"]
            if not panels:
                problems.append(f"{where}: no panel")
            for panel in panels:
                title = f"{where} panel {panel.get('title')!r}"
                if (panel.get("datasource") or {}).get("uid") != "${datasource}":
                    problems.append(f"{title}: datasource is not ${{datasource}}")
                if not panel.get("targets"):
                    problems.append(f"{title}: no query")
                for target in panel.get("targets") or []:
                    expr = str(target.get("expr") or "")
                    if "$namespace" not in expr:
                        problems.append(f"{title}: {expr!r} is not limited to $namespace")
                    for m in METRIC_SELECTOR.finditer(expr):
                        metric = m.group(1)
                        if metric.startswith(("webhook_", "outbox_")) and metric not in series:
                            near = difflib.get_close_matches(metric, sorted(series), 2)
                            problems.append(f"{title}: `{metric}` is not a series the binaries register"
                                            + (f" (did you mean {' or '.join(near)}?)" if near else ""))
    return problems


# The recommended labels (kubernetes.io/docs/concepts/overview/working-with-objects/common-labels).
RECOMMENDED = ("app.kubernetes.io/part-of", "app.kubernetes.io/managed-by",
               "app.kubernetes.io/instance", "app.kubernetes.io/version")


def check_labels(objs: list[dict], containers: list[Ours]) -> list[str]:
    """Every object an operator applies carries the recommended labels, one
    instance and one version per render, and the version is the tag of the
    images it runs (when they have one)."""
    problems = []
    values: dict[str, set[str]] = {k: set() for k in RECOMMENDED}
    for obj in objs:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        missing = [k for k in RECOMMENDED if k not in labels]
        if missing:
            problems.append(f"{ident(obj)}: no {', '.join(missing)} label")
        for k in RECOMMENDED:
            if k in labels:
                values[k].add(str(labels[k]))
    for k in ("app.kubernetes.io/instance", "app.kubernetes.io/version"):
        if len(values[k]) > 1:
            problems.append(f"{k} differs between objects: {sorted(values[k])}")
    tags = {c.container.get("image", "").split("@")[0].rsplit("/", 1)[-1].partition(":")[2] for c in containers}
    tags.discard("")
    if tags and values["app.kubernetes.io/version"] and tags != values["app.kubernetes.io/version"]:
        problems.append(f"app.kubernetes.io/version {sorted(values['app.kubernetes.io/version'])} is not the images' tag "
                        f"{sorted(tags)}: set both in the release (overlays/prod/release)")
    return problems


def check_release(objs: list[dict], containers: list[Ours]) -> list[str]:
    """The migration runs the schema of the release it precedes; no Secret is
    ever rendered (the operator creates them from *.example.yaml)."""
    problems = [f"{ident(s)} is rendered: Secrets are created by the operator, never listed in a kustomization"
                for s in objs if s.get("kind") == "Secret"]
    images: dict[str, set[str]] = {}
    for oc in containers:
        images.setdefault(oc.role, set()).add(oc.container.get("image"))
    if "migrate" in images and "ingest" in images and images["migrate"] != images["ingest"]:
        problems.append(f"the migration runs {sorted(images['migrate'])} but webhook-ingest runs {sorted(images['ingest'])}")
    return problems


def dockerfile_stages() -> dict[str, tuple[str, list[str]]]:
    """deploy/Dockerfile's stages: name -> (what it is FROM, its instructions)."""
    stages: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in DOCKERFILE.read_text().splitlines():
        if m := re.match(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.I):
            current = m.group(2) or f"stage{len(stages)}"
            stages[current] = (m.group(1), [])
        elif current and line.strip() and not line.lstrip().startswith("#"):
            stages[current][1].append(line.strip())
    return stages


def stage_lines(stages: dict[str, tuple[str, list[str]]], name: str) -> list[str]:
    """A stage's instructions after those of the stages it is built FROM (the
    later USER or ENTRYPOINT wins, as in the image)."""
    base, lines = stages[name]
    return (stage_lines(stages, base) if base in stages and base != name else []) + lines


def check_dockerfile(all_containers: list[Ours]) -> list[str]:
    """Each binary's image stage runs it, as the uid the manifests give it;
    its `-prebuilt` target (what make images builds, from the host's binaries)
    is the same image but for where the binary comes from."""
    if not DOCKERFILE.is_file():
        return ["deploy/Dockerfile is missing"]
    stages = dockerfile_stages()
    problems = []
    for binary in OURS:
        if binary not in stages:
            problems.append(f"deploy/Dockerfile: no `FROM ... AS {binary}` stage")
            continue
        lines = stage_lines(stages, binary)
        user = next((l.split(None, 1)[1] for l in reversed(lines) if l.upper().startswith("USER ")), "")
        uid = int_of(user.split(":")[0])
        manifest_uids = {(oc.container.get("securityContext") or {}).get("runAsUser", (oc.pod.get("securityContext") or {}).get("runAsUser"))
                         for oc in all_containers if oc.binary == binary}
        if uid is None or uid == 0:
            problems.append(f"deploy/Dockerfile stage {binary}: USER must be a numeric non-root uid (is `{user}`)")
        elif manifest_uids and manifest_uids != {uid}:
            problems.append(f"deploy/Dockerfile stage {binary}: USER {uid}, but the manifests run it as {sorted(manifest_uids, key=str)}")
        entry = next((l for l in reversed(lines) if l.upper().startswith("ENTRYPOINT")), "")
        if f'/{binary}"' not in entry:
            problems.append(f"deploy/Dockerfile stage {binary}: ENTRYPOINT should run /usr/local/bin/{binary} (exec form)")
        prebuilt = f"{binary}-prebuilt"
        if prebuilt not in stages:
            problems.append(f"deploy/Dockerfile: no `{prebuilt}` target (make images builds it)")
        elif stages[prebuilt][0] != stages[binary][0]:
            problems.append(f"deploy/Dockerfile: {prebuilt} is FROM {stages[prebuilt][0]}, but {binary} FROM "
                            f"{stages[binary][0]}: make images would not build the release's image")
        elif [l.split()[0].upper() for l in stages[prebuilt][1]] != ["COPY"]:
            problems.append(f"deploy/Dockerfile: {prebuilt} must only COPY the binary onto {stages[binary][0]}")
    return problems
