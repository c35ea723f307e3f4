#!/usr/bin/env bash
# Make a Docker engine available on this machine, then build the local
# Cosmos DB emulator image (backends/cosmos/emulator/build-image.sh).
#
# - installs Debian's docker.io when no `dockerd` is present (the machine may
#   ship only the docker CLI);
# - starts `dockerd --bridge=none --iptables=false` in the background when no
#   daemon answers `docker info` (no registry is reachable and containers use
#   host networking, so no bridge/NAT is needed); log: $DOCKERD_LOG;
# - waits up to $DOCKERD_TIMEOUT seconds (default 60) for `docker info`.
# Idempotent: a second run finds the daemon up and the image built, and
# returns in about a second.
#
# Env: DOCKERD_LOG (default /tmp/stepstone-dockerd.log),
#      DOCKERD_TIMEOUT (default 60), SKIP_COSMOS_IMAGE=1 to skip the build.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log="${DOCKERD_LOG:-/tmp/stepstone-dockerd.log}"
timeout_s="${DOCKERD_TIMEOUT:-60}"

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
  echo "start-dockerd: installing docker.io (Debian)" >&2
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -q
  as_root apt-get install -y -q docker.io
fi

if docker info >/dev/null 2>&1; then
  echo "start-dockerd: docker daemon already running" >&2
else
  echo "start-dockerd: starting dockerd (log: $log)" >&2
  # setsid + nohup: the daemon outlives this script and its session.
  as_root setsid nohup dockerd --bridge=none --iptables=false >>"$log" 2>&1 < /dev/null &
  deadline=$((SECONDS + timeout_s))
  until docker info >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "start-dockerd: docker daemon did not answer within ${timeout_s}s; last log lines:" >&2
      tail -n 30 "$log" >&2 || true
      exit 1
    fi
    sleep 0.5
  done
  echo "start-dockerd: docker daemon is up" >&2
fi

if [ "${SKIP_COSMOS_IMAGE:-0}" != "1" ]; then
  "$repo_root/backends/cosmos/emulator/build-image.sh"
fi
