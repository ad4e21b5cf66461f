"""Every kustomization under deploy/, rendered by `kubectl kustomize`
(kustomize itself: hash suffixes, patches and components as `kubectl apply
-k` sends them), and validated: the Kubernetes OpenAPI schemas
(kubernetes-validate, strict: an unknown field fails), the published schemas
of the custom resources we use (crds/, see crds/README.md), and promtool for
the alerts: `check rules`, and `test rules` with the unit tests beside them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import NamedTuple

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils as kv_utils
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CRDS = Path(__file__).resolve().parent / "crds"

# Overlays rendered a second time with a component swapped, (overlay, the
# component it uses, the documented alternative), or added, (overlay, None,
# an opt-in component the README says how to add: prod-console shows prod
# with the console, this shows dev with it, as the quick look describes).
VARIANTS = [("overlays/prod/app", "components/relay-keda", "components/relay-hpa"),
            ("overlays/dev", None, "components/console")]


class RenderError(Exception):
    pass


class Render(NamedTuple):
    label: str
    objs: list[dict]
    # What an operator applies, so the checks against the code run on it: a
    # kustomization no other one includes, and every overlay (deploy/overlays/
    # NAME), even one another overlay builds on (overlays/prod, under
    # overlays/prod-cnpg).
    entry_point: bool


def kubectl(*args: str) -> str:
    exe = os.environ.get("DEPLOY_CHECK_KUBECTL") or "kubectl"  # scripts/deploy-check.sh finds or installs one
    done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RenderError(done.stderr.strip() or f"kubectl {args[0]} exited {done.returncode}")
    return done.stdout


def render_all() -> tuple[list[Render], list[tuple[str, str]]]:
    """(the renders, [(label, why it failed)]). Each object carries `_source`."""
    renders, failures = [], []
    with tempfile.TemporaryDirectory(prefix="deploy-check-") as tmp:
        # deploy/ copied, each kustomization asking for origin annotations.
        copy = Path(tmp) / "deploy"
        shutil.copytree(DEPLOY, copy)
        written = {}
        for path in sorted(copy.rglob("kustomization.yaml"), key=lambda p: p.parent.parts):
            k = written[str(path.parent.relative_to(copy))] = yaml.safe_load(path.read_text()) or {}
            path.write_text(yaml.safe_dump({**k, "buildMetadata": ["originAnnotations"]}, sort_keys=False))
        # Those another one lists as a resource or component.
        inner = {str((copy / label / entry).resolve().relative_to(copy.resolve()))
                 for label, k in written.items() for entry in (k.get("resources") or []) + (k.get("components") or [])
                 if (copy / label / entry).is_dir()}
        todo = [(label, label, label not in inner or Path(label).parent == Path("overlays"))
                for label, k in written.items() if k.get("kind") == "Kustomization"]
        for i, (overlay, used, other) in enumerate(VARIANTS):
            label = f"{overlay} with {other}" + (f" instead of {used}" if used else "")
            path = copy / f"{overlay}.variant{i}" / "kustomization.yaml"
            shutil.copytree(copy / overlay, path.parent)
            k = yaml.safe_load(path.read_text())
            components = k.get("components") or []
            rel_used, rel_other = (os.path.relpath(DEPLOY / c, DEPLOY / overlay) if c else None for c in (used, other))
            if (rel_used and rel_used not in components) or rel_other in components:
                failures.append((label, f"deploy/{overlay} lists {rel_other}, or not {rel_used}: update VARIANTS"))
                continue
            k["components"] = [rel_other if c == rel_used else c for c in components] + [rel_other] * (not rel_used)
            path.write_text(yaml.safe_dump(k, sort_keys=False))
            todo.append((label, str(path.parent.relative_to(copy)), True))
        for label, directory, entry_point in todo:
            try:
                objs = [d for d in yaml.safe_load_all(kubectl("kustomize", str(copy / directory))) if d is not None]
            except RenderError as e:
                failures.append((label, str(e).replace(tmp + "/", "")))
                continue
            for obj in objs:  # kustomize's origin annotation, moved to `_source`: the file under deploy/ to fix
                annotations = obj.setdefault("metadata", {}).get("annotations") or {}
                origin = yaml.safe_load(annotations.pop("config.kubernetes.io/origin", "") or "{}") or {}
                where = origin.get("path") or origin.get("configuredIn")
                where = where and os.path.relpath((copy / directory / where).resolve(), copy.resolve())
                obj["_source"] = "deploy/" + re.sub(r"\.variant\d+", "", where) if where else "?"
            renders.append(Render(label, objs, entry_point))
    return renders, failures


def examples(directory: Path = DEPLOY) -> list[tuple[Path, dict]]:
    """The *.example.yaml files' objects: shapes for the operator, in no kustomization."""
    return [(p, d) for p in sorted(directory.rglob("*.example.yaml"))
            for d in yaml.safe_load_all(p.read_text()) if d is not None]


# The Kubernetes version the manifests target: `lifecycle.preStop.sleep`
# needs 1.30 (beta, on by default).
K8S_VERSION = "1.30.0"
# The alerts' unit tests (promtool test rules): the rules are written where
# its rule_files say.
RULES_TESTS = ROOT / "deploy/components/monitoring/tests/rules-test.yaml"


def ident(obj: dict) -> str:
    """Kind/name, and the file it comes from once rendered."""
    name = f"{obj.get('kind', '?')}/{(obj.get('metadata') or {}).get('name', '?')}"
    return f"{name} ({obj['_source']})" if "_source" in obj else name


def dig(obj, *keys):
    """obj[key][key]..., or None where one is missing."""
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def strict(schema):
    """A CRD schema that rejects unknown fields, as the API server's strict
    field validation does (except where the CRD keeps unknown fields)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if "properties" in out and not {"additionalProperties", "x-kubernetes-preserve-unknown-fields"} & set(out):
        out["additionalProperties"] = False
    return out


@cache
def crds() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the CRD file's content, with a validator of its schema made strict."""
    out = {}
    for crd in [json.loads(path.read_text()) for path in sorted(CRDS.glob("*.json"))]:
        schema = strict(crd["openAPIV3Schema"])
        schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is the API server's to check
        crd["validator"] = jsonschema.Draft7Validator(schema)
        out[(f"{crd['group']}/{crd['version']}", crd["kind"])] = crd
    return out


@cache
def _schema_problems(text: str) -> tuple[str, ...]:
    obj = json.loads(text)
    if not isinstance(obj, dict) or "apiVersion" not in obj or "kind" not in obj:
        return ("not a Kubernetes object (apiVersion and kind required)",)
    crd = crds().get((obj["apiVersion"], obj["kind"]))
    errors = sorted(crd["validator"].iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))) if crd else []
    try:
        if crd is None:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kv_utils.SchemaNotFoundError:
        return (f"{ident(obj)}: no schema for {obj['apiVersion']} {obj['kind']} in Kubernetes {K8S_VERSION} "
                f"nor in {CRDS.name}/ (add the CRD's published schema there)",)
    except kv_utils.ValidationError as e:
        errors = [e]
    # One line per problem, though several schema branches may report it.
    return tuple(dict.fromkeys(f"{ident(obj)} at {'.'.join(map(str, e.absolute_path)) or '(top level)'}: "
                               f"{e.message}" for e in errors))


def schema_problems(obj: dict) -> list[str]:
    """Each distinct object validated once, whichever render it is in."""
    return list(_schema_problems(json.dumps({k: v for k, v in obj.items() if k != "_source"}, sort_keys=True)))


def promtool(*args: str, cwd: str | None = None, quiet: bool = True) -> list[str]:  # its output, if it failed
    exe = os.environ.get("DEPLOY_CHECK_PROMTOOL") or "promtool"
    exe = str(Path(exe).resolve()) if "/" in exe else exe  # it runs in a temporary folder
    done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, cwd=cwd)
    return [] if quiet and done.returncode == 0 else [
        line.rstrip() for line in (done.stdout + done.stderr).splitlines()
        if line.strip() and not line.startswith(("Checking ", "Unit Testing:", "FAILED:"))]


@cache
def _rules_problems(text: str) -> tuple[list[str], list[str]]:
    groups, tests = json.loads(text), yaml.safe_load(RULES_TESTS.read_text())
    with tempfile.TemporaryDirectory(prefix="deploy-check-rules-") as tmp:
        (Path(tmp) / "all.rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        checked = promtool("check", "rules", "all.rules.yaml", cwd=tmp)
        # Without the annotations: promtool compares every annotation of an
        # alert that fires with the test's `exp_annotations`, and these tests
        # are about when alerts fire (`check rules` and RUNBOOK.md check them).
        bare = [{**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g.get("rules") or []]}
                for g in groups]
        for name in tests.get("rule_files") or []:
            (Path(tmp) / name).write_text(yaml.safe_dump({"groups": bare}, sort_keys=False))
        (Path(tmp) / RULES_TESTS.name).write_text(RULES_TESTS.read_text())
        tested = promtool("test", "rules", RULES_TESTS.name, cwd=tmp)
    # Every alert tested both ways: some test expects it firing, and some
    # test expects it silent at a time it is evaluated.
    cases = [case for test in tests.get("tests") or [] for case in test.get("alert_rule_test") or []]
    tested += [f"{alert}: no test in {RULES_TESTS.relative_to(ROOT)} expects it {way}"
               for alert in [r["alert"] for g in groups for r in g.get("rules") or [] if r.get("alert")]
               for expected, way in ((True, "to fire"), (False, "silent"))
               if not any(c.get("alertname") == alert and bool(c.get("exp_alerts")) == expected for c in cases)]
    return checked, tested


def rules_problems(rule: dict) -> tuple[list[str], list[str]]:
    """(`promtool check rules`, `promtool test rules` of RULES_TESTS) on a PrometheusRule's groups."""
    checked, tested = _rules_problems(json.dumps((rule.get("spec") or {}).get("groups") or []))
    return [p.strip().replace("all.rules.yaml", ident(rule)) for p in checked], tested
