"""CPU by process over one window, in microseconds per unit of work, for the
throughput ratios two shared cores decide (docs/BENCHMARK.md, "What bounds
the ratios"): Postgres (as db_cpu counts it), the long-running processes
named, and the bench's children that ran to completion in the window
(resource.getrusage(RUSAGE_CHILDREN))."""

from __future__ import annotations

import resource
from typing import TYPE_CHECKING

from .common import CpuMeter, proc_cpu_secs
from .db_cpu import Server, Window, backend_apps
from .db import Session

if TYPE_CHECKING:
    from .runner import Bench


def children_cpu_secs() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Split:
    """Start before the work, stop after it (the children it started
    reaped). `pids`: name -> pid of processes alive through the window;
    `children`: the label for what the bench's children that finished in
    the window used (None: none of them is part of the work);
    `exclude`: backends of the bench's own sessions."""

    def __init__(self, bench: Bench, database: str, pids: dict[str, int], children: str | None = None,
                 exclude: set[int] | None = None) -> None:
        self.bench, self.database, self.pids, self.children = bench, database, pids, children
        self.exclude = set(exclude or ())

    def start(self) -> "Split":
        self.session = Session(self.bench.db, self.database)
        poll = int(self.session.query("SELECT pg_backend_pid();")[0])
        self.window = Window(Server.find(self.session), self.exclude | {poll}, {self.database})
        self.proc0 = {name: proc_cpu_secs(pid) for name, pid in self.pids.items()}
        self.children0 = children_cpu_secs()
        self.meter = CpuMeter()
        self.window.start()
        return self

    def stop(self) -> dict:
        try:
            pg = self.window.stop(backend_apps(self.session))
            cores = self.meter.cores_busy()
            children = children_cpu_secs() - self.children0
            procs = {name: (proc_cpu_secs(pid) or 0.0) - (self.proc0[name] or 0.0)
                     for name, pid in self.pids.items()}
        finally:
            self.session.close()
        cpu = {"postgres": pg["cpu_secs"], **{k: round(v, 3) for k, v in procs.items()}}
        if self.children:
            cpu[self.children] = round(children, 3)
        return {"seconds": pg["seconds"], "machine_cores_busy": cores, "cpu_secs": cpu,
                "postgres_split_secs": pg["split_secs"]}


def per_unit(split: dict, n: int | float) -> dict:
    """Microseconds of CPU per unit of work, by part and in total; and the
    cores all the parts kept busy."""
    parts = {k: round(v / n * 1e6, 1) for k, v in split["cpu_secs"].items()} if n else {}
    return {**parts, "total": round(sum(parts.values()), 1) if parts else None,
            "cores_counted": round(sum(split["cpu_secs"].values()) / split["seconds"], 2)
            if split["seconds"] else None,
            "machine_cores_busy": split["machine_cores_busy"]}


def brief(u: dict) -> str:
    """`per_unit`'s parts on one line, for the log."""
    return ", ".join(f"{k} {v}" for k, v in u.items() if k not in ("cores_counted", "machine_cores_busy"))
