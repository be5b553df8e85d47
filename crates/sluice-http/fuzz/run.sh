#!/usr/bin/env bash
# Runs one sluice-http fuzz target for a while, from its seed corpus when it has one, with an
# input cap near what the server reads for that field.
# Usage: crates/sluice-http/fuzz/run.sh TARGET [SECONDS]   (default 600 = 10 minutes)
set -euo pipefail
cd "$(dirname "$0")"
target=${1:?usage: run.sh TARGET [SECONDS]}
secs=${2:-600}
case "$target" in
  # A chunked body with its trailer (MAX_LINE: 4 KiB of trailer) and a few chunks.
  chunked|chunked_trailer) max_len=65536 ;;
  # A request head's fields: hyper reads heads up to 64 KiB.
  request_head|response_head|h1_screen|cache_headers|forwarded|settle_length) max_len=65536 ;;
  # A request target's path, a Host value, a route table's lines and a lookup.
  path|host|host_normalize|location|route_table) max_len=8192 ;;
  # A PROXY v2 header is at most 16 + 65535 bytes; a ClientHello spans a few 16 KiB records.
  proxy_protocol|client_hello) max_len=65552 ;;
  *) echo "unknown target $target" >&2; exit 2 ;;
esac
python3 seed.py >/dev/null
mkdir -p "corpus/$target"
cargo +nightly fuzz run "$target" "corpus/$target" -- -max_len="$max_len" -max_total_time="$secs" -timeout=10
