"""What the API server and the kubelet refuse before a container starts.

- Pod Security admission: a namespace labelled
  `pod-security.kubernetes.io/enforce: baseline|restricted` gets no pod
  that violates that level (the ReplicaSet or Job controller's create is
  refused; the Deployment itself is only warned about). The checks of the
  Pod Security Standards (v1.30) that concern the fields our pods can carry.
- The kubelet's own non-root check: with runAsNonRoot, a container whose
  user (runAsUser, else the image's USER) is 0, or not numeric, is never
  started (CreateContainerConfigError).
"""

from __future__ import annotations

from .objects import Objects
from .pod import Container

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def level(objs: Objects, namespace: str) -> str:
    ns = next((o for o in objs.of_kind("Namespace") if o["metadata"]["name"] == namespace), None)
    labels = ((ns or {}).get("metadata") or {}).get("labels") or {}
    return labels.get("pod-security.kubernetes.io/enforce", "privileged")


def violations(pod_spec: dict, enforce: str) -> list[str]:
    """The Pod Security Standards' checks for one pod template, worded as
    the admission error words them."""
    if enforce == "privileged":
        return []
    out = []
    pod_sc = pod_spec.get("securityContext") or {}
    containers = (pod_spec.get("initContainers") or []) + pod_spec["containers"]
    for f in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(f):
            out.append(f"host namespaces ({f}=true)")
    for c in containers:
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            out.append(f'privileged (container "{name}" must not set securityContext.privileged=true)')
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            out.append(f'non-default capabilities (container "{name}" must not include {sorted(added - BASELINE_CAPABILITIES)} in securityContext.capabilities.add)')
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f'hostPort (container "{name}" uses hostPort)')
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp == "Unconfined":
            out.append(f'seccompProfile (container "{name}" must not set seccompProfile.type to "Unconfined")')
    for v in pod_spec.get("volumes") or []:
        if "hostPath" in v:
            out.append(f'hostPath volumes (volume "{v["name"]}")')
    if enforce != "restricted":
        return out
    for v in pod_spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f'restricted volume types (volume "{v["name"]}" uses {sorted(kinds)})')
    pod_non_root = pod_sc.get("runAsNonRoot")
    if pod_sc.get("runAsUser") == 0:
        out.append("runAsUser=0 (pod must not set runAsUser=0)")
    for c in containers:
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f'allowPrivilegeEscalation != false (container "{name}" must set securityContext.allowPrivilegeEscalation=false)')
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f'unrestricted capabilities (container "{name}" must set securityContext.capabilities.drop=["ALL"])')
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f'unrestricted capabilities (container "{name}" must not include {sorted(set(caps["add"]) - {"NET_BIND_SERVICE"})} in securityContext.capabilities.add)')
        if sc.get("runAsNonRoot") is False or (sc.get("runAsNonRoot") is None and pod_non_root is not True):
            out.append(f'runAsNonRoot != true (pod or container "{name}" must set securityContext.runAsNonRoot=true)')
        if sc.get("runAsUser") == 0:
            out.append(f'runAsUser=0 (container "{name}" must not set runAsUser=0)')
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f'seccompProfile (pod or container "{name}" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")')
    return out


def admit(objs: Objects, namespace: str) -> tuple[str, dict[str, list[str]]]:
    """(the namespace's enforced level, {Kind/name: violations}) for every
    pod template of the render."""
    enforce = level(objs, namespace)
    out = {}
    for obj in objs.all:
        spec = ((obj.get("spec") or {}).get("template") or {}).get("spec")
        if spec is not None and "containers" in spec:
            out[f"{obj['kind']}/{obj['metadata']['name']}"] = violations(spec, enforce)
    return enforce, out


def kubelet_non_root(c: Container, image_user: str) -> str | None:
    """The kubelet's verifyRunAsNonRoot: None if the container may start."""
    if not c.run_as_non_root:
        return None
    if c.run_as_user is not None:
        if c.run_as_user == 0:
            return f"container's runAsUser breaks non-root policy (pod: {c.pod_name}, container: {c.name})"
        return None
    user = image_user.split(":", 1)[0]
    if not user.isdigit():
        return (f"container has runAsNonRoot and image has non-numeric user ({user or 'none: root'}), "
                f"cannot verify user is non-root (pod: {c.pod_name}, container: {c.name})")
    if int(user) == 0:
        return f"container has runAsNonRoot and image will run as root (pod: {c.pod_name}, container: {c.name})"
    return None
