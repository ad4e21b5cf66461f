"""The smoke's own test: renders broken on purpose, each of which the smoke
must refuse, and for the right reason (what a cluster would show)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .objects import Objects, SmokeFailure

INGEST = ("Deployment", "webhook-ingest")


def container(objs: Objects, kind: str, name: str) -> dict:
    for o in objs.of_kind(kind):
        if o["metadata"]["name"] == name:
            return o["spec"]["template"]["spec"]["containers"][0]
    raise SmokeFailure(f"the render has no {kind}/{name} to break")


def readiness_port(objs: Objects) -> str:
    c = container(objs, *INGEST)
    probe = c["readinessProbe"]["httpGet"]
    port = next(p["containerPort"] for p in c["ports"] if p.get("name") == probe["port"] or p["containerPort"] == probe["port"])
    probe["port"] = port + 1
    return f"webhook-ingest's readinessProbe.httpGet.port: {port + 1} (nothing listens there)"


def root_user(objs: Objects) -> str:
    c = container(objs, *INGEST)
    c.setdefault("securityContext", {})["runAsUser"] = 0
    return "webhook-ingest's securityContext.runAsUser: 0"


def missing_variable(objs: Objects) -> str:
    c = container(objs, *INGEST)
    c["env"] = [e for e in c["env"] if e["name"] != "WEBHOOK_SECRETS"]
    return "webhook-ingest's env without WEBHOOK_SECRETS"


@dataclass
class Break:
    name: str
    mutate: Callable[[Objects], str]
    expect: str  # in the smoke's failure


BREAKS = [
    Break("readiness-port", readiness_port, "not Ready"),
    Break("root-user", root_user, "runAsUser=0"),
    Break("missing-variable", missing_variable, "exited with 2"),
]
