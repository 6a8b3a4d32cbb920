#!/usr/bin/env bash
# The CPU scorer image, built as a release build would be but tagged for local tests.
#
#   scripts/scorer_image.sh [TAG]     default decision-gateway-scorer:cpu-local
#
# The bases come from scripts/base_images.sh when they cannot be pulled. The Dockerfile's
# llama-cpp-python layer is cached by the engine, so after the first build (minutes) a
# change to the code rebuilds in seconds. The build log goes to build/scorer-image.log.
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-decision-gateway-scorer:cpu-local}"
docker_bin="${DOCKER:-$(command -v /usr/bin/docker || command -v docker || true)}"
[[ -n "$docker_bin" ]] || { echo "[scorer-image] no docker client: run scripts/engine.sh" >&2; exit 2; }
scripts/base_images.sh
mkdir -p build
echo "[scorer-image] building $tag (first build compiles llama.cpp: minutes; log in build/scorer-image.log)" >&2
start=$SECONDS
if ! DOCKER_BUILDKIT=1 "$docker_bin" build --progress=plain --network host \
    -f scorer_container/Dockerfile -t "$tag" . >build/scorer-image.log 2>&1; then
  tail -n 30 build/scorer-image.log >&2
  echo "[scorer-image] build failed (build/scorer-image.log)" >&2
  exit 1
fi
size="$("$docker_bin" image inspect -f '{{.Size}}' "$tag")"
echo "[scorer-image] $tag: $((size / 1000000)) MB, built in $((SECONDS - start)) s" >&2
echo "$tag"  # the one line on stdout: what was built, for the tests
