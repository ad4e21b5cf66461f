#!/usr/bin/env bash
# `make images`: the images of the two services and of the operator's
# console, built by podman from deploy/Dockerfile, from the host's build:
#
#   localhost/webhook-ingest:$IMAGES_TAG   localhost/outbox-relay:$IMAGES_TAG
#   localhost/ops-console:$IMAGES_TAG
#
# Nothing is compiled inside the build and no registry is reached:
# - the binaries are the ones cargo built on this machine (target/release, or
#   target/debug with IMAGES_PROFILE=debug), given to the Dockerfile's
#   `<binary>-prebuilt` targets in a build context of their own
#   (target/images/context: the repository's .dockerignore keeps target/ out
#   of the usual context). Those targets are the release targets
#   (`webhook-ingest`, `outbox-relay`, `ops-console`) with the binary copied
#   from the context instead of compiled: the same runtime stage, user, ports
#   and entrypoint;
# - the runtime base, gcr.io/distroless/cc-debian12:nonroot for users, is a
#   stand-in made here FROM scratch with what distroless cc carries and the
#   binaries need: the shared libraries `ldd` lists (the host's own, so the
#   glibc is the one they were linked against), the CA bundle, /etc/passwd
#   and /etc/group with `nonroot` (65532), /tmp, USER 65532:65532. No shell,
#   like distroless.
# Both are rebuilt only when their content changes (podman's layer cache).
#
# Writes target/images/images.json (tag, id, size of each image and of the
# base) for scripts/deploy-smoke.sh, and prints the sizes.
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
say() { containers_say "$@"; }

profile=${IMAGES_PROFILE:-release}
tag=${IMAGES_TAG:-dev}
case $profile in release | debug) ;; *) say "IMAGES_PROFILE must be release or debug (is '$profile')"; exit 2 ;; esac
bindir=target/$profile
binaries=(webhook-ingest outbox-relay ops-console)
for b in "${binaries[@]}"; do
  [[ -x $bindir/$b ]] || { say "$bindir/$b is missing: run 'make ${profile/debug/build}' first"; exit 2; }
done

need_podman
start=$(date +%s.%N)
out=target/images
mkdir -p "$out"
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
# What the previous run built: removed at the end if no tag names it (this
# run's tags have moved) and no container uses it.
previous=$(python3 -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1])).get("built", [])))' \
  "$out/images.json" 2>/dev/null || true)
rm -f "$out/images.json"

# --- the runtime base's stand-in ---------------------------------------------
base_tag=localhost/webhooks-standin/distroless-cc:nonroot
checkout=checkout-$(printf '%s' "$(pwd -P)" | sha1sum | cut -c1-10)
base=$out/base
rm -rf "$base"
mkdir -p "$base/rootfs/etc/ssl/certs" "$base/rootfs/tmp" "$base/home/nonroot"
chmod 1777 "$base/rootfs/tmp"
chmod 0700 "$base/home/nonroot"
# Every library any binary loads, at the path the loader finds it, and the
# loader itself (linux-vdso is the kernel's).
libs=$(for b in "${binaries[@]}"; do ldd "$bindir/$b"; done \
  | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u)
[[ -n $libs ]] || { say "ldd lists no libraries for $bindir/${binaries[0]}: a static build needs no base, but this script expects glibc"; exit 2; }
for lib in $libs; do
  mkdir -p "$base/rootfs$(dirname "$lib")"
  cp -L "$lib" "$base/rootfs$lib"
done
bundle=/etc/ssl/certs/ca-certificates.crt
[[ -s $bundle ]] || { say "no $bundle on this machine (apt-get install ca-certificates): the images need it"; exit 2; }
cp -L "$bundle" "$base/rootfs$bundle"
# distroless's users and groups.
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
# build IIDFILE ARGS...: podman build, quiet unless it fails.
build() {
  local log
  if ! log=$(podman build --quiet --iidfile "$1" "${@:2}" 2>&1); then
    printf '%s\n' "$log" >&2
    say "podman build ${*:2} failed"
    exit 1
  fi
}
build "$out/base.iid" -t "$base_tag" -t "${base_tag%:*}:$checkout" "$base"

# --- the images -----------------------------------------------------------------
context=$out/context
rm -rf "$context"
mkdir -p "$context"
for b in "${binaries[@]}"; do
  # A link keeps cargo's file time, so unchanged binaries hit the cache.
  ln -f "$bindir/$b" "$context/$b" 2>/dev/null || cp -p "$bindir/$b" "$context/$b"
done
dockerfile=(-f deploy/Dockerfile --build-arg RUNTIME_IMAGE="$base_tag")
# A second tag per checkout: another checkout building the same tags (a CI
# clone beside a working copy) leaves this one's images named, so that
# neither's clean-up below removes what the other is about to run.
for b in "${binaries[@]}"; do
  t0=$(date +%s.%N)
  build "$out/$b.iid" "${dockerfile[@]}" --target "$b-prebuilt" -t "localhost/$b:$tag" -t "localhost/$b:$checkout" "$context"
  say "built localhost/$b:$tag (target $b-prebuilt) from $bindir in $(elapsed "$t0") s"
done

# --- what was built ---------------------------------------------------------------
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
python3 - "$out" "$profile" "$tag" "$base_tag" "$revision" "${binaries[@]}" <<'PY'
import json, subprocess, sys
out, profile, tag, base_tag, revision, *binaries = sys.argv[1:]

def iid(name):
    return open(f"{out}/{name}.iid").read().strip().removeprefix("sha256:")

def inspect(ref):
    done = subprocess.run(["podman", "image", "inspect", ref], capture_output=True, text=True, check=True)
    image = json.loads(done.stdout)[0]
    return {"id": image["Id"], "size": image["Size"]}

images = {b: {"tag": f"localhost/{b}:{tag}", **inspect(iid(b))} for b in binaries}
base = {"tag": base_tag, **inspect(iid("base"))}
built = [base["id"]] + [i["id"] for i in images.values()]
json.dump({"profile": profile, "bindir": f"target/{profile}", "revision": revision, "base": base,
           "images": images, "built": built}, open(f"{out}/images.json", "w"), indent=2)
mb = lambda n: f"{n / 1e6:.1f} MB"
print(f"images: {profile} binaries, revision {revision[:12]}; sizes uncompressed, as `podman images` counts:",
      file=sys.stderr)
for b, i in images.items():
    print(f"  {i['tag']:<30} {i['id'][:12]}  {mb(i['size']):>9}  (base {mb(base['size'])} + {b} {mb(i['size'] - base['size'])})",
          file=sys.stderr)
PY

# The previous run's images that this one replaced, if no tag names them and
# no container uses them (podman refuses then): ours alone, by id.
now=$(python3 -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))["built"]))' "$out/images.json")
for id in $previous; do
  [[ " $now " == *" $id "* ]] && continue
  [[ $(podman image inspect --format '{{len .RepoTags}}' "$id" 2>/dev/null) == 0 ]] || continue
  podman rmi "$id" >/dev/null 2>&1 || true
done
say "done in $(elapsed "$start") s"
