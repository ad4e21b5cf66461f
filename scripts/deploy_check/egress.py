"""The NetworkPolicies' egress to PostgreSQL (5432) and HTTPS (443).

Each overlay sets where the services may reach the database and the HTTPS
APIs, as variables (its `network-egress` ConfigMap, copied into the policies
by `replacements`). The base policies carry placeholders, not addresses, so a
rendered policy is correct only with the overlay's values in place. Where the
render runs the database itself on CloudNativePG (components/cnpg), the rule
to 5432 names that Cluster's pods instead (`podSelector` on
`cnpg.io/cluster: <a Cluster of the render>`, in the policy's namespace):
cnpg.py checks the rest of it. A rule that reaches 5432 or 443 fails the
check when it
- has no `to` (any address, every namespace),
- lists a namespace or pod selector instead of the configured range (other
  than the pods of a Cluster of the render, for 5432 only),
- has an ipBlock whose cidr is not an address range (a placeholder the
  overlay did not replace), or
- has an ipBlock of the whole address space (0.0.0.0/0, ::/0), or one that
  holds the cloud metadata endpoint (169.254.169.254).
"""

from __future__ import annotations

import ipaddress

GUARDED = {5432: "PostgreSQL", 443: "HTTPS"}
METADATA = ipaddress.ip_network("169.254.169.254/32")


def _ports(rule: dict) -> set[int]:
    """The guarded ports a rule opens: all of them when it lists no port (a
    named port cannot be resolved offline and does not name these two)."""
    ports = rule.get("ports") or []
    if not ports:
        return set(GUARDED)
    out = set()
    for p in ports:
        port, end = p.get("port"), p.get("endPort")
        if port is None:
            return set(GUARDED)
        if isinstance(port, int):
            out |= {g for g in GUARDED if port <= g <= (end or port)}
    return out


def _cluster_pods(peer: dict, guarded: set[int], clusters: set[str]) -> bool:
    """A peer that is the pods of a CloudNativePG Cluster of the render, in the
    policy's namespace, for PostgreSQL alone."""
    selector = peer.get("podSelector") or {}
    name = (selector.get("matchLabels") or {}).get("cnpg.io/cluster")
    return (guarded == {5432} and set(peer) == {"podSelector"} and not selector.get("matchExpressions")
            and name is not None and name in clusters)


def check_egress(objs: list[dict]) -> list[str]:
    problems = []
    clusters = {(o["metadata"].get("namespace"), o["metadata"].get("name")) for o in objs
                if (o.get("apiVersion"), o.get("kind")) == ("postgresql.cnpg.io/v1", "Cluster")}
    for obj in objs:
        if obj.get("kind") != "NetworkPolicy":
            continue
        name = f"NetworkPolicy {obj.get('metadata', {}).get('name')}"
        for i, rule in enumerate(obj.get("spec", {}).get("egress") or []):
            guarded = _ports(rule)
            if not guarded:
                continue
            what = " and ".join(f"{GUARDED[p]} ({p})" for p in sorted(guarded))
            where = f"{name}: egress[{i}] to {what}"
            to = rule.get("to") or []
            if not to:
                problems.append(f"{where} allows any address: set the overlay's network-egress variable")
                continue
            namespace = obj.get("metadata", {}).get("namespace")
            for peer in to:
                block = peer.get("ipBlock")
                if block is None:
                    if not _cluster_pods(peer, guarded, {n for ns, n in clusters if ns == namespace}):
                        problems.append(f"{where} has a selector, not the overlay's configured range"
                                        + (" nor the pods of a CloudNativePG Cluster of the render" if 5432 in guarded else ""))
                    continue
                cidr = str(block.get("cidr", ""))
                try:
                    net = ipaddress.ip_network(cidr, strict=False)
                except ValueError:
                    problems.append(f"{where}: cidr {cidr!r} is not an address range (the overlay's variable is not set)")
                    continue
                if net.prefixlen == 0:
                    problems.append(f"{where} allows {cidr} (the whole address space): narrow it in the overlay's network-egress")
                elif net.version == 4 and net.overlaps(METADATA):
                    problems.append(f"{where}: {cidr} holds the cloud metadata endpoint 169.254.169.254")
    return problems


def breakages(objs: list[dict]) -> list[tuple[str, list[dict]]]:
    """Broken copies of a render that passes: for its first NetworkPolicy
    rule that reaches a guarded port through an ipBlock, that rule opened to
    any address, to 0.0.0.0/0, to a placeholder the overlay left, to a
    namespace selector, to the pods of a Cluster the render does not hold,
    and to the metadata endpoint's range. Each copy must
    fail `check_egress`, which is how deploy-check shows the check can fail."""
    import copy

    for p, obj in enumerate(objs):
        if obj.get("kind") != "NetworkPolicy":
            continue
        for i, rule in enumerate(obj.get("spec", {}).get("egress") or []):
            if not _ports(rule) or not any("ipBlock" in peer for peer in rule.get("to") or []):
                continue
            edits = {
                "no `to`": lambda r: r.pop("to"),
                "0.0.0.0/0": lambda r: r.__setitem__("to", [{"ipBlock": {"cidr": "0.0.0.0/0"}}]),
                "a placeholder": lambda r: r.__setitem__("to", [{"ipBlock": {"cidr": "POSTGRES_CIDR"}}]),
                "a namespace selector": lambda r: r.__setitem__("to", [{"namespaceSelector": {}}]),
                "the pods of no Cluster": lambda r: r.__setitem__(
                    "to", [{"podSelector": {"matchLabels": {"cnpg.io/cluster": "no-such-cluster"}}}]),
                "169.254.0.0/16": lambda r: r.__setitem__("to", [{"ipBlock": {"cidr": "169.254.0.0/16"}}]),
            }
            out = []
            for what, edit in edits.items():
                broken = copy.deepcopy(objs)
                edit(broken[p]["spec"]["egress"][i])
                out.append((what, broken))
            return out
    return []
