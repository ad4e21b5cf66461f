"""`make deploy-check` (scripts/deploy-check.sh): the manifests under deploy/,
offline. Every kustomization rendered and validated (render.py), checked
against the code (against_code.py), the overlays' egress ranges (egress.py)
and CloudNativePG's rules (cnpg.py), whose checks must also refuse broken
copies of a render that passes, to show they can fail. What only a cluster
knows (admission, defaulting, the controllers) is out of reach.
"""

from __future__ import annotations

import sys

import kubernetes_validate  # a missing package: run scripts/deploy-check.sh, which installs them

from . import against_code as code
from . import cnpg, egress
from .render import (DEPLOY, K8S_VERSION, ROOT, RenderError, crds, examples, ident, kubectl, promtool, render_all,
                     rules_problems, schema_problems)

passed, failed = [], []


def check(name: str, problems: list[str], detail: str = "") -> None:
    (failed if problems else passed).append(name)
    print(f"FAIL  {name}" if problems else f"ok    {name}" + (f" ({detail})" if detail else ""))
    for p in problems:
        print(f"        - {p}")


def title(check: object) -> str:  # the first paragraph of its docstring
    return " ".join(check.__doc__.split("\n\n")[0].split())


def main() -> int:
    try:
        print(f"deploy-check: {' '.join(kubectl('version', '--client').split())}; Kubernetes {K8S_VERSION} schemas "
              f"(kubernetes-validate {kubernetes_validate.__version__}); CRD schemas from "
              f"{', '.join(sorted({' '.join(c['source'].split()[:2]) for c in crds().values()}))}; "
              f"{promtool('--version', quiet=False)[0]}")
    except (RenderError, OSError) as e:
        check("kubectl and promtool (scripts/deploy-check.sh provides them)", [str(e)])
        return 1
    renders, failures = render_all()
    for label, why in failures:
        check(f"[{label}] renders (kubectl kustomize)", [why])
    for r in renders:
        check(f"[{r.label}] renders (kubectl kustomize)", [], f"{len(r.objs)} objects")
    for r in renders:
        check(f"[{r.label}] schemas (strict)", [f"{o['_source']}: {p}" for o in r.objs for p in schema_problems(o)])
        for rule in [o for o in r.objs if o.get("kind") == "PrometheusRule"]:
            checked, tested = rules_problems(rule)
            check(f"[{r.label}] {ident(rule)}: promtool check rules", checked)
            check(f"[{r.label}] {ident(rule)}: promtool test rules (each alert fires, and stays silent, when it "
                  "should)", tested)
    check("*.example.yaml schemas (strict)",
          [f"{path.relative_to(ROOT)}: {p}" for path, doc in examples() for p in schema_problems(doc)])

    # Against the code, on what an operator applies.
    all_ours = []
    for r in [r for r in renders if r.entry_point]:
        objs, ours = r.objs, code.ours(r.objs)
        kinds = {o.get("kind") for o in objs}
        all_ours += ours
        for run, applies in ((code.check_env, ours), (code.check_ports_and_probes, ours), (code.check_grace, ours),
                             (code.check_release, ours), (code.check_console, "console" in [oc.role for oc in ours]),
                             (code.check_keda_query, "ScaledObject" in kinds),
                             (code.check_alerts, "PrometheusRule" in kinds)):
            if applies:
                check(f"[{r.label}] {title(run)}", run(objs, ours))
        if "NetworkPolicy" in kinds:
            check(f"[{r.label}] {title(egress.check_egress)}", egress.check_egress(objs))
            if broken := egress.breakages(objs):
                check(f"[{r.label}] the egress check fails a rule opened to any address, 0.0.0.0/0, a placeholder, a "
                      "selector (of a namespace, or of pods no Cluster runs) or the metadata range",
                      [f"a rule opened to {what} passed the check" for what, b in broken if not egress.check_egress(b)],
                      f"{len(broken)} broken copies refused")
        if cnpg.clusters(objs):
            shown = examples(DEPLOY / r.label)
            files = ", ".join(sorted({str(p.relative_to(ROOT)) for p, _ in shown})) or f"deploy/{r.label}/*.example"
            for which in ("cluster", "roles", "network", "urls"):
                run = getattr(cnpg, f"check_{which}")
                check(f"[{r.label}] {files + ': ' if which == 'urls' else ''}{title(run)}", run(objs, ours, shown))
            broken = cnpg.breakages(objs, shown)
            check(f"[{r.label}] the CloudNativePG checks fail a broken copy each: " + ", ".join(b[0] for b in broken),
                  [f"{what} passed the {which} check" for what, which, b, e in broken
                   if not getattr(cnpg, f"check_{which}")(b, code.ours(b), e)], f"{len(broken)} broken copies refused")
    check(title(code.check_dockerfile), code.check_dockerfile([], all_ours))
    print(f"deploy-check: {len(passed)} passed, {len(failed)} failed")
    if failed:
        print("deploy-check: FAILED (see the FAIL lines above)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
