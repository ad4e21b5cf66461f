"""`make deploy-check`: every kustomization under deploy/ rendered and validated
(render.py); what an operator applies checked against the code (against_code.py,
cnpg.py) and for its egress (egress.py); the last two refuse broken copies too."""

from __future__ import annotations

import json
import sys

from . import against_code as code
from . import cnpg, egress
from .render import DEPLOY, ROOT, examples, ident, render_all, rules_problems, schema_problems

passed, failed = [], []


def check(name: str, problems: list[str], detail: str = "") -> None:
    (failed if problems else passed).append(name)
    print(f"FAIL  {name}" if problems else f"ok    {name}" + (f" ({detail})" if detail else ""))
    for p in problems:
        print(f"        - {p}")


def title(check: object) -> str:
    return " ".join(check.__doc__.split())


def main() -> int:
    renders, failures = render_all()
    for label, why in failures:
        check(f"[{label}] renders (kubectl kustomize)", [why])
    for r in renders:
        check(f"[{r.label}] renders (kubectl kustomize)", [], f"{len(r.objs)} objects")
    for r in renders:
        check(f"[{r.label}] schemas (strict)", [p for o in r.objs for p in schema_problems(json.dumps(o))])
        for rule in [o for o in r.objs if o.get("kind") == "PrometheusRule"]:
            check(f"[{r.label}] {ident(rule)}: promtool check rules, test rules",
                  rules_problems(json.dumps(rule["spec"]["groups"])))
    check("*.example.yaml schemas (strict)", [f"{path.relative_to(ROOT)}: {p}" for path, doc in examples()
                                              for p in schema_problems(json.dumps(doc))])

    for r in [r for r in renders if r.entry_point]:  # what an operator applies
        objs, ours = r.objs, code.ours(r.objs)
        kinds = {o.get("kind") for o in objs}
        check(f"[{r.label}] no Secret rendered (the operator makes them from *.example.yaml)",
              [f"{ident(s)} is rendered" for s in objs if s.get("kind") == "Secret"])
        for run, applies in ((code.check_env, ours), (code.check_ports_and_probes, ours),
                             (code.check_grace, ours),
                             (code.check_console, "console" in [oc.role for oc in ours]),
                             (code.check_keda_query, "ScaledObject" in kinds),
                             (code.check_alerts, "PrometheusRule" in kinds)):
            if applies:
                check(f"[{r.label}] {title(run)}", run(objs, ours))
        if "NetworkPolicy" in kinds:
            check(f"[{r.label}] {title(egress.check_egress)}", egress.check_egress(objs))
            if broken := egress.breakages(objs):
                check(f"[{r.label}] the egress check refuses a rule opened to: " + ", ".join(dict(broken)),
                      [f"a rule opened to {what} passed" for what, b in broken if not egress.check_egress(b)])
        if cnpg.clusters(objs):
            shown = examples(DEPLOY / r.label)
            for which in ("cluster", "roles", "network", "urls"):
                run = getattr(cnpg, f"check_{which}")
                check(f"[{r.label}] {title(run)}", run(objs, ours, shown))
            broken = cnpg.breakages(objs, shown)
            check(f"[{r.label}] the CloudNativePG checks refuse: " + ", ".join(b[0] for b in broken),
                  [f"{what} passed the {which} check" for what, which, b, e in broken
                   if not getattr(cnpg, f"check_{which}")(b, code.ours(b), e)])
    print(f"deploy-check: {len(passed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
