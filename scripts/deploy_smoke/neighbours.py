"""What stands around the pods: the smoke's own Postgres and the simulated
downstream APIs, both on the host's loopback."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from .manifests import ROOT, SmokeFailure


class Cluster:
    """The smoke's own throwaway Postgres (scripts/pg-cluster.sh with a
    folder and port of its own, which it may stop: nothing else uses it)."""

    def __init__(self) -> None:
        self.admin = self._pg("start").strip().splitlines()[-1]
        parts = urlsplit(self.admin)
        self.port = parts.port

    @staticmethod
    def _pg(verb: str) -> str:
        done = subprocess.run([str(ROOT / "scripts/pg-cluster.sh"), verb], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise SmokeFailure(f"scripts/pg-cluster.sh {verb}: {done.stderr.strip()}")
        return done.stdout

    def stop(self) -> None:
        self._pg("stop")

    def start(self) -> None:
        self._pg("start")

    def url(self, database: str) -> str:
        return self.admin.rsplit("/", 1)[0] + "/" + database

    def sql(self, sql: str, database: str = "postgres") -> str:
        done = subprocess.run(["psql", self.url(database), "-X", "-qAt", "-v", "ON_ERROR_STOP=1", "-c", sql],
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise SmokeFailure(f"psql: {done.stderr.strip()}")
        return done.stdout.strip()


class Downstream:
    """The simulated fulfilment and email APIs (crates/simulator), on the
    host's loopback, which the relay reaches at 10.0.2.2."""

    def __init__(self, simulator: Path, workdir: Path) -> None:
        self.log = (workdir / "downstream.log").open("w")
        self.proc = subprocess.Popen([str(simulator), "downstream", "--listen", "127.0.0.1:0"],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise SmokeFailure(f"the simulated downstream did not start (see {workdir / 'downstream.log'})")
        addr = json.loads(line)["listening"]
        self.port = int(addr.rsplit(":", 1)[1])
        self.url = f"http://{addr}"

    def faults(self, faults: dict) -> None:
        req = urllib.request.Request(f"{self.url}/control/faults", data=json.dumps(faults).encode(),
                                     headers={"content-type": "application/json"}, method="POST")
        urllib.request.urlopen(req, timeout=10).read()

    def stats(self) -> dict:
        return json.loads(urllib.request.urlopen(f"{self.url}/stats", timeout=10).read())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
