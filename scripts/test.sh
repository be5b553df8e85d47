#!/usr/bin/env bash
# The one command that runs every test. Installs what the tests need first (ffmpeg for frame-exact
# decode checks; the pages check installs chromium itself), so nothing is skipped for lack of a tool.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v ffmpeg >/dev/null 2>&1 || need_apt+=(ffmpeg)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Multicast tests join groups on the loopback interface only.
if command -v ip >/dev/null 2>&1; then
  ip link set lo multicast on 2>/dev/null || true
fi

cargo test --workspace --locked "$@"
# The gateway-only build (for routers) must build and pass its own tests too.
cargo test -p sluice --locked --no-default-features --features iptv "$@"
# The pages in a real browser (installs chromium and playwright-core when missing).
./scripts/browser-check/pages.sh
