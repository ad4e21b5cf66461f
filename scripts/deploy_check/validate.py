"""Schemas: the Kubernetes OpenAPI schemas (kubernetes-validate, strict: an
unknown field fails), the published schemas of the custom resources we use
(crds/, see crds/README.md), and promtool for the alerts: `check rules`, and
`test rules` with the unit tests beside them."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils as kv_utils
import yaml

# The Kubernetes version the manifests target: `lifecycle.preStop.sleep`
# needs 1.30 (beta, on by default).
K8S_VERSION = "1.30.0"

CRDS = Path(__file__).resolve().parent / "crds"
ROOT = Path(__file__).resolve().parents[2]
# The alerts' unit tests (promtool test rules); its rule_files name RULES_FILE.
RULES_TESTS = ROOT / "deploy/components/monitoring/tests/rules-test.yaml"
RULES_FILE = "webhooks.rules.yaml"


def ident(obj: dict) -> str:
    """Kind/name, and the file it comes from once rendered."""
    name = f"{obj.get('kind', '?')}/{(obj.get('metadata') or {}).get('name', '?')}"
    return f"{name} ({obj['_source']})" if "_source" in obj else name


def strict(schema):
    """A CRD schema that rejects unknown fields, as the API server's strict
    field validation does (except where the CRD keeps unknown fields)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@cache
def crd_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    out = {}
    for path in sorted(CRDS.glob("*.json")):
        crd = json.loads(path.read_text())
        schema = strict(crd["openAPIV3Schema"])
        # ObjectMeta is the API server's, not the CRD's, to check.
        schema["properties"]["metadata"] = {"type": "object"}
        out[(f"{crd['group']}/{crd['version']}", crd["kind"])] = jsonschema.Draft7Validator(schema)
    return out


def crd_sources() -> str:
    """Where the CRD schemas come from, e.g. `kedacore/keda v2.12.1`."""
    return ", ".join(sorted({" ".join(json.loads(p.read_text())["source"].split()[:2]) for p in CRDS.glob("*.json")}))


def schema_problems(obj: dict) -> list[str]:
    if not isinstance(obj, dict) or "apiVersion" not in obj or "kind" not in obj:
        return ["not a Kubernetes object (apiVersion and kind required)"]
    crd = crd_validators().get((obj["apiVersion"], obj["kind"]))
    if crd is not None:
        return list(dict.fromkeys(  # one line per problem, though several schema branches may report it
            f"{ident(obj)} at {'.'.join(str(p) for p in e.absolute_path) or '(top level)'}: {e.message}"
            for e in sorted(crd.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))))
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kv_utils.SchemaNotFoundError:
        return [f"{ident(obj)}: no schema for {obj['apiVersion']} {obj['kind']} in Kubernetes {K8S_VERSION} "
                f"nor in {CRDS.name}/ (add the CRD's published schema there)"]
    except kv_utils.ValidationError as e:
        return [f"{ident(obj)} at {'.'.join(str(p) for p in e.absolute_path) or '(top level)'}: {e.message}"]
    return []


def promtool() -> str | None:
    return os.environ.get("DEPLOY_CHECK_PROMTOOL") or None


def rules_problems(rule: dict) -> list[str]:
    """`promtool check rules` on a PrometheusRule's groups."""
    exe = promtool()
    if exe is None:
        return ["no promtool: run scripts/deploy-check.sh (it installs one), or set DEPLOY_CHECK_PROMTOOL"]
    with tempfile.NamedTemporaryFile("w", suffix=".rules.yaml", prefix="deploy-check-") as f:
        yaml.safe_dump({"groups": (rule.get("spec") or {}).get("groups") or []}, f, sort_keys=False)
        f.flush()
        done = subprocess.run([exe, "check", "rules", f.name], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        text = (done.stdout + done.stderr).replace(f.name, ident(rule))
        return [line.strip() for line in text.splitlines()
                if line.strip() and not line.startswith(("Checking ", "FAILED:"))]
    return []


def promtool_version() -> str:
    exe = promtool()
    if exe is None:
        return "no promtool"
    done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    return (done.stdout or done.stderr).splitlines()[0] if (done.stdout or done.stderr) else "promtool"


def rules_test_problems(rule: dict) -> list[str]:
    """`promtool test rules` of RULES_TESTS on a PrometheusRule's groups, and
    every alert of it tested both ways: some test expects it firing, and
    some test expects it silent at a time it is evaluated.

    The groups are written without their annotations: promtool compares
    every annotation of an alert that fires with the test's
    `exp_annotations`, and these tests are about when alerts fire (the
    annotations are checked by `check rules` and against RUNBOOK.md)."""
    exe = promtool()
    if exe is None:
        return ["no promtool: run scripts/deploy-check.sh (it installs one), or set DEPLOY_CHECK_PROMTOOL"]
    if not RULES_TESTS.is_file():
        return [f"{RULES_TESTS.relative_to(ROOT)} is missing: the alerts' unit tests"]
    if "/" in exe:
        exe = str(Path(exe).resolve())  # it runs in the temporary folder
    tests = yaml.safe_load(RULES_TESTS.read_text()) or {}
    problems = []
    if tests.get("rule_files") != [RULES_FILE]:
        problems.append(f"{RULES_TESTS.relative_to(ROOT)}: rule_files must be [{RULES_FILE}] (deploy-check writes the rules there)")
    groups = json.loads(json.dumps((rule.get("spec") or {}).get("groups") or []))
    for group in groups:
        for r in group.get("rules") or []:
            r.pop("annotations", None)
    with tempfile.TemporaryDirectory(prefix="deploy-check-rules-") as tmp:
        (Path(tmp) / RULES_FILE).write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        (Path(tmp) / RULES_TESTS.name).write_text(RULES_TESTS.read_text())
        done = subprocess.run([exe, "test", "rules", RULES_TESTS.name], cwd=tmp, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        problems += [line.rstrip() for line in (done.stdout + done.stderr).splitlines()
                     if line.strip() and not line.startswith("Unit Testing:")]
    fires, silent = set(), set()
    for test in tests.get("tests") or []:
        for case in test.get("alert_rule_test") or []:
            (fires if case.get("exp_alerts") else silent).add(case.get("alertname"))
    for alert in [r["alert"] for g in groups for r in g.get("rules") or [] if r.get("alert")]:
        if alert not in fires:
            problems.append(f"{alert}: no test in {RULES_TESTS.relative_to(ROOT)} expects it to fire")
        if alert not in silent:
            problems.append(f"{alert}: no test in {RULES_TESTS.relative_to(ROOT)} expects it silent")
    return problems
