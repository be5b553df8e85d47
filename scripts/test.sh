#!/usr/bin/env bash
# The one command that runs every test. Installs what the tests need first (ffmpeg for frame-exact
# decode checks; GStreamer's RTSP server for the RTSP tests; the pages check installs chromium
# itself; the deploy check installs its own tools), so nothing is skipped for lack of a tool.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's start, in seconds since this script began (where CI's 45 minutes go).
step() { echo "== test.sh at ${SECONDS}s: $*"; }

need_apt=()
command -v ffmpeg >/dev/null 2>&1 || need_apt+=(ffmpeg)
# An outside HTTP/2 client for the response encoder's check (crates/sluice/tests/reverse.rs).
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
# The cache cluster test (crates/sluice/tests/cluster.rs) puts each node in its own network
# namespace with ip(8) (root, like the soak's tmpfs).
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
# The RTSP tests run GStreamer's RTSP server from the distribution's Python; its seekable mounts
# demux an H.264 MP4 (qtdemux, h264parse: good and bad plugins) and re-mux it (mpegtsmux: bad).
if ! /usr/bin/python3 -c 'import gi; gi.require_version("GstRtspServer", "1.0"); from gi.repository import GstRtspServer' >/dev/null 2>&1 \
  || ! gst-inspect-1.0 rtpmp2tpay >/dev/null 2>&1 || ! gst-inspect-1.0 tsparse >/dev/null 2>&1 \
  || ! gst-inspect-1.0 qtdemux >/dev/null 2>&1 || ! gst-inspect-1.0 h264parse >/dev/null 2>&1 \
  || ! gst-inspect-1.0 mpegtsmux >/dev/null 2>&1; then
  need_apt+=(python3 python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-tools
    gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# The ACME tests: Pebble and its DNS test server (Go module proxy), BIND 9 (Debian).
step tools
./scripts/acme-tools
# The HTTP/2 conformance test's h2spec (Go module proxy).
./scripts/h2spec-tool
# The HTTP/3 tests' client (aioquic from PyPI, in a venv under target/).
./scripts/aioquic-venv

# Multicast tests join groups on the loopback interface only.
if command -v ip >/dev/null 2>&1; then
  ip link set lo multicast on 2>/dev/null || true
fi

# The module layers (scripts/layers.toml) hold; the check tests itself on fixtures first.
step layers
./scripts/check-layers-test && ./scripts/check-layers

step workspace tests
cargo test --workspace --locked "$@"
# The patched crates under vendor/ (h2, h3, hyper, quinn) pass their own unit tests.
step vendored tests
./scripts/vendored-tests
# Four minutes of every front end under mixed load with injected faults (bench/README.md, "Soak
# and faults"): each of the eight faults of seed 1's schedule comes on once by 3m20s. Fails on a
# failure no fault explains or a leak. Needs root (it mounts a tmpfs). Before the gateway-only
# tests, which rebuild target/debug/sluice without the other front ends.
step soak
SOAK_AFTER_TESTS=1 ./scripts/soak --minutes 4
# The gateway-only build (for routers) must build and pass its own tests too.
step gateway-only tests
cargo test -p sluice --locked --no-default-features --features iptv "$@"
# The pages in a real browser (installs chromium and playwright-core when missing).
step browser checks
./scripts/browser-check/pages.sh
# The /player page playing a live multicast channel through /hls/ (hls.js embedded in the binary).
./scripts/browser-check/player.sh
# The same with low-latency HLS: partial segments, blocking reloads, a few seconds behind live.
./scripts/browser-check/player.sh --low-latency
# A timeshift channel: the recorded window is seekable in the page, and a seek 10 s back plays.
./scripts/browser-check/player.sh --timeshift
# DASH out (/proxy/mpd/manifest.mpd) played by Shaka Player, ClearKey content decrypted by sluice.
./scripts/browser-check/dash-out.sh
# LL-HLS (blocking reloads through sluice) played by hls.js in low-latency mode.
./scripts/browser-check/llhls.sh
# A two-period DASH presentation as HLS: one discontinuity, a map per period, each period decoded
# frame-exactly by ffmpeg, and hls.js playing across the boundary.
./scripts/browser-check/multiperiod.sh
# The install paths for real: the container image under podman, the aarch64 router build under
# qemu, the .deb in a scratch Debian root, systemd-analyze verify, the .ipk, the Helm chart
# (installs podman, runc, qemu-user-static, debootstrap, helm, the musl targets when missing;
# builds one x86_64 musl binary and the aarch64 router build: see the script).
step deploy check
./scripts/deploy-check/run.sh
step done
