#!/usr/bin/env bash
# Plays sluice's output in headless Chromium with hls.js:
#   1. DASH (Shaka Packager CENC fixtures, ClearKey) served as HLS by /proxy/mpd/manifest.m3u8
#   2. a clear HLS stream (ffmpeg testsrc) through /proxy/hls/manifest.m3u8
# Everything listens on 127.0.0.1; every process started here is stopped on exit.
# Prints one PASS/FAIL line per stream, writes docs/browser-check.png, exits non-zero on failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
fixtures="$repo/crates/sluice-media/tests/fixtures/drm"
shot="${SCREENSHOT:-$repo/docs/browser-check.png}"

# Keys of the fixture package (crates/sluice-media/tests/fixtures/drm/keys.txt).
VIDEO_KID=6d76f25cb17f5e16b8eaef6bbf582d8e VIDEO_KEY=ce1b07f0b4c5f1b8c2a9f6ba2a8c7e41
AUDIO_KID=1fba7ed02bb85aa8b8c0dbf0d1ac2e7a AUDIO_KEY=4c2d8a6e3e5b9a7c1d0f2e4b6a8c9d1e

log() { echo "browser-check: $*" >&2; }

# --- 1. tools -------------------------------------------------------------------------------------
need_apt=()
command -v chromium >/dev/null || need_apt+=(chromium)
command -v ffmpeg >/dev/null || need_apt+=(ffmpeg)
command -v node >/dev/null || need_apt+=(nodejs npm)
command -v python3 >/dev/null || need_apt+=(python3)
command -v curl >/dev/null || need_apt+=(curl)
if ((${#need_apt[@]})); then
  log "installing ${need_apt[*]} from Debian"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if [[ ! -d "$here/node_modules/hls.js" || ! -d "$here/node_modules/playwright-core" ]]; then
  log "installing hls.js and playwright-core (npm ci)"
  # playwright-core never downloads a browser by itself; the variable makes sure of it.
  (cd "$here" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
fi
CHROMIUM="${CHROMIUM:-$(command -v chromium)}"
export CHROMIUM

log "building sluice (release)"
(cd "$repo" && cargo build --release -p sluice --quiet)
sluice="$repo/target/release/sluice"

# --- 2. processes, cleaned up by PID ------------------------------------------------------------------
work="$(mktemp -d /tmp/sluice-browser-check.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_http() { # url
  for _ in $(seq 1 100); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  log "nothing answers at $1"; return 1
}

# Origin content: the CENC fixture package with a static (VOD) MPD, and a clear HLS stream.
mkdir -p "$work/origin/dash" "$work/origin/hls" "$work/page"
cp -r "$fixtures/cenc/video" "$fixtures/cenc/audio" "$work/origin/dash/"
# Same change tests/dash.rs makes: the packager wrote a live MPD; serve it as a 2 s static one.
sed -e 's/type="dynamic"/type="static" mediaPresentationDuration="PT2S"/' \
    -e 's/ \(publishTime\|availabilityStartTime\|minimumUpdatePeriod\|timeShiftBufferDepth\)="[^"]*"//g' \
    "$fixtures/cenc/manifest.mpd" > "$work/origin/dash/manifest.mpd"
ffmpeg -hide_banner -loglevel error -f lavfi -i testsrc=size=320x240:rate=25 \
  -f lavfi -i sine=frequency=440:sample_rate=48000 -t 4 \
  -c:v libx264 -pix_fmt yuv420p -profile:v high -level 3.0 -g 25 -c:a aac -b:a 64k \
  -f hls -hls_time 1 -hls_playlist_type vod -hls_segment_filename "$work/origin/hls/seg%d.ts" \
  "$work/origin/hls/index.m3u8"

cp "$here/page.html" "$work/page/index.html"
cp "$here/node_modules/hls.js/dist/hls.min.js" "$work/page/"

origin_port=$(free_port)
python3 -m http.server "$origin_port" --bind 127.0.0.1 --directory "$work/origin" \
  >"$work/origin.log" 2>&1 &
pids+=($!)
page_port=$(free_port)
python3 -m http.server "$page_port" --bind 127.0.0.1 --directory "$work/page" \
  >"$work/page.log" 2>&1 &
pids+=($!)
sluice_port=$(free_port)
"$sluice" serve --listen "127.0.0.1:$sluice_port" --allow-private-upstreams >"$work/sluice.log" 2>&1 &
pids+=($!)

origin="http://127.0.0.1:$origin_port"
proxy="http://127.0.0.1:$sluice_port"
wait_http "$origin/dash/manifest.mpd"
wait_http "http://127.0.0.1:$page_port/index.html"
wait_http "$proxy/health"

enc() { python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$1"; }
dash_url="$proxy/proxy/mpd/manifest.m3u8?d=$(enc "$origin/dash/manifest.mpd")&key_id=$VIDEO_KID,$AUDIO_KID&key=$VIDEO_KEY,$AUDIO_KEY"
hls_url="$proxy/proxy/hls/manifest.m3u8?d=$(enc "$origin/hls/index.m3u8")"
page_url="http://127.0.0.1:$page_port/index.html?dash=$(enc "$dash_url")&hls=$(enc "$hls_url")"

log "sluice $("$sluice" --version 2>/dev/null || echo '?') on $proxy, origin $origin"
log "DASH: $dash_url"
log "HLS:  $hls_url"

mkdir -p "$(dirname "$shot")"
status=0
node "$here/check.mjs" "$page_url" "$shot" || status=$?
if ((status != 0)); then
  log "sluice log (last 30 lines):"; tail -n 30 "$work/sluice.log" >&2 || true
fi
log "screenshot: $shot"
exit "$status"
