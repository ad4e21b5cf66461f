#!/usr/bin/env bash
# `make images`: localhost/{webhook-ingest,outbox-relay,ops-console}:$IMAGES_TAG
# built by podman from deploy/Dockerfile, with no registry and nothing compiled:
# - the binaries are the host's (target/release, or target/debug with
#   IMAGES_PROFILE=debug), in a build context of their own (.dockerignore keeps
#   target/ out of the usual one), for the Dockerfile's `<binary>-prebuilt`
#   targets: the release targets with the binary copied instead of compiled;
# - the runtime base (gcr.io/distroless/cc-debian12:nonroot for users) is a
#   stand-in made FROM scratch with what the binaries need of distroless cc:
#   the libraries `ldd` lists (the host's: the glibc they were linked
#   against), the CA bundle, the user `nonroot` (65532), /tmp; no shell.
# Writes target/images/<image>.iid (the smoke checks that its pods run these).
#
# Environment:
#   IMAGES_PROFILE=release   release | debug: which cargo build to package
#   IMAGES_TAG=dev           the tag (the dev overlay runs `webhook-ingest:dev`)
#   CONTAINERS_OPTIONAL=1    skip (exit 0) when podman cannot be had and CI is unset
set -euo pipefail
cd "$(dirname "$0")/.."

containers_who=images
# shellcheck source=scripts/containers.sh
source scripts/containers.sh

profile=${IMAGES_PROFILE:-release}
bindir=target/$profile
binaries=(webhook-ingest outbox-relay ops-console)
for b in "${binaries[@]}"; do
  if [[ ! -x $bindir/$b ]]; then
    containers_say "$bindir/$b is missing: run 'make ${profile/debug/build}' first (IMAGES_PROFILE: release or debug)"
    exit 2
  fi
done
need_podman
out=target/images
base=$out/base
context=$out/context
rm -rf "$out"
mkdir -p "$base/rootfs/etc/ssl/certs" "$base/rootfs/tmp" "$base/home/nonroot" "$context"
chmod 1777 "$base/rootfs/tmp"
chmod 0700 "$base/home/nonroot"

# The base's stand-in: every library a binary loads, at the path the loader
# finds it, and the loader itself (linux-vdso is the kernel's).
libs=$(ldd "${binaries[@]/#/$bindir/}" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u)
for lib in $libs; do
  mkdir -p "$base/rootfs$(dirname "$lib")"
  cp -L "$lib" "$base/rootfs$lib"
done
cp -L /etc/ssl/certs/ca-certificates.crt "$base/rootfs/etc/ssl/certs/"
printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
  'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$base/rootfs/etc/passwd"
printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$base/rootfs/etc/group"
printf '%s\n' 'hosts: files dns' >"$base/rootfs/etc/nsswitch.conf"
cat >"$base/Containerfile" <<'EOF'
# A local stand-in for gcr.io/distroless/cc-debian12:nonroot (scripts/images.sh).
FROM scratch
COPY rootfs/ /
COPY --chown=65532:65532 home/ /home/
USER 65532:65532
WORKDIR /home/nonroot
EOF
# Fixed times: podman's layer cache compares the files' times too, and this
# folder is made afresh each run.
find "$base" -exec touch -h -d @0 {} +
for b in "${binaries[@]}"; do
  # A link keeps cargo's file time, so unchanged binaries hit the cache.
  ln -f "$bindir/$b" "$context/$b" 2>/dev/null || cp -p "$bindir/$b" "$context/$b"
done

# build NAME ARGS...: podman build, quiet but for errors. The label lets the
# end of this script remove the images that a new build left untagged.
build() { podman build --quiet --label webhooks.images=1 --iidfile "$out/$1.iid" "${@:2}" >/dev/null; }
base_tag=localhost/webhooks-standin/distroless-cc:nonroot
build base -t "$base_tag" "$base"
for b in "${binaries[@]}"; do
  build "$b" -f deploy/Dockerfile --build-arg RUNTIME_IMAGE="$base_tag" --target "$b-prebuilt" \
    -t "localhost/$b:${IMAGES_TAG:-dev}" "$context"
done
podman image prune -f --filter label=webhooks.images=1 >/dev/null
containers_say "$profile binaries, revision $(git rev-parse --short HEAD 2>/dev/null || echo unknown):"
podman images --format '{{.Repository}}:{{.Tag}} {{.ID}} {{.Size}}' --filter label=webhooks.images=1 >&2
