"""The smoke's own test: renders broken on purpose, each of which the smoke
must refuse, and for the right reason (what a cluster would show)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .manifests import Render


def ingest(r: Render) -> dict:
    return r.get("Deployment", "webhook-ingest")["spec"]["template"]["spec"]["containers"][0]


def readiness_port(r: Render) -> str:
    c = ingest(r)
    probe = c["readinessProbe"]["httpGet"]
    port = next(p["containerPort"] for p in c["ports"] if probe["port"] in (p.get("name"), p["containerPort"]))
    probe["port"] = port + 1
    return f"webhook-ingest's readinessProbe.httpGet.port: {port + 1} (nothing listens there)"


def root_user(r: Render) -> str:
    ingest(r).setdefault("securityContext", {})["runAsUser"] = 0
    return "webhook-ingest's securityContext.runAsUser: 0"


def missing_variable(r: Render) -> str:
    c = ingest(r)
    c["env"] = [e for e in c["env"] if e["name"] != "WEBHOOK_SECRETS"]
    return "webhook-ingest's env without WEBHOOK_SECRETS"


@dataclass
class Break:
    name: str
    mutate: Callable[[Render], str]
    expect: str  # in the smoke's failure


BREAKS = [
    Break("readiness-port", readiness_port, "not Ready"),
    Break("root-user", root_user, "runAsUser=0"),
    Break("missing-variable", missing_variable, "exited with 2"),
]
