#!/usr/bin/env bash
# A Docker engine for the container and `sam local` tests, started when the machine allows.
#
#   scripts/engine.sh     prints "ready" (exit 0) or why there is none (exit 3)
#
# An engine that already answers (Docker Desktop, a system service) is used as it is.
# Otherwise, as root on Debian, it installs Debian's docker.io and mmdebstrap and starts
# dockerd with no NAT and no iptables rules, without turning IP forwarding on: containers
# reach this machine (loopback, or the bridge's own address) and nothing beyond it. The reason for a
# missing engine is also written to build/engine.txt (DG_ENGINE_STATUS), which the tests
# quote when they skip.
set -uo pipefail
cd "$(dirname "$0")/.."
status_file="${DG_ENGINE_STATUS:-build/engine.txt}"
mkdir -p "$(dirname "$status_file")"
docker_bin="${DOCKER:-$(command -v /usr/bin/docker || command -v docker || echo docker)}"
say() { echo "[engine] $*" >&2; }
finish() { echo "$2" > "$status_file"; [[ $1 == 0 ]] && echo ready || echo "no engine: $2"; exit "$1"; }

if "$docker_bin" info >/dev/null 2>&1; then finish 0 "ready"; fi
if [[ "${DG_NO_ENGINE_SETUP:-0}" == 1 ]]; then finish 3 "no Docker engine answers and DG_NO_ENGINE_SETUP=1"; fi
if [[ "$(id -u)" != 0 ]]; then finish 3 "no Docker engine answers, and starting one needs root"; fi
if ! command -v dockerd >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1; then
  command -v apt-get >/dev/null 2>&1 || finish 3 "no Docker engine, and no apt-get to install Debian's docker.io"
  say "installing Debian's docker.io and mmdebstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io mmdebstrap >build/engine-install.log 2>&1 \
    || { apt-get update -q >>build/engine-install.log 2>&1 \
         && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io mmdebstrap >>build/engine-install.log 2>&1; } \
    || finish 3 "apt-get install docker.io failed (build/engine-install.log)"
  docker_bin=/usr/bin/docker
fi
say "starting dockerd (no NAT, no iptables rules, IP forwarding left as it is)"
nohup dockerd --iptables=false --ip-masq=false --ip-forward=false >build/dockerd.log 2>&1 &
for _ in $(seq 1 60); do
  if "$docker_bin" info >/dev/null 2>&1; then finish 0 "ready"; fi
  sleep 0.5
done
finish 3 "dockerd did not answer within 30 s (build/dockerd.log: $(tail -n 1 build/dockerd.log 2>/dev/null))"
