#!/usr/bin/env bash
# Build the scorer image, push it to ECR, and record the digest the template pins.
#
#   CPU_IMAGE=python:3.11-slim-bookworm@sha256:... scripts/push_image.sh cpu [repository]
#   CUDA_IMAGE=nvidia/cuda:12.4.1-devel-ubuntu22.04@sha256:... \
#   CUDA_RUNTIME_IMAGE=nvidia/cuda:12.4.1-runtime-ubuntu22.04@sha256:... scripts/push_image.sh cuda [repository]
#
# Prints REPOSITORY@sha256:... and writes it to build/image-<flavor>.txt: pass it to
# `sam deploy --parameter-overrides CpuImageUri=... | GpuImageUri=...`. Base images must be
# pinned by digest too (ALLOW_UNPINNED_BASE=1 to try a build with the Dockerfile's tags).
# Needs docker and the AWS CLI, with credentials allowed to push to ECR.
set -euo pipefail

flavor="${1:-cpu}"
repository="${2:-decision-gateway-scorer}"
case "$flavor" in
  cpu) base_arg="CPU_IMAGE"; base="${CPU_IMAGE:-}" ;;
  cuda) base_arg="CUDA_IMAGE"; base="${CUDA_IMAGE:-}" ;;
  *) echo "push_image: flavor is cpu or cuda, not '$flavor'" >&2; exit 2 ;;
esac
build_args=(--build-arg "BASE=$flavor")
if [[ -n "$base" ]]; then
  build_args+=(--build-arg "$base_arg=$base")
fi
if [[ "$flavor" == cuda ]]; then
  # The CUDA image compiles; the runtime image it is installed into must be pinned too.
  [[ -n "${CUDA_RUNTIME_IMAGE:-}" ]] && build_args+=(--build-arg "CUDA_RUNTIME_IMAGE=$CUDA_RUNTIME_IMAGE")
  if [[ "${CUDA_RUNTIME_IMAGE:-}" != *@sha256:* && "${ALLOW_UNPINNED_BASE:-0}" != "1" ]]; then
    echo "push_image: set CUDA_RUNTIME_IMAGE to a runtime image pinned by digest (name@sha256:...)" >&2
    exit 2
  fi
fi
if [[ "$base" != *@sha256:* && "${ALLOW_UNPINNED_BASE:-0}" != "1" ]]; then
  echo "push_image: set $base_arg to a base image pinned by digest (name@sha256:...)" >&2
  exit 2
fi

region="${AWS_REGION:-${AWS_DEFAULT_REGION:-$(aws configure get region)}}"
account="$(aws sts get-caller-identity --query Account --output text)"
registry="$account.dkr.ecr.$region.amazonaws.com"
if ! aws ecr describe-repositories --repository-names "$repository" --region "$region" >/dev/null 2>&1; then
  aws ecr create-repository --repository-name "$repository" --region "$region" \
    --image-tag-mutability IMMUTABLE --image-scanning-configuration scanOnPush=true >/dev/null
fi
aws ecr get-login-password --region "$region" | docker login --username AWS --password-stdin "$registry" >/dev/null

tag="$flavor-$(git rev-parse --short=12 HEAD)"
image="$registry/$repository:$tag"
# BuildKit: the Dockerfile bind-mounts the compiled wheel from its build stage.
DOCKER_BUILDKIT=1 docker build -f scorer_container/Dockerfile "${build_args[@]}" -t "$image" .
# A base from scripts/base_images.sh trusts the build host's CA bundle: never ship one.
if [[ -n "$(docker image inspect -f '{{index .Config.Labels "io.decision-gateway.local-base"}}' "$image" 2>/dev/null)" ]]; then
  echo "push_image: $image is built on a local base (scripts/base_images.sh); pull the real base images to release" >&2
  exit 2
fi
docker push "$image" >/dev/null
digest="$(docker inspect --format '{{index .RepoDigests 0}}' "$image")"
mkdir -p build
echo "$digest" > "build/image-$flavor.txt"
echo "$digest"
