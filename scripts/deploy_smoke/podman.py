"""The container runtime: a rendered container as `podman run` arguments,
and the few podman commands the smoke needs.

Networking: each container gets a network namespace of its own, like a pod
(slirp4netns), with the host's loopback reachable at 10.0.2.2
(allow_host_loopback), which is where the smoke's Postgres and the simulated
downstream listen. Every container port, and every port a probe targets, is
published on 127.0.0.1 at a port podman picks: the container listens on the
ports of the manifest, and the smoke reaches them as a kubelet reaches the
pod's IP. Host networking would need every port moved apart (both services
serve :9090), and so could not run the manifests' ports as they are.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .objects import SmokeFailure
from .pod import Container

LABEL = "webhooks.deploy-smoke"
HOST_FROM_CONTAINER = "10.0.2.2"
NETWORK = "slirp4netns:allow_host_loopback=true"


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise SmokeFailure(f"podman {' '.join(args[:2])}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def inspect(ref: str, what: str = "container") -> dict:
    return json.loads(podman(what, "inspect", ref).stdout)[0]


@dataclass
class Running:
    container: Container
    name: str  # the podman container's name
    host_ports: dict[int, int]  # container port -> 127.0.0.1 port

    def state(self) -> dict:
        return inspect(self.name)["State"]

    def exited(self) -> int | None:
        """The exit code once the container has stopped; None while it runs."""
        s = self.state()
        return None if s["Status"] in ("running", "created", "configured", "initialized", "stopping") else s["ExitCode"]

    def logs(self, tail: int | None = None) -> str:
        # All of it, cut here: podman's --tail counts the pieces of a line
        # written in several writes, and can cut one in two.
        done = subprocess.run(["podman", "logs", self.name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=60)
        lines = done.stdout.splitlines()
        return "\n".join(lines[-tail:] if tail else lines)

    def remove(self) -> None:
        podman("rm", "-f", "-t", "0", self.name, check=False)


class Runtime:
    def __init__(self, key: str, workdir: Path) -> None:
        self.key = key
        self.workdir = workdir
        self.label = f"{LABEL}={key}"

    def remove_leftovers(self) -> int:
        """Containers an interrupted earlier run of this checkout left."""
        ids = podman("ps", "-a", "-q", "--filter", f"label={self.label}").stdout.split()
        for i in ids:
            podman("rm", "-f", "-t", "0", i, check=False)
        return len(ids)

    def args(self, c: Container, image_id: str, env_file: Path, ports: list[int]) -> list[str]:
        """`podman run` arguments for the container, from its settings alone."""
        a = ["--name", f"smoke-{self.key}-{c.pod_name}", "--hostname", c.pod_name, "--label", self.label,
             "--pull", "never", "--network", NETWORK, "--env-file", str(env_file)]
        for p in ports:
            a += ["-p", f"127.0.0.1::{p}"]
        if c.run_as_user is not None:
            a += ["--user", f"{c.run_as_user}" + (f":{c.run_as_group}" if c.run_as_group is not None else "")]
        for g in c.supplemental_groups:
            a += ["--group-add", str(g)]
        if c.read_only_root:
            # podman would otherwise mount tmpfs on /tmp, /run and /var/tmp of
            # a read-only container; a kubelet mounts nothing there.
            a += ["--read-only", "--read-only-tmpfs=false"]
        for cap in c.cap_drop:
            a += ["--cap-drop", cap.lower()]
        for cap in c.cap_add:
            a += ["--cap-add", cap.lower()]
        if not c.allow_privilege_escalation:
            a += ["--security-opt", "no-new-privileges"]
        if c.seccomp == "Unconfined":
            a += ["--security-opt", "seccomp=unconfined"]
        if c.memory_limit is not None:
            # No swap: the kubelet runs containers without.
            a += ["--memory", str(c.memory_limit), "--memory-swap", str(c.memory_limit)]
        if c.cpu_limit is not None:
            a += ["--cpus", f"{c.cpu_limit:g}"]
        if c.cpu_shares is not None:
            a += ["--cpu-shares", str(c.cpu_shares)]
        for path in c.tmpfs:
            a += ["--mount", f"type=tmpfs,destination={path},tmpfs-mode=1777"]
        if c.working_dir:
            a += ["--workdir", c.working_dir]
        if c.command is not None:
            a += ["--entrypoint", json.dumps(c.command)]
        return a + [image_id] + (c.args or [])

    def run(self, c: Container, image_id: str, extra_ports: list[int]) -> Running:
        env_file = self.workdir / f"{c.pod_name}.env"
        for k, v in c.env.items():
            if "\n" in v:
                raise SmokeFailure(f"{c.owner}: variable {k} holds a newline, which --env-file cannot carry")
        env_file.touch(mode=0o600)
        os.chmod(env_file, 0o600)
        env_file.write_text("".join(f"{k}={v}\n" for k, v in c.env.items()))
        ports = sorted(set(c.ports) | set(extra_ports))
        args = self.args(c, image_id, env_file, ports)
        name = args[1]
        try:
            podman("run", "-d", *args)
        finally:
            env_file.unlink()
        running = Running(c, name, {})
        try:
            self._publish(running, ports)
        except SmokeFailure:
            running.remove()
            raise
        return running

    @staticmethod
    def _publish(running: Running, ports: list[int]) -> None:
        c, name = running.container, running.name
        for p in ports:
            out = podman("port", name, f"{p}/tcp", check=False).stdout.strip().splitlines()
            if not out:
                code = running.exited()
                if code is not None:
                    raise SmokeFailure(f"{c.owner}: the container exited with {code} at once (CrashLoopBackOff); "
                                       f"its last lines:\n" + "\n".join("    " + line for line in running.logs(tail=15).splitlines()))
                raise SmokeFailure(f"{c.owner}: podman published no port for {p}")
            running.host_ports[p] = int(out[0].rsplit(":", 1)[1])


def image_user(image_id: str) -> str:
    return inspect(image_id, "image")["Config"].get("User", "")


def effective(r: Running) -> dict:
    """What the running process really got, read from /proc on the host."""
    pid = r.state()["Pid"]
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
    root_options = ""
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            root_options = fields[5]
    host = inspect(r.name)["HostConfig"]
    environ = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in item)
    return {
        "environ": environ,
        "uid": int(status["Uid"].split()[1]),
        "gid": int(status["Gid"].split()[1]),
        "groups": [int(g) for g in status.get("Groups", "").split()],
        "cap_eff": int(status["CapEff"], 16),
        "cap_bnd": int(status["CapBnd"], 16),
        "no_new_privs": status.get("NoNewPrivs", "0").strip() == "1",
        "seccomp": status.get("Seccomp", "0").strip() == "2",
        "root_read_only": "ro" in root_options.split(","),
        "memory": host.get("Memory") or None,
        "pid1": Path(f"/proc/{pid}/status").exists() and status.get("NSpid", "").split()[-1:] == ["1"],
    }
