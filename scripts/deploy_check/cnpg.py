"""The PostgreSQL a render runs on CloudNativePG (deploy/components/cnpg),
against the product and the operator's rules. For each render holding a
`postgresql.cnpg.io/v1` Cluster:

- check_cluster: synchronous replication that a commit waits for (the
  `synchronous` stanza, `dataDurability: required`, a standby to spare, no
  `synchronous_commit` that skips the standby) and the instances kept on
  separate nodes;
- check_roles: the database, its owner, the groups, the login roles and the
  settings each carries, the same as deploy/sql/roles.sql;
- check_network: our pods' egress reaches the Cluster's pods on the port the
  operator fixes (5432), and the Cluster's pods admit ours, each other and
  the operator;
- check_urls: the overlay's *.example.yaml Secrets, which say what the
  operator puts in each DATABASE_URL (a Secret the base only references):
  the Cluster's read-write Service (never -ro, -r), its port and database,
  verify-full against the operator's CA as the container mounts it, and
  each service's own role, whose password Secret the Cluster names.

`breakages` makes broken copies of a passing render that each check must
fail: deploy-check shows with them that the checks can fail.
"""

from __future__ import annotations

import base64
import copy
import re
from pathlib import Path
from urllib.parse import parse_qs, unquote

import yaml

from .render import DEPLOY, ROOT
from .validate import ident

CLUSTER = ("postgresql.cnpg.io/v1", "Cluster")
# CloudNativePG fixes `port` (pkg/postgres/configuration.go,
# FixedConfigurationParameters): every instance listens on 5432, and its
# Services forward there. 8000: the instance manager's status, which the
# operator calls.
PORT = 5432
STATUS_PORT = 8000
CLUSTER_LABEL = "cnpg.io/cluster"
OPERATOR_LABELS = {"app.kubernetes.io/name": "cloudnative-pg"}
ROLES_SQL = ROOT / "deploy/sql/roles.sql"
HOSTNAME = "kubernetes.io/hostname"
# What each of our containers logs in as: a member of this group
# (deploy/sql/roles.sql); the migration as the database's owner.
SERVICE_GROUP = {"ingest": "webhook_ingest", "relay": "outbox_relay", "keda": "outbox_monitor",
                 "console": "ops_console"}
URL_VARIABLES = ("DATABASE_URL", "RELAY_LISTEN_DATABASE_URL")


def clusters(objs: list[dict]) -> list[dict]:
    return [o for o in objs if (o.get("apiVersion"), o.get("kind")) == CLUSTER]


def _spec(obj: dict) -> dict:
    return obj.get("spec") or {}


def _ns(obj: dict) -> str | None:
    return (obj.get("metadata") or {}).get("namespace")


def _name(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("name", "?")


# --------------------------------------------------------------------------
# deploy/sql/roles.sql: what an administrator runs on any other PostgreSQL


def roles_sql(text: str | None = None) -> dict:
    """The database, its owner, the groups, login -> group, and the role
    settings ({(role, name): value}) that deploy/sql/roles.sql makes."""
    text = ROLES_SQL.read_text() if text is None else text
    groups = re.search(r"unnest\(ARRAY\[([^\]]*)\]\)", text)
    owner = re.search(r"CREATE ROLE (\w+) LOGIN PASSWORD", text)
    dbname = re.search(r"^\\set dbname (\w+)", text, re.M)
    return {
        "groups": re.findall(r"'(\w+)'", groups.group(1)) if groups else [],
        "owner": owner.group(1) if owner else None,
        "dbname": dbname.group(1) if dbname else None,
        "logins": dict(re.findall(r"\('(\w+)',\s*:'\w+',\s*'(\w+)'\)", text)),
        "settings": {(role, name): _setting(value)
                     for role, name, value in re.findall(r"^ALTER ROLE (\w+) SET (\w+)\s*(?:=|TO)\s*(.+?);\s*$", text, re.M | re.I)},
    }


def _setting(value: str) -> str:
    return value.strip().strip("'").lower()


def _alter_role(statement: str) -> tuple[str, str, str] | None:
    m = re.fullmatch(r"\s*ALTER ROLE (\w+) SET (\w+)\s*(?:=|TO)\s*(.+?)\s*;?\s*", statement, re.I | re.S)
    return (m.group(1), m.group(2), _setting(m.group(3))) if m else None


# --------------------------------------------------------------------------
# The checks


def check_cluster(objs: list[dict]) -> list[str]:
    """Synchronous replication that every commit waits for, and the instances
    apart: what makes a 200 survive the loss of the primary's node."""
    problems = []
    for cl in clusters(objs):
        spec, name = _spec(cl), ident(cl)
        instances = spec.get("instances", 1)
        postgresql = spec.get("postgresql") or {}
        sync = postgresql.get("synchronous")
        if not sync:
            problems.append(f"{name}: no spec.postgresql.synchronous: replication is asynchronous, and a failover "
                            "loses the commits the old primary had not yet sent (acknowledged payments included)")
        else:
            method, number, durability = sync.get("method"), sync.get("number"), sync.get("dataDurability")
            if method not in ("any", "first"):
                problems.append(f"{name}: synchronous.method {method!r} is neither `any` (quorum) nor `first` (priority)")
            if not isinstance(number, int) or number < 1:
                problems.append(f"{name}: synchronous.number {number!r}: at least 1 standby must confirm each commit")
            elif instances < number + 2:
                problems.append(f"{name}: {instances} instances for synchronous.number {number}: with one standby down "
                                f"(a node drain, an upgrade) fewer than {number} remain and every write waits; "
                                f"instances >= number + 2")
            if durability != "required":
                why = ("is not set: set `required` explicitly, it is what a 200 relies on" if durability is None else
                       f"is {durability!r}: with no standby to confirm, commits are acknowledged on the primary alone")
                problems.append(f"{name}: synchronous.dataDurability {why}")
        commit = str((postgresql.get("parameters") or {}).get("synchronous_commit", "on")).lower()
        if commit not in ("on", "remote_apply"):
            problems.append(f"{name}: parameters.synchronous_commit = {commit}: commits would not wait for the "
                            "standby's flush (on or remote_apply)")
        affinity = spec.get("affinity") or {}
        if affinity.get("enablePodAntiAffinity") is False:
            problems.append(f"{name}: affinity.enablePodAntiAffinity is false: two instances may share a node")
        else:
            if affinity.get("topologyKey", HOSTNAME) not in (HOSTNAME, "topology.kubernetes.io/zone"):
                problems.append(f"{name}: affinity.topologyKey {affinity.get('topologyKey')!r}: keep the instances "
                                f"apart by {HOSTNAME} (or zone)")
            if affinity.get("podAntiAffinityType", "preferred") != "required":
                problems.append(f"{name}: affinity.podAntiAffinityType is "
                                f"{affinity.get('podAntiAffinityType', 'preferred (the default)')}: the scheduler may "
                                "put the primary and its synchronous standby on one node, whose loss takes both")
        if spec.get("enablePDB") is False:
            problems.append(f"{name}: enablePDB is false: a drain may evict instances the synchronous standby needs")
    return problems


def check_roles(objs: list[dict], sql: dict | None = None) -> list[str]:
    """The Cluster makes the database, owner, groups, login roles and role
    settings that deploy/sql/roles.sql makes elsewhere."""
    sql = roles_sql() if sql is None else sql
    problems = []
    if not sql["owner"] or not sql["logins"] or not sql["settings"]:
        return [f"{ROLES_SQL.relative_to(ROOT)}: cannot read its owner, logins or ALTER ROLE ... SET lines: update deploy-check"]
    for cl in clusters(objs):
        spec, name = _spec(cl), ident(cl)
        initdb = (spec.get("bootstrap") or {}).get("initdb") or {}
        if initdb.get("database") != sql["dbname"]:
            problems.append(f"{name}: bootstrap.initdb.database {initdb.get('database')!r}, roles.sql makes {sql['dbname']!r}")
        if initdb.get("owner") != sql["owner"]:
            problems.append(f"{name}: bootstrap.initdb.owner {initdb.get('owner')!r}, roles.sql makes {sql['owner']!r} (runs migrate)")
        if not (initdb.get("secret") or {}).get("name"):
            problems.append(f"{name}: bootstrap.initdb.secret is not set: the operator would invent the owner's password")
        managed = {r.get("name"): r for r in (spec.get("managed") or {}).get("roles") or []}
        for group in sql["groups"]:
            role = managed.get(group)
            if role is None:
                problems.append(f"{name}: managed.roles has no group {group} (the migrations grant to it)")
            elif role.get("login"):
                problems.append(f"{name}: managed role {group} can log in: it is a group")
        for login, group in sql["logins"].items():
            role = managed.get(login)
            if role is None:
                problems.append(f"{name}: managed.roles has no {login} (roles.sql: LOGIN, IN ROLE {group})")
                continue
            if role.get("login") is not True:
                problems.append(f"{name}: managed role {login} has no `login: true`")
            if group not in (role.get("inRoles") or []):
                problems.append(f"{name}: managed role {login} is not in {group} (inRoles {role.get('inRoles')})")
            if not (role.get("passwordSecret") or {}).get("name"):
                problems.append(f"{name}: managed role {login} has no passwordSecret: it could not log in")
        owner_role = managed.get(sql["owner"])
        if owner_role and (owner_role.get("passwordSecret") or {}).get("name") != (initdb.get("secret") or {}).get("name"):
            problems.append(f"{name}: managed role {sql['owner']} takes its password from "
                            f"{(owner_role.get('passwordSecret') or {}).get('name')!r}, initdb from "
                            f"{(initdb.get('secret') or {}).get('name')!r}: one Secret, or the passwords part")
        settings = {}
        for statement in initdb.get("postInitSQL") or []:
            parsed = _alter_role(str(statement))
            if parsed:
                settings[parsed[:2]] = parsed[2]
        for (role, setting), value in sorted(sql["settings"].items()):
            got = settings.get((role, setting))
            if got is None:
                problems.append(f"{name}: postInitSQL does not set {setting} = {value} on {role} (roles.sql does)")
            elif got != value:
                problems.append(f"{name}: postInitSQL sets {setting} = {got} on {role}, roles.sql {value}")
        for (role, setting), value in sorted(settings.items()):
            if (role, setting) not in sql["settings"]:
                problems.append(f"{name}: postInitSQL sets {setting} = {value} on {role}, which roles.sql does not")
    return problems


def _selects(selector: dict | None, labels: dict) -> bool:
    """A label selector (matchLabels, and matchExpressions In/Exists) matching labels."""
    if selector is None:
        return False
    if not all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and labels.get(key) in values) \
                or (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
    return True


def _ports(rule: dict) -> set | None:
    """The ports a rule opens (None: all), numbers and names."""
    ports = rule.get("ports") or []
    if not ports:
        return None
    if any(p.get("port") is None for p in ports):
        return None
    out = set()
    for p in ports:
        port, end = p.get("port"), p.get("endPort")
        out |= set(range(port, (end or port) + 1)) if isinstance(port, int) else {port}
    return out


def opens(rule: dict, port: int, name: str | None = None) -> bool:
    ports = _ports(rule)
    return ports is None or port in ports or (name is not None and name in ports)


def _peer_admits(peer: dict, labels: dict, ns: str | None) -> bool:
    """Whether a NetworkPolicy peer matches pods with these labels in the
    namespace `ns` (the policy's own), or, ns None, in another namespace
    whose labels are not known here (any namespaceSelector may name it)."""
    if "ipBlock" in peer:
        return False  # addresses, not pods: nothing to tell offline
    if "namespaceSelector" in peer:
        if ns is not None and not _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": ns}):
            return False
    elif ns is None:
        return False  # no namespaceSelector: the policy's own namespace only
    return "podSelector" not in peer or _selects(peer["podSelector"], labels)


def policies_selecting(objs: list[dict], ns: str | None, labels: dict, direction: str) -> list[dict]:
    """The NetworkPolicies that select these pods for a direction (policyTypes
    defaults to Ingress, plus Egress when the policy has egress rules)."""
    out = []
    for p in objs:
        if p.get("kind") != "NetworkPolicy" or _ns(p) != ns or not _selects(_spec(p).get("podSelector") or {}, labels):
            continue
        types = _spec(p).get("policyTypes") or (["Ingress"] + (["Egress"] if "egress" in _spec(p) else []))
        if direction in types:
            out.append(p)
    return out


def _match_labels(peer_or_spec: dict) -> dict:
    return (peer_or_spec.get("podSelector") or {}).get("matchLabels") or {}


def _template_labels(obj: dict) -> dict:
    return (((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}


def cluster_pod_labels(cl: dict) -> dict:
    """Labels every instance pod of the Cluster carries (the ones selectors here use)."""
    return {CLUSTER_LABEL: _name(cl), "cnpg.io/podRole": "instance"}


def check_network(objs: list[dict], containers) -> list[str]:
    """Our pods' egress reaches the Cluster's pods on 5432; the Cluster's pods
    admit ours, each other (replication, status) and the operator."""
    problems = []
    for cl in clusters(objs):
        ns, cname = _ns(cl), _name(cl)
        target = cluster_pod_labels(cl)
        # Our pods, out.
        owners = list({id(oc.owner): oc.owner for oc in containers if _ns(oc.owner) == ns}.values())
        for owner in owners:
            policies = policies_selecting(objs, ns, _template_labels(owner), "Egress")
            if not policies:
                continue  # no egress policy: nothing restricts it
            reaches = False
            for p in policies:
                for i, rule in enumerate(_spec(p).get("egress") or []):
                    to_cluster = not rule.get("to") or any(_peer_admits(peer, target, ns) for peer in rule["to"])
                    if not to_cluster:
                        continue
                    names_it = any(_match_labels(peer).get(CLUSTER_LABEL) == cname for peer in rule.get("to") or [])
                    if opens(rule, PORT, "postgresql"):
                        reaches = True
                    elif names_it:
                        problems.append(f"{ident(p)}: egress[{i}] to the Cluster {cname}'s pods opens "
                                        f"{sorted(map(str, _ports(rule) or []))}, but CloudNativePG listens on {PORT}")
            if not reaches:
                problems.append(f"{ident(owner)}: no NetworkPolicy egress rule lets its pods reach the Cluster "
                                f"{cname}'s pods ({CLUSTER_LABEL}: {cname}) on {PORT}")
        # The Cluster's pods, in.
        policies = policies_selecting(objs, ns, target, "Ingress")
        if not policies:
            problems.append(f"{ident(cl)}: no NetworkPolicy selects its pods ({CLUSTER_LABEL}: {cname}): "
                            "every pod of the cluster may connect to the database")
            continue
        wanted = [(ident(owner), _template_labels(owner), ns, PORT) for owner in owners]
        wanted += [("its own instances (replication)", target, ns, PORT),
                   ("its own instances (status)", target, ns, STATUS_PORT),
                   ("the operator (status)", OPERATOR_LABELS, None, STATUS_PORT),
                   ("the operator", OPERATOR_LABELS, None, PORT)]
        for who, labels, from_ns, port in wanted:
            admitted = any(opens(rule, port)
                           and (not rule.get("from") or any(_peer_admits(peer, labels, from_ns) for peer in rule["from"]))
                           for p in policies for rule in _spec(p).get("ingress") or [])
            if not admitted:
                problems.append(f"the Cluster {cname}'s pods do not admit {who} on {port} "
                                f"({', '.join(ident(p) for p in policies)})")
    return problems


# --------------------------------------------------------------------------
# The Secrets the operator creates, as the overlay's example shows them


def examples_of(label: str) -> tuple[list[Path], list[dict]]:
    """The *.example.yaml files beside an overlay, and their objects."""
    paths = sorted((DEPLOY / label).glob("*.example.yaml")) if (DEPLOY / label).is_dir() else []
    return paths, [d for p in paths for d in yaml.safe_load_all(p.read_text()) if d is not None]


def _secret_value(secrets: list[dict], name: str, key: str) -> str | None:
    for s in secrets:
        if s.get("kind") == "Secret" and _name(s) == name:
            if key in (s.get("stringData") or {}):
                return str(s["stringData"][key])
            if key in (s.get("data") or {}):
                return base64.b64decode(s["data"][key]).decode()
    return None


def parse_url(url: str) -> dict:
    """A libpq URL, multi-host form included: user, password, [(host, port)],
    dbname and the query's parameters."""
    scheme, _, rest = url.partition("://")
    netloc, _, path = rest.partition("/")
    path, _, query = path.partition("?")
    userinfo, at, hosts = netloc.rpartition("@")
    user, _, password = userinfo.partition(":") if at else ("", "", "")
    out_hosts = []
    for h in hosts.split(","):
        host, _, port = h.partition(":")
        out_hosts.append((host, int(port) if port.isdigit() else None))
    return {"scheme": scheme, "user": unquote(user), "password": unquote(password), "hosts": out_hosts,
            "dbname": unquote(path), "params": {k: v[-1] for k, v in parse_qs(query).items()}}


def _ca_files(oc, cname: str) -> set[str]:
    """The paths at which the container sees the operator's CA certificate
    (the Secret <cluster>-ca, key ca.crt)."""
    volumes = {v.get("name"): v for v in oc.pod.get("volumes") or []}
    out = set()
    for m in oc.container.get("volumeMounts") or []:
        v = volumes.get(m.get("name")) or {}
        sources = [v] + [s for s in (v.get("projected") or {}).get("sources") or []]
        for s in sources:
            secret = s.get("secret") or {}
            if (secret.get("secretName") or secret.get("name")) != f"{cname}-ca":
                continue
            items = secret.get("items")
            path = next((i.get("path") for i in items if i.get("key") == "ca.crt"), None) if items else "ca.crt"
            if path and not m.get("subPath"):
                out.add(f"{m.get('mountPath', '').rstrip('/')}/{path}")
            elif m.get("subPath") == path:
                out.add(m.get("mountPath", ""))
    return out


def check_urls(label: str, objs: list[dict], containers, examples: tuple[list[Path], list[dict]] | None = None) -> list[str]:
    """What the overlay's example Secrets put in each database URL our
    containers (and KEDA) read, against the Cluster."""
    paths, docs = examples_of(label) if examples is None else examples
    cls = clusters(objs)
    if not cls:
        return []
    if not paths:
        return [f"deploy/{label}: no *.example.yaml shows the Secrets (the DATABASE_URLs at the Cluster) the operator creates"]
    where = ", ".join(str(p.relative_to(ROOT)) for p in paths)
    by_name = {_name(c): c for c in cls}
    problems = []
    secrets = [d for d in docs if d.get("kind") == "Secret"]

    def roles_of(cl: dict) -> dict:
        return {r.get("name"): r for r in (_spec(cl).get("managed") or {}).get("roles") or []}

    def check_url(who: str, role: str, ref: str, url: str, ca_files: set[str] | None) -> None:
        """ca_files None: a client without the CA mount (KEDA)."""
        u = parse_url(url)
        what = f"{where}: {ref} ({who})"
        matched = None
        for host, port in u["hosts"]:
            service, _, domain = host.partition(".")
            cname = next((c for c in by_name if service in (f"{c}-rw", f"{c}-ro", f"{c}-r")), None)
            cl = by_name.get(cname)
            if cl is None:
                problems.append(f"{what} names {host}, not the read-write Service of a Cluster in the render "
                                f"({', '.join(f'{c}-rw.{_ns(by_name[c])}.svc' for c in by_name)})")
                continue
            rw = f"{cname}-rw.{_ns(cl)}.svc"
            if service == f"{cname}-ro":
                problems.append(f"{what} names {host}, the Cluster's read-only Service (standbys only, which refuse "
                                f"writes): use {rw}")
            elif service == f"{cname}-r":
                problems.append(f"{what} names {host}, the Cluster's any-instance Service (a standby as often as "
                                f"the primary): use {rw}")
            elif domain not in ("", _ns(cl), f"{_ns(cl)}.svc", f"{_ns(cl)}.svc.cluster.local"):
                problems.append(f"{what} names {host}, which is not the Service {rw} (another namespace?)")
            else:
                matched = cl
            if port not in (None, PORT):
                problems.append(f"{what}: port {port}, but the Cluster's Services forward to {PORT}")
        if matched is None:
            return
        initdb = (_spec(matched).get("bootstrap") or {}).get("initdb") or {}
        if u["dbname"] != initdb.get("database"):
            problems.append(f"{what}: database {u['dbname']!r}, the Cluster's is {initdb.get('database')!r}")
        mode = u["params"].get("sslmode")
        if ca_files is not None:
            if mode != "verify-full":
                problems.append(f"{what}: sslmode={mode}: verify-full against the operator's CA, as prod verifies its database")
            rootcert = u["params"].get("sslrootcert")
            if rootcert not in ca_files:
                problems.append(f"{what}: sslrootcert={rootcert} is not the operator's CA (Secret {_name(matched)}-ca, "
                                f"key ca.crt) as the container mounts it ({sorted(ca_files) or 'not mounted'})")
        elif mode in (None, "disable", "allow", "prefer"):
            problems.append(f"{what}: sslmode={mode}: at least require (encrypted)")
        roles = roles_of(matched)
        if role == "migrate":
            if u["user"] != initdb.get("owner"):
                problems.append(f"{what}: logs in as {u['user']!r}; the migration runs as the owner {initdb.get('owner')!r}")
            secret = (initdb.get("secret") or {}).get("name")
        else:
            group = SERVICE_GROUP[role]
            r = roles.get(u["user"])
            if r is None or not r.get("login") or group not in (r.get("inRoles") or []):
                problems.append(f"{what}: logs in as {u['user']!r}, which is no login role of the Cluster in {group}")
                return
            secret = (r.get("passwordSecret") or {}).get("name")
        if secret and _secret_value(secrets, secret, "password") is not None \
                and _secret_value(secrets, secret, "password") != u["password"]:
            problems.append(f"{what}: the password is not the one of {u['user']}'s Secret {secret} "
                            "(the operator sets that one in the database)")

    for cl in cls:
        initdb = (_spec(cl).get("bootstrap") or {}).get("initdb") or {}
        named = [(initdb.get("owner"), (initdb.get("secret") or {}).get("name"))]
        named += [(r.get("name"), (r.get("passwordSecret") or {}).get("name")) for r in roles_of(cl).values()]
        for role, secret in named:
            if not secret:
                continue
            doc = next((s for s in secrets if _name(s) == secret), None)
            if doc is None:
                problems.append(f"{where}: no Secret {secret}, the password of the Cluster's role {role}")
            elif doc.get("type") != "kubernetes.io/basic-auth" or _secret_value(secrets, secret, "username") != role:
                problems.append(f"{where}: Secret {secret} must be of type kubernetes.io/basic-auth with username "
                                f"{role} (is {doc.get('type')}, {_secret_value(secrets, secret, 'username')!r})")
    for oc in containers:
        role = oc.role
        if role not in ("ingest", "relay", "console", "migrate"):
            continue
        files = set().union(*(_ca_files(oc, c) for c in by_name))
        for e in oc.container.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if e.get("name") not in URL_VARIABLES or not ref:
                continue
            url = _secret_value(secrets, ref.get("name"), ref.get("key"))
            if url is None:
                if not ref.get("optional"):
                    problems.append(f"{where}: no Secret {ref.get('name')} with key {ref.get('key')}, the "
                                    f"{e['name']} of {oc.where}")
                continue
            check_url(oc.where, role, f"Secret {ref.get('name')} {ref.get('key')}", url, files)
    for ta in [o for o in objs if o.get("kind") == "TriggerAuthentication"]:
        for t in _spec(ta).get("secretTargetRef") or []:
            if t.get("parameter") != "connection":
                continue
            url = _secret_value(secrets, t.get("name"), t.get("key"))
            if url is None:
                problems.append(f"{where}: no Secret {t.get('name')} with key {t.get('key')}, "
                                f"KEDA's connection ({ident(ta)})")
            else:
                check_url(f"KEDA, {ident(ta)}", "keda", f"Secret {t.get('name')} {t.get('key')}", url, None)
    return problems


# --------------------------------------------------------------------------
# The checks' own test: broken copies each must fail


def breakages(label: str, objs: list[dict]) -> list[tuple[str, str, list[dict], tuple[list[Path], list[dict]]]]:
    """(what, the check that must fail: cluster, roles, network or urls, the
    broken objects, the broken examples) for a render that passes. The
    caller finds our containers again in each broken copy."""
    examples = examples_of(label)
    cls = clusters(objs)
    if not cls:
        return []
    cname = _name(cls[0])
    out = []

    def edit_objs(what: str, check: str, edit) -> None:
        broken = copy.deepcopy(objs)
        if edit(broken) is not False:
            out.append((what, check, broken, examples))

    def cluster_of(broken):
        return next(o for o in broken if (o.get("apiVersion"), o.get("kind")) == CLUSTER)

    def first_egress_to_cluster(broken):
        for p in broken:
            if p.get("kind") != "NetworkPolicy":
                continue
            for rule in _spec(p).get("egress") or []:
                if any(_match_labels(peer).get(CLUSTER_LABEL) == cname for peer in rule.get("to") or []):
                    rule["ports"] = [{"port": PORT + 1, "protocol": "TCP"}]
                    return True
        return False

    def drop_relay_from_cluster_ingress(broken):
        for p in broken:
            if p.get("kind") == "NetworkPolicy" and _match_labels(_spec(p)).get(CLUSTER_LABEL) == cname:
                for rule in _spec(p).get("ingress") or []:
                    peers = rule.get("from") or []
                    kept = [peer for peer in peers if _match_labels(peer).get("app.kubernetes.io/name") != "outbox-relay"]
                    if len(kept) != len(peers):
                        rule["from"] = kept
                        return True
        return False

    def drop_a_setting(broken):
        initdb = _spec(cluster_of(broken)).get("bootstrap", {}).get("initdb", {})
        sql = initdb.get("postInitSQL") or []
        at = next((i for i, s in enumerate(sql) if "synchronous_commit" in str(s)), None)
        if at is None:
            return False
        del sql[at]

    def ca_from_configmap(broken):
        for o in broken:
            for v in ((((o.get("spec") or {}).get("template") or {}).get("spec") or {}).get("volumes") or []):
                if (v.get("secret") or {}).get("secretName") == f"{cname}-ca":
                    v.pop("secret")
                    v["configMap"] = {"name": "postgres-ca"}
                    return True
        return False

    edit_objs("egress to the Cluster on 5433", "network", first_egress_to_cluster)
    edit_objs("the Cluster's pods not admitting the relay", "network", drop_relay_from_cluster_ingress)
    edit_objs("no synchronous stanza", "cluster",
              lambda b: _spec(cluster_of(b)).get("postgresql", {}).pop("synchronous", None))
    edit_objs("dataDurability: preferred", "cluster",
              lambda b: _spec(cluster_of(b)).get("postgresql", {}).get("synchronous", {}).__setitem__("dataDurability", "preferred"))
    edit_objs("podAntiAffinityType: preferred", "cluster",
              lambda b: _spec(cluster_of(b)).setdefault("affinity", {}).__setitem__("podAntiAffinityType", "preferred"))
    edit_objs("relay_app's synchronous_commit = off missing", "roles", drop_a_setting)
    edit_objs("the CA from the ConfigMap postgres-ca", "urls", ca_from_configmap)
    paths, docs = examples
    for what, old, new in (("DATABASE_URL at the -ro Service", f"@{cname}-rw.", f"@{cname}-ro."),
                           ("DATABASE_URL at the -r Service", f"@{cname}-rw.", f"@{cname}-r."),
                           ("sslmode=require", "sslmode=verify-full", "sslmode=require")):
        broken_docs = copy.deepcopy(docs)
        for d in broken_docs:
            data = d.get("stringData") or {}
            if d.get("kind") == "Secret" and "DATABASE_URL" in data and old in data["DATABASE_URL"]:
                data["DATABASE_URL"] = data["DATABASE_URL"].replace(old, new)
                out.append((what, "urls", objs, (paths, broken_docs)))
                break
    return out
