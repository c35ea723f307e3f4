#!/usr/bin/env bash
# Build the TEST-ONLY Cosmos DB emulator image FROM scratch, with nothing
# pulled from any registry:
#   node (`command -v node`) + the libraries `ldd` lists + the dynamic loader,
#   node_modules (npm ci from package-lock.json when missing or stale),
#   launcher.js, and a freshly generated self-signed cert (localhost, 127.0.0.1).
#
# Idempotent and fast: the image carries a label with a hash of every input
# (node binary, package-lock.json, launcher.js, Dockerfile, this script); when
# an image with that tag and hash exists, nothing is done.
#
# Env: COSMOS_EMULATOR_IMAGE (default stepstone/cosmos-emulator:1.0.1),
#      FORCE=1 to rebuild anyway.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
image="${COSMOS_EMULATOR_IMAGE:-stepstone/cosmos-emulator:1.0.1}"
label_key="org.stepstone.cosmos-emulator.inputs"

node_bin="$(command -v node)"
node_bin="$(readlink -f "$node_bin")"

inputs_hash="$(
  {
    sha256sum "$node_bin" | cut -d' ' -f1
    cd "$here" && sha256sum package.json package-lock.json launcher.js Dockerfile build-image.sh
  } | sha256sum | cut -d' ' -f1
)"

if [ "${FORCE:-0}" != "1" ]; then
  existing="$(docker image inspect --format "{{ index .Config.Labels \"$label_key\" }}" "$image" 2>/dev/null || true)"
  if [ "$existing" = "$inputs_hash" ]; then
    echo "build-image: $image is up to date" >&2
    exit 0
  fi
fi

# node_modules must match package-lock.json: npm writes its own copy of the
# lock to node_modules/.package-lock.json on install, so a missing or older
# copy means node_modules is absent or stale.
if [ ! -d "$here/node_modules/@vercel/cosmosdb-server" ] \
   || [ ! -f "$here/node_modules/.package-lock.json" ] \
   || [ "$here/node_modules/.package-lock.json" -ot "$here/package-lock.json" ]; then
  echo "build-image: npm ci" >&2
  (cd "$here" && npm ci --omit=dev --no-audit --no-fund --loglevel=error)
fi

ctx="$(mktemp -d "${TMPDIR:-/tmp}/stepstone-cosmos-image.XXXXXX")"
trap 'rm -rf "$ctx"' EXIT
root="$ctx/rootfs"
mkdir -p "$root/usr/bin" "$root/app/certs" "$root/tmp"
chmod 1777 "$root/tmp"

# node and its shared libraries, each at the path the loader looks for it
# (ldd's left-hand path for the loader line, the resolved path otherwise).
cp -L "$node_bin" "$root/usr/bin/node"
ldd "$node_bin" | awk '
  $2 == "=>" && $3 ~ /^\// { print $3; next }   # libfoo.so => /path (0x...)
  $1 ~ /^\// { print $1 }                        # /lib64/ld-linux-x86-64.so.2 (0x...)
' | sort -u | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
interp="$(readelf -l "$node_bin" 2>/dev/null | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p' || true)"
if [ -n "$interp" ] && [ ! -e "$root$interp" ]; then
  mkdir -p "$root$(dirname "$interp")"
  cp -L "$interp" "$root$interp"
fi

cp "$here/launcher.js" "$here/package.json" "$here/package-lock.json" "$root/app/"
cp -a "$here/node_modules" "$root/app/node_modules"

# Throwaway TEST-ONLY cert, new for every build, never committed.
openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
  -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
  -keyout "$root/app/certs/key.pem" -out "$root/app/certs/cert.pem" 2>/dev/null
chmod 0644 "$root/app/certs/key.pem" "$root/app/certs/cert.pem"   # read by uid 65534

cp "$here/Dockerfile" "$ctx/Dockerfile"

# The docker.io engine has no buildx plugin; the classic builder needs none.
if ! docker buildx version >/dev/null 2>&1; then
  export DOCKER_BUILDKIT=0
fi
echo "build-image: building $image" >&2
docker build -q --label "$label_key=$inputs_hash" -t "$image" "$ctx" >/dev/null
echo "build-image: built $image" >&2
