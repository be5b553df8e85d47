#!/usr/bin/env bash
# The install paths, tested for real (part of scripts/test.sh): builds what they need, then runs
# check.py. What it builds, and why CI can afford it:
#   - one static musl binary of the full build (x86_64, profile ci-dist: no LTO, not the fat
#     LTO of `dist`), for the amd64 image and the .deb;
#   - the aarch64 router build (profile router, gateway only), run under qemu, and its .ipk.
# The full matrix (every target, fat LTO, the amd64 + arm64 manifest list) is `scripts/dist`,
# run by hand for a release: not here.
set -euo pipefail
cd "$(dirname "$0")/../.."

need_apt=()
command -v podman >/dev/null || need_apt+=(podman)
command -v runc >/dev/null || need_apt+=(runc)
command -v qemu-aarch64-static >/dev/null || need_apt+=(qemu-user-static)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
command -v systemd-analyze >/dev/null || need_apt+=(systemd)
command -v dpkg-deb >/dev/null || need_apt+=(dpkg)
command -v newuidmap >/dev/null || need_apt+=(uidmap)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
rustup target list --installed | grep -q x86_64-unknown-linux-musl || rustup target add x86_64-unknown-linux-musl
rustup target list --installed | grep -q aarch64-unknown-linux-musl || rustup target add aarch64-unknown-linux-musl
command -v cargo-zigbuild >/dev/null || pip install -q ziglang cargo-zigbuild
command -v kubernetes-validate >/dev/null || pip install -q kubernetes-validate
HELM=${HELM:-$PWD/target/tools/helm}
if [ ! -x "$HELM" ]; then
  GOBIN="$PWD/target/tools" go install helm.sh/helm/v3/cmd/helm@v3.22.0
fi

# podman as this machine runs it (crun refuses this host's cgroup layout).
export CONTAINERS_CONF="$PWD/target/containers.conf"
mkdir -p target
printf '[containers]\ndefault_ulimits = []\n' > "$CONTAINERS_CONF"

DIST=target/deploy-dist
export DIST
# A fixed commit string: the test builds then do not rebuild on every commit.
export SLUICE_GIT_COMMIT=deploy-check
TARGETS=x86_64 PROFILE=ci-dist scripts/dist full image deb
TARGETS=aarch64 scripts/dist router ipk

# A scratch Debian root to install the .deb into (kept between runs; a few minutes to make).
DEB_ROOT=${DEB_ROOT:-/var/tmp/sluice-deb-root}
if [ ! -x "$DEB_ROOT/usr/bin/dpkg" ] || [ ! -x "$DEB_ROOT/usr/sbin/adduser" ] || [ ! -e "$DEB_ROOT/lib/systemd/system/sysinit.target" ]; then
  rm -rf "$DEB_ROOT"
  debootstrap --variant=minbase --include=adduser,systemd bookworm "$DEB_ROOT" http://deb.debian.org/debian >/dev/null
fi

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
SLUICE_IMAGE=localhost/sluice:latest \
ROUTER_BIN="$DIST/sluice-router-$VERSION-aarch64-linux-musl" \
IPK="$DIST/sluice_$VERSION-1_aarch64_generic.ipk" \
DEB="$DIST/sluice_${VERSION}_amd64.deb" \
HOST_BIN="$DIST/sluice-$VERSION-x86_64-linux-musl" \
DEB_ROOT="$DEB_ROOT" HELM="$HELM" \
  python3 scripts/deploy-check/check.py
# The images each run leaves untagged (vfs storage keeps full copies).
podman --runtime runc --cgroup-manager=cgroupfs --storage-driver=vfs image prune -f >/dev/null || true
