#!/usr/bin/env python3
"""Offline checks of the Kubernetes manifests under deploy/ (`make deploy-check`).

Nothing is applied and no cluster is needed: kubectl and kustomize are not
available here, so this script renders the kustomizations itself (the subset
of kustomize the manifests use) and checks the result.

What it checks:
- every object against the Kubernetes OpenAPI schemas of K8S_VERSION in
  strict mode (kubernetes-validate: unknown fields fail), both the files as
  written and every kustomization as rendered (so a typo in a patch fails);
- the custom resources the schemas do not know (ServiceMonitor,
  PrometheusRule, ScaledObject, TriggerAuthentication) and the kustomization
  files with small hand-written structure checks;
- the invariants that keep manifests and code in step: environment variables
  against the binaries' `--help`, ports and probe paths against their
  defaults, pod hygiene (probes, limits, non-root, read-only root), grace
  periods against the configured timeouts, the KEDA query against
  crates/outbox-relay/sql/count_due.sql, no Secret in any kustomization,
  selectors that select something, alerts that name real metrics.

What it cannot check: that the objects are accepted by a real API server
(admission, defaulting, CRD versions installed), kustomize's exact output
(name hashes, ordering), PromQL semantics, and anything about the cluster
(namespaces, CNI, controllers).

# Layout
- `Report`: one line per check, then a summary; exit status 1 on any failure.
- `Cli`, `read_cli`: the variables and defaults a binary accepts, from `--help`.
- `Renderer`: resources, components, patches (strategic merge, by name),
  configMapGenerator, namespace, labels, images. Anything else fails loudly.
- `check_*`: the schema and invariant checks, each returning problems.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

try:
    import kubernetes_validate
    import kubernetes_validate.utils as kv_utils
    import yaml
except ImportError as e:  # pragma: no cover - environment problem
    sys.stderr.write(
        f"deploy-check: missing Python package ({e.name}); run scripts/deploy-check.sh, "
        "which installs kubernetes-validate and pyyaml in target/deploy-check-venv\n"
    )
    sys.exit(2)

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COUNT_DUE_SQL = ROOT / "crates/outbox-relay/sql/count_due.sql"
RUNBOOK = DEPLOY / "RUNBOOK.md"

# The Kubernetes version the manifests target: `lifecycle.preStop.sleep` needs
# 1.30 (beta, on by default).
K8S_VERSION = "1.30.0"

OUR_BINARIES = ("webhook-ingest", "outbox-relay")
# Read by the OpenTelemetry SDK or the log filter, not by clap.
ALWAYS_ACCEPTED = re.compile(r"^(OTEL_[A-Z0-9_]+|RUST_LOG)$")

# Used only when a binary is not built and DEPLOY_CHECK_ALLOW_MISSING_BINARIES=1:
# the documented variables (README, Configuration) (and their defaults). The real `--help`
# always wins once the binary exists.
DOCUMENTED_VARIABLES = {
    "webhook-ingest": {
        "DATABASE_URL": None,
        "DATABASE_POOL_SIZE": "16",
        "INGEST_LISTEN_ADDR": "0.0.0.0:8080",
        "ADMIN_LISTEN_ADDR": "0.0.0.0:9090",
        "WEBHOOK_SIGNATURE_SCHEME": "standard",
        "WEBHOOK_SECRETS": None,
        "WEBHOOK_TOLERANCE_SECS": "300",
        "INGEST_DEADLINE_MS": "5000",
        "LOG_FORMAT": "json",
    },
    "outbox-relay": {
        "DATABASE_URL": None,
        "DATABASE_POOL_SIZE": "8",
        "ADMIN_LISTEN_ADDR": "0.0.0.0:9090",
        "FULFILMENT_URL": None,
        "EMAIL_URL": None,
        "RELAY_BATCH_SIZE": "50",
        "RELAY_CONCURRENCY": "32",
        "RELAY_LEASE_SECS": "60",
        "RELAY_HTTP_TIMEOUT_MS": "10000",
        "RELAY_MAX_ATTEMPTS": "25",
        "RELAY_BACKOFF_BASE_MS": "1000",
        "RELAY_BACKOFF_MAX_SECS": "3600",
        "RELAY_POLL_INTERVAL_MS": "1000",
        "RETENTION_DAYS": "7",
        "RELAY_PRUNE_INTERVAL_SECS": "600",
        "RELAY_LISTEN": "true",
        "RELAY_LISTEN_DATABASE_URL": None,
        "RELAY_ID": None,
        "LOG_FORMAT": "json",
    },
}

# Variables a command cannot start without (no default), by (binary, subcommand).
REQUIRED_VARIABLES = {
    ("webhook-ingest", ()): ["DATABASE_URL", "WEBHOOK_SECRETS"],
    ("webhook-ingest", ("serve",)): ["DATABASE_URL", "WEBHOOK_SECRETS"],
    ("webhook-ingest", ("migrate",)): ["DATABASE_URL"],
    ("outbox-relay", ()): ["DATABASE_URL", "FULFILMENT_URL", "EMAIL_URL"],
}

# The admin endpoints (crates/process/src/admin.rs) and the ports' names in
# the manifests.
HEALTHZ, READYZ, METRICS = "/healthz", "/readyz", "/metrics"

# The documented metric names and label values.
INGEST_OUTCOMES = {
    "processed", "refunded", "ignored", "unmatched", "already_paid", "order_refunded",
    "duplicate", "invalid_signature", "malformed", "too_large", "unavailable", "internal_error",
}
DISPATCH_KINDS = {"ship_order", "send_confirmation", "send_refund_notice"}
DISPATCH_OUTCOMES = {"done", "retry", "dead"}
COUNTERS = {"webhook_requests_total", "outbox_dispatch_total"}
GAUGES = {"outbox_pending", "outbox_oldest_pending_age_seconds", "outbox_dead"}
HISTOGRAMS = {"webhook_request_duration_seconds", "outbox_dispatch_duration_seconds", "outbox_enqueue_to_done_seconds"}
# Ours beyond the documented list: the relay's periodic pruner.
EXTRA_COUNTERS = {"outbox_prune_runs_total", "outbox_pruned_rows_total"}
KNOWN_SERIES = (COUNTERS | GAUGES | EXTRA_COUNTERS
                | {h + s for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")})
LABEL_VALUES = {
    "webhook_requests_total": {"outcome": INGEST_OUTCOMES},
    "outbox_dispatch_total": {"kind": DISPATCH_KINDS, "outcome": DISPATCH_OUTCOMES},
    "outbox_dispatch_duration_seconds_bucket": {"kind": DISPATCH_KINDS},
    "outbox_dispatch_duration_seconds_count": {"kind": DISPATCH_KINDS},
    "outbox_dispatch_duration_seconds_sum": {"kind": DISPATCH_KINDS},
    "outbox_prune_runs_total": {"result": {"pruned", "locked_out", "failed"}},
    "outbox_pruned_rows_total": {"table": {"outbox", "processed_events"}},
}

# Components no overlay uses because they are the documented alternative to
# one that is: checked by rendering the overlay with the swap made.
ALTERNATIVE_COMPONENTS = {
    "components/relay-hpa": ("overlays/prod/app", "components/relay-keda"),
}

PLACEHOLDER = "REPLACE_ME"
EXAMPLE_SUFFIXES = (".example.yaml", ".example.yml")

WORKLOAD_TEMPLATE = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
LONG_RUNNING = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"}
CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PriorityClass",
    "StorageClass", "PersistentVolume", "IngressClass", "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration", "APIService",
}


# --------------------------------------------------------------------------
# Reporting


class Report:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0
        self.skipped = 0

    def check(self, name: str, problems: list[str], detail: str = "") -> bool:
        if problems:
            self.failed += 1
            print(f"FAIL  {name}")
            for p in problems:
                print(f"        - {p}")
            return False
        self.passed += 1
        print(f"ok    {name}" + (f" ({detail})" if detail else ""))
        return True

    def skip(self, name: str, reason: str) -> None:
        self.skipped += 1
        print(f"SKIP  {name}: {reason}")

    def summary(self) -> int:
        line = f"deploy-check: {self.passed} passed, {self.failed} failed"
        if self.skipped:
            line += f", {self.skipped} skipped"
        print(line)
        if self.failed:
            print("deploy-check: FAILED (see the FAIL lines above)", file=sys.stderr)
            return 1
        return 0


def rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def ident(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind', '?')}/{meta.get('name', '?')}"


# --------------------------------------------------------------------------
# The binaries' configuration, from `--help`


@dataclass
class Cli:
    binary: str
    subcommand: tuple[str, ...]
    variables: dict[str, str | None]  # NAME -> default (None: no default)
    source: str  # the command it was read from, or why the fallback is used

    def accepts(self, name: str) -> bool:
        return name in self.variables or bool(ALWAYS_ACCEPTED.match(name))


ENV_MARK = re.compile(r"\[env: ([A-Za-z_][A-Za-z0-9_]*)(?:=[^\]]*)?\](?: \[default: ([^\]]*)\])?")


def parse_help(text: str) -> dict[str, str | None]:
    """`[env: NAME=...]` and the `[default: ...]` clap prints right after it.

    Whitespace is normalised first, so help wrapped to a terminal's width
    parses the same as unwrapped help.
    """
    flat = re.sub(r"\s+", " ", text)
    return {m.group(1): m.group(2) for m in ENV_MARK.finditer(flat)}


class Binaries:
    def __init__(self, bindir: Path, allow_missing: bool) -> None:
        self.bindir = bindir
        self.allow_missing = allow_missing
        self.cache: dict[tuple[str, tuple[str, ...]], tuple[Cli | None, str | None]] = {}

    def path(self, binary: str) -> Path:
        return self.bindir / binary

    def cli(self, binary: str, subcommand: tuple[str, ...] = ()) -> tuple[Cli | None, str | None]:
        """(Cli, None), or (fallback Cli or None, the problem)."""
        key = (binary, subcommand)
        if key not in self.cache:
            self.cache[key] = self._read(binary, subcommand)
        return self.cache[key]

    def _read(self, binary: str, subcommand: tuple[str, ...]) -> tuple[Cli | None, str | None]:
        exe = self.path(binary)
        if not exe.exists():
            # The other checks go on against the documented variables, so the
            # one failure reported is this one.
            problem = f"{binary} binary not built yet ({rel(exe)}): build it (make build) or set DEPLOY_CHECK_ALLOW_MISSING_BINARIES=1"
            return Cli(binary, subcommand, dict(DOCUMENTED_VARIABLES[binary]), "the documented variables (binary missing)"), problem
        command = [str(exe), *subcommand, "--help"]
        # A clean environment: clap prints the current value of a variable that
        # is set ([env: NAME=value]); none must leak in (or out, for secrets).
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30, env=env)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"`{' '.join([binary, *subcommand])} --help` could not run: {e}"
        if done.returncode != 0:
            return None, f"`{' '.join([binary, *subcommand])} --help` exited {done.returncode}: {done.stderr.strip()[:300]}"
        variables = parse_help(done.stdout)
        if not variables:
            return None, f"`{' '.join([binary, *subcommand])} --help` lists no [env: NAME] (clap `env` attributes missing?)"
        return Cli(binary, subcommand, variables, f"{' '.join([binary, *subcommand])} --help"), None


# --------------------------------------------------------------------------
# YAML files


def load_docs(path: Path) -> list:
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def is_example(path: Path) -> bool:
    return path.name.endswith(EXAMPLE_SUFFIXES)


KUSTOMIZATION_NAMES = ("kustomization.yaml", "kustomization.yml", "Kustomization")


def kustomization_file(directory: Path) -> Path | None:
    for name in KUSTOMIZATION_NAMES:
        if (directory / name).is_file():
            return directory / name
    return None


# --------------------------------------------------------------------------
# A small kustomize


class RenderError(Exception):
    pass


SUPPORTED_KUSTOMIZATION_FIELDS = {
    "apiVersion", "kind", "metadata", "resources", "components", "patches",
    "configMapGenerator", "namespace", "labels", "images",
}
# Valid kustomize, but not emulated here: fail rather than check something else
# than what kubectl would render.
UNSUPPORTED_KUSTOMIZATION_FIELDS = {
    "secretGenerator": "no Secret may be generated: the operator creates them (see *.example.yaml)",
    "commonLabels": "deprecated; use `labels` (with includeSelectors: false)",
    "commonAnnotations": "not emulated by deploy-check",
    "namePrefix": "not emulated by deploy-check",
    "nameSuffix": "not emulated by deploy-check",
    "patchesStrategicMerge": "deprecated; use `patches`",
    "patchesJson6902": "deprecated; use `patches` (strategic merge)",
    "replicas": "not emulated by deploy-check (and autoscalers own replicas)",
    "replacements": "not emulated by deploy-check",
    "vars": "deprecated",
    "generatorOptions": "not emulated by deploy-check",
    "helmCharts": "not renderable by plain `kubectl kustomize`",
    "generators": "plugins are not renderable by plain `kubectl kustomize`",
    "transformers": "plugins are not renderable by plain `kubectl kustomize`",
    "validators": "plugins are not renderable by plain `kubectl kustomize`",
    "crds": "not emulated by deploy-check",
    "configurations": "not emulated by deploy-check",
    "openapi": "not emulated by deploy-check",
    "sortOptions": "not emulated by deploy-check",
    "buildMetadata": "not emulated by deploy-check",
}

# Strategic-merge keys of the lists the patches here touch; other lists are
# replaced whole, as kustomize does for lists without a merge key.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "topologySpreadConstraints": "topologyKey",
    "hostAliases": "ip",
}


def strategic_merge(base, patch, key: str | None = None):
    if isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
        if patch.get("$patch") == "delete":
            return None
        if not isinstance(base, dict):
            base = {}
        out = dict(base)
        for k, v in patch.items():
            if k.startswith("$"):
                continue
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = strategic_merge(out[k], v, k)
            else:
                out[k] = strip_directives(copy.deepcopy(v))
        return out
    if isinstance(patch, list):
        merge_key = MERGE_KEYS.get(key or "")
        if key == "ports" and patch and isinstance(patch[0], dict):
            merge_key = "containerPort" if "containerPort" in patch[0] else "port"
        if merge_key and isinstance(base, list) and all(isinstance(i, dict) for i in patch):
            out = [copy.deepcopy(i) for i in base]
            for item in patch:
                match = next((i for i, b in enumerate(out) if b.get(merge_key) == item.get(merge_key)), None)
                if item.get("$patch") == "delete":
                    if match is not None:
                        out.pop(match)
                elif match is None:
                    out.append(strip_directives(copy.deepcopy(item)))
                else:
                    out[match] = strategic_merge(out[match], item, None)
            return out
        return strip_directives(copy.deepcopy(patch))
    return patch


def strip_directives(value):
    if isinstance(value, dict):
        return {k: strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [strip_directives(v) for v in value]
    return value


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_env_file(path: Path) -> dict[str, str]:
    """kustomize's `envs` format: KEY=VALUE lines, `#` comment lines."""
    data = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.lstrip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise RenderError(f"{rel(path)}:{n}: `{line}` has no `=` (kustomize would read the value from its own environment)")
        name, value = line.split("=", 1)
        if not ENV_NAME.match(name):
            raise RenderError(f"{rel(path)}:{n}: `{name}` is not a valid variable name")
        if name in data:
            raise RenderError(f"{rel(path)}:{n}: `{name}` set twice")
        data[name] = value
    return data


@dataclass
class Usage:
    """How kustomizations use the files under deploy/."""

    roles: dict[Path, set[str]] = field(default_factory=dict)
    components_used: set[Path] = field(default_factory=set)
    kustomizations_included: set[Path] = field(default_factory=set)

    def mark(self, path: Path, role: str) -> None:
        self.roles.setdefault(path.resolve(), set()).add(role)


class Renderer:
    def __init__(self, usage: Usage) -> None:
        self.usage = usage
        # Objects written in patches, by file, to validate loosely.
        self.patch_docs: dict[tuple[str, str], dict] = {}

    def load_kustomization(self, directory: Path, expected_kind: str) -> dict:
        path = kustomization_file(directory)
        if path is None:
            raise RenderError(f"{rel(directory)} has no kustomization.yaml")
        self.usage.mark(path, "kustomization")
        docs = load_docs(path)
        if len(docs) != 1 or not isinstance(docs[0], dict):
            raise RenderError(f"{rel(path)}: expected one YAML mapping")
        k = docs[0]
        problems = check_kustomization_structure(k, expected_kind)
        if problems:
            raise RenderError(f"{rel(path)}: " + "; ".join(problems))
        return k

    def build(self, directory: Path, overrides: dict[Path, Path] | None = None, stack: tuple = ()) -> list[dict]:
        directory = directory.resolve()
        if directory in stack:
            raise RenderError(f"cycle: {' -> '.join(rel(d) for d in (*stack, directory))}")
        k = self.load_kustomization(directory, "Kustomization")
        return self.accumulate(directory, k, [], overrides or {}, (*stack, directory))

    def file_in(self, directory: Path, name: str) -> Path:
        # kustomize's default load restrictor: files must sit in or under the
        # kustomization's directory (other kustomizations may be anywhere).
        path = (directory / name).resolve()
        if directory not in path.parents:
            raise RenderError(f"{rel(directory)}: file `{name}` is outside the kustomization's directory (kustomize refuses it)")
        if not path.is_file():
            raise RenderError(f"{rel(directory)}: `{name}` does not exist")
        return path

    def accumulate(self, directory: Path, k: dict, acc: list[dict], overrides: dict, stack: tuple) -> list[dict]:
        for entry in k.get("resources") or []:
            if not isinstance(entry, str) or "://" in entry or entry.startswith("github.com/"):
                raise RenderError(f"{rel(directory)}: resource `{entry}` is not a local path (remote bases are not checked)")
            target = (directory / entry).resolve()
            if target.is_dir():
                self.usage.kustomizations_included.add(target)
                acc.extend(self.build(target, overrides, stack))
            else:
                path = self.file_in(directory, entry)
                self.usage.mark(path, "resource")
                for doc in load_docs(path):
                    if not isinstance(doc, dict):
                        raise RenderError(f"{rel(path)}: a document is not a mapping")
                    acc.append(copy.deepcopy(doc))
        for entry in k.get("components") or []:
            target = (directory / entry).resolve()
            target = overrides.get(target, target)
            if not target.is_dir():
                raise RenderError(f"{rel(directory)}: component `{entry}` is not a directory")
            self.usage.components_used.add(target)
            ck = self.load_kustomization(target, "Component")
            acc = self.accumulate(target, ck, acc, overrides, (*stack, target))
        self.generate(directory, k, acc)
        self.transform(directory, k, acc)
        return acc

    def generate(self, directory: Path, k: dict, acc: list[dict]) -> None:
        for gen in k.get("configMapGenerator") or []:
            name = gen.get("name")
            if not name:
                raise RenderError(f"{rel(directory)}: configMapGenerator entry without a name")
            data: dict[str, str] = {}
            for env_file in gen.get("envs") or []:
                path = self.file_in(directory, env_file)
                self.usage.mark(path, "env")
                data.update(parse_env_file(path))
            for literal in gen.get("literals") or []:
                if "=" not in literal:
                    raise RenderError(f"{rel(directory)}: literal `{literal}` has no `=`")
                key, value = literal.split("=", 1)
                data[key] = value
            for file_entry in gen.get("files") or []:
                key, _, file_name = file_entry.rpartition("=")
                path = self.file_in(directory, file_name)
                self.usage.mark(path, "data")
                data[key or path.name] = path.read_text()
            unknown = set(gen) - {"name", "envs", "literals", "files", "behavior", "namespace", "options"}
            if unknown:
                raise RenderError(f"{rel(directory)}: configMapGenerator {name}: unsupported fields {sorted(unknown)}")
            behavior = gen.get("behavior", "create")
            existing = [o for o in acc if o.get("kind") == "ConfigMap" and o["metadata"].get("name") == name]
            if behavior == "create":
                if existing:
                    raise RenderError(f"{rel(directory)}: ConfigMap {name} generated twice (use behavior: merge)")
                acc.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
            elif behavior in ("merge", "replace"):
                if not existing:
                    raise RenderError(f"{rel(directory)}: configMapGenerator {name} has behavior {behavior} but no base generates it")
                target = existing[0]
                target["data"] = {**(target.get("data") or {}), **data} if behavior == "merge" else data
            else:
                raise RenderError(f"{rel(directory)}: configMapGenerator {name}: unknown behavior {behavior}")

    def transform(self, directory: Path, k: dict, acc: list[dict]) -> None:
        for entry in k.get("patches") or []:
            self.apply_patch(directory, entry, acc)
        namespace = k.get("namespace")
        if namespace:
            for obj in acc:
                if obj.get("kind") not in CLUSTER_SCOPED:
                    obj.setdefault("metadata", {})["namespace"] = namespace
        for entry in k.get("labels") or []:
            pairs = entry.get("pairs") or {}
            if entry.get("includeSelectors"):
                raise RenderError(f"{rel(directory)}: labels with includeSelectors: true are not emulated (and selectors are immutable)")
            for obj in acc:
                obj.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
                if entry.get("includeTemplates"):
                    template = pod_template(obj)
                    if template is not None:
                        template.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
        for image in k.get("images") or []:
            for obj in acc:
                for container in all_containers(obj):
                    name, tag, digest = split_image(container.get("image", ""))
                    if name != image.get("name"):
                        continue
                    new = image.get("newName", name)
                    if image.get("digest"):
                        container["image"] = f"{new}@{image['digest']}"
                    elif image.get("newTag"):
                        container["image"] = f"{new}:{image['newTag']}"
                    else:
                        container["image"] = new + (f"@{digest}" if digest else f":{tag}" if tag else "")

    def apply_patch(self, directory: Path, entry: dict, acc: list[dict]) -> None:
        if "path" in entry:
            path = self.file_in(directory, entry["path"])
            self.usage.mark(path, "patch")
            docs = load_docs(path)
            where = rel(path)
        elif "patch" in entry:
            docs = [d for d in yaml.safe_load_all(entry["patch"]) if d is not None]
            where = f"{rel(directory)} (inline patch)"
        else:
            raise RenderError(f"{rel(directory)}: a patch needs `path` or `patch`")
        target = entry.get("target") or {}
        for doc in docs:
            if not isinstance(doc, dict) or isinstance(doc.get("spec"), list) or "op" in doc:
                raise RenderError(f"{where}: only strategic-merge patches are supported (no JSON 6902 operations)")
            self.patch_docs[(where, json.dumps(doc, sort_keys=True))] = doc
            kind = target.get("kind", doc.get("kind"))
            name = target.get("name", (doc.get("metadata") or {}).get("name"))
            if not kind or not name:
                raise RenderError(f"{where}: a patch must name its target (kind and metadata.name)")
            matches = [o for o in acc if o.get("kind") == kind and o["metadata"].get("name") == name]
            if not matches:
                raise RenderError(f"{where}: patch target {kind}/{name} not found (kustomize fails the build)")
            for obj in matches:
                merged = strategic_merge(obj, doc)
                obj.clear()
                obj.update(merged)


def split_image(image: str) -> tuple[str, str | None, str | None]:
    digest = None
    if "@" in image:
        image, digest = image.split("@", 1)
    tag = None
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        image, tag = image.rsplit(":", 1)
    return image, tag, digest


def image_basename(image: str) -> str:
    return split_image(image)[0].rsplit("/", 1)[-1]


def pod_template(obj: dict) -> dict | None:
    path = WORKLOAD_TEMPLATE.get(obj.get("kind", ""))
    if not path:
        return None
    node = obj
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node if isinstance(node, dict) else None


def all_containers(obj: dict) -> list[dict]:
    template = pod_template(obj)
    if not template:
        return []
    spec = template.get("spec") or {}
    return [c for key in ("initContainers", "containers") for c in spec.get(key) or [] if isinstance(c, dict)]


# --------------------------------------------------------------------------
# Structure checks for what the Kubernetes schemas do not cover


DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def keys_problems(where: str, obj, required: set[str], allowed: set[str]) -> list[str]:
    if not isinstance(obj, dict):
        return [f"{where}: expected a mapping"]
    problems = [f"{where}: missing `{k}`" for k in sorted(required - set(obj))]
    problems += [f"{where}: unknown field `{k}`" for k in sorted(set(obj) - allowed - required)]
    return problems


def check_kustomization_structure(k: dict, expected_kind: str) -> list[str]:
    api = {"Kustomization": "kustomize.config.k8s.io/v1beta1", "Component": "kustomize.config.k8s.io/v1alpha1"}
    problems = []
    if k.get("kind") != expected_kind:
        problems.append(f"kind is {k.get('kind')!r}, expected {expected_kind}")
    elif k.get("apiVersion") != api[expected_kind]:
        problems.append(f"apiVersion should be {api[expected_kind]}")
    for key in k:
        if key in UNSUPPORTED_KUSTOMIZATION_FIELDS:
            problems.append(f"`{key}`: {UNSUPPORTED_KUSTOMIZATION_FIELDS[key]}")
        elif key not in SUPPORTED_KUSTOMIZATION_FIELDS:
            problems.append(f"unknown field `{key}`")
    for key in ("resources", "components"):
        if key in k and not (isinstance(k[key], list) and all(isinstance(x, str) for x in k[key])):
            problems.append(f"`{key}` must be a list of paths")
    for entry in k.get("images") or []:
        problems += keys_problems("images[]", entry, {"name"}, {"newName", "newTag", "digest"})
    for entry in k.get("labels") or []:
        problems += keys_problems("labels[]", entry, {"pairs"}, {"includeSelectors", "includeTemplates", "fields"})
    for entry in k.get("patches") or []:
        problems += keys_problems("patches[]", entry, set(), {"path", "patch", "target", "options"})
    if "namespace" in k and not isinstance(k["namespace"], str):
        problems.append("`namespace` must be a string")
    return problems


def check_servicemonitor(obj: dict) -> list[str]:
    where = ident(obj)
    spec = obj.get("spec")
    problems = keys_problems(where, obj, {"apiVersion", "kind", "metadata", "spec"}, set())
    if obj.get("apiVersion") != "monitoring.coreos.com/v1":
        problems.append(f"{where}: apiVersion should be monitoring.coreos.com/v1")
    if not isinstance(spec, dict):
        return problems + [f"{where}: spec must be a mapping"]
    problems += keys_problems(f"{where} spec", spec, {"selector", "endpoints"}, {
        "jobLabel", "targetLabels", "podTargetLabels", "namespaceSelector", "sampleLimit", "targetLimit",
        "labelLimit", "labelNameLengthLimit", "labelValueLengthLimit", "keepDroppedTargets", "attachMetadata",
        "scrapeProtocols", "fallbackScrapeProtocol", "bodySizeLimit", "scrapeClass", "selectorMechanism",
        "nativeHistogramBucketLimit", "nativeHistogramMinBucketFactor", "scrapeClassicHistograms",
        "convertClassicHistogramsToNHCB",
    })
    problems += keys_problems(f"{where} spec.selector", spec.get("selector", {}), set(), {"matchLabels", "matchExpressions"})
    endpoints = spec.get("endpoints")
    if not isinstance(endpoints, list) or not endpoints:
        return problems + [f"{where}: spec.endpoints must be a non-empty list"]
    for i, ep in enumerate(endpoints):
        w = f"{where} spec.endpoints[{i}]"
        problems += keys_problems(w, ep, set(), {
            "port", "targetPort", "path", "scheme", "params", "interval", "scrapeTimeout", "honorLabels",
            "honorTimestamps", "trackTimestampsStaleness", "metricRelabelings", "relabelings", "proxyUrl",
            "followRedirects", "enableHttp2", "filterRunning", "tlsConfig", "bearerTokenSecret", "authorization",
            "basicAuth", "oauth2", "noProxy", "proxyFromEnvironment", "proxyConnectHeader",
        })
        if not isinstance(ep, dict):
            continue
        if "port" not in ep and "targetPort" not in ep:
            problems.append(f"{w}: needs `port` (a Service port name)")
        for key in ("interval", "scrapeTimeout"):
            if key in ep and not DURATION.match(str(ep[key])):
                problems.append(f"{w}: {key} `{ep[key]}` is not a Prometheus duration")
        if "interval" in ep and "scrapeTimeout" in ep and DURATION.match(str(ep["interval"])) and DURATION.match(str(ep["scrapeTimeout"])):
            if seconds(ep["scrapeTimeout"]) > seconds(ep["interval"]):
                problems.append(f"{w}: scrapeTimeout exceeds interval")
    return problems


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return sum(int(n) * units[u] for n, u in re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", str(duration)))


def promql_balanced(expr: str) -> str | None:
    stack, pairs, quote = [], {")": "(", "}": "{", "]": "["}, None
    for ch in expr:
        if quote:
            if ch == quote:
                quote = None
            continue
        if ch in "\"'`":
            quote = ch
        elif ch in "({[":
            stack.append(ch)
        elif ch in ")}]":
            if not stack or stack.pop() != pairs[ch]:
                return f"unbalanced `{ch}`"
    if quote:
        return "unterminated string"
    if stack:
        return f"unclosed `{stack[-1]}`"
    return None


def check_prometheusrule(obj: dict) -> list[str]:
    where = ident(obj)
    problems = keys_problems(where, obj, {"apiVersion", "kind", "metadata", "spec"}, set())
    if obj.get("apiVersion") != "monitoring.coreos.com/v1":
        problems.append(f"{where}: apiVersion should be monitoring.coreos.com/v1")
    groups = (obj.get("spec") or {}).get("groups")
    if not isinstance(groups, list) or not groups:
        return problems + [f"{where}: spec.groups must be a non-empty list"]
    names, alerts = set(), set()
    for g in groups:
        problems += keys_problems(f"{where} group", g, {"name", "rules"}, {"interval", "partial_response_strategy", "limit", "query_offset", "labels"})
        if not isinstance(g, dict):
            continue
        if g.get("name") in names:
            problems.append(f"{where}: group {g.get('name')} defined twice")
        names.add(g.get("name"))
        for r in g.get("rules") or []:
            w = f"{where} rule {r.get('alert') or r.get('record')}" if isinstance(r, dict) else where
            problems += keys_problems(w, r, {"expr"}, {"alert", "record", "for", "keep_firing_for", "labels", "annotations"})
            if not isinstance(r, dict):
                continue
            if ("alert" in r) == ("record" in r):
                problems.append(f"{w}: exactly one of `alert` and `record`")
            if not str(r.get("expr", "")).strip():
                problems.append(f"{w}: empty expr")
            elif (err := promql_balanced(str(r["expr"]))):
                problems.append(f"{w}: expr has {err}")
            for key in ("for", "keep_firing_for"):
                if key in r and not DURATION.match(str(r[key])):
                    problems.append(f"{w}: `{key}: {r[key]}` is not a duration")
            for key in ("labels", "annotations"):
                if key in r and not (isinstance(r[key], dict) and all(isinstance(v, str) for v in r[key].values())):
                    problems.append(f"{w}: {key} must map strings to strings")
            if "alert" in r:
                if r["alert"] in alerts:
                    problems.append(f"{w}: alert defined twice")
                alerts.add(r["alert"])
                # Our policy: every alert is routable and explains itself.
                if (r.get("labels") or {}).get("severity") not in ("critical", "warning", "info"):
                    problems.append(f"{w}: needs labels.severity (critical, warning or info)")
                for a in ("summary", "description", "runbook"):
                    if not (r.get("annotations") or {}).get(a):
                        problems.append(f"{w}: needs annotations.{a}")
                if "for" not in r:
                    problems.append(f"{w}: needs `for` (no alert should fire on one bad scrape)")
    return problems


def check_scaledobject(obj: dict) -> list[str]:
    where = ident(obj)
    problems = keys_problems(where, obj, {"apiVersion", "kind", "metadata", "spec"}, set())
    if obj.get("apiVersion") != "keda.sh/v1alpha1":
        problems.append(f"{where}: apiVersion should be keda.sh/v1alpha1")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return problems + [f"{where}: spec must be a mapping"]
    problems += keys_problems(f"{where} spec", spec, {"scaleTargetRef", "triggers"}, {
        "pollingInterval", "cooldownPeriod", "initialCooldownPeriod", "idleReplicaCount", "minReplicaCount",
        "maxReplicaCount", "advanced", "fallback",
    })
    problems += keys_problems(f"{where} spec.scaleTargetRef", spec.get("scaleTargetRef", {}), {"name"}, {"apiVersion", "kind", "envSourceContainerName"})
    for key in ("pollingInterval", "cooldownPeriod", "initialCooldownPeriod", "idleReplicaCount", "minReplicaCount", "maxReplicaCount"):
        if key in spec and (not isinstance(spec[key], int) or isinstance(spec[key], bool) or spec[key] < 0):
            problems.append(f"{where}: spec.{key} must be a non-negative integer")
    lo, hi = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        problems.append(f"{where}: minReplicaCount > maxReplicaCount")
    advanced = spec.get("advanced")
    if advanced is not None:
        problems += keys_problems(f"{where} spec.advanced", advanced, set(), {"horizontalPodAutoscalerConfig", "restoreToOriginalReplicaCount", "scalingModifiers"})
        hpa_config = (advanced or {}).get("horizontalPodAutoscalerConfig")
        if hpa_config is not None:
            problems += keys_problems(f"{where} horizontalPodAutoscalerConfig", hpa_config, set(), {"name", "behavior"})
            behavior = (hpa_config or {}).get("behavior")
            if behavior is not None:
                # The behavior block is the HPA's own: validate it as one.
                probe = {
                    "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "probe"},
                    "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "probe"}, "maxReplicas": 1, "behavior": behavior},
                }
                problems += [f"{where} horizontalPodAutoscalerConfig.behavior: {p}" for p in schema_problems(probe)]
    triggers = spec.get("triggers")
    if not isinstance(triggers, list) or not triggers:
        return problems + [f"{where}: spec.triggers must be a non-empty list"]
    for i, t in enumerate(triggers):
        w = f"{where} spec.triggers[{i}]"
        problems += keys_problems(w, t, {"type", "metadata"}, {"name", "authenticationRef", "metricType", "useCachedMetrics"})
        if not isinstance(t, dict):
            continue
        metadata = t.get("metadata") or {}
        # KEDA's metadata is map[string]string: an unquoted number fails.
        for k, v in metadata.items():
            if not isinstance(v, str):
                problems.append(f"{w}: metadata.{k} must be a string (quote it)")
        if "authenticationRef" in t:
            problems += keys_problems(f"{w} authenticationRef", t["authenticationRef"], {"name"}, {"kind"})
        if t.get("type") == "postgresql":
            for k in ("query", "targetQueryValue"):
                if k not in metadata:
                    problems.append(f"{w}: postgresql trigger needs metadata.{k}")
            try:
                if float(metadata.get("targetQueryValue", "1")) <= 0:
                    problems.append(f"{w}: targetQueryValue must be positive")
            except ValueError:
                problems.append(f"{w}: targetQueryValue must be a number")
            if not ("authenticationRef" in t or "connectionFromEnv" in metadata or "host" in metadata):
                problems.append(f"{w}: postgresql trigger needs a connection (authenticationRef, connectionFromEnv or host)")
    return problems


def check_triggerauthentication(obj: dict) -> list[str]:
    where = ident(obj)
    problems = keys_problems(where, obj, {"apiVersion", "kind", "metadata", "spec"}, set())
    if obj.get("apiVersion") != "keda.sh/v1alpha1":
        problems.append(f"{where}: apiVersion should be keda.sh/v1alpha1")
    spec = obj.get("spec")
    if not isinstance(spec, dict) or not spec:
        return problems + [f"{where}: spec must be a non-empty mapping"]
    problems += keys_problems(f"{where} spec", spec, set(), {
        "secretTargetRef", "configMapTargetRef", "env", "podIdentity", "hashiCorpVault", "azureKeyVault",
        "awsSecretManager", "gcpSecretManager", "boundServiceAccountToken",
    })
    for i, ref in enumerate(spec.get("secretTargetRef") or []):
        problems += keys_problems(f"{where} secretTargetRef[{i}]", ref, {"parameter", "name", "key"}, set())
    return problems


CUSTOM_RESOURCES = {
    ("monitoring.coreos.com", "ServiceMonitor"): check_servicemonitor,
    ("monitoring.coreos.com", "PrometheusRule"): check_prometheusrule,
    ("keda.sh", "ScaledObject"): check_scaledobject,
    ("keda.sh", "TriggerAuthentication"): check_triggerauthentication,
}


def schema_problems(obj: dict) -> list[str]:
    """Strict schema validation of a built-in kind, or the hand-written check of
    a known custom resource."""
    if not isinstance(obj, dict) or "apiVersion" not in obj or "kind" not in obj:
        return ["not a Kubernetes object (apiVersion and kind required)"]
    group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
    custom = CUSTOM_RESOURCES.get((group, obj["kind"]))
    if custom:
        return custom(obj)
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kv_utils.SchemaNotFoundError:
        return [f"{ident(obj)}: no schema for {obj['apiVersion']} {obj['kind']} in Kubernetes {K8S_VERSION}, and no hand-written check"]
    except kv_utils.ValidationError as e:
        at = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        return [f"{ident(obj)} at {at}: {e.message}"]
    return []


# --------------------------------------------------------------------------
# Invariant checks on a rendered set of objects


@dataclass
class Pod:
    owner: dict
    template: dict

    @property
    def name(self) -> str:
        return ident(self.owner)

    @property
    def namespace(self) -> str | None:
        return (self.owner.get("metadata") or {}).get("namespace")

    @property
    def labels(self) -> dict:
        return (self.template.get("metadata") or {}).get("labels") or {}

    @property
    def spec(self) -> dict:
        return self.template.get("spec") or {}

    def containers(self) -> list[dict]:
        return [c for key in ("initContainers", "containers") for c in self.spec.get(key) or []]


def pods(objs: list[dict]) -> list[Pod]:
    return [Pod(o, t) for o in objs if (t := pod_template(o)) is not None]


def selector_matches(selector: dict | None, labels: dict) -> bool:
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def same_namespace(a: dict, b_namespace: str | None) -> bool:
    return (a.get("metadata") or {}).get("namespace") == b_namespace


def find(objs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objs if o.get("kind") == kind and (name is None or o["metadata"].get("name") == name)]


@dataclass
class OurContainer:
    pod: Pod
    container: dict
    binary: str
    subcommand: tuple[str, ...]

    @property
    def where(self) -> str:
        sub = " ".join(self.subcommand)
        return f"{self.pod.name} container {self.container.get('name')} ({self.binary}{' ' + sub if sub else ''})"

    @property
    def role(self) -> str:
        if self.binary == "webhook-ingest":
            return "ingest" if self.subcommand in ((), ("serve",)) else "ingest-" + "-".join(self.subcommand)
        return "relay" if self.subcommand == () else "relay-" + "-".join(self.subcommand)


def our_containers(objs: list[dict]) -> list[OurContainer]:
    out = []
    for pod in pods(objs):
        for c in pod.containers():
            binary = image_basename(c.get("image", ""))
            if binary not in OUR_BINARIES:
                continue
            if c.get("command"):
                binary = Path(str(c["command"][0])).name
            args = [str(a) for a in c.get("args") or []]
            sub = []
            for a in args:
                if a.startswith("-"):
                    break
                sub.append(a)
            out.append(OurContainer(pod, c, binary, tuple(sub)))
    return out


class Env:
    """A container's environment as the kubelet would build it (env wins over
    envFrom), with values from the rendered ConfigMaps; Secrets are opaque."""

    SECRET = object()
    POD_FIELD = object()

    def __init__(self, container: dict, namespace: str | None, objs: list[dict]) -> None:
        self.values: dict[str, object] = {}
        self.problems: list[str] = []
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                name = source["configMapRef"].get("name")
                cms = [o for o in find(objs, "ConfigMap", name) if same_namespace(o, namespace)]
                if not cms:
                    if not source["configMapRef"].get("optional"):
                        self.problems.append(f"envFrom ConfigMap {name} is not in the rendered manifests")
                    continue
                for k, v in (cms[0].get("data") or {}).items():
                    self.values[prefix + k] = v
            if "secretRef" in source:
                self.problems.append(
                    f"envFrom Secret {source['secretRef'].get('name')} hides which variables it sets: "
                    "use env[].valueFrom.secretKeyRef per variable"
                )
        for e in container.get("env") or []:
            name = e.get("name")
            if "value" in e:
                self.values[name] = str(e["value"])
            elif "configMapKeyRef" in (e.get("valueFrom") or {}):
                ref = e["valueFrom"]["configMapKeyRef"]
                cms = [o for o in find(objs, "ConfigMap", ref.get("name")) if same_namespace(o, namespace)]
                self.values[name] = (cms[0].get("data") or {}).get(ref.get("key")) if cms else None
            elif "secretKeyRef" in (e.get("valueFrom") or {}):
                self.values[name] = Env.SECRET
            else:
                self.values[name] = Env.POD_FIELD

    def names(self) -> set[str]:
        return set(self.values)

    def value(self, name: str, cli: Cli | None) -> str | None:
        v = self.values.get(name)
        if isinstance(v, str):
            return v
        if v is None and cli is not None:
            return cli.variables.get(name)
        return None


def port_of(addr: str | None) -> int | None:
    if not addr:
        return None
    m = re.search(r":(\d+)$", addr)
    return int(m.group(1)) if m else None


def int_value(raw: str | None) -> int | None:
    try:
        return int(str(raw).strip()) if raw is not None else None
    except ValueError:
        return None


def container_port(pod: Pod, port) -> int | None:
    """A probe's or Service's port (number or name) as a number."""
    if isinstance(port, int):
        return port
    for c in pod.containers():
        for p in c.get("ports") or []:
            if p.get("name") == port:
                return p.get("containerPort")
    return None


class Context:
    """Everything the invariant checks need about one render."""

    def __init__(self, label: str, objs: list[dict], binaries: Binaries, examples: list[dict], collector: list[dict]) -> None:
        self.label = label
        self.objs = objs
        self.binaries = binaries
        self.examples = examples
        self.collector = collector
        self.ours = our_containers(objs)

    def cli(self, oc: OurContainer) -> Cli | None:
        return self.binaries.cli(oc.binary, oc.subcommand)[0]

    def env(self, oc: OurContainer) -> Env:
        return Env(oc.container, oc.pod.namespace, self.objs)


def check_env(ctx: Context) -> list[str]:
    problems = []
    for oc in ctx.ours:
        cli, problem = ctx.binaries.cli(oc.binary, oc.subcommand)
        if cli is None:  # built but --help failed: reported here (a missing binary is reported once, above)
            problems.append(f"{oc.where}: cannot check its variables: {problem}")
            continue
        env = ctx.env(oc)
        problems += [f"{oc.where}: {p}" for p in env.problems]
        for name in sorted(env.names()):
            if not cli.accepts(name):
                problems.append(f"{oc.where} sets {name}, which `{' '.join([oc.binary, *oc.subcommand])} --help` does not list ([env: ...], from {cli.source})")
        for name in REQUIRED_VARIABLES.get((oc.binary, oc.subcommand), []):
            if name not in env.names():
                problems.append(f"{oc.where} does not set {name}, which it cannot start without")
    return problems


def check_ports_and_probes(ctx: Context) -> list[str]:
    problems = []
    for oc in ctx.ours:
        cli = ctx.cli(oc)
        env = ctx.env(oc)
        named = {p.get("name"): p.get("containerPort") for p in oc.container.get("ports") or []}
        if oc.role == "ingest":
            want = {"http": port_of(env.value("INGEST_LISTEN_ADDR", cli)), "admin": port_of(env.value("ADMIN_LISTEN_ADDR", cli))}
        elif oc.role == "relay":
            want = {"admin": port_of(env.value("ADMIN_LISTEN_ADDR", cli))}
        else:
            continue  # one-off commands (migrate, operator tools) listen on nothing
        for name, port in want.items():
            if port is None:
                problems.append(f"{oc.where}: cannot tell which port `{name}` should be (listen address unknown)")
            elif named.get(name) != port:
                problems.append(f"{oc.where}: containerPort `{name}` is {named.get(name)}, the binary listens on {port}")
        for probe, path in (("livenessProbe", HEALTHZ), ("readinessProbe", READYZ)):
            get = (oc.container.get(probe) or {}).get("httpGet")
            if not get:
                problems.append(f"{oc.where}: {probe} should be an httpGet of {path} on the admin port")
                continue
            if get.get("path") != path:
                problems.append(f"{oc.where}: {probe} path is {get.get('path')}, expected {path}")
            if container_port(oc.pod, get.get("port")) != want["admin"]:
                problems.append(f"{oc.where}: {probe} port {get.get('port')} is not the admin port {want['admin']}")
    # Services and ServiceMonitors in front of them.
    all_pods = pods(ctx.objs)
    for svc in find(ctx.objs, "Service"):
        selected = [p for p in all_pods if same_namespace(svc, p.namespace) and selector_matches({"matchLabels": svc["spec"].get("selector") or {}}, p.labels)]
        for sp in svc["spec"].get("ports") or []:
            target = sp.get("targetPort", sp.get("port"))
            for p in selected:
                if container_port(p, target) is None:
                    problems.append(f"{ident(svc)}: targetPort {target} is not a port of {p.name}")
    for sm in find(ctx.objs, "ServiceMonitor"):
        services = [s for s in find(ctx.objs, "Service") if same_namespace(s, sm["metadata"].get("namespace"))
                    and selector_matches(sm["spec"].get("selector"), s["metadata"].get("labels") or {})]
        for ep in sm["spec"].get("endpoints") or []:
            if ep.get("path", METRICS) != METRICS:
                problems.append(f"{ident(sm)}: scrapes {ep.get('path')}, the services serve {METRICS}")
            for s in services:
                if ep.get("port") not in {p.get("name") for p in s["spec"].get("ports") or []}:
                    problems.append(f"{ident(sm)}: port `{ep.get('port')}` is not a named port of {ident(s)}")
    return problems


def check_hygiene(ctx: Context) -> list[str]:
    problems = []
    for pod in pods(ctx.objs):
        spec = pod.spec
        pod_sc = spec.get("securityContext") or {}
        for c in pod.containers():
            where = f"{pod.name} container {c.get('name')}"
            if pod.owner["kind"] in LONG_RUNNING and c in (spec.get("containers") or []):
                for probe in ("livenessProbe", "readinessProbe"):
                    if not c.get(probe):
                        problems.append(f"{where}: no {probe}")
            resources = c.get("resources") or {}
            if not (resources.get("limits") or {}).get("memory"):
                problems.append(f"{where}: no memory limit")
            for r in ("cpu", "memory"):
                if not (resources.get("requests") or {}).get(r):
                    problems.append(f"{where}: no {r} request")
            sc = c.get("securityContext") or {}

            def effective(key):
                return sc.get(key, pod_sc.get(key))

            if effective("runAsNonRoot") is not True:
                problems.append(f"{where}: runAsNonRoot is not true")
            uid = effective("runAsUser")
            if not isinstance(uid, int) or isinstance(uid, bool) or uid == 0:
                problems.append(f"{where}: runAsUser should be a numeric non-root uid (the kubelet cannot verify a user name)")
            if sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{where}: readOnlyRootFilesystem is not true")
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: allowPrivilegeEscalation is not false")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                problems.append(f"{where}: capabilities.drop does not include ALL")
            if sc.get("privileged"):
                problems.append(f"{where}: privileged")
            if ((effective("seccompProfile") or {}).get("type")) not in ("RuntimeDefault", "Localhost"):
                problems.append(f"{where}: seccompProfile is not RuntimeDefault")
    return problems


def check_grace(ctx: Context) -> list[str]:
    problems = []
    for oc in ctx.ours:
        cli = ctx.cli(oc)
        env = ctx.env(oc)
        grace = oc.pod.spec.get("terminationGracePeriodSeconds", 30)
        if oc.role == "ingest":
            deadline_ms = int_value(env.value("INGEST_DEADLINE_MS", cli))
            pre_stop = ((oc.container.get("lifecycle") or {}).get("preStop")) or {}
            pause = (pre_stop.get("sleep") or {}).get("seconds")
            if not pre_stop:
                problems.append(f"{oc.where}: no preStop pause: requests routed while the endpoint is being removed would be refused")
                pause = 0
            elif pause is None:
                problems.append(f"{oc.where}: the preStop pause should be the `sleep` handler (the image has no shell)")
                pause = 0
            if deadline_ms is None:
                problems.append(f"{oc.where}: INGEST_DEADLINE_MS unknown")
                continue
            need = pause + math.ceil(deadline_ms / 1000)
            if grace < need:
                problems.append(f"{oc.where}: terminationGracePeriodSeconds {grace} < preStop {pause} s + INGEST_DEADLINE_MS {deadline_ms} ms = {need} s")
        elif oc.role == "relay":
            timeout_ms = int_value(env.value("RELAY_HTTP_TIMEOUT_MS", cli))
            lease = int_value(env.value("RELAY_LEASE_SECS", cli))
            if timeout_ms is None:
                problems.append(f"{oc.where}: RELAY_HTTP_TIMEOUT_MS unknown")
                continue
            if not grace > timeout_ms / 1000 + 1:
                problems.append(f"{oc.where}: terminationGracePeriodSeconds {grace} must exceed RELAY_HTTP_TIMEOUT_MS/1000 + 1 = {timeout_ms / 1000 + 1:g} s")
            if lease is None or not lease * 1000 > timeout_ms:
                problems.append(f"{oc.where}: RELAY_LEASE_SECS {lease} must exceed RELAY_HTTP_TIMEOUT_MS {timeout_ms} ms (the binary refuses to start)")
    return problems


def normalise_sql(sql: str) -> str:
    return re.sub(r"\s+", " ", sql).strip().rstrip(";").strip()


def check_autoscaling(ctx: Context) -> tuple[list[str], bool]:
    """Autoscaler targets exist, one per workload, and KEDA counts with the
    relay's own SQL. Returns (problems, whether a ScaledObject was seen)."""
    problems = []
    owners: dict[tuple, list[str]] = {}
    for hpa in find(ctx.objs, "HorizontalPodAutoscaler"):
        ref = hpa["spec"].get("scaleTargetRef") or {}
        owners.setdefault((ref.get("kind"), ref.get("name"), hpa["metadata"].get("namespace")), []).append(ident(hpa))
    scaled = find(ctx.objs, "ScaledObject")
    for so in scaled:
        ref = so["spec"].get("scaleTargetRef") or {}
        owners.setdefault((ref.get("kind", "Deployment"), ref.get("name"), so["metadata"].get("namespace")), []).append(ident(so))
        for t in so["spec"].get("triggers") or []:
            auth = (t.get("authenticationRef") or {}).get("name")
            if auth and not [a for a in find(ctx.objs, "TriggerAuthentication", auth) if same_namespace(a, so["metadata"].get("namespace"))]:
                problems.append(f"{ident(so)}: TriggerAuthentication {auth} is not in the rendered manifests")
            if t.get("type") == "postgresql":
                if not COUNT_DUE_SQL.is_file():
                    problems.append(f"{rel(COUNT_DUE_SQL)} is missing: the relay's count query is the reference")
                    continue
                want = normalise_sql(COUNT_DUE_SQL.read_text())
                got = normalise_sql(str((t.get("metadata") or {}).get("query", "")))
                if got != want:
                    problems.append(f"{ident(so)}: the postgresql query differs from {rel(COUNT_DUE_SQL)}:\n            trigger: {got}\n            relay:   {want}")
    for (kind, name, ns), by in owners.items():
        targets = [o for o in find(ctx.objs, kind, name) if same_namespace(o, ns)]
        if not targets:
            problems.append(f"{', '.join(by)}: scale target {kind}/{name} is not in the rendered manifests")
        if len(by) > 1:
            problems.append(f"{kind}/{name} has {len(by)} autoscalers ({', '.join(by)}): they would fight; keep one")
        for t in targets:
            if "replicas" in (t.get("spec") or {}):
                problems.append(f"{ident(t)} sets spec.replicas although {by[0]} owns it: every apply would reset the count")
    return problems, bool(scaled)


def example_secret_keys(examples: list[dict]) -> dict[str, set[str]]:
    keys: dict[str, set[str]] = {}
    for s in examples:
        if s.get("kind") == "Secret":
            keys.setdefault(s["metadata"]["name"], set()).update((s.get("stringData") or {}).keys(), (s.get("data") or {}).keys())
    return keys


def check_secrets(ctx: Context) -> list[str]:
    problems = [f"{ident(s)} is rendered: Secrets are created by the operator, never listed in a kustomization" for s in find(ctx.objs, "Secret")]
    documented = example_secret_keys(ctx.examples)
    refs: list[tuple[str, str, str]] = []
    for pod in pods(ctx.objs):
        for c in pod.containers():
            for e in c.get("env") or []:
                ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    refs.append((f"{pod.name} {e.get('name')}", ref.get("name"), ref.get("key")))
        for v in pod.spec.get("volumes") or []:
            if "secret" in v:
                for item in v["secret"].get("items") or [{"key": None}]:
                    refs.append((f"{pod.name} volume {v.get('name')}", v["secret"].get("secretName"), item.get("key")))
    for ta in find(ctx.objs, "TriggerAuthentication"):
        for ref in ta["spec"].get("secretTargetRef") or []:
            refs.append((ident(ta), ref.get("name"), ref.get("key")))
    for where, name, key in refs:
        if name not in documented:
            problems.append(f"{where}: Secret {name} is not in any *.example.yaml: document it for the operator")
        elif key is not None and key not in documented[name]:
            problems.append(f"{where}: key {key} of Secret {name} is not in its *.example.yaml")
    return problems


def check_selectors(ctx: Context) -> list[str]:
    problems = []
    all_pods = pods(ctx.objs)

    def selected(obj: dict, selector: dict) -> list[Pod]:
        return [p for p in all_pods if same_namespace(obj, p.namespace) and selector_matches(selector, p.labels)]

    for pod in all_pods:
        own = (pod.owner.get("spec") or {}).get("selector")
        if pod.owner["kind"] in LONG_RUNNING:
            if not selector_matches(own, pod.labels):
                problems.append(f"{pod.name}: spec.selector does not match its own pod template")
            for other in all_pods:
                if other is not pod and same_namespace(pod.owner, other.namespace) and selector_matches(own, other.labels):
                    problems.append(f"{pod.name}: spec.selector also matches the pods of {other.name}")
        for tsc in pod.spec.get("topologySpreadConstraints") or []:
            if not selector_matches(tsc.get("labelSelector"), pod.labels):
                problems.append(f"{pod.name}: a topologySpreadConstraint's labelSelector does not select its own pods")
    for svc in find(ctx.objs, "Service"):
        if not selected(svc, {"matchLabels": svc["spec"].get("selector") or {}}):
            problems.append(f"{ident(svc)}: selects no pod")
    for pdb in find(ctx.objs, "PodDisruptionBudget"):
        if not selected(pdb, pdb["spec"].get("selector") or {}):
            problems.append(f"{ident(pdb)}: selects no pod")
    for np in find(ctx.objs, "NetworkPolicy"):
        chosen = selected(np, np["spec"].get("podSelector") or {})
        if not chosen:
            problems.append(f"{ident(np)}: selects no pod")
        for direction in ("ingress", "egress"):
            for rule in np["spec"].get(direction) or []:
                for port in rule.get("ports") or []:
                    if isinstance(port.get("port"), str) and direction == "ingress":
                        for p in chosen:
                            if container_port(p, port["port"]) is None:
                                problems.append(f"{ident(np)}: named port `{port['port']}` is not a port of {p.name}")
    for sm in find(ctx.objs, "ServiceMonitor"):
        if not [s for s in find(ctx.objs, "Service") if same_namespace(s, sm["metadata"].get("namespace"))
                and selector_matches(sm["spec"].get("selector"), s["metadata"].get("labels") or {})]:
            problems.append(f"{ident(sm)}: selects no Service")
    return problems


def egress_allows(ctx: Context, pod: Pod, port: int, protocol: str = "TCP") -> bool:
    policies = [np for np in find(ctx.objs, "NetworkPolicy")
                if same_namespace(np, pod.namespace) and selector_matches(np["spec"].get("podSelector") or {}, pod.labels)
                and "Egress" in (np["spec"].get("policyTypes") or [])]
    if not policies:
        return True  # not isolated for egress
    for np in policies:
        for rule in np["spec"].get("egress") or []:
            ports = rule.get("ports")
            if not ports:
                return True
            for p in ports:
                if p.get("protocol", "TCP") == protocol and (p.get("port") == port or p.get("port") is None
                                                             or (isinstance(p.get("port"), int) and p.get("endPort") and p["port"] <= port <= p["endPort"])):
                    return True
    return False


def url_port(url: str) -> int | None:
    try:
        parsed = urlparse(url)
        return parsed.port or {"https": 443, "http": 80}.get(parsed.scheme)
    except ValueError:
        return None


def check_network_needs(ctx: Context) -> list[str]:
    """The egress each of our pods needs is allowed: DNS, PostgreSQL, the OTLP
    collector, the relay's downstream URLs; and the OTLP endpoint is the
    example collector's Service."""
    problems = []
    for oc in ctx.ours:
        cli = ctx.cli(oc)
        env = ctx.env(oc)
        needs = [(53, "UDP", "DNS"), (5432, "TCP", "PostgreSQL")]
        endpoint = env.value("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", cli) or env.value("OTEL_EXPORTER_OTLP_ENDPOINT", cli)
        if endpoint:
            port = url_port(endpoint)
            needs.append((port, "TCP", f"OTLP {endpoint}"))
            protocol = env.value("OTEL_EXPORTER_OTLP_PROTOCOL", cli)
            if protocol == "http/protobuf" and port == 4317:
                problems.append(f"{oc.where}: OTLP http/protobuf sent to 4317, the collector's gRPC port")
            if protocol == "grpc" and port == 4318:
                problems.append(f"{oc.where}: OTLP grpc sent to 4318, the collector's HTTP port")
            host = urlparse(endpoint).hostname or ""
            m = re.match(r"^([a-z0-9-]+)\.([a-z0-9-]+)\.svc(\.cluster\.local)?$", host)
            if m and ctx.collector:
                svc = [s for s in find(ctx.collector, "Service", m.group(1)) if (s["metadata"].get("namespace") == m.group(2))]
                if not svc:
                    problems.append(f"{oc.where}: OTLP endpoint host {host} is not the Service of deploy/otel-collector")
                elif port not in {p.get("port") for p in svc[0]["spec"].get("ports") or []}:
                    problems.append(f"{oc.where}: the collector Service has no port {port}")
        if oc.role == "relay":
            for var in ("FULFILMENT_URL", "EMAIL_URL"):
                url = env.value(var, cli)
                if url:
                    needs.append((url_port(url), "TCP", f"{var} {url}"))
        for port, protocol, what in needs:
            if port is None:
                problems.append(f"{oc.where}: cannot tell the port of {what}")
            elif not egress_allows(ctx, oc.pod, port, protocol):
                problems.append(f"{oc.where}: its NetworkPolicies block egress to {port}/{protocol} ({what})")
    return problems


def check_release_images(ctx: Context) -> list[str]:
    """The migration runs the schema of the release it precedes."""
    problems = []
    by_role: dict[str, set[str]] = {}
    for oc in ctx.ours:
        by_role.setdefault(oc.role, set()).add(oc.container.get("image"))
    if "ingest-migrate" in by_role and "ingest" in by_role and by_role["ingest-migrate"] != by_role["ingest"]:
        problems.append(f"the migration Job runs {sorted(by_role['ingest-migrate'])} but webhook-ingest runs {sorted(by_role['ingest'])}")
    for role, images in by_role.items():
        for image in images:
            name, tag, digest = split_image(image)
            if tag == "latest":
                problems.append(f"{role} image {image}: `latest` is not a release")
    return problems


METRIC_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def check_alert_rules(ctx: Context) -> list[str]:
    problems = []
    scraped_jobs = set()
    for sm in find(ctx.objs, "ServiceMonitor"):
        for s in find(ctx.objs, "Service"):
            if same_namespace(s, sm["metadata"].get("namespace")) and selector_matches(sm["spec"].get("selector"), s["metadata"].get("labels") or {}):
                scraped_jobs.add(s["metadata"]["name"])
    runbook = RUNBOOK.read_text() if RUNBOOK.is_file() else ""
    headings = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^##+ (.+)$", runbook, re.M)}
    for rule_obj in find(ctx.objs, "PrometheusRule"):
        for group in rule_obj["spec"].get("groups") or []:
            for rule in group.get("rules") or []:
                name = rule.get("alert") or rule.get("record")
                expr = str(rule.get("expr", ""))
                for m in METRIC_SELECTOR.finditer(expr):
                    metric, selector = m.group(1), m.group(2) or ""
                    if metric.startswith(("webhook_", "outbox_")) and metric not in KNOWN_SERIES:
                        problems.append(f"{name}: `{metric}` is not a documented metric")
                    for label, op, value in MATCHER.findall(selector):
                        allowed = LABEL_VALUES.get(metric, {}).get(label)
                        if metric == "up" and label == "job" and op == "=" and value not in scraped_jobs:
                            problems.append(f"{name}: job=\"{value}\" is not a Service any ServiceMonitor here scrapes ({sorted(scraped_jobs)})")
                        if allowed is None:
                            continue
                        values = value.split("|") if op in ("=~", "!~") else [value]
                        for v in values:
                            if v not in allowed:
                                problems.append(f"{name}: {metric}{{{label}}} has no value `{v}` (documented: {', '.join(sorted(allowed))})")
                if rule.get("alert"):
                    anchor = rule["alert"].lower()
                    if anchor not in headings:
                        problems.append(f"{name}: no `## {rule['alert']}` section in {rel(RUNBOOK)}")
                    text = " ".join((rule.get("annotations") or {}).values())
                    for link in re.findall(r"RUNBOOK\.md#([a-z0-9-]+)", text):
                        if link not in headings:
                            problems.append(f"{name}: links RUNBOOK.md#{link}, which is no heading")
    return problems


# --------------------------------------------------------------------------
# Checks on the repository's files


def check_examples(examples: list[tuple[Path, dict]]) -> list[str]:
    problems = []
    for path, s in examples:
        if s.get("kind") != "Secret":
            continue
        values = dict(s.get("stringData") or {})
        for k, v in (s.get("data") or {}).items():
            try:
                values[k] = base64.b64decode(str(v)).decode()
            except ValueError:
                problems.append(f"{rel(path)} {ident(s)} data.{k}: not base64")
        for k, v in values.items():
            if PLACEHOLDER not in str(v):
                problems.append(f"{rel(path)} {ident(s)} {k}: every example value must contain {PLACEHOLDER}, so nothing real-looking is ever committed")
    return problems


def check_dockerfile(renders: dict[str, list[dict]]) -> list[str]:
    problems = []
    dockerfile = DEPLOY / "Dockerfile"
    if not dockerfile.is_file():
        return [f"{rel(dockerfile)} is missing"]
    stages: dict[str, list[str]] = {}
    current = None
    for line in dockerfile.read_text().splitlines():
        m = re.match(r"^FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.I)
        if m:
            current = m.group(1) or f"stage{len(stages)}"
            stages[current] = []
        elif current and line.strip() and not line.lstrip().startswith("#"):
            stages[current].append(line.strip())
    uids: dict[str, set[int]] = {}
    for objs in renders.values():
        for oc in our_containers(objs):
            sc = oc.container.get("securityContext") or {}
            uid = sc.get("runAsUser", (oc.pod.spec.get("securityContext") or {}).get("runAsUser"))
            uids.setdefault(oc.binary, set()).add(uid)
    for binary in OUR_BINARIES:
        lines = stages.get(binary)
        if lines is None:
            problems.append(f"{rel(dockerfile)}: no `FROM ... AS {binary}` stage")
            continue
        user = next((l.split(None, 1)[1] for l in lines if l.upper().startswith("USER ")), None)
        uid = int_value((user or "").split(":")[0])
        if uid is None or uid == 0:
            problems.append(f"{rel(dockerfile)} stage {binary}: USER must be a numeric non-root uid (is {user})")
        elif uids.get(binary) and uids[binary] != {uid}:
            problems.append(f"{rel(dockerfile)} stage {binary}: USER {uid}, but the manifests run it as {sorted(uids[binary], key=str)}")
        entry = next((l for l in lines if l.upper().startswith("ENTRYPOINT")), "")
        if f"/{binary}\"" not in entry:
            problems.append(f"{rel(dockerfile)} stage {binary}: ENTRYPOINT should run /usr/local/bin/{binary} (exec form)")
    ignore = ROOT / ".dockerignore"
    if not ignore.is_file():
        problems.append(".dockerignore is missing")
    else:
        entries = {l.strip().rstrip("/") for l in ignore.read_text().splitlines()}
        for must in ("target", ".git"):
            if must not in entries:
                problems.append(f".dockerignore does not exclude {must}")
    return problems


def check_collector_config(objs: list[dict]) -> list[str]:
    problems = []
    for cm in find(objs, "ConfigMap"):
        for key, text in (cm.get("data") or {}).items():
            if not key.endswith((".yaml", ".yml")):
                continue
            try:
                config = yaml.safe_load(text) or {}
            except yaml.YAMLError as e:
                problems.append(f"{ident(cm)} {key}: {e}")
                continue
            service = config.get("service") or {}
            for ext in service.get("extensions") or []:
                if ext not in (config.get("extensions") or {}):
                    problems.append(f"{ident(cm)} {key}: extension {ext} is used but not defined")
            for pname, pipeline in (service.get("pipelines") or {}).items():
                for section in ("receivers", "processors", "exporters"):
                    for comp in pipeline.get(section) or []:
                        if comp not in (config.get(section) or {}):
                            problems.append(f"{ident(cm)} {key}: pipeline {pname} uses {section[:-1]} {comp}, which is not defined")
            http = (((config.get("receivers") or {}).get("otlp") or {}).get("protocols") or {}).get("http")
            if http is None:
                problems.append(f"{ident(cm)} {key}: no OTLP/HTTP receiver (the services send http/protobuf)")
    return problems


# --------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bindir", type=Path, default=Path(os.environ.get("DEPLOY_CHECK_BINDIR", ROOT / "target/debug")),
                        help="where webhook-ingest and outbox-relay are built (default target/debug, or $DEPLOY_CHECK_BINDIR)")
    parser.add_argument("--render", metavar="KUSTOMIZATION",
                        help="print what deploy-check renders for e.g. overlays/prod (no checks) and exit")
    args = parser.parse_args()
    if args.render:
        objs = Renderer(Usage()).build(DEPLOY / args.render)
        print(f"# {len(objs)} objects of deploy/{args.render}, as deploy-check renders them: the subset of kustomize\n"
              "# used here, without the hash suffix kustomize adds to generated ConfigMap names.")
        print(yaml.safe_dump_all(objs, sort_keys=False, width=120), end="")
        return 0
    bindir = args.bindir if args.bindir.is_absolute() else (Path.cwd() / args.bindir)
    allow_missing = os.environ.get("DEPLOY_CHECK_ALLOW_MISSING_BINARIES") == "1"
    binaries = Binaries(bindir, allow_missing)
    report = Report()
    print(f"deploy-check: Kubernetes {K8S_VERSION} schemas (kubernetes-validate {kubernetes_validate.__version__}), "
          f"binaries from {rel(bindir)}")

    # 1. The binaries' configuration.
    for binary in OUR_BINARIES:
        cli, problem = binaries.cli(binary)
        if problem is None:
            report.check(f"{binary} --help lists its variables", [], f"{len(cli.variables)} [env: ...] entries")
        elif cli is not None and allow_missing:
            report.skip(f"{binary} --help", f"{problem.split(':')[0]}; checking against the documented variables instead (DEPLOY_CHECK_ALLOW_MISSING_BINARIES=1)")
        else:
            report.check(f"{binary} --help lists its variables", [problem])

    # 2. Every YAML file parses, and every one is used.
    files = sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.suffix in (".yaml", ".yml"))
    parsed: dict[Path, list] = {}
    problems = []
    for path in files:
        try:
            parsed[path.resolve()] = load_docs(path)
        except yaml.YAMLError as e:
            problems.append(f"{rel(path)}: {e}")
    report.check("YAML files parse", problems, f"{len(files)} files")
    if problems:
        return report.summary()

    usage = Usage()
    renderer = Renderer(usage)
    kustomization_dirs = sorted({p.parent.resolve() for p in DEPLOY.rglob("*") if p.name in KUSTOMIZATION_NAMES})
    kinds = {d: (load_docs(kustomization_file(d)) or [{}])[0].get("kind") for d in kustomization_dirs}
    roots = [d for d in kustomization_dirs if kinds[d] == "Kustomization"]
    renders: dict[str, list[dict]] = {}
    for d in roots:
        label = rel(d).removeprefix("deploy/")
        try:
            renders[label] = renderer.build(d)
            report.check(f"[{label}] renders", [], f"{len(renders[label])} objects")
        except (RenderError, yaml.YAMLError, OSError) as e:
            report.check(f"[{label}] renders", [str(e)])
    for component, (overlay, replaced) in ALTERNATIVE_COMPONENTS.items():
        label = f"{overlay} with {component} instead of {replaced}"
        try:
            renders[label] = renderer.build(DEPLOY / overlay, {(DEPLOY / replaced).resolve(): (DEPLOY / component).resolve()})
            report.check(f"[{label}] renders", [], f"{len(renders[label])} objects")
        except (RenderError, yaml.YAMLError, OSError) as e:
            report.check(f"[{label}] renders", [str(e)])

    problems = []
    for path in files:
        roles = usage.roles.get(path.resolve(), set())
        if is_example(path):
            if roles:
                problems.append(f"{rel(path)} is an example but a kustomization uses it as {sorted(roles)}")
        elif not roles:
            problems.append(f"{rel(path)} is used by no kustomization (list it, or name it *.example.yaml)")
    for d in kustomization_dirs:
        if kinds[d] == "Component" and d not in usage.components_used:
            problems.append(f"{rel(d)}: component used by no kustomization (nor listed in ALTERNATIVE_COMPONENTS)")
    report.check("every manifest is used by a kustomization or is an *.example.yaml", problems)

    # 3. Schemas: the files as written (resources and examples), then every render.
    examples: list[tuple[Path, dict]] = []
    for path in files:
        roles = usage.roles.get(path.resolve(), set())
        if not (roles & {"resource"} or is_example(path)):
            continue  # kustomizations, patches, generator data: checked through the renders
        docs = parsed[path.resolve()]
        problems = []
        for doc in docs:
            problems += schema_problems(doc)
            if is_example(path):
                examples.append((path, doc))
        report.check(f"schema {rel(path)}", problems, ", ".join(ident(d) for d in docs))
    problems = []
    for (where, _), doc in renderer.patch_docs.items():
        problems += [f"{where}: {p}" for p in keys_problems("patch", doc, {"apiVersion", "kind", "metadata"}, {"spec", "data"})]
    report.check("patches name their target (apiVersion, kind, metadata.name)", problems, f"{len(renderer.patch_docs)} patches")
    for label, objs in renders.items():
        problems = []
        seen = set()
        for obj in objs:
            problems += schema_problems(obj)
            key = (obj.get("kind"), obj["metadata"].get("namespace"), obj["metadata"].get("name"))
            if key in seen:
                problems.append(f"{ident(obj)} appears twice")
            seen.add(key)
        report.check(f"[{label}] schema (strict, rendered)", problems)

    report.check("example Secrets hold placeholders only", check_examples(examples))
    report.check("Dockerfile and .dockerignore agree with the manifests", check_dockerfile(renders))

    # 4. Invariants, on what is actually deployed: the kustomizations no other
    # one includes (the entry points), and the alternatives.
    collector = renders.get("otel-collector", [])
    example_docs = [doc for _, doc in examples]
    included = {rel(d).removeprefix("deploy/") for d in usage.kustomizations_included}
    entry_points = [label for label in renders if label not in included]
    for label in entry_points:
        objs = renders[label]
        ctx = Context(label, objs, binaries, example_docs, collector)
        if ctx.ours:
            report.check(f"[{label}] env: every variable is one its binary accepts", check_env(ctx))
            report.check(f"[{label}] ports and probes match the binaries' defaults", check_ports_and_probes(ctx))
            report.check(f"[{label}] grace periods and lease cover the configured timeouts", check_grace(ctx))
            report.check(f"[{label}] NetworkPolicies allow what the pods need", check_network_needs(ctx))
            report.check(f"[{label}] the migration runs the deployed release", check_release_images(ctx))
        if pods(objs):
            report.check(f"[{label}] pods: probes, resources, non-root read-only security context", check_hygiene(ctx))
            report.check(f"[{label}] selectors select what they should", check_selectors(ctx))
        problems, has_keda = check_autoscaling(ctx)
        report.check(f"[{label}] autoscalers: one per workload" + (", KEDA query = count_due.sql" if has_keda else ""), problems)
        report.check(f"[{label}] no Secret rendered; referenced Secrets documented", check_secrets(ctx))
        if find(objs, "PrometheusRule"):
            report.check(f"[{label}] alerts use documented metrics and have runbook sections", check_alert_rules(ctx))
        if label == "otel-collector":
            report.check(f"[{label}] collector pipelines are complete", check_collector_config(objs))
    return report.summary()


if __name__ == "__main__":
    sys.exit(main())
