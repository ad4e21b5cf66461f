#!/usr/bin/env bash
# `make images`: localhost/{webhook-ingest,outbox-relay,ops-console}:$IMAGES_TAG by podman
# from deploy/Dockerfile's `<binary>-prebuilt` targets (the host's binaries copied, not
# compiled) on a stand-in for gcr.io/distroless/cc-debian12:nonroot made FROM scratch:
# the libraries `ldd` lists, the CA bundle, the user nonroot, /tmp; no shell; no registry.
# Writes target/images/<image>.iid (the smoke checks that its pods run these).
#
# Environment:
#   IMAGES_PROFILE=release   release | debug: which cargo build (target/<profile>) to package
#   IMAGES_TAG=dev           the tag (the dev overlay runs `webhook-ingest:dev`)
#   CONTAINERS_OPTIONAL=1    skip (exit 0) when podman cannot be had and CI is unset
set -euo pipefail
cd "$(dirname "$0")/.."

containers_who=images
# shellcheck source=scripts/containers.sh
source scripts/containers.sh

bindir=target/${IMAGES_PROFILE:-release}
binaries=(webhook-ingest outbox-relay ops-console)
need_podman
out=target/images base=target/images/base context=target/images/context
rm -rf "$out"
mkdir -p "$base/rootfs/etc/ssl/certs" "$base/rootfs/tmp" "$base/home/nonroot" "$context"
chmod 1777 "$base/rootfs/tmp"
chmod 0700 "$base/home/nonroot"

# Every library a binary loads, where the loader finds it, and the loader (linux-vdso is the kernel's).
ldd "${binaries[@]/#/$bindir/}" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' \
  | sort -u | while read -r lib; do
  mkdir -p "$base/rootfs$(dirname "$lib")"
  cp -L "$lib" "$base/rootfs$lib"
done
cp -L /etc/ssl/certs/ca-certificates.crt "$base/rootfs/etc/ssl/certs/"
printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
  'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$base/rootfs/etc/passwd"
printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$base/rootfs/etc/group"
printf '%s\n' 'hosts: files dns' >"$base/rootfs/etc/nsswitch.conf"
cat >"$base/Containerfile" <<'EOF'
FROM scratch
COPY rootfs/ /
COPY --chown=65532:65532 home/ /home/
USER 65532:65532
WORKDIR /home/nonroot
EOF
# Fixed times: podman's layer cache compares the files' times, and this folder is made afresh.
find "$base" -exec touch -h -d @0 {} +
# Links keep cargo's file times, so unchanged binaries hit the cache. (make builds them.)
ln -f "${binaries[@]/#/$bindir/}" "$context/"

# The label lets the end of this script remove the images a new build left untagged.
build() { podman build --quiet --label webhooks.images=1 --iidfile "$out/$1.iid" "${@:2}" >/dev/null; }
base_tag=localhost/webhooks-standin/distroless-cc:nonroot
build base -t "$base_tag" "$base"
for b in "${binaries[@]}"; do
  build "$b" -f deploy/Dockerfile --build-arg RUNTIME_IMAGE="$base_tag" --target "$b-prebuilt" \
    -t "localhost/$b:${IMAGES_TAG:-dev}" "$context"
done
podman image prune -f --filter label=webhooks.images=1 >/dev/null
containers_say "built ${binaries[*]} (tag ${IMAGES_TAG:-dev}) from $bindir"
