"""NetworkPolicies: selectors, peers and ports as deploy-check reads them
(for the console and the CloudNativePG Cluster too), and the egress to
PostgreSQL (5432) and HTTPS (443): each overlay sets where the services may
reach them, as variables (its `network-egress` ConfigMap, copied into the
policies by `replacements`) in place of the base's placeholders."""

from __future__ import annotations

import ipaddress
import json

from .render import ident

GUARDED, METADATA = {5432: "PostgreSQL", 443: "HTTPS"}, ipaddress.ip_network("169.254.169.254/32")


def selects(selector: dict | None, labels: dict | None) -> bool:
    """A label selector matching labels: matchLabels only, as the manifests use (any other fails closed)."""
    return selector is not None and set(selector) <= {"matchLabels"} and all(
        (labels or {}).get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def opens(rule: dict, port: int, name: str | None = None) -> bool:
    """Whether a rule opens this port (by number, or the container port's name); one without ports opens all."""
    return not rule.get("ports") or any(
        p.get("port") is None or p.get("port") == name
        or (isinstance(p.get("port"), int) and p["port"] <= port <= (p.get("endPort") or p["port"]))
        for p in rule["ports"])


def peer_admits(peer: dict, labels: dict, ns: str | None) -> bool:
    """Whether a NetworkPolicy peer matches pods with these labels in the
    namespace `ns` (the policy's own), or, ns None, in another namespace
    whose labels are not known here (any namespaceSelector may name it).
    An ipBlock is addresses, not pods: nothing to tell offline."""
    namespace = ns is not None and "namespaceSelector" in peer
    return "ipBlock" not in peer and ("namespaceSelector" in peer or ns is not None) and (
        not namespace or selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": ns})) and (
        "podSelector" not in peer or selects(peer["podSelector"], labels))


def policies_selecting(objs: list[dict], ns: str | None, labels: dict, direction: str) -> list[dict]:
    """The NetworkPolicies that select these pods for a direction (policyTypes
    defaults to Ingress, plus Egress when the policy has egress rules)."""
    return [p for p in objs if p.get("kind") == "NetworkPolicy" and p["metadata"].get("namespace") == ns
            and selects(p["spec"].get("podSelector") or {}, labels)
            and direction in (p["spec"].get("policyTypes") or ["Ingress"] + ["Egress"] * ("egress" in p["spec"]))]


def check_egress(objs: list[dict]) -> list[str]:
    """NetworkPolicies reach 5432 and 443 only at the overlay's configured ranges

    For 5432 alone, the pods of a Cluster of the render may stand for the
    range (cnpg.py checks those rules); a cidr that is no range is a
    placeholder the overlay did not replace."""
    problems = []
    clusters = {(o["metadata"].get("namespace"), o["metadata"].get("name")) for o in objs
                if (o.get("apiVersion"), o.get("kind")) == ("postgresql.cnpg.io/v1", "Cluster")}
    for policy in [o for o in objs if o.get("kind") == "NetworkPolicy"]:
        for i, rule in enumerate(policy["spec"].get("egress") or []):
            guarded = {port for port in GUARDED if opens(rule, port)}
            where = f"{ident(policy)}: egress[{i}] to " + " and ".join(f"{GUARDED[p]} ({p})" for p in sorted(guarded))
            if guarded and not rule.get("to"):
                problems.append(f"{where} allows any address: set the overlay's network-egress variable")
            for peer in (rule.get("to") or []) if guarded else []:
                cidr = str((peer.get("ipBlock") or {}).get("cidr", ""))
                try:
                    net = ipaddress.ip_network(cidr, strict=False) if "ipBlock" in peer else None
                except ValueError:
                    problems.append(f"{where}: cidr {cidr!r} is no address range (the overlay's variable is not set)")
                    continue
                cluster = ((peer.get("podSelector") or {}).get("matchLabels") or {}).get("cnpg.io/cluster")
                if net is None and not (guarded == {5432} and list(peer) == ["podSelector"] and (
                        policy["metadata"].get("namespace"), cluster) in clusters):
                    problems.append(f"{where} has a selector, not the overlay's range (nor, on 5432, a Cluster's pods)")
                elif net is not None and (net.prefixlen == 0 or (net.version == 4 and net.overlaps(METADATA))):
                    problems.append(f"{where} allows {cidr}: everything, or the cloud metadata endpoint; narrow it")
    return problems


def breakages(objs: list[dict]) -> list[tuple[str, list[dict]]]:
    """Broken copies of a render that passes, which check_egress must refuse:
    its first rule to a guarded port through an ipBlock, opened to each of
    these instead."""
    for at, obj in enumerate(objs):
        rules = [r for r in (obj.get("spec") or {}).get("egress") or [] if obj.get("kind") == "NetworkPolicy"
                 and any(opens(r, port) for port in GUARDED) and any("ipBlock" in t for t in r.get("to") or [])]
        if rules:
            old = json.dumps({"to": rules[0]["to"]})[1:-1]
            instead = {"no `to`": [], "0.0.0.0/0": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
                       "a placeholder": [{"ipBlock": {"cidr": "POSTGRES_CIDR"}}],
                       "a namespace selector": [{"namespaceSelector": {}}],
                       "the pods of no Cluster": [{"podSelector": {"matchLabels": {"cnpg.io/cluster": "-"}}}],
                       "169.254.0.0/16": [{"ipBlock": {"cidr": "169.254.0.0/16"}}]}
            return [(what, objs[:at] + [json.loads(json.dumps(obj).replace(old, json.dumps({"to": to})[1:-1], 1))]
                     + objs[at + 1:]) for what, to in instead.items()]
    return []
