#!/usr/bin/env bash
# Runs one fuzz target for a while with the input cap the server itself applies.
# Usage: crates/sluice-media/fuzz/run.sh TARGET [SECONDS]   (default 600 = 10 minutes)
set -euo pipefail
cd "$(dirname "$0")"
target=${1:?usage: run.sh TARGET [SECONDS]}
secs=${2:-600}
case "$target" in
  # media.max_manifest_bytes / media.max_mpd_bytes default to 8 MiB.
  hls_rewrite|mpd_parse|mpd_out) max_len=8388608 ;;
  # One source of /playlist/playlist is capped at media.max_manifest_bytes too.
  m3u_merge) max_len=8388608 ;;
  # A realistic init plus media segment; the server allows 64 MiB, which libFuzzer cannot explore.
  mp4_decrypt|remux_ts) max_len=1048576 ;;
  # A few TS segments; the gateway cuts at 32 MiB, which libFuzzer cannot explore.
  fmp4_writer) max_len=1048576 ;;
  # One datagram run; media.iptv max_datagram_bytes is 1536.
  rtp_mpegts|rs_fec) max_len=65536 ;;
  # A token is at most 16 KiB (sealed::MAX_TOKEN_LEN); a query string rarely more than a URL.
  sealed_token|query) max_len=65536 ;;
  # A segment's head: the search window (256 KiB) plus a few packets.
  ts_unwrap) max_len=300000 ;;
  # An echo answer is capped at 64 KiB (public_ip::MAX_ANSWER_BYTES).
  echo_ip) max_len=65600 ;;
  # XC API answers are read up to media.xtream_max_response_bytes (64 MiB); 1 MiB is explorable.
  xtream) max_len=1048576 ;;
  # Engine answers and content ids are small.
  acestream) max_len=65536 ;;
  # An RTSP control connection: answers up to 64 KiB, interleaved frames up to 64 KiB.
  rtsp) max_len=262144 ;;
  # One signalling packet; anything past 64 bytes is never read.
  fcc) max_len=256 ;;
  # A compressed guide; iptv.epg_max_bytes bounds its output, 1 MiB of input is explorable.
  gzip) max_len=1048576 ;;
  # A few seconds of a channel's TS, pushed as the gateway does; MAX_SEGMENT_BYTES is 32 MiB.
  segmenter) max_len=1048576 ;;
  # A fetched guide, plain or gzip; the target's own bound is at most 64 KiB.
  xmltv) max_len=1048576 ;;
  *) echo "unknown target $target" >&2; exit 2 ;;
esac
python3 seed.py >/dev/null
mkdir -p "corpus/$target"
cargo +nightly fuzz run "$target" "corpus/$target" -- -max_len="$max_len" -max_total_time="$secs"
