"""The PostgreSQL a render runs on CloudNativePG (deploy/components/cnpg),
against the product and the operator's rules. `breakages` makes broken
copies of a render that each check must refuse."""

from __future__ import annotations

import base64
import json
import re
from urllib.parse import parse_qs, unquote, urlsplit

from .egress import opens, peer_admits, policies_selecting
from .render import ROOT, dig, ident

# CloudNativePG fixes `port` (pkg/postgres/configuration.go,
# FixedConfigurationParameters): every instance listens on 5432, and its
# Services forward there. 8000: the instance manager's status, which the
# operator calls.
PORT, STATUS_PORT = 5432, 8000
ROLES_SQL = ROOT / "deploy/sql/roles.sql"
HOSTNAME = "kubernetes.io/hostname"
# What each of our containers logs in as: a member of this group
# (deploy/sql/roles.sql); the migration as the database's owner.
SERVICE_GROUP = {"ingest": "webhook_ingest", "relay": "outbox_relay", "keda": "outbox_monitor",
                 "console": "ops_console"}
ALTER_ROLE = r"ALTER ROLE (\w+) SET (\w+)\s*(?:=|TO)\s*'?(.+?)'?\s*;?\s*"


def clusters(objs: list[dict]) -> list[dict]:
    return [o for o in objs if (o.get("apiVersion"), o.get("kind")) == ("postgresql.cnpg.io/v1", "Cluster")]


def initdb(cl: dict) -> dict:
    return dig(cl, "spec", "bootstrap", "initdb") or {}


def roles(cl: dict) -> dict[str, dict]:
    return {r.get("name"): r for r in dig(cl, "spec", "managed", "roles") or []}


def check_cluster(objs: list[dict], *_) -> list[str]:
    """CloudNativePG Cluster: synchronous replication every commit waits for (dataDurability: required), a standby to
    spare, instances on separate nodes

    What makes a 200 survive the loss of the primary's node. (The CRD's
    schema refuses a `method` other than any or first.)"""
    problems = []
    for cl in clusters(objs):
        spec, name = cl["spec"], ident(cl)
        sync, instances = dig(spec, "postgresql", "synchronous"), spec.get("instances", 1)
        if not sync:
            problems.append(f"{name}: no spec.postgresql.synchronous: replication is asynchronous, and a failover "
                            "loses the commits the old primary had not yet sent (acknowledged payments included)")
        elif not 1 <= sync.get("number", 0) <= instances - 2:  # else one standby down (a drain) and writes wait
            problems.append(f"{name}: {instances} instances for synchronous.number {sync.get('number')}: need 1 or "
                            "more standbys confirming each commit, and one more to spare")
        if sync and sync.get("dataDurability") != "required":
            problems.append(f"{name}: synchronous.dataDurability is {sync.get('dataDurability')!r}, not `required`: "
                            "with no standby to confirm, commits would be acknowledged on the primary alone")
        commit = str(dig(spec, "postgresql", "parameters", "synchronous_commit") or "on").lower()
        if commit not in ("on", "remote_apply"):
            problems.append(f"{name}: synchronous_commit = {commit}: commits would not wait for the standby's flush")
        affinity = spec.get("affinity") or {}
        if affinity.get("enablePodAntiAffinity") is False or affinity.get("topologyKey", HOSTNAME) not in (
                HOSTNAME, "topology.kubernetes.io/zone") or affinity.get("podAntiAffinityType") != "required":
            problems.append(f"{name}: affinity {affinity}: the primary and its synchronous standby may share a node, "
                            f"whose loss takes both (podAntiAffinityType: required, by {HOSTNAME})")
        if spec.get("enablePDB") is False:
            problems.append(f"{name}: enablePDB is false: a drain may evict instances the synchronous standby needs")
    return problems


def check_roles(objs: list[dict], *_) -> list[str]:
    """CloudNativePG Cluster: the database, owner, groups, logins and role settings of deploy/sql/roles.sql

    What deploy/sql/roles.sql makes on any other PostgreSQL."""
    text = ROLES_SQL.read_text()
    groups = re.search(r"unnest\(ARRAY\[([^\]]*)\]\)", text)
    owner = re.search(r"CREATE ROLE (\w+) LOGIN PASSWORD", text)
    dbname = re.search(r"^\\set dbname (\w+)", text, re.M)
    logins = dict(re.findall(r"\('(\w+)',\s*:'\w+',\s*'(\w+)'\)", text))
    settings = {(r, s): v.lower() for r, s, v in re.findall(rf"^{ALTER_ROLE}$", text, re.M | re.I)}
    if not (groups and owner and dbname and logins and settings):
        return [f"{ROLES_SQL.relative_to(ROOT)}: cannot read its database, owner, groups, logins or ALTER ROLE ... "
                "SET lines: update deploy-check"]
    problems = []
    for cl in clusters(objs):
        name, boot, managed = ident(cl), initdb(cl), roles(cl)
        secret = dig(boot, "secret", "name")
        problems += [f"{name}: bootstrap.initdb.{key} {boot.get(key)!r}, roles.sql makes {want!r}" for key, want
                     in (("database", dbname.group(1)), ("owner", owner.group(1))) if boot.get(key) != want]
        problems += [f"{name}: managed.roles has no group (no login) {group}: the migrations grant to it"
                     for group in re.findall(r"'(\w+)'", groups.group(1))
                     if managed.get(group, {"login": True}).get("login")]
        for login, group in logins.items():
            role = managed.get(login) or {}
            if role.get("login") is not True or group not in (role.get("inRoles") or []) or not dig(
                    role, "passwordSecret", "name"):
                problems.append(f"{name}: managed.roles has no {login} with login, inRoles [{group}], a passwordSecret")
        owner_secret = dig(managed.get(owner.group(1)), "passwordSecret", "name") or secret
        if not secret or owner_secret != secret:
            problems.append(f"{name}: the owner {owner.group(1)}'s password from {owner_secret!r} (managed.roles) and "
                            f"{secret!r} (bootstrap.initdb.secret): one Secret, or the operator invents one")
        got = {(r, s): v.lower() for statement in boot.get("postInitSQL") or []
               for r, s, v in re.findall(rf"^\s*{ALTER_ROLE}$", str(statement), re.I | re.S)}
        problems += [f"{name}: postInitSQL sets {setting} on {role} to {got.get((role, setting))}, roles.sql to "
                     f"{settings.get((role, setting))}" for role, setting in sorted(set(got) | set(settings))
                     if got.get((role, setting)) != settings.get((role, setting))]
    return problems


def check_network(objs: list[dict], containers, _=None) -> list[str]:
    """NetworkPolicies: our pods reach the Cluster's pods on its port (5432); its pods admit ours, each other and the
    operator

    Each other: replication on 5432, the instance manager's status on 8000."""
    problems = []
    for cl in clusters(objs):
        ns, cname = cl["metadata"].get("namespace"), cl["metadata"]["name"]
        target = {"cnpg.io/cluster": cname, "cnpg.io/podRole": "instance"}  # what every instance pod carries
        owners = list({id(oc.owner): oc for oc in containers if oc.ns == ns}.values())
        for oc in owners:
            policies = policies_selecting(objs, ns, oc.labels, "Egress")
            if policies and not any(opens(rule, PORT, "postgresql") and (
                    not rule.get("to") or any(peer_admits(peer, target, ns) for peer in rule["to"]))
                    for p in policies for rule in p["spec"].get("egress") or []):
                problems.append(f"{ident(oc.owner)}: no NetworkPolicy egress lets it reach {cname}'s pods on {PORT}")
        policies = policies_selecting(objs, ns, target, "Ingress")
        operator = {"app.kubernetes.io/name": "cloudnative-pg"}
        wanted = [(ident(oc.owner), oc.labels, ns, PORT) for oc in owners] + [
            (who, labels, from_ns, port) for port in (PORT, STATUS_PORT) for who, labels, from_ns in (
                (f"its own instances ({port})", target, ns), (f"the operator ({port})", operator, None))]
        if not policies:
            problems.append(f"{ident(cl)}: no NetworkPolicy selects its pods: any pod may connect to the database")
        problems += [f"the Cluster {cname}'s pods do not admit {who} on {port} ({', '.join(map(ident, policies))})"
                     for who, labels, from_ns, port in wanted if policies
                     if not any(opens(rule, port) and (not rule.get("from") or any(
                         peer_admits(peer, labels, from_ns) for peer in rule["from"]))
                                for p in policies for rule in p["spec"].get("ingress") or [])]
    return problems


def check_urls(objs: list[dict], containers, examples: list[tuple]) -> list[str]:
    """every DATABASE_URL at the Cluster's -rw Service (never -ro, -r), its port and database, verify-full against
    the operator's CA as mounted, each service's own role and password Secret

    As the overlay's example Secrets show them: never -ro (standbys only, which
    refuse writes) nor -r (a standby as often as the primary)."""
    where = ", ".join(sorted({str(p.relative_to(ROOT)) for p, _ in examples}))
    # Each Cluster's read-write Service, as a URL may name it (<cluster>-rw[.<ns>[.svc[.cluster.local]]]).
    rw = {".".join([f"{c['metadata']['name']}-rw", c["metadata"].get("namespace"), "svc", "cluster.local"][:i]): c
          for c in clusters(objs) for i in range(1, 5)}
    problems = []

    def secret_value(name: str, key: str) -> str | None:
        doc = next((d for _, d in examples if d.get("kind") == "Secret" and d["metadata"].get("name") == name), {})
        data = {k: base64.b64decode(v).decode() for k, v in (doc.get("data") or {}).items()}
        return {**(doc.get("stringData") or {}), **data}.get(key)

    def check_url(who: str, role: str, ref: dict, ca: set[str] | None) -> None:
        """ca None: a client without the CA mount (KEDA)."""
        what = f"{where}: Secret {ref.get('name')} {ref.get('key')} ({who})"
        url = secret_value(ref.get("name"), ref.get("key"))
        if url is None:
            problems.extend([] if ref.get("optional") else [f"{what}: no such Secret and key"])
            return
        u = urlsplit(url)
        host, _, port = u.netloc.rpartition("@")[2].partition(":")
        cl = rw.get(host) if port in ("", str(PORT)) else None
        if cl is None:
            problems.append(f"{what} names {host}:{port}, no Cluster's read-write Service on {PORT}: {sorted(rw)}")
            return
        boot, params, user = initdb(cl), {k: v[-1] for k, v in parse_qs(u.query).items()}, unquote(u.username or "")
        if unquote(u.path.lstrip("/")) != boot.get("database"):
            problems.append(f"{what}: database {u.path.lstrip('/')!r}, the Cluster's is {boot.get('database')!r}")
        mode = params.get("sslmode")
        if ca is not None and (mode != "verify-full" or params.get("sslrootcert") not in ca):
            problems.append(f"{what}: sslmode={mode}, sslrootcert={params.get('sslrootcert')}: verify-full against "
                            f"the operator's CA (Secret {cl['metadata']['name']}-ca) as mounted ({sorted(ca)})")
        elif ca is None and mode in (None, "disable", "allow", "prefer"):
            problems.append(f"{what}: sslmode={mode}: at least require (encrypted)")
        if role == "migrate":
            secret = dig(boot, "secret", "name")
            if user != boot.get("owner"):
                problems.append(f"{what}: logs in as {user!r}; the migration runs as the owner {boot.get('owner')!r}")
        else:
            r = roles(cl).get(user) or {}
            secret = dig(r, "passwordSecret", "name")
            if not r.get("login") or SERVICE_GROUP[role] not in (r.get("inRoles") or []):
                problems.append(f"{what}: logs in as {user!r}, no login role of the Cluster in {SERVICE_GROUP[role]}")
        if secret and secret_value(secret, "password") not in (None, unquote(u.password or "")):
            problems.append(f"{what}: not the password of {user}'s Secret {secret}, which the operator sets")

    names = [c["metadata"]["name"] for c in clusters(objs)]
    for oc in [oc for oc in containers if oc.role in ("ingest", "relay", "console", "migrate")]:
        volumes = {v.get("name"): v.get("secret") or {} for v in oc.pod.get("volumes") or []}
        ca = set()  # where the container sees the operator's CA (Secret <cluster>-ca, key ca.crt)
        for m in [m for m in oc.container.get("volumeMounts") or [] if not m.get("subPath")]:
            secret = volumes.get(m.get("name")) or {}
            items = {i.get("key"): i.get("path") for i in secret.get("items") or [{"key": "ca.crt", "path": "ca.crt"}]}
            if "ca.crt" in items and secret.get("secretName") in {f"{name}-ca" for name in names}:
                ca.add(f"{m['mountPath'].rstrip('/')}/{items['ca.crt']}")
        for e in oc.container.get("env") or []:
            if e.get("name") in ("DATABASE_URL", "RELAY_LISTEN_DATABASE_URL") and dig(e, "valueFrom", "secretKeyRef"):
                check_url(f"{e['name']} of {oc.where}", oc.role, e["valueFrom"]["secretKeyRef"], ca)
    for ta in [o for o in objs if o.get("kind") == "TriggerAuthentication"]:
        for t in [t for t in ta["spec"].get("secretTargetRef") or [] if t.get("parameter") == "connection"]:
            check_url(f"KEDA, {ident(ta)}", "keda", t, None)
    return problems


def breakages(objs: list[dict], examples: list[tuple]) -> list[tuple[str, str, list[dict], list[tuple]]]:
    """(what, the check that must refuse it, the broken objects and examples):
    a text edited in the first object (kind/name; None: an example) with it."""
    cname = clusters(objs)[0]["metadata"]["name"]
    edits = [
        ("egress to the Cluster on 5433", "network", "NetworkPolicy/outbox-relay", f'"port": {PORT},', '"port": 5433,'),
        ("the Cluster's pods not admitting the relay", "network", f"NetworkPolicy/{cname}",
         '"app.kubernetes.io/name": "outbox-relay"', '"app.kubernetes.io/name": "not-the-relay"'),
        ("no synchronous stanza", "cluster", f"Cluster/{cname}", '"synchronous": {', '"not-synchronous": {'),
        ("dataDurability: preferred", "cluster", f"Cluster/{cname}", '"dataDurability": "required"',
         '"dataDurability": "preferred"'),
        ("podAntiAffinityType: preferred", "cluster", f"Cluster/{cname}", '"podAntiAffinityType": "required"',
         '"podAntiAffinityType": "preferred"'),
        ("relay_app's synchronous_commit = off missing", "roles", f"Cluster/{cname}",
         "ALTER ROLE relay_app SET synchronous_commit = off", "SELECT 1"),
        ("the CA from the Secret postgres-ca", "urls", "Deployment/webhook-ingest", f'"secretName": "{cname}-ca"',
         '"secretName": "postgres-ca"'),
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
