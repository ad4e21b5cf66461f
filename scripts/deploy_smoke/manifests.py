"""The rendered overlay, with what a cluster would put around it replaced by
this machine's stand-ins (shims 1 and 2 of the package docstring)."""

from __future__ import annotations

import base64
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import yaml

ROOT = Path(__file__).resolve().parents[2]
# The host's loopback as a pod on slirp4netns (allow_host_loopback) reaches it.
HOST_FROM_POD = "10.0.2.2"
PLACEHOLDER = "REPLACE_ME"
URL = re.compile(r"\b([a-z][a-z0-9+.-]*)://([^/?#\s\"']+)")


class SmokeFailure(Exception):
    """The smoke failed: the message says what a cluster would have shown."""


class Render:
    """`kubectl kustomize` of the overlay, plus the overlay's example Secrets."""

    def __init__(self, kubectl: str, overlay: Path, secrets: Path, password: str) -> None:
        done = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise SmokeFailure(f"kubectl kustomize {overlay}: {done.stderr.strip()}")
        self.docs = [d for d in yaml.safe_load_all(done.stdout) if d]
        # Shim 1: no kustomization lists the Secrets; the example's, each
        # REPLACE_ME filled with this run's password, as its comments ask.
        self.secrets: dict[str, dict[str, str]] = {}
        for doc in yaml.safe_load_all(secrets.read_text()):
            if doc and doc.get("kind") == "Secret":
                values = {k: base64.b64decode(v).decode() for k, v in (doc.get("data") or {}).items()}
                values.update({k: str(v) for k, v in (doc.get("stringData") or {}).items()})
                self.secrets[doc["metadata"]["name"]] = {k: v.replace(PLACEHOLDER, password) for k, v in values.items()}

    def of_kind(self, kind: str) -> list[dict]:
        return [d for d in self.docs if d.get("kind") == kind]

    def get(self, kind: str, name: str) -> dict:
        for d in self.of_kind(kind):
            if d["metadata"]["name"] == name:
                return d
        raise SmokeFailure(f"the render has no {kind}/{name}")

    def configmap(self, name: str) -> dict[str, str]:
        return {k: str(v) for k, v in (self.get("ConfigMap", name).get("data") or {}).items()}

    def stand_ins(self, services: dict[str, int], downstream: int) -> list[str]:
        """Shim 2, in every ConfigMap and Secret value: a URL to a Service
        that has a stand-in on the host (cluster DNS would find the Service;
        the dev overlay's Postgres StatefulSet is not played) goes to the
        host's port; a URL under `.invalid` (RFC 2606: the overlay's
        placeholder APIs) goes to the simulated downstream. Returns what was
        changed, names only: some values are secret."""
        namespace = self.of_kind("Deployment")[0]["metadata"]["namespace"]
        hosts = {f"{n}{suffix}": n for n in services
                 for suffix in ("", f".{namespace}", f".{namespace}.svc", f".{namespace}.svc.cluster.local")}
        notes: list[str] = []

        def rewrite(m: re.Match) -> str:
            scheme, netloc = m.group(1), m.group(2)
            parts = urlsplit(f"{scheme}://{netloc}")
            user = netloc.rsplit("@", 1)[0] + "@" if "@" in netloc else ""
            host = (parts.hostname or "").lower()
            if host in hosts:
                svc = hosts[host]
                ports = [p["port"] for p in self.get("Service", svc)["spec"]["ports"]]
                if (parts.port or ports[0]) not in ports:
                    raise SmokeFailure(f"a URL names {host}:{parts.port}, but the Service {svc} serves {ports}")
                notes.append(f"{host}:{parts.port or ports[0]} -> {HOST_FROM_POD}:{services[svc]} (Service {svc})")
                return f"{scheme}://{user}{HOST_FROM_POD}:{services[svc]}"
            if host.endswith(".invalid"):
                notes.append(f"{scheme}://{host} -> http://{HOST_FROM_POD}:{downstream} (the simulated downstream)")
                return f"http://{user}{HOST_FROM_POD}:{downstream}"
            return m.group(0)

        for cm in self.of_kind("ConfigMap"):
            cm["data"] = {k: URL.sub(rewrite, str(v)) for k, v in (cm.get("data") or {}).items()}
        for values in self.secrets.values():
            values.update({k: URL.sub(rewrite, v) for k, v in values.items()})
        return sorted(set(notes))

    def env(self, container: dict, pod_name: str) -> dict[str, str]:
        """The environment a kubelet gives the container (envFrom, then env;
        the fieldRef the manifests use): what the process must see."""
        out: dict[str, str] = {}
        for ref in container.get("envFrom") or []:
            if "configMapRef" in ref:
                out.update(self.configmap(ref["configMapRef"]["name"]))
            if "secretRef" in ref:
                out.update(self.secrets.get(ref["secretRef"]["name"], {}))
        for e in container.get("env") or []:
            src = e.get("valueFrom") or {}
            if "value" in e:
                out[e["name"]] = str(e["value"])
            elif "fieldRef" in src and src["fieldRef"]["fieldPath"] == "metadata.name":
                out[e["name"]] = pod_name
            elif "configMapKeyRef" in src:
                out[e["name"]] = self.configmap(src["configMapKeyRef"]["name"])[src["configMapKeyRef"]["key"]]
            elif "secretKeyRef" in src:
                ref = src["secretKeyRef"]
                value = self.secrets.get(ref["name"], {}).get(ref["key"])
                if value is not None:
                    out[e["name"]] = value
                elif not ref.get("optional"):
                    raise SmokeFailure(f"env {e['name']}: CreateContainerConfigError: "
                                       f"couldn't find key {ref['key']} in Secret {ref['name']}")
            else:
                raise SmokeFailure(f"env {e['name']}: {sorted(src)} is not reproduced here: teach manifests.py")
        return out
