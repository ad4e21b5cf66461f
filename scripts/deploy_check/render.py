"""What gets checked: every kustomization under deploy/, rendered by
`kubectl kustomize` (kustomize itself, so hash suffixes, patches and
components are exactly what `kubectl apply -k` sends)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

# Components no overlay uses because they are the documented alternative to
# one that is: (overlay, the component it uses, the alternative). The overlay
# is rendered a second time with the swap made.
ALTERNATIVES = [("overlays/prod/app", "components/relay-keda", "components/relay-hpa")]
# Components an overlay leaves out because they are opt-in, and the README
# says how to add them: (overlay, the component). The overlay is rendered a
# second time with it added (overlays/prod-console shows prod with the
# console; this shows dev with it, as the quick look describes).
OPT_INS = [("overlays/dev", "components/console")]


class RenderError(Exception):
    pass


@dataclass
class Render:
    label: str
    objs: list[dict]
    # What an operator applies, so the checks against the code run on it: a
    # kustomization no other one includes, and every overlay (deploy/overlays/
    # NAME), even one another overlay builds on (overlays/prod, under
    # overlays/prod-cnpg).
    entry_point: bool


def kubectl() -> str:
    exe = os.environ.get("DEPLOY_CHECK_KUBECTL") or shutil.which("kubectl")
    if not exe:
        raise RenderError("no kubectl: run scripts/deploy-check.sh (it finds or installs one), or set DEPLOY_CHECK_KUBECTL")
    return exe


def kubectl_version() -> str:
    done = subprocess.run([kubectl(), "version", "--client"], capture_output=True, text=True, timeout=30)
    return " ".join(done.stdout.split()) or done.stderr.strip()


def kustomize(directory: Path) -> list[dict]:
    done = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RenderError(done.stderr.strip() or f"kubectl kustomize exited {done.returncode}")
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


def kustomizations() -> dict[str, dict]:
    """deploy/-relative directory -> its kustomization.yaml as written."""
    out = {}
    for path in sorted(DEPLOY.rglob("kustomization.yaml"), key=lambda p: p.parent.parts):
        out[str(path.parent.relative_to(DEPLOY))] = yaml.safe_load(path.read_text()) or {}
    return out


def included(all_k: dict[str, dict]) -> set[str]:
    """The kustomizations another one lists as a resource or component."""
    out = set()
    for label, k in all_k.items():
        for entry in (k.get("resources") or []) + (k.get("components") or []):
            target = (DEPLOY / label / entry).resolve()
            if target.is_dir():
                out.add(str(target.relative_to(DEPLOY)))
    return out


def annotated_copy(tmp: Path) -> Path:
    """deploy/ copied to tmp, each kustomization asking kustomize to record
    where every object comes from (config.kubernetes.io/origin), so that a
    failure names the file to fix."""
    copy = tmp / "deploy"
    shutil.copytree(DEPLOY, copy)
    for path in copy.rglob("kustomization.yaml"):
        k = yaml.safe_load(path.read_text()) or {}
        k["buildMetadata"] = sorted(set(k.get("buildMetadata") or []) | {"originAnnotations"})
        path.write_text(yaml.safe_dump(k, sort_keys=False))
    return copy


def take_origin(obj: dict, rendered: Path, copy: Path) -> dict:
    """Moves kustomize's origin annotation to obj["_source"]: the file under
    deploy/ it comes from."""
    meta = obj.setdefault("metadata", {})
    annotations = meta.get("annotations") or {}
    origin = yaml.safe_load(annotations.pop("config.kubernetes.io/origin", "") or "{}") or {}
    if not annotations:
        meta.pop("annotations", None)
    where = origin.get("path") or origin.get("configuredIn")
    if where:
        where = "deploy/" + re.sub(r"\.(alternative|opt-in)\d+", "", os.path.relpath((rendered / where).resolve(), copy.resolve()))
    obj["_source"] = where or "?"
    return obj


def swap_component(copy: Path, overlay: str, used: str, alternative: str) -> None:
    path = copy / overlay / "kustomization.yaml"
    k = yaml.safe_load(path.read_text())
    rel_used = os.path.relpath(DEPLOY / used, DEPLOY / overlay)
    if rel_used not in (k.get("components") or []):
        raise RenderError(f"deploy/{overlay} no longer lists the component {rel_used}: update ALTERNATIVES")
    k["components"] = [os.path.relpath(DEPLOY / alternative, DEPLOY / overlay) if c == rel_used else c
                       for c in k["components"]]
    path.write_text(yaml.safe_dump(k, sort_keys=False))


def add_component(copy: Path, overlay: str, component: str) -> None:
    path = copy / overlay / "kustomization.yaml"
    k = yaml.safe_load(path.read_text())
    rel = os.path.relpath(DEPLOY / component, DEPLOY / overlay)
    if rel in (k.get("components") or []):
        raise RenderError(f"deploy/{overlay} lists the opt-in component {rel} already: update OPT_INS")
    k["components"] = (k.get("components") or []) + [rel]
    path.write_text(yaml.safe_dump(k, sort_keys=False))


def render_all() -> tuple[list[Render], list[tuple[str, str]]]:
    """(the renders, [(label, why it failed)]). Each object carries `_source`,
    the file it comes from (remove it before validating)."""
    all_k = kustomizations()
    inner = included(all_k)
    todo = [(label, label, label not in inner or Path(label).parent == Path("overlays"))
            for label, k in all_k.items() if k.get("kind") == "Kustomization"]
    todo += [(f"{o} with {a} instead of {u}", f"{o}.alternative{i}", True) for i, (o, u, a) in enumerate(ALTERNATIVES)]
    todo += [(f"{o} with {c}", f"{o}.opt-in{i}", True) for i, (o, c) in enumerate(OPT_INS)]
    renders, failures = [], []
    with tempfile.TemporaryDirectory(prefix="deploy-check-") as tmp:
        copy = annotated_copy(Path(tmp))
        for i, (overlay, used, alternative) in enumerate(ALTERNATIVES):
            shutil.copytree(copy / overlay, copy / f"{overlay}.alternative{i}")
            try:
                swap_component(copy, f"{overlay}.alternative{i}", used, alternative)
            except RenderError as e:
                failures.append((f"{overlay} with {alternative}", str(e)))
        for i, (overlay, component) in enumerate(OPT_INS):
            shutil.copytree(copy / overlay, copy / f"{overlay}.opt-in{i}")
            try:
                add_component(copy, f"{overlay}.opt-in{i}", component)
            except RenderError as e:
                failures.append((f"{overlay} with {component}", str(e)))
        for label, directory, entry_point in todo:
            try:
                objs = kustomize(copy / directory)
                renders.append(Render(label, [take_origin(o, copy / directory, copy) for o in objs], entry_point))
            except RenderError as e:
                failures.append((label, str(e).replace(tmp + "/", "")))
    return renders, failures


def examples() -> list[tuple[Path, dict]]:
    """The *.example.yaml files: shapes for the operator, in no kustomization."""
    return [(p, d) for p in sorted(DEPLOY.rglob("*.example.yaml"))
            for d in yaml.safe_load_all(p.read_text()) if d is not None]
