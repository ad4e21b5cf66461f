"""The PostgreSQL a render runs on CloudNativePG (deploy/components/cnpg) against what
the product relies on; `breakages`: broken copies of a render each check must refuse."""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs, urlsplit

from .egress import admits
from .render import ROOT, dig, ident

PORT = 5432  # CloudNativePG fixes it: every instance and its Services
ROLES_SQL = ROOT / "deploy/sql/roles.sql"
HOSTNAME = "kubernetes.io/hostname"
# The group of deploy/sql/roles.sql each client logs in as a member of (the migration: the owner).
SERVICE_GROUP = {"ingest": "webhook_ingest", "relay": "outbox_relay", "console": "ops_console"}
ALTER_ROLE = r"ALTER ROLE (\w+) SET (\w+)\s*(?:=|TO)\s*'?(.+?)'?\s*;?\s*"


def clusters(objs: list[dict]) -> list[dict]:
    return [o for o in objs if o.get("kind") == "Cluster" and o["apiVersion"] == "postgresql.cnpg.io/v1"]


def check_cluster(objs: list[dict], *_) -> list[str]:
    """CloudNativePG Cluster: synchronous replication every commit waits for (dataDurability:
    required), a standby to spare, instances on separate nodes"""
    problems = []
    for cl in clusters(objs):
        spec, name = cl["spec"], ident(cl)
        sync, instances = dig(spec, "postgresql", "synchronous"), spec.get("instances", 1)
        if not sync:
            problems.append(f"{name}: no postgresql.synchronous: a failover loses acknowledged commits")
        elif not 1 <= sync.get("number", 0) <= instances - 2:  # else a drained standby stops writes
            problems.append(f"{name}: {instances} instances for synchronous.number {sync.get('number')}: "
                            "need 1 or more standbys confirming each commit, and one more to spare")
        if sync and sync.get("dataDurability") != "required":
            problems.append(f"{name}: synchronous.dataDurability {sync.get('dataDurability')!r}, not "
                            "`required`: with no standby, commits acknowledged on the primary alone")
        commit = str(dig(spec, "postgresql", "parameters", "synchronous_commit") or "on").lower()
        if commit not in ("on", "remote_apply"):
            problems.append(f"{name}: synchronous_commit = {commit}: commits skip the standby's flush")
        affinity = spec.get("affinity") or {}
        if affinity.get("enablePodAntiAffinity") is False or affinity.get("topologyKey", HOSTNAME) not in (
                HOSTNAME, "topology.kubernetes.io/zone") or affinity.get("podAntiAffinityType") != "required":
            problems.append(f"{name}: affinity {affinity}: the primary and its synchronous standby may "
                            f"share a node (podAntiAffinityType: required, by {HOSTNAME})")
    return problems


def check_roles(objs: list[dict], *_) -> list[str]:
    """CloudNativePG Cluster: the database, owner and role settings of deploy/sql/roles.sql"""
    text = ROLES_SQL.read_text()
    want = {"database": re.search(r"^\\set dbname (\w+)", text, re.M),
            "owner": re.search(r"CREATE ROLE (\w+) LOGIN PASSWORD", text)}
    settings = {(r, s): v.lower() for r, s, v in re.findall(rf"^{ALTER_ROLE}$", text, re.M | re.I)}
    if not (all(want.values()) and settings):
        return [f"{ROLES_SQL.relative_to(ROOT)}: no database, owner or ALTER ROLE: update deploy-check"]
    problems = []
    for cl in clusters(objs):
        boot = dig(cl, "spec", "bootstrap", "initdb") or {}
        problems += [f"{ident(cl)}: bootstrap.initdb.{key} {boot.get(key)!r}, roles.sql makes {m[1]!r}"
                     for key, m in want.items() if boot.get(key) != m[1]]
        got = {(r, s): v.lower() for statement in boot.get("postInitSQL") or []
               for r, s, v in re.findall(rf"^\s*{ALTER_ROLE}$", str(statement), re.I | re.S)}
        problems += [f"{ident(cl)}: postInitSQL sets {setting} on {role} to {got.get((role, setting))}, "
                     f"roles.sql to {settings.get((role, setting))}"
                     for role, setting in sorted(set(got) | set(settings))
                     if got.get((role, setting)) != settings.get((role, setting))]
    return problems


def check_network(objs: list[dict], containers, _=None) -> list[str]:
    """NetworkPolicies: our pods reach the Cluster's pods on 5432, and those admit ours"""
    problems = []
    for cl in clusters(objs):
        ns, target = cl["metadata"].get("namespace"), {"cnpg.io/cluster": cl["metadata"]["name"]}
        for oc in {id(oc.owner): oc for oc in containers if oc.ns == ns}.values():
            if not admits(objs, ns, oc.labels, "Egress", PORT, target):
                problems.append(f"{ident(oc.owner)}: no NetworkPolicy egress to {ident(cl)}'s pods on {PORT}")
            if not admits(objs, ns, target, "Ingress", PORT, oc.labels):
                problems.append(f"{ident(cl)}'s pods: no NetworkPolicy admits {ident(oc.owner)} on {PORT}")
    return problems


def mounted_ca(oc, clusters_ca: set[str]) -> set[str]:
    """Where the container sees the operator's CA (Secret <cluster>-ca, key ca.crt)."""
    volumes = {v.get("name"): v.get("secret") or {} for v in oc.pod.get("volumes") or []}
    out = set()
    for m in [m for m in oc.container.get("volumeMounts") or [] if not m.get("subPath")]:
        secret = volumes.get(m.get("name")) or {}
        items = {i["key"]: i["path"] for i in secret.get("items") or [{"key": "ca.crt", "path": "ca.crt"}]}
        if "ca.crt" in items and secret.get("secretName") in clusters_ca:
            out.add(f"{m['mountPath'].rstrip('/')}/{items['ca.crt']}")
    return out


def check_urls(objs: list[dict], containers, examples: list[tuple]) -> list[str]:
    """the example Secrets put every DATABASE_URL at the Cluster's -rw Service (standbys refuse
    writes), verify-full against the operator's CA as mounted, as a login of the service's group"""
    # Each Cluster's read-write Service, as a URL may name it (<cluster>-rw[.<ns>[.svc[.cluster.local]]]).
    rw = {".".join([f"{c['metadata']['name']}-rw", c["metadata"].get("namespace"), "svc",
                    "cluster.local"][:i]): c for c in clusters(objs) for i in range(1, 5)}
    values = {(d["metadata"]["name"], key): value for _, d in examples if d.get("kind") == "Secret"
              for key, value in (d.get("stringData") or {}).items()}
    problems = []
    for oc in [oc for oc in containers if oc.role in SERVICE_GROUP or oc.role == "migrate"]:
        ca = mounted_ca(oc, {f"{c['metadata']['name']}-ca" for c in clusters(objs)})
        for e in [e for e in oc.container.get("env") or [] if e["name"].endswith("DATABASE_URL")]:
            ref = dig(e, "valueFrom", "secretKeyRef") or {}
            what = f"Secret {ref.get('name')} {ref.get('key')} ({e['name']} of {oc.where})"
            url = values.get((ref.get("name"), ref.get("key")))
            if url is None:
                problems += [] if ref.get("optional") else [f"{what}: not in the example Secrets"]
                continue
            u = urlsplit(url)
            cl = rw.get(u.hostname) if u.port in (None, PORT) else None
            if cl is None:
                problems.append(f"{what}: {u.hostname}:{u.port} is no Cluster's -rw Service on {PORT}")
                continue
            params = {k: v[-1] for k, v in parse_qs(u.query).items()}
            if params.get("sslmode") != "verify-full" or params.get("sslrootcert") not in ca:
                problems.append(f"{what}: sslmode={params.get('sslmode')}, sslrootcert="
                                f"{params.get('sslrootcert')}: not verify-full with the CA at {sorted(ca)}")
            roles = dig(cl, "spec", "managed", "roles") or []
            role = next((r for r in roles if r["name"] == u.username), {})
            if oc.role == "migrate":
                if u.username != dig(cl, "spec", "bootstrap", "initdb", "owner"):
                    problems.append(f"{what}: logs in as {u.username!r}, not the database's owner")
            elif not (role.get("login") and SERVICE_GROUP[oc.role] in (role.get("inRoles") or [])):
                problems.append(f"{what}: logs in as {u.username!r}, no login of {SERVICE_GROUP[oc.role]}")
    return problems


def breakages(objs: list[dict], examples: list[tuple]) -> list[tuple[str, str, list[dict], list[tuple]]]:
    """(what, the check that must refuse it, the broken objects and examples):
    a text edited in the first object (kind/name; None: an example) with it."""
    cname = clusters(objs)[0]["metadata"]["name"]
    edits = [
        ("egress to the Cluster on 5433", "network", "NetworkPolicy/outbox-relay", f'"port": {PORT},',
         '"port": 5433,'),
        ("the Cluster's pods not admitting the relay", "network", f"NetworkPolicy/{cname}",
         '"app.kubernetes.io/name": "outbox-relay"', '"app.kubernetes.io/name": "not-the-relay"'),
        ("no synchronous stanza", "cluster", f"Cluster/{cname}", '"synchronous": {', '"not-synchronous": {'),
        ("dataDurability: preferred", "cluster", f"Cluster/{cname}", '"dataDurability": "required"',
         '"dataDurability": "preferred"'),
        ("podAntiAffinityType: preferred", "cluster", f"Cluster/{cname}", '"podAntiAffinityType": "required"',
         '"podAntiAffinityType": "preferred"'),
        ("relay_app's synchronous_commit = off missing", "roles", f"Cluster/{cname}",
         "ALTER ROLE relay_app SET synchronous_commit = off", "SELECT 1"),
        ("the CA from the Secret postgres-ca", "urls", "Deployment/webhook-ingest",
         f'"secretName": "{cname}-ca"', '"secretName": "postgres-ca"'),
        ("DATABASE_URL at the -ro Service", "urls", None, f"@{cname}-rw.", f"@{cname}-ro."),
        ("DATABASE_URL at the -r Service", "urls", None, f"@{cname}-rw.", f"@{cname}-r."),
        ("sslmode=require", "urls", None, "sslmode=verify-full", "sslmode=require"),
    ]
    out = []
    for what, check, target, old, new in edits:
        docs = [d for _, d in examples] if target is None else objs
        at = next((i for i, d in enumerate(docs) if old in json.dumps(d)
                   and (target is None or f"{d.get('kind')}/{d['metadata'].get('name')}" == target)), None)
        if at is not None:  # else nothing to break: the check fails on the render itself
            edited = docs[:at] + [json.loads(json.dumps(docs[at]).replace(old, new, 1))] + docs[at + 1:]
            out.append((what, check, objs, list(zip([p for p, _ in examples], edited))) if target is None
                       else (what, check, edited, examples))
    return out
