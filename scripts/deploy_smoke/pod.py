"""From a rendered pod template to the container a kubelet would start:
what it runs, as whom, with which environment, probes and termination.

Everything comes from the rendered objects; nothing here names one of our
settings. A field this module does not know how to reproduce stops the smoke
(`Unsupported`) rather than being dropped, so that "run exactly as
Kubernetes would" stays true when the manifests grow. Fields that only
matter to the scheduler or the API server are listed as such.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

from .objects import Objects, SmokeFailure, ident


class Unsupported(SmokeFailure):
    """A field the smoke cannot reproduce: teach this module, do not drop it."""


# Pod fields that change nothing inside the container (scheduling, API
# identity), and those reproduced below.
POD_IGNORED = {"topologySpreadConstraints", "affinity", "nodeSelector", "tolerations", "priorityClassName",
               "serviceAccountName", "serviceAccount", "schedulerName", "dnsPolicy", "preemptionPolicy"}
POD_KNOWN = POD_IGNORED | {"containers", "securityContext", "terminationGracePeriodSeconds", "restartPolicy",
                           "volumes", "automountServiceAccountToken", "enableServiceLinks"}
CONTAINER_IGNORED = {"imagePullPolicy", "terminationMessagePolicy", "terminationMessagePath"}
CONTAINER_KNOWN = CONTAINER_IGNORED | {"name", "image", "command", "args", "env", "envFrom", "ports", "livenessProbe",
                                       "readinessProbe", "resources", "securityContext", "lifecycle", "workingDir",
                                       "volumeMounts"}
SECURITY_KNOWN = {"runAsUser", "runAsGroup", "runAsNonRoot", "readOnlyRootFilesystem", "allowPrivilegeEscalation",
                  "capabilities", "seccompProfile", "privileged", "fsGroup", "fsGroupChangePolicy",
                  "supplementalGroups"}
PROBE_KNOWN = {"httpGet", "tcpSocket", "periodSeconds", "timeoutSeconds", "failureThreshold", "successThreshold",
               "initialDelaySeconds", "terminationGracePeriodSeconds"}

# What the kubelet assumes when a field is absent (core/v1 defaults).
PROBE_DEFAULTS = {"periodSeconds": 10, "timeoutSeconds": 1, "failureThreshold": 3, "successThreshold": 1,
                  "initialDelaySeconds": 0}
DEFAULT_GRACE_SECONDS = 30


@dataclass
class Probe:
    kind: str  # liveness | readiness
    path: str | None  # httpGet; None for tcpSocket
    port: int  # a containerPort (named ports resolved)
    scheme: str
    headers: dict[str, str]
    period: float
    timeout: float
    failure_threshold: int
    success_threshold: int
    initial_delay: float

    def describe(self) -> str:
        target = f"GET :{self.port}{self.path}" if self.path is not None else f"TCP :{self.port}"
        return (f"{target} every {self.period:g} s (timeout {self.timeout:g} s), "
                f"{self.failure_threshold} failure(s) to fail")


@dataclass
class PreStop:
    sleep: float | None = None
    exec_command: list[str] | None = None
    http_path: str | None = None
    http_port: int | None = None

    def describe(self) -> str:
        if self.sleep is not None:
            return f"preStop sleep {self.sleep:g} s (the kubelet's own)"
        if self.exec_command is not None:
            return f"preStop exec {self.exec_command}"
        return f"preStop GET :{self.http_port}{self.http_path}"


@dataclass
class Container:
    """One container of one pod, with everything `podman run` needs."""
    owner: str  # Deployment/webhook-ingest, Job/webhook-ingest-migrate
    pod_name: str
    name: str
    image: str  # as rendered
    command: list[str] | None
    args: list[str] | None
    env: dict[str, str]
    env_sources: dict[str, str]  # NAME -> where its value came from (no values: some are secret)
    ports: dict[int, str | None]  # containerPort -> name
    run_as_user: int | None
    run_as_group: int | None
    run_as_non_root: bool
    supplemental_groups: list[int]
    read_only_root: bool
    allow_privilege_escalation: bool
    cap_drop: list[str]
    cap_add: list[str]
    seccomp: str  # RuntimeDefault | Unconfined
    memory_limit: int | None  # bytes
    cpu_limit: float | None  # cores
    cpu_shares: int | None
    tmpfs: list[str]
    working_dir: str | None
    liveness: Probe | None
    readiness: Probe | None
    grace_seconds: int
    pre_stop: PreStop | None
    restart_policy: str
    active_deadline: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.owner.split("/", 1)[0]


def check_known(where: str, fields: dict, known: set[str]) -> None:
    unknown = sorted(set(fields) - known)
    if unknown:
        raise Unsupported(f"{where}: the smoke does not know how to reproduce {unknown}: "
                          "teach scripts/deploy_smoke/pod.py (or list it as irrelevant inside a container)")


def quantity(value) -> float:
    """A Kubernetes resource quantity ("256Mi", "250m", "1.5", "1G") as a number."""
    text = str(value)
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", text)
    if not m:
        raise Unsupported(f"resource quantity {text!r}")
    number, suffix = float(m.group(1)), m.group(2)
    factors = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
               "Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4}
    if suffix not in factors:
        raise Unsupported(f"resource quantity {text!r}")
    return number * factors[suffix]


def env_name(service: str) -> str:
    return service.upper().replace("-", "_").replace(".", "_")


def service_links(objs: Objects, namespace: str) -> dict[str, str]:
    """The variables a kubelet gives every container for each Service of its
    namespace (enableServiceLinks, on by default), and for the API server's
    `kubernetes` Service always. The cluster IPs are placeholders (10.96.0.x):
    only the names matter here (a Service named like one of our variables'
    prefixes would shadow nothing, since explicit variables win, but would
    show up as an unexpected variable)."""
    out: dict[str, str] = {}

    def add(name: str, ip: str, ports: list[dict]) -> None:
        n = env_name(name)
        first = ports[0]
        out[f"{n}_SERVICE_HOST"] = ip
        out[f"{n}_SERVICE_PORT"] = str(first["port"])
        out[f"{n}_PORT"] = f"{first.get('protocol', 'TCP').lower()}://{ip}:{first['port']}"
        for p in ports:
            proto = p.get("protocol", "TCP")
            if p.get("name"):
                out[f"{n}_SERVICE_PORT_{env_name(p['name'])}"] = str(p["port"])
            base = f"{n}_PORT_{p['port']}_{proto}"
            out[base] = f"{proto.lower()}://{ip}:{p['port']}"
            out[f"{base}_PROTO"] = proto.lower()
            out[f"{base}_PORT"] = str(p["port"])
            out[f"{base}_ADDR"] = ip

    services = [s for s in objs.of_kind("Service") if s["metadata"].get("namespace") == namespace]
    for i, svc in enumerate(sorted(services, key=lambda s: s["metadata"]["name"])):
        spec = svc.get("spec") or {}
        if spec.get("clusterIP") == "None" or not spec.get("ports"):
            continue  # headless: no variables
        add(svc["metadata"]["name"], f"10.96.0.{10 + i}", spec["ports"])
    add("kubernetes", "10.96.0.1", [{"name": "https", "port": 443, "protocol": "TCP"}])
    return out


EXPANSION = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion: a defined variable is replaced, an
    undefined reference kept as written, $$ escapes."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return EXPANSION.sub(sub, value)


def resolve_env(objs: Objects, namespace: str, pod_name: str, pod_spec: dict, c: dict,
                where: str) -> tuple[dict[str, str], dict[str, str]]:
    """The container's environment as the kubelet builds it: envFrom in order,
    then env in order (later wins), then the Service links under any name not
    already set. A missing ConfigMap, Secret or key that is not optional
    stops the container from being created (CreateContainerConfigError)."""
    env: dict[str, str] = {}
    sources: dict[str, str] = {}
    for ref in c.get("envFrom") or []:
        prefix = ref.get("prefix", "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if key not in ref:
                continue
            name = ref[key]["name"]
            data = objs.data(kind, namespace, name)
            if data is None:
                if ref[key].get("optional"):
                    continue
                raise SmokeFailure(f"{where}: CreateContainerConfigError: {kind.lower()} \"{name}\" not found")
            for k, v in data.items():
                env[prefix + k] = v
                sources[prefix + k] = f"{kind} {name}"
    for e in c.get("env") or []:
        name = e["name"]
        if "value" in e:
            env[name] = expand(str(e["value"]), env)
            sources[name] = "value"
            continue
        src = e.get("valueFrom") or {}
        if "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            fields = {"metadata.name": pod_name, "metadata.namespace": namespace,
                      "spec.serviceAccountName": pod_spec.get("serviceAccountName", "default"),
                      "spec.nodeName": "deploy-smoke", "status.podIP": "10.0.2.100", "status.hostIP": "10.0.2.2"}
            if path not in fields:
                raise Unsupported(f"{where}: env {name}: fieldRef {path}")
            env[name] = fields[path]
            sources[name] = f"fieldRef {path}"
            continue
        for kind, key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
            if key not in src:
                continue
            ref = src[key]
            data = objs.data(kind, namespace, ref["name"])
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    break
                missing = f"{kind.lower()} \"{ref['name']}\" not found" if data is None else \
                    f"couldn't find key {ref['key']} in {kind} {namespace}/{ref['name']}"
                raise SmokeFailure(f"{where}: CreateContainerConfigError: {missing}")
            env[name] = data[ref["key"]]
            sources[name] = f"{kind} {ref['name']}"
            break
        else:
            if "fieldRef" not in src:
                raise Unsupported(f"{where}: env {name}: {sorted(src)}")
    if pod_spec.get("enableServiceLinks", True):
        links = service_links(objs, namespace)
    else:
        links = {k: v for k, v in service_links(objs, namespace).items() if k.startswith("KUBERNETES_")}
    for k, v in links.items():
        if k not in env:
            env[k] = v
            sources[k] = "Service link"
    return env, sources


def resolve_port(port, ports: dict[int, str | None], where: str) -> int:
    if isinstance(port, int):
        return port
    if str(port).isdigit():
        return int(port)
    for number, name in ports.items():
        if name == port:
            return number
    raise SmokeFailure(f"{where}: the kubelet cannot resolve the named port {port!r} "
                       f"(the container's ports: {sorted(n for n in ports.values() if n)})")


def probe(kind: str, spec: dict | None, ports: dict[int, str | None], where: str) -> Probe | None:
    if spec is None:
        return None
    check_known(f"{where} {kind}Probe", spec, PROBE_KNOWN)
    values = {k: spec.get(k, d) for k, d in PROBE_DEFAULTS.items()}
    if "httpGet" in spec:
        h = spec["httpGet"]
        if h.get("host"):
            raise Unsupported(f"{where} {kind}Probe: httpGet.host")
        path, port = h.get("path", "/"), resolve_port(h["port"], ports, f"{where} {kind}Probe")
        scheme = h.get("scheme", "HTTP")
        headers = {x["name"]: x["value"] for x in h.get("httpHeaders") or []}
    elif "tcpSocket" in spec:
        path, port, scheme, headers = None, resolve_port(spec["tcpSocket"]["port"], ports, where), "TCP", {}
    else:
        raise Unsupported(f"{where} {kind}Probe: only httpGet and tcpSocket are reproduced")
    return Probe(kind, path, port, scheme, headers, float(values["periodSeconds"]), float(values["timeoutSeconds"]),
                 int(values["failureThreshold"]), int(values["successThreshold"]),
                 float(values["initialDelaySeconds"]))


def pre_stop(c: dict, ports: dict[int, str | None], where: str) -> PreStop | None:
    lifecycle = c.get("lifecycle") or {}
    check_known(f"{where} lifecycle", lifecycle, {"preStop"})
    hook = lifecycle.get("preStop")
    if hook is None:
        return None
    if "sleep" in hook:
        return PreStop(sleep=float(hook["sleep"]["seconds"]))
    if "exec" in hook:
        return PreStop(exec_command=list(hook["exec"]["command"]))
    if "httpGet" in hook:
        return PreStop(http_path=hook["httpGet"].get("path", "/"),
                       http_port=resolve_port(hook["httpGet"]["port"], ports, where))
    raise Unsupported(f"{where} preStop: {sorted(hook)}")


def pod_name_for(owner_kind: str, name: str) -> str:
    """A name like the controllers give: <deployment>-<template hash>-<5>, <job>-<5>."""
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    suffix = "".join(secrets.choice(alphabet) for _ in range(5))
    if owner_kind == "Deployment":
        return f"{name}-{''.join(secrets.choice(alphabet) for _ in range(10))}-{suffix}"
    return f"{name}-{suffix}"


def containers(objs: Objects) -> list[Container]:
    """Every container of every Deployment and Job in the render (for
    Deployments, of one pod; the smoke runs one replica of each)."""
    out = []
    for obj in objs.all:
        if obj.get("kind") not in ("Deployment", "Job"):
            continue
        namespace = obj["metadata"].get("namespace", "default")
        template = obj["spec"]["template"]
        spec = template["spec"]
        owner = f"{obj['kind']}/{obj['metadata']['name']}"
        check_known(owner, spec, POD_KNOWN)
        if spec.get("automountServiceAccountToken", True):
            raise Unsupported(f"{owner}: a service account token would be mounted (automountServiceAccountToken)")
        pod_security = spec.get("securityContext") or {}
        check_known(f"{owner} securityContext", pod_security, SECURITY_KNOWN)
        if pod_security.get("fsGroup") is not None:
            raise Unsupported(f"{owner}: securityContext.fsGroup (volume ownership)")
        volumes = {}
        for v in spec.get("volumes") or []:
            kinds = set(v) - {"name"}
            if kinds != {"emptyDir"}:
                raise Unsupported(f"{owner}: volume {v['name']} of type {sorted(kinds)} (only emptyDir is reproduced)")
            volumes[v["name"]] = v
        pod_name = pod_name_for(obj["kind"], obj["metadata"]["name"])
        for c in spec["containers"]:
            where = f"{owner} container {c['name']}"
            check_known(where, c, CONTAINER_KNOWN)
            sc = c.get("securityContext") or {}
            check_known(f"{where} securityContext", sc, SECURITY_KNOWN)
            merged = {**pod_security, **sc}
            ports = {int(p["containerPort"]): p.get("name") for p in c.get("ports") or []}
            for p in c.get("ports") or []:
                if p.get("hostPort"):
                    raise Unsupported(f"{where}: hostPort")
            caps = merged.get("capabilities") or {}
            resources = c.get("resources") or {}
            limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
            tmpfs = []
            for m in c.get("volumeMounts") or []:
                if m["name"] not in volumes:
                    raise SmokeFailure(f"{where}: volumeMount {m['name']} names no volume of the pod")
                tmpfs.append(m["mountPath"])
            env, sources = resolve_env(objs, namespace, pod_name, spec, c, where)
            command = [expand(x, env) for x in c["command"]] if "command" in c else None
            args = [expand(x, env) for x in c["args"]] if "args" in c else None
            seccomp = (merged.get("seccompProfile") or {}).get("type", "RuntimeDefault")
            if seccomp not in ("RuntimeDefault", "Unconfined"):
                raise Unsupported(f"{where}: seccompProfile {seccomp}")
            if merged.get("privileged"):
                raise Unsupported(f"{where}: privileged")
            out.append(Container(
                owner=owner, pod_name=pod_name, name=c["name"], image=c["image"], command=command, args=args,
                env=env, env_sources=sources, ports=ports,
                run_as_user=merged.get("runAsUser"), run_as_group=merged.get("runAsGroup"),
                run_as_non_root=bool(merged.get("runAsNonRoot")),
                supplemental_groups=list(pod_security.get("supplementalGroups") or []),
                read_only_root=bool(merged.get("readOnlyRootFilesystem")),
                allow_privilege_escalation=merged.get("allowPrivilegeEscalation", True) is not False,
                cap_drop=list(caps.get("drop") or []), cap_add=list(caps.get("add") or []),
                seccomp=seccomp,
                memory_limit=int(quantity(limits["memory"])) if "memory" in limits else None,
                cpu_limit=quantity(limits["cpu"]) if "cpu" in limits else None,
                # The kubelet's cgroup v1 mapping of a CPU request.
                cpu_shares=max(2, int(quantity(requests["cpu"]) * 1024)) if "cpu" in requests else None,
                tmpfs=tmpfs, working_dir=c.get("workingDir"),
                liveness=probe("liveness", c.get("livenessProbe"), ports, where),
                readiness=probe("readiness", c.get("readinessProbe"), ports, where),
                grace_seconds=int(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)),
                pre_stop=pre_stop(c, ports, where),
                restart_policy=spec.get("restartPolicy", "Always"),
                active_deadline=obj["spec"].get("activeDeadlineSeconds") if obj["kind"] == "Job" else None,
            ))
    return out


def find(all_containers: list[Container], owner: str) -> Container:
    for c in all_containers:
        if c.owner == owner:
            return c
    raise SmokeFailure(f"the render has no {owner}")


__all__ = ["Container", "Probe", "PreStop", "Unsupported", "containers", "find", "ident"]
