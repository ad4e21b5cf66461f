#!/usr/bin/env bash
# Unused dependencies, the check `make lint` ends with. Two parts:
# - cargo-machete reads each crate's sources for every dependency its
#   Cargo.toml names (a name used only through a feature or a derive shows up
#   in the sources too; a true exception goes in that crate's
#   [package.metadata.cargo-machete] ignored = [...], with the reason);
# - every entry of the root [workspace.dependencies] must be inherited by
#   some crate, which cargo-machete does not look at.
# cargo-machete is installed on first use (about a minute of compiling on two
# cores), at the version pinned here, in cargo's own bin directory.
set -euo pipefail
cd "$(dirname "$0")/.."

MACHETE_VERSION=0.9.2
machete="${CARGO_HOME:-$HOME/.cargo}/bin/cargo-machete"
if [[ "$("$machete" --version 2>/dev/null)" != "$MACHETE_VERSION" ]]; then
  echo "lint-deps: installing cargo-machete $MACHETE_VERSION" >&2
  # A debug build: it compiles in well under half the time of a release
  # build, and still reads this workspace in seconds.
  cargo install --locked --debug --quiet --version "$MACHETE_VERSION" cargo-machete
fi
status=0
"$machete" || status=1

python3 - <<'PY' || status=1
import glob, sys, tomllib

def load(path):
    with open(path, "rb") as f:
        return tomllib.load(f)

root = load("Cargo.toml")
declared = set(root["workspace"]["dependencies"])
inherited = set()
for pattern in root["workspace"]["members"]:
    for member in sorted(glob.glob(pattern)):
        manifest = load(f"{member}/Cargo.toml")
        tables = [manifest] + list(manifest.get("target", {}).values())
        for table in tables:
            for section in ("dependencies", "dev-dependencies", "build-dependencies"):
                for name, spec in table.get(section, {}).items():
                    if isinstance(spec, dict) and spec.get("workspace"):
                        inherited.add(name)
unused = sorted(declared - inherited)
if unused:
    print("Cargo.toml [workspace.dependencies] that no crate inherits:", ", ".join(unused))
    sys.exit(1)
PY
exit $status
