"""NetworkPolicies as deploy-check reads them, and the egress to PostgreSQL (5432)
and HTTPS (443) at the ranges each overlay sets (its `network-egress` ConfigMap,
which `replacements` copy into the policies in place of the base's placeholders)."""

from __future__ import annotations

import ipaddress
import json

from .render import dig, ident

GUARDED, METADATA = (5432, 443), ipaddress.ip_network("169.254.169.254/32")


def selects(selector: dict | None, labels: dict | None) -> bool:
    """matchLabels only, as the manifests use (any other selector fails closed)."""
    return selector is not None and set(selector) <= {"matchLabels"} and all(
        (labels or {}).get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def opens(rule: dict, port: int, name: str | None = None) -> bool:
    """Whether a rule opens this port (by number, or the container port's name)."""
    return not rule.get("ports") or any(
        p.get("port") is None or p.get("port") == name
        or (isinstance(p.get("port"), int) and p["port"] <= port <= (p.get("endPort") or p["port"]))
        for p in rule["ports"])


def admits(objs: list[dict], ns: str | None, labels: dict, direction: str, port: int, peer: dict) -> bool:
    """Whether the NetworkPolicies of `ns` let its pods with `labels` send to (Egress) or receive
    from (Ingress) its pods with the labels `peer` on `port`: none selects them, or a rule does."""
    mine = {"kubernetes.io/metadata.name": ns}

    def matches(to: dict) -> bool:
        return "ipBlock" not in to and selects(to.get("namespaceSelector", {"matchLabels": mine}), mine) \
            and selects(to.get("podSelector", {}), peer)
    policies = [p["spec"] for p in objs if p.get("kind") == "NetworkPolicy"
                and p["metadata"].get("namespace") == ns and selects(p["spec"].get("podSelector"), labels)]
    policies = [p for p in policies  # policyTypes' default: Ingress, and Egress if it has egress rules
                if direction in (p.get("policyTypes") or ["Ingress"] + ["Egress"] * ("egress" in p))]
    rules = [rule for p in policies for rule in p.get(direction.lower()) or []]
    return not policies or any(opens(rule, port, "postgresql") and any(
        map(matches, rule.get("to" if direction == "Egress" else "from") or [{}])) for rule in rules)


def narrow(cidr: str) -> bool:
    """A range (not a placeholder left), neither everything nor the cloud metadata endpoint."""
    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return False
    return net.prefixlen > 0 and not (net.version == 4 and net.overlaps(METADATA))


def check_egress(objs: list[dict]) -> list[str]:
    """NetworkPolicies reach 5432 and 443 only at the overlay's ranges (or, on 5432, a Cluster's pods)"""
    problems = []
    clusters = {(o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs
                if o["kind"] == "Cluster"}
    for policy in [o for o in objs if o.get("kind") == "NetworkPolicy"]:
        ns = policy["metadata"].get("namespace")
        for i, rule in enumerate(policy["spec"].get("egress") or []):
            guarded = [port for port in GUARDED if opens(rule, port)]
            for peer in (rule.get("to") or [{}]) if guarded else []:  # no `to`: any address
                cidr = dig(peer, "ipBlock", "cidr")
                cluster = ns, dig(peer, "podSelector", "matchLabels", "cnpg.io/cluster")
                to_cluster = guarded == [5432] and list(peer) == ["podSelector"] and cluster in clusters
                if not (narrow(cidr) if cidr is not None else to_cluster):
                    problems.append(f"{ident(policy)}: egress[{i}] to {guarded} opened to "
                                    f"{peer or 'any address'}: not the overlay's range, nor a Cluster's pods")
    return problems


def breakages(objs: list[dict]) -> list[tuple[str, list[dict]]]:
    """(what, a broken copy of a render that passes, which check_egress must refuse): its first
    rule to a guarded port through an ipBlock, opened to each of these instead."""
    instead = {"no `to`": [], "0.0.0.0/0": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
               "a placeholder": [{"ipBlock": {"cidr": "POSTGRES_CIDR"}}],
               "a namespace selector": [{"namespaceSelector": {}}],
               "the pods of no Cluster": [{"podSelector": {"matchLabels": {"cnpg.io/cluster": "-"}}}],
               "169.254.0.0/16": [{"ipBlock": {"cidr": "169.254.0.0/16"}}]}
    for at, obj in enumerate(objs):
        rules = [r for r in dig(obj, "spec", "egress") or [] if obj.get("kind") == "NetworkPolicy"
                 and any(opens(r, port) for port in GUARDED) and any("ipBlock" in t for t in r.get("to", []))]
        if rules:
            old = json.dumps({"to": rules[0]["to"]})[1:-1]
            broken = [json.loads(json.dumps(obj).replace(old, json.dumps({"to": to})[1:-1], 1))
                      for to in instead.values()]
            return [(what, objs[:at] + [b] + objs[at + 1:]) for what, b in zip(instead, broken)]
    return []
