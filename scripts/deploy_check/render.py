"""Every kustomization under deploy/ rendered by `kubectl kustomize` and validated:
the Kubernetes schemas (kubernetes-validate) and the custom resources' published
ones (crds/), both strict, and promtool for the alerts."""

from __future__ import annotations

import json
import os
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
DEPLOY, CRDS = ROOT / "deploy", Path(__file__).resolve().parent / "crds"
K8S_VERSION = "1.30.0"  # `lifecycle.preStop.sleep` needs 1.30
RULES_TESTS = DEPLOY / "components/monitoring/tests/rules-test.yaml"
# Overlays rendered again with a component swapped (overlay, the one it uses, the
# documented alternative) or added (None: the opt-in console on dev).
VARIANTS = [("overlays/prod/app", "components/relay-keda", "components/relay-hpa"),
            ("overlays/dev", None, "components/console")]


class Render(NamedTuple):
    label: str
    objs: list[dict]
    entry_point: bool  # what an operator applies: an overlay, or what nothing includes


def kubectl(*args: str) -> str:
    exe = os.environ.get("DEPLOY_CHECK_KUBECTL") or "kubectl"  # scripts/deploy-venv.sh provides one
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, check=True).stdout


def render_all() -> tuple[list[Render], list[tuple[str, str]]]:
    """(the renders, [(label, why it failed)])."""
    renders, failures = [], []
    with tempfile.TemporaryDirectory(prefix="deploy-check-") as tmp:
        copy = Path(tmp) / "deploy"
        shutil.copytree(DEPLOY, copy)
        found = {str(p.parent.relative_to(copy)): yaml.safe_load(p.read_text()) or {}
                 for p in sorted(copy.rglob("kustomization.yaml"))}
        inner = {os.path.normpath(f"{label}/{entry}") for label, k in found.items()
                 for entry in (k.get("resources") or []) + (k.get("components") or [])}
        todo = [(label, label, label not in inner or Path(label).parent.name == "overlays")
                for label, k in found.items() if k.get("kind") == "Kustomization"]
        for i, (overlay, used, other) in enumerate(VARIANTS):
            label = f"{overlay} with {other}" + (f" instead of {used}" if used else "")
            used, other = (c and os.path.relpath(DEPLOY / c, DEPLOY / overlay) for c in (used, other))
            components = found[overlay].get("components") or []
            if (used and used not in components) or other in components:
                failures.append((label, f"deploy/{overlay} lists {other}, or not {used}: update VARIANTS"))
                continue
            components = [other if c == used else c for c in components] + [other] * (not used)
            shutil.copytree(copy / overlay, copy / f"{overlay}.variant{i}")
            path = copy / f"{overlay}.variant{i}/kustomization.yaml"
            path.write_text(yaml.safe_dump({**found[overlay], "components": components}))
            todo.append((label, f"{overlay}.variant{i}", True))
        for label, directory, entry_point in todo:
            try:
                objs = [d for d in yaml.safe_load_all(kubectl("kustomize", str(copy / directory))) if d]
                renders.append(Render(label, objs, entry_point))
            except subprocess.CalledProcessError as e:
                failures.append((label, e.stderr.strip().replace(f"{tmp}/", "")))
    return renders, failures


def examples(directory: Path = DEPLOY) -> list[tuple[Path, dict]]:
    """The *.example.yaml files' objects: shapes for the operator, in no kustomization."""
    return [(p, d) for p in sorted(directory.rglob("*.example.yaml"))
            for d in yaml.safe_load_all(p.read_text()) if d is not None]


def ident(obj: dict) -> str:
    return f"{obj.get('kind', '?')}/{(obj.get('metadata') or {}).get('name', '?')}"


def dig(obj, *keys):
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def strict(schema):
    """Unknown fields refused, as by the API server's strict field validation."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    keeps = {"additionalProperties", "x-kubernetes-preserve-unknown-fields"}  # where the CRD keeps them
    if "properties" in out and not keeps & set(out):
        out["additionalProperties"] = False
    return out


@cache
def crds() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    """(apiVersion, kind) -> a validator of the CRD's schema (crds/README.md), strict."""
    out = {}
    for crd in [json.loads(path.read_text()) for path in CRDS.glob("*.json")]:
        schema = strict(crd["openAPIV3Schema"])
        schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is the API server's to check
        out[(f"{crd['group']}/{crd['version']}", crd["kind"])] = jsonschema.Draft7Validator(schema)
    return out


@cache
def schema_problems(text: str) -> tuple[str, ...]:
    """An object's (as JSON: each distinct one validated once, whichever render it is in)."""
    obj = json.loads(text)
    if not isinstance(obj, dict) or "apiVersion" not in obj or "kind" not in obj:
        return ("not a Kubernetes object (apiVersion and kind required)",)
    validator = crds().get((obj["apiVersion"], obj["kind"]))
    try:
        errors = list(validator.iter_errors(obj)) if validator else []
        if validator is None:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kv_utils.SchemaNotFoundError:
        return (f"{ident(obj)}: no schema in Kubernetes {K8S_VERSION} nor in {CRDS.name}/",)
    except kv_utils.ValidationError as e:
        errors = [e]
    # One line per problem, though several schema branches may report it.
    return tuple(dict.fromkeys(f"{ident(obj)} at {'.'.join(map(str, e.absolute_path)) or '(top)'}: "
                               f"{e.message}" for e in errors))


def promtool(*args: str, cwd: str) -> list[str]:
    """Its output if it failed, else []."""
    exe = os.environ.get("DEPLOY_CHECK_PROMTOOL") or "promtool"
    exe = str(Path(exe).resolve()) if "/" in exe else exe  # it runs in a temporary folder
    done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, cwd=cwd)
    return (done.stdout + done.stderr).strip().splitlines() if done.returncode else []


@cache
def rules_problems(text: str) -> tuple[str, ...]:
    """`promtool check rules` on a PrometheusRule's groups (as JSON), `test rules` with RULES_TESTS."""
    groups, tests = json.loads(text), yaml.safe_load(RULES_TESTS.read_text())
    # The tests without annotations: promtool would compare all of a firing alert's with
    # `exp_annotations`, and the tests are about when alerts fire.
    bare = [{**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]}
            for g in groups]
    with tempfile.TemporaryDirectory(prefix="deploy-check-rules-") as tmp:
        (Path(tmp) / "prometheusrule.yaml").write_text(yaml.safe_dump({"groups": groups}))
        for name in tests.get("rule_files") or []:
            (Path(tmp) / name).write_text(yaml.safe_dump({"groups": bare}))
        shutil.copy(RULES_TESTS, tmp)
        return tuple(promtool("check", "rules", "prometheusrule.yaml", cwd=tmp)
                     + promtool("test", "rules", RULES_TESTS.name, cwd=tmp))
