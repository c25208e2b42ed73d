#!/usr/bin/env bash
# Builds the container image from ./Containerfile with podman and checks what
# can be checked without running a container (this sandbox refuses `podman
# run`: crun cannot set its rlimits here):
#
#   - the image's entrypoint (/fencegw), user (65532:65532, not root),
#     default command, exposed port and data volume (podman image inspect);
#   - that it holds the binary, the CA certificates and the data directory
#     and nothing else (podman export of a created container);
#   - the binary inside it: copied out (podman create + podman cp), it is a
#     static build (CGO_ENABLED=0), starts on a free port and answers
#     /healthz.
#
#   bash scripts/image-check.sh
#   GO_IMAGE=docker.io/library/golang:1.26-bookworm bash scripts/image-check.sh
#
# The build stage needs a Go image. This machine reaches no image registry,
# so unless GO_IMAGE is given the script makes a local one from the
# machine's own Go toolchain (GOROOT, the CA bundle, sh and mkdir with the
# libraries they load), tagged with the Go version and kept for later runs.
# RUN steps use --isolation chroot (crun cannot start containers here); the
# machine's module and build caches are mounted into the build stage.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'image-check: %s\n' "$*"; }
die() { say "FAIL: $*" >&2; exit 1; }

if ! command -v podman >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman >/dev/null
fi
say "$(podman --version)"

image=localhost/fencegw:image-check
tmp=$(mktemp -d)
ctr=""
gw=""
cleanup() {
  local rc=$?
  if [ -n "$gw" ]; then
    kill "$gw" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$gw" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$gw" 2>/dev/null || true
    wait "$gw" 2>/dev/null || true
  fi
  [ -n "$ctr" ] && podman rm -f "$ctr" >/dev/null 2>&1 || true
  if [ "$rc" -ne 0 ] && [ -s "$tmp/gateway.log" ]; then
    echo "--- gateway.log" >&2; tail -n 40 "$tmp/gateway.log" >&2
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# builder_image: a local Go image for the build stage, from this machine.
builder_image() {
  local goroot tag root bin lib
  goroot=$(go env GOROOT)
  tag=localhost/fencegw-go-builder:$(go env GOVERSION)
  if podman image exists "$tag"; then
    printf '%s\n' "$tag"; return
  fi
  root=$tmp/rootfs
  mkdir -p "$root/usr/local" "$root/etc/ssl/certs" "$root/bin" "$root/tmp" "$root/root" "$root/go"
  cp -a "$goroot" "$root/usr/local/go"
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
  for bin in sh mkdir; do
    cp -L "$(command -v "$bin")" "$root/bin/$bin"
    for lib in $(ldd "$(command -v "$bin")" | grep -Eo '/[^ ]+\.so[^ ]*'); do
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done
  done
  chmod 1777 "$root/tmp"
  tar -C "$root" -cf - . | podman import \
    --change 'ENV PATH=/usr/local/go/bin:/go/bin:/bin' \
    --change 'ENV HOME=/root' --change 'ENV GOPATH=/go' --change 'ENV GOTOOLCHAIN=local' \
    - "$tag" >/dev/null
  rm -rf "$root"
  printf '%s\n' "$tag"
}

go_image=${GO_IMAGE:-}
if [ -z "$go_image" ]; then
  go_image=$(builder_image)
fi
say "build stage: $go_image"

say "podman build -f Containerfile"
mkdir -p "$(go env GOMODCACHE)" "$(go env GOCACHE)"
timeout 1200 podman build --isolation chroot --build-arg "GO_IMAGE=$go_image" \
  -v "$(go env GOMODCACHE):/go/pkg/mod" -v "$(go env GOCACHE):/root/.cache/go-build" \
  -f Containerfile -t "$image" . >"$tmp/build.log" 2>&1 || { tail -n 40 "$tmp/build.log" >&2; die "podman build failed"; }
# The build stage and the image this tag named before are left untagged;
# without this every run keeps ~300 MB more.
podman image prune -f >/dev/null 2>&1 || true

say "podman image inspect"
inspect() { podman image inspect --format "$1" "$image"; }
[ "$(inspect '{{json .Config.Entrypoint}}')" = '["/fencegw"]' ] || die "entrypoint $(inspect '{{json .Config.Entrypoint}}'), want [\"/fencegw\"]"
[ "$(inspect '{{.Config.User}}')" = "65532:65532" ] || die "user $(inspect '{{.Config.User}}'), want 65532:65532 (not root)"
inspect '{{json .Config.Cmd}}' | grep -q '"serve","--listen","0.0.0.0:8080"' || die "default command $(inspect '{{json .Config.Cmd}}')"
inspect '{{json .Config.ExposedPorts}}' | grep -q '"8080/tcp"' || die "exposes $(inspect '{{json .Config.ExposedPorts}}'), want 8080/tcp"
inspect '{{json .Config.Volumes}}' | grep -q '"/data"' || die "volumes $(inspect '{{json .Config.Volumes}}'), want /data"
say "entrypoint /fencegw, user 65532:65532, cmd $(inspect '{{json .Config.Cmd}}'), port 8080, volume /data"

ctr=$(podman create "$image")
# What the image holds: only these (directories aside).
podman export "$ctr" | tar -t | grep -v '/$' | sort >"$tmp/files"
want=$'etc/ssl/certs/ca-certificates.crt\nfencegw'
if [ "$(grep -Ev '^(dev|etc|proc|run|sys)/(hostname|hosts|resolv\.conf|\.containerenv)?$|^run/\.containerenv$|^etc/(hostname|hosts|resolv\.conf)$' "$tmp/files")" != "$want" ]; then
  cat "$tmp/files" >&2; die "the image holds more than the binary and the CA certificates (above)"
fi
podman export "$ctr" | tar -tv | grep -E ' data/?$' | grep -q '65532/65532' || die "/data is not owned by 65532"

podman cp "$ctr:/fencegw" "$tmp/fencegw"
go version -m "$tmp/fencegw" | grep -q 'CGO_ENABLED=0' || die "the binary in the image is not a CGO_ENABLED=0 build"
say "the image holds /fencegw ($(du -h "$tmp/fencegw" | cut -f1), CGO_ENABLED=0), the CA certificates and /data"

"$tmp/fencegw" serve --listen 127.0.0.1:0 --data "$tmp/data" >"$tmp/gateway.log" 2>&1 &
gw=$!
url=""
for _ in $(seq 300); do
  url=$(sed -n 's/.*serving on \(http[^ ]*\).*/\1/p' "$tmp/gateway.log" | head -n 1)
  [ -n "$url" ] && break
  kill -0 "$gw" 2>/dev/null || die "the binary from the image did not start"
  sleep 0.1
done
[ -n "$url" ] || die "the binary from the image did not say where it serves"
got=$(curl -fsS --max-time 10 "$url/healthz") || die "GET $url/healthz failed"
[ "$got" = "ok" ] || die "GET /healthz answered '$got'"
say "the binary from the image serves: GET $url/healthz -> $got"
say "PASS"
