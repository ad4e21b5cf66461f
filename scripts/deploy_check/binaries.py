"""What our binaries accept, read from their `--help` (clap's `[env: NAME]`)."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

OURS = ("webhook-ingest", "outbox-relay", "ops-console")

# Read by the OpenTelemetry SDK or the log filter, not by clap.
ALWAYS_ACCEPTED = re.compile(r"^(OTEL_[A-Z0-9_]+|RUST_LOG)$")

# Variables a command cannot start without (clap cannot say: they are
# required by one subcommand and not another, or checked after parsing).
REQUIRED = {
    ("webhook-ingest", ()): ["DATABASE_URL", "WEBHOOK_SECRETS"],
    ("webhook-ingest", ("serve",)): ["DATABASE_URL", "WEBHOOK_SECRETS"],
    ("webhook-ingest", ("migrate",)): ["DATABASE_URL"],
    ("outbox-relay", ()): ["DATABASE_URL", "FULFILMENT_URL", "EMAIL_URL"],
    # Off unless CONSOLE_LISTEN_ADDR names an address; no sign-in without the token.
    ("ops-console", ()): ["DATABASE_URL", "CONSOLE_LISTEN_ADDR", "CONSOLE_TOKEN"],
}

ENV_MARK = re.compile(r"\[env: ([A-Za-z_][A-Za-z0-9_]*)(?:=[^\]]*)?\](?: \[default: ([^\]]*)\])?")


@dataclass
class Cli:
    command: str  # e.g. `webhook-ingest migrate`
    variables: dict[str, str | None]  # NAME -> default (None: no default)

    def accepts(self, name: str) -> bool:
        return name in self.variables or bool(ALWAYS_ACCEPTED.match(name))


def parse_help(text: str) -> dict[str, str | None]:
    """`[env: NAME]` and the `[default: ...]` clap prints after it; whitespace
    is flattened first, so wrapped help parses like unwrapped help."""
    return {m.group(1): m.group(2) for m in ENV_MARK.finditer(re.sub(r"\s+", " ", text))}


class Binaries:
    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.cache: dict[tuple[str, tuple[str, ...]], tuple[Cli | None, str | None]] = {}

    def cli(self, binary: str, subcommand: tuple[str, ...] = ()) -> tuple[Cli | None, str | None]:
        """(the Cli, None) or (None, why not)."""
        key = (binary, subcommand)
        if key not in self.cache:
            self.cache[key] = self._read(binary, subcommand)
        return self.cache[key]

    def _read(self, binary: str, subcommand: tuple[str, ...]) -> tuple[Cli | None, str | None]:
        exe = self.bindir / binary
        command = " ".join([binary, *subcommand])
        if not exe.exists():
            return None, f"{exe} is not built: run `cargo build --workspace --bins` (make build) first"
        # A clean environment: clap prints the value of a variable that is set
        # ([env: NAME=value]); none may leak in, or out for secrets.
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        try:
            done = subprocess.run([str(exe), *subcommand, "--help"], capture_output=True, text=True, timeout=30, env=env)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"`{command} --help` could not run: {e}"
        if done.returncode != 0:
            return None, f"`{command} --help` exited {done.returncode}: {done.stderr.strip()[:300]}"
        variables = parse_help(done.stdout)
        if not variables:
            return None, f"`{command} --help` lists no [env: NAME] (clap `env` attributes missing?)"
        return Cli(command, variables), None
