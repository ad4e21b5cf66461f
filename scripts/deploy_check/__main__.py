"""`make deploy-check`: the Kubernetes manifests under deploy/, offline.

Run it through scripts/deploy-check.sh, which provides kubectl, promtool and
the pinned Python packages. No cluster is needed and nothing is applied.

1. Render every kustomization (and each documented alternative component)
   with `kubectl kustomize`.
2. Validate what it renders: built-in kinds against the Kubernetes schemas in
   strict mode (kubernetes-validate), the custom resources against their
   published CRD schemas (crds/), the alert rules with `promtool check rules`
   and their unit tests with `promtool test rules`.
3. Check the manifests against the code (against_code.py): variables against
   the binaries' `--help`, ports and probes against the admin server, grace
   periods against the shutdown budgets, KEDA's query against the relay's,
   alerts (and their runbook_url) and the dashboard against the metrics the
   code exports and RUNBOOK.md, the recommended labels, images against the
   Dockerfile, and where a render runs the operator's console, what keeps it
   to one pod and behind its auth proxy.
4. Where a render runs PostgreSQL on CloudNativePG (cnpg.py): synchronous
   replication a commit waits for, the roles of deploy/sql/roles.sql, the
   NetworkPolicies between our pods and the Cluster's, and the overlay's
   example Secrets' DATABASE_URLs at the read-write Service, verified
   against the operator's CA.

What only a cluster knows (admission, defaulting, the CRD versions
installed, the controllers) is out of reach.

# Layout
- render.py: kubectl kustomize, with the origin of every object.
- validate.py: the schemas and promtool.
- binaries.py: what our binaries accept, from `--help`.
- against_code.py: the checks against the code.
- egress.py: the NetworkPolicies' egress to 5432 and 443, per overlay.
- cnpg.py: the CloudNativePG Cluster against the product.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

try:
    import kubernetes_validate

    from . import against_code as code
    from . import cnpg, egress
    from .binaries import OURS, Binaries
    from .render import ROOT, RenderError, examples, kubectl_version, render_all
    from .validate import (K8S_VERSION, crd_sources, ident, promtool_version, rules_problems, rules_test_problems,
                           schema_problems)
except ImportError as e:  # pragma: no cover - environment problem
    sys.stderr.write(f"deploy-check: missing Python package ({e.name}); run scripts/deploy-check.sh\n")
    sys.exit(2)


class Report:
    def __init__(self) -> None:
        self.passed = self.failed = 0

    def check(self, name: str, problems: list[str], detail: str = "") -> None:
        if problems:
            self.failed += 1
            print(f"FAIL  {name}")
            for p in problems:
                print(f"        - {p}")
        else:
            self.passed += 1
            print(f"ok    {name}" + (f" ({detail})" if detail else ""))

    def summary(self) -> int:
        print(f"deploy-check: {self.passed} passed, {self.failed} failed")
        if self.failed:
            print("deploy-check: FAILED (see the FAIL lines above)", file=sys.stderr)
        return 1 if self.failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="deploy-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bindir", type=Path, default=Path(os.environ.get("DEPLOY_CHECK_BINDIR", ROOT / "target/debug")),
                        help="where webhook-ingest, outbox-relay and ops-console are built (default target/debug, or $DEPLOY_CHECK_BINDIR)")
    args = parser.parse_args()
    report = Report()
    try:
        kubectl = kubectl_version()
    except (RenderError, OSError) as e:
        report.check("kubectl", [str(e)])
        return report.summary()
    print(f"deploy-check: {kubectl}; Kubernetes {K8S_VERSION} schemas (kubernetes-validate {kubernetes_validate.__version__}); "
          f"CRD schemas from {crd_sources()}; {promtool_version()}")

    binaries = Binaries(args.bindir.resolve())
    for binary in OURS:
        cli, problem = binaries.cli(binary)
        report.check(f"{binary} --help lists its variables", [problem] if problem else [],
                     f"{len(cli.variables)} [env: ...]" if cli else "")

    renders, failures = render_all()
    for label, why in failures:
        report.check(f"[{label}] renders (kubectl kustomize)", [why])
    for r in renders:
        report.check(f"[{r.label}] renders (kubectl kustomize)", [], f"{len(r.objs)} objects")

    # Schemas: each distinct object once, reported in every render it is in.
    seen: dict[str, list[str]] = {}
    rules_seen: dict[str, list[str]] = {}
    for r in renders:
        problems = []
        for obj in r.objs:
            source = obj.pop("_source")
            key = json.dumps(obj, sort_keys=True)
            if key not in seen:
                seen[key] = schema_problems(obj)
            problems += [f"{source}: {p}" for p in seen[key]]
            obj["_source"] = source
        report.check(f"[{r.label}] schemas (strict)", problems)
        for rule in [o for o in r.objs if o.get("kind") == "PrometheusRule"]:
            key = json.dumps(rule["spec"], sort_keys=True)
            if key not in rules_seen:
                rules_seen[key] = (rules_problems(rule), rules_test_problems(rule))
            checked, tested = rules_seen[key]
            report.check(f"[{r.label}] {ident(rule)}: promtool check rules", checked)
            report.check(f"[{r.label}] {ident(rule)}: promtool test rules (each alert fires, and stays silent, when it should)", tested)
    problems = [f"{path.relative_to(ROOT)}: {p}" for path, doc in examples() for p in schema_problems(doc)]
    report.check("*.example.yaml schemas (strict)", problems)

    # Against the code, on what an operator applies.
    all_ours = []
    for r in [r for r in renders if r.entry_point]:
        objs = r.objs
        ours = code.ours(objs, binaries)
        all_ours += ours
        if ours:
            report.check(f"[{r.label}] env: every variable is in the binary's --help, the required ones are set", code.check_env(objs, ours))
            report.check(f"[{r.label}] ports, probes and scrapes match the admin server", code.check_ports_and_probes(objs, ours))
            report.check(f"[{r.label}] grace periods cover the shutdown budgets", code.check_grace(objs, ours))
            report.check(f"[{r.label}] the migration runs the deployed release; no Secret rendered", code.check_release(objs, ours))
            report.check(f"[{r.label}] recommended labels on every object; the version is the images' tag", code.check_labels(objs, ours))
        if any(oc.role == "console" for oc in ours):
            report.check(f"[{r.label}] the console: one replica, Recreate, no autoscaler; URL and token from Secrets; "
                         "cookie HTTPS-only; pages admitted from named pods only (the auth proxy), routed by no Ingress",
                         code.check_console(objs, ours))
        if any(o.get("kind") == "NetworkPolicy" for o in objs):
            report.check(f"[{r.label}] NetworkPolicies reach 5432 and 443 only at the overlay's configured ranges", egress.check_egress(objs))
            broken = egress.breakages(objs)
            missed = [f"a rule opened to {what} passed the check" for what, b in broken if not egress.check_egress(b)]
            if broken:
                report.check(f"[{r.label}] the egress check fails a rule opened to any address, 0.0.0.0/0, a placeholder, a selector "
                             "(of a namespace, or of pods no Cluster runs) or the metadata range",
                             missed, f"{len(broken)} broken copies refused")
        if cnpg.clusters(objs):
            shown_secrets = cnpg.examples_of(r.label)
            shown = ", ".join(str(p.relative_to(ROOT)) for p in shown_secrets[0]) or f"deploy/{r.label}/*.example.yaml"
            checks = {
                "cluster": ("CloudNativePG Cluster: synchronous replication every commit waits for "
                            "(dataDurability: required), a standby to spare, instances on separate nodes",
                            lambda o, e, c: cnpg.check_cluster(o)),
                "roles": ("CloudNativePG Cluster: the database, owner, groups, logins and role settings of deploy/sql/roles.sql",
                          lambda o, e, c: cnpg.check_roles(o)),
                "network": (f"NetworkPolicies: our pods reach the Cluster's pods on its port ({cnpg.PORT}); "
                            "its pods admit ours, each other and the operator",
                            lambda o, e, c: cnpg.check_network(o, c)),
                "urls": (f"{shown}: every DATABASE_URL at the Cluster's -rw Service (never -ro, -r), its port and database, "
                         "verify-full against the operator's CA as mounted, each service's own role and password Secret",
                         lambda o, e, c: cnpg.check_urls(r.label, o, c, e)),
            }
            for title, run in checks.values():
                report.check(f"[{r.label}] {title}", run(objs, shown_secrets, ours))
            broken = cnpg.breakages(r.label, objs)
            missed = [f"{what} passed the {which} check" for what, which, b, e in broken
                      if not checks[which][1](b, e, code.ours(b, binaries))]
            report.check(f"[{r.label}] the CloudNativePG checks fail a broken copy each: "
                         + ", ".join(what for what, _, _, _ in broken),
                         missed, f"{len(broken)} broken copies refused")
        if any(o.get("kind") == "ScaledObject" for o in objs):
            report.check(f"[{r.label}] KEDA query = crates/outbox-relay/sql/count_due.sql", code.check_keda_query(objs))
        if any(o.get("kind") == "PrometheusRule" for o in objs):
            report.check(f"[{r.label}] alerts use the code's metrics and label values; RUNBOOK sections and runbook_url anchors", code.check_alerts(objs))
        if any(((o.get("metadata") or {}).get("labels") or {}).get("grafana_dashboard") for o in objs):
            report.check(f"[{r.label}] Grafana dashboard: JSON, $datasource and $namespace, the code's metrics", code.check_dashboard(objs))
    report.check("deploy/Dockerfile runs each binary as the manifests' uid", code.check_dockerfile(all_ours))
    return report.summary()


if __name__ == "__main__":
    sys.exit(main())
