"""The rendered objects, and what stands in here for the cluster around them.

The overlay is rendered by `kubectl kustomize` (the kustomize that `kubectl
apply -k` runs). Three things a cluster would provide are replaced, each
printed, none of them a pod setting:

- the Secrets, which no kustomization lists: the overlay's example
  (secrets.example.yaml) with every REPLACE_ME filled with this run's
  password, as its comments ask an operator to;
- Service addresses in those values: cluster DNS would take `postgres:5432`
  to the Service `postgres`; here the smoke's own Postgres stands in for it,
  at the address a container reaches the host's loopback by (slirp4netns);
- URLs under `.invalid` (RFC 2606: reserved, never resolve), which the
  overlay uses for the downstream APIs it does not know: the simulated
  downstream (crates/simulator) stands in for them.
"""

from __future__ import annotations

import base64
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import yaml


class SmokeFailure(Exception):
    """The smoke failed: the message says what a cluster would have shown."""


def ident(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{meta.get('name')}"


class Objects:
    def __init__(self, docs: list[dict]) -> None:
        self.all = docs

    def of_kind(self, kind: str) -> list[dict]:
        return [o for o in self.all if o.get("kind") == kind]

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        for o in self.of_kind(kind):
            meta = o["metadata"]
            if meta.get("name") == name and meta.get("namespace", namespace) == namespace:
                return o
        return None

    def data(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's or Secret's keys and values (Secret `data` decoded,
        `stringData` over it, as the API server stores them)."""
        obj = self.get(kind, namespace, name)
        if obj is None:
            return None
        out = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()} if kind == "Secret" \
            else {k: str(v) for k, v in (obj.get("data") or {}).items()}
        if kind == "Secret":
            out.update({k: str(v) for k, v in (obj.get("stringData") or {}).items()})
        return out

    def namespace(self) -> str:
        names = {o["metadata"].get("namespace") for o in self.all if o.get("kind") in ("Deployment", "Job")}
        if len(names) != 1 or None in names:
            raise SmokeFailure(f"the workloads are not in one namespace: {sorted(map(str, names))}")
        return names.pop()


def render(kubectl: str, overlay: Path) -> list[dict]:
    done = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SmokeFailure(f"kubectl kustomize {overlay}: {done.stderr.strip()}")
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


PLACEHOLDER = "REPLACE_ME"
URL = re.compile(r"\b([a-z][a-z0-9+.-]*)://([^/?#\s\"']+)")


def add_example_secrets(objs: Objects, path: Path, namespace: str, password: str) -> list[str]:
    """The example Secrets, placeholders filled, created in the namespace."""
    notes = []
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc or doc.get("kind") != "Secret":
            continue
        doc.setdefault("metadata", {})["namespace"] = namespace
        filled = []
        for section in ("stringData", "data"):
            for k, v in (doc.get(section) or {}).items():
                text = base64.b64decode(v).decode() if section == "data" else str(v)
                if PLACEHOLDER in text:
                    filled.append(k)
                    text = text.replace(PLACEHOLDER, password)
                doc[section][k] = base64.b64encode(text.encode()).decode() if section == "data" else text
        objs.all.append(doc)
        notes.append(f"Secret {doc['metadata']['name']} from {path.name}"
                     + (f" ({', '.join(filled)}: {PLACEHOLDER} filled with this run's password)" if filled else ""))
    return notes


def service_hosts(objs: Objects, namespace: str) -> dict[str, str]:
    """Every DNS name of every Service of the namespace -> the Service."""
    out = {}
    for svc in objs.of_kind("Service"):
        name = svc["metadata"]["name"]
        if svc["metadata"].get("namespace", namespace) != namespace:
            continue
        for host in (name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"):
            out[host] = name
    return out


def rewrite_addresses(objs: Objects, namespace: str, services: dict[str, tuple[str, int]],
                      invalid: tuple[str, str, int]) -> list[str]:
    """In every Secret and ConfigMap value: a URL to a Service that has a
    stand-in goes to the stand-in (host and port; the Service's port must be
    the one the URL names); a URL to a host under .invalid goes to `invalid`
    (scheme, host, port). Returns what was changed (names, never values)."""
    hosts = service_hosts(objs, namespace)
    notes = []

    def rewrite(m: re.Match, changed: list[str]) -> str:
        scheme, netloc = m.group(1), m.group(2)
        parts = urlsplit(f"{scheme}://{netloc}")
        host = (parts.hostname or "").lower()
        userinfo = netloc.rsplit("@", 1)[0] + "@" if "@" in netloc else ""
        if host in hosts and hosts[host] in services:
            svc = objs.get("Service", namespace, hosts[host])
            ports = [p["port"] for p in svc["spec"].get("ports") or []]
            if parts.port is not None and parts.port not in ports:
                raise SmokeFailure(f"a URL names {host}:{parts.port}, but the Service {hosts[host]} serves {ports}")
            to_host, to_port = services[hosts[host]]
            changed.append(f"{host}:{parts.port or ports[0]} -> {to_host}:{to_port} (Service {hosts[host]})")
            return f"{scheme}://{userinfo}{to_host}:{to_port}"
        if host.endswith(".invalid"):
            to_scheme, to_host, to_port = invalid
            changed.append(f"{scheme}://{host} -> {to_scheme}://{to_host}:{to_port}")
            return f"{to_scheme}://{userinfo}{to_host}:{to_port}"
        return m.group(0)

    for obj in objs.all:
        if obj.get("kind") not in ("Secret", "ConfigMap") or obj["metadata"].get("namespace", namespace) != namespace:
            continue
        for section in ("data", "stringData"):
            values = obj.get(section) or {}
            for k, v in list(values.items()):
                encoded = obj["kind"] == "Secret" and section == "data"
                text = base64.b64decode(v).decode() if encoded else str(v)
                changed: list[str] = []
                text = URL.sub(lambda m, changed=changed: rewrite(m, changed), text)
                if changed:
                    values[k] = base64.b64encode(text.encode()).decode() if encoded else text
                    notes.append(f"{obj['kind']} {obj['metadata']['name']} {k}: {'; '.join(sorted(set(changed)))}")
    return notes
