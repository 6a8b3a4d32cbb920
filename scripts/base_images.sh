#!/usr/bin/env bash
# Base images for hosts that cannot pull from a registry: the system from Debian bookworm
# packages (DEBIAN_MIRROR, default deb.debian.org), the Python packages from the package
# index pip is configured with. That is what an air-gapped build host has: mirrors.
#
#   scripts/base_images.sh            build what is missing, tag it as the real images
#   scripts/base_images.sh --force    rebuild both
#
# It makes the two images this project starts from, under the names the unchanged
# scorer Dockerfile and the SAM CLI look for:
#   python:3.11-slim-bookworm                  the scorer's base (Debian bookworm's Python
#                                              3.11, `python` on PATH, pip allowed to install)
#   public.ecr.aws/lambda/python:3.13-$ARCH    a Lambda base for `sam local` (the functions'
#                                              runtime, template.yaml): Debian trixie's Python
#                                              3.13, the runtime interface client `awslambdaric`
#                                              from PyPI behind /var/runtime/bootstrap (AWS's
#                                              way to build a Lambda image on any base), boto3
#                                              at this project's pin and snapshot-restore-py
#                                              (the managed runtime ships both); the SAM CLI
#                                              adds its own Runtime Interface Emulator.
# An image that is already present (pulled, or built earlier) is left alone, so where
# the real images can be pulled nothing here runs. The images built here carry the label
# io.decision-gateway.local-base (scripts/push_image.sh refuses to ship one): they trust
# the build host's CA bundle. Progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

docker_bin="${DOCKER:-$(command -v /usr/bin/docker || command -v docker || true)}"
[[ -n "$docker_bin" ]] || { echo "[base-images] no docker client: run scripts/engine.sh" >&2; exit 2; }
force=0
[[ "${1:-}" == "--force" ]] && force=1
mirror="${DEBIAN_MIRROR:-http://deb.debian.org}"
arch="$(uname -m)"
case "$arch" in
  x86_64|amd64) lambda_arch=x86_64 ;;
  aarch64|arm64) lambda_arch=arm64 ;;
  *) echo "base_images: no Lambda base for $arch" >&2; exit 2 ;;
esac
python_image="python:3.11-slim-bookworm"
lambda_python="3.13"  # template.yaml's Runtime (tests/infra/test_template.py holds them equal)
lambda_image="public.ecr.aws/lambda/python:$lambda_python-$lambda_arch"
rootfs_image="decision-gateway/bookworm-rootfs:latest"
lambda_rootfs_image="decision-gateway/trixie-rootfs:latest"
work="build/base-images"
say() { echo "[base-images] $*" >&2; }
present() { "$docker_bin" image inspect "$1" >/dev/null 2>&1; }

# Where a registry answers, the real images are simply pulled and nothing is built.
limit() { if command -v timeout >/dev/null; then timeout 600 "$@"; else "$@"; fi; }
pull() { present "$1" || limit "$docker_bin" pull --quiet "$1" >/dev/null 2>&1; }
if (( ! force )) && pull "$python_image" && pull "$lambda_image"; then
  say "both bases present ($python_image, $lambda_image): nothing to build"
  exit 0
fi
mkdir -p "$work"

# The host's CA bundle goes into the images so that pip and apt inside a build reach the
# same package index and mirror the host reaches (a proxy with its own CA included).
ca_bundle="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
cp "$ca_bundle" "$work/ca-certificates.crt"

rootfs() {  # rootfs SUITE TAG: a Debian minbase with its Python, imported as TAG
  command -v mmdebstrap >/dev/null || { echo "base_images: needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 2; }
  say "mmdebstrap: Debian $1 minbase with its Python (about a minute)"
  local start=$SECONDS
  mmdebstrap --quiet --variant=minbase \
    --include=python3,python3-venv,python3-pip,ca-certificates,passwd \
    --aptopt='Acquire::Retries "3"' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    "$1" "$work/rootfs.tar" \
    "deb $mirror/debian $1 main" \
    "deb $mirror/debian $1-updates main" \
    "deb $mirror/debian-security $1-security main"
  "$docker_bin" import "$work/rootfs.tar" "$2" >/dev/null
  rm -f "$work/rootfs.tar"
  say "$1 rootfs imported in $((SECONDS - start)) s"
}
if (( force )) || { ! present "$python_image" && ! present "$rootfs_image"; }; then rootfs bookworm "$rootfs_image"; fi
if (( force )) || { ! present "$lambda_image" && ! present "$lambda_rootfs_image"; }; then
  rootfs trixie "$lambda_rootfs_image"
fi

# What python:3.11-slim-bookworm gives a Dockerfile: `python` and pip on PATH (the sbin
# folders too: useradd lives there), UTF-8, pip free to install into the system, and the
# official Debian images' apt settings, which keep package lists and caches out of layers.
cat > "$work/docker-clean.conf" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
Acquire::GzipIndexes "true";
EOF
python_dockerfile() {  # python_dockerfile ROOTFS VERSION: the slim image's set-up over a rootfs
  cat <<EOF
FROM $1
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY docker-clean.conf /etc/apt/apt.conf.d/docker-clean
LABEL io.decision-gateway.local-base="scripts/base_images.sh: Debian packages, the build host's CA bundle"
RUN rm -f /usr/lib/python$2/EXTERNALLY-MANAGED \\
    && ln -sf /usr/bin/python3 /usr/local/bin/python \\
    && ln -sf /usr/bin/pip3 /usr/local/bin/pip
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \\
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
EOF
}
{ python_dockerfile "$rootfs_image" 3.11; echo 'CMD ["python3"]'; } > "$work/python.Dockerfile"

# The Lambda layout: the function's code in /var/task (the working directory), the
# runtime's bootstrap in /var/runtime, which the emulator runs with _HANDLER set.
boto3_pin="$(grep -E '^boto3==' constraints.txt || true)"
[[ -n "$boto3_pin" ]] || { echo "[base-images] constraints.txt pins no boto3" >&2; exit 2; }
awslambdaric_pin="awslambdaric==${AWSLAMBDARIC_VERSION:-4.2.2}"
snapshot_pin="snapshot-restore-py==${SNAPSHOT_RESTORE_PY_VERSION:-1.0.0}"
{ python_dockerfile "$lambda_rootfs_image" "$lambda_python"; cat <<EOF
RUN python -m pip install --no-cache-dir --root-user-action=ignore "$awslambdaric_pin" "$boto3_pin" "$snapshot_pin" \\
    && mkdir -p /var/task /var/runtime /opt \\
    && printf '#!/bin/sh\nexec /usr/local/bin/python -m awslambdaric "\$_HANDLER"\n' > /var/runtime/bootstrap \\
    && chmod 755 /var/runtime/bootstrap
ENV LAMBDA_TASK_ROOT=/var/task LAMBDA_RUNTIME_DIR=/var/runtime PYTHONPATH=/var/task
WORKDIR /var/task
ENTRYPOINT ["/var/runtime/bootstrap"]
EOF
} > "$work/lambda.Dockerfile"

build() {  # build TAG DOCKERFILE: the engine's own builder, host network, nothing pulled
  say "building $1"
  DOCKER_BUILDKIT=1 "$docker_bin" build --quiet --network host -t "$1" -f "$work/$2" "$work" >/dev/null
}
if (( force )) || ! present "$python_image"; then build "$python_image" python.Dockerfile; fi
if (( force )) || ! present "$lambda_image"; then
  build "$lambda_image" lambda.Dockerfile
  # The SAM CLI layers its emulator over the base once and reuses that image: drop it so
  # that the next `sam local` builds it again over this base.
  "$docker_bin" image rm "public.ecr.aws/lambda/python:$lambda_python-rapid-$lambda_arch" >/dev/null 2>&1 || true
fi
say "ready: $python_image, $lambda_image"
