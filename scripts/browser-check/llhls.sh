#!/usr/bin/env bash
# Plays a live LL-HLS stream through sluice with hls.js (low-latency mode) in headless Chromium.
# The origin (llhls-origin.py) publishes a 0.2 s part every 0.2 s and blocks playlist reloads
# until the asked-for part exists; sluice (with a password, so children are sealed tokens and
# CORS is on) forwards the blocking reloads. Passes when the video advances past 1.5 s with
# decoded frames and no player error, and sluice sent blocking reloads upstream (its metric).
# Everything listens on 127.0.0.1; every process started here is stopped on exit by PID.
# Installs what it lacks (Debian's chromium, ffmpeg, node; playwright-core and hls.js from npm).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
shot="${SCREENSHOT:-}"
log() { echo "llhls-check: $*" >&2; }

if [[ ! -d "$here/node_modules/hls.js" ]]; then
  log "installing hls.js (npm ci)"
  (cd "$here" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
fi
name=llhls
extra_apt=ffmpeg
source "$here/common.sh"

# 20 s of H.264 + AAC cut into 0.2 s fMP4 fragments, a keyframe every 0.8 s (each segment start).
mkdir -p "$work/origin" "$work/page"
ffmpeg -hide_banner -loglevel error -f lavfi -i testsrc2=size=320x240:rate=25 \
  -f lavfi -i sine=frequency=440:sample_rate=48000 -t 20 \
  -c:v libx264 -preset ultrafast -g 20 -keyint_min 20 -sc_threshold 0 -pix_fmt yuv420p \
  -c:a aac -b:a 64k -f hls -hls_time 0.2 -hls_flags split_by_time -hls_segment_type fmp4 \
  -hls_fmp4_init_filename init.mp4 -hls_segment_filename "$work/origin/p%d.m4s" \
  -hls_playlist_type vod "$work/origin/out.m3u8"
cp "$here/page.html" "$work/page/index.html"
cp "$here/node_modules/hls.js/dist/hls.min.js" "$work/page/"

origin_port=$(free_port)
python3 "$here/llhls-origin.py" "$work/origin" "$origin_port" 2>"$work/origin.log" &
pids+=($!)
serve_dir page_port "$work/page"
start_sluice_with_password
origin="http://127.0.0.1:$origin_port"
wait_http "$origin/live.m3u8"
wait_http "http://127.0.0.1:$page_port/index.html"

hls_url="$proxy/proxy/hls/manifest.m3u8?d=$(enc "$origin/live.m3u8")&api_password=$password"
page_url="http://127.0.0.1:$page_port/index.html?hls=$(enc "$hls_url")"

status=0
node "$here/check.mjs" "$page_url" "${shot:-$work/shot.png}" || status=$?
reloads=$(curl -fsS -H "Authorization: Basic $(printf 'x:%s' "$password" | base64)" "$proxy/metrics" |
  awk '/^sluice_media_llhls_upstream_reloads_total|^media_llhls_upstream_reloads_total/ {print $2}' | head -n1)
blocked=$(grep -c '_HLS_msn=' "$work/origin.log" || true)
log "blocking reloads: sluice sent ${reloads:-none}, the origin saw $blocked"
if [[ -z "${reloads:-}" || "${reloads%.*}" -lt 1 || "$blocked" -lt 1 ]]; then
  log "FAIL: hls.js made no blocking reload through sluice"; status=1
fi
if ((status != 0)); then
  log "sluice log (last 30 lines):"; tail -n 30 "$work/sluice.log" >&2 || true
  log "origin log (last 15 lines):"; tail -n 15 "$work/origin.log" >&2 || true
fi
exit "$status"
