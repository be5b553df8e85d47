#!/usr/bin/env bash
# Runs one fuzz target for a while with the input cap the server itself applies.
# Usage: crates/sluice-media/fuzz/run.sh TARGET [SECONDS]   (default 600 = 10 minutes)
set -euo pipefail
cd "$(dirname "$0")"
target=${1:?usage: run.sh TARGET [SECONDS]}
secs=${2:-600}
case "$target" in
  # media.max_manifest_bytes / media.max_mpd_bytes default to 8 MiB.
  hls_rewrite|mpd_parse) max_len=8388608 ;;
  # A realistic init plus media segment; the server allows 64 MiB, which libFuzzer cannot explore.
  mp4_decrypt|remux_ts) max_len=1048576 ;;
  # One datagram run; media.iptv max_datagram_bytes is 1536.
  rtp_mpegts|rs_fec) max_len=65536 ;;
  # One signalling packet; anything past 64 bytes is never read.
  fcc) max_len=256 ;;
  *) echo "unknown target $target" >&2; exit 2 ;;
esac
python3 seed.py >/dev/null
mkdir -p "corpus/$target"
cargo +nightly fuzz run "$target" "corpus/$target" -- -max_len="$max_len" -max_total_time="$secs"
