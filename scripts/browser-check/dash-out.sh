#!/usr/bin/env bash
# Plays DASH out (/proxy/mpd/manifest.mpd) of the Shaka Packager ClearKey fixture, decrypted by
# sluice, with Shaka Player (from npm) in headless Chromium, through sealed tokens (a password is
# set, so the MPD's URLs are /_token_ children and CORS is on). Checks that the video time and the
# decoded frame count advance and that no player error happened. No EME: the browser never sees
# a key. Everything listens on 127.0.0.1; every process started here is stopped on exit by PID.
# Installs what it lacks (Debian's chromium, node; playwright-core and shaka-player from npm).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
fixtures="$repo/crates/sluice-media/tests/fixtures/drm"
shot="${SCREENSHOT:-}"
log() { echo "dash-out-check: $*" >&2; }

if [[ ! -d "$here/node_modules/shaka-player" ]]; then
  log "installing shaka-player (npm ci)"
  (cd "$here" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
fi
name=dash-out
source "$here/common.sh"

# Keys of the fixture package (crates/sluice-media/tests/fixtures/drm/keys.txt).
VIDEO_KID=6d76f25cb17f5e16b8eaef6bbf582d8e VIDEO_KEY=ce1b07f0b4c5f1b8c2a9f6ba2a8c7e41
AUDIO_KID=1fba7ed02bb85aa8b8c0dbf0d1ac2e7a AUDIO_KEY=4c2d8a6e3e5b9a7c1d0f2e4b6a8c9d1e

mkdir -p "$work/origin/dash" "$work/page"
cp -r "$fixtures/cenc/video" "$fixtures/cenc/audio" "$work/origin/dash/"
# As tests/dash.rs does: the packager wrote a live MPD; serve it as a 2 s static one.
sed -e 's/type="dynamic"/type="static" mediaPresentationDuration="PT2S"/' \
    -e 's/ \(publishTime\|availabilityStartTime\|minimumUpdatePeriod\|timeShiftBufferDepth\)="[^"]*"//g' \
    "$fixtures/cenc/manifest.mpd" >"$work/origin/dash/manifest.mpd"
cp "$here/dash-out.html" "$work/page/index.html"
cp "$here/node_modules/shaka-player/dist/shaka-player.compiled.js" "$work/page/"

serve_dir origin_port "$work/origin"
serve_dir page_port "$work/page"
start_sluice_with_password
origin="http://127.0.0.1:$origin_port"
wait_http "$origin/dash/manifest.mpd"
wait_http "http://127.0.0.1:$page_port/index.html"

mpd_url="$proxy/proxy/mpd/manifest.mpd?d=$(enc "$origin/dash/manifest.mpd")&key_id=$VIDEO_KID,$AUDIO_KID&key=$VIDEO_KEY,$AUDIO_KEY&api_password=$password"
# The MPD itself: no protection left, every address a sealed child of sluice.
mpd="$(curl -fsS "$mpd_url")"
for gone in ContentProtection BaseURL "$origin_port" "$VIDEO_KEY" "$password"; do
  if grep -q -- "$gone" <<<"$mpd"; then log "FAIL: $gone in the rewritten MPD"; exit 1; fi
done
page_url="http://127.0.0.1:$page_port/index.html?dash=$(enc "$mpd_url")"

status=0
node "$here/check.mjs" "$page_url" "${shot:-$work/shot.png}" || status=$?
if ((status != 0)); then
  log "sluice log (last 30 lines):"; tail -n 30 "$work/sluice.log" >&2 || true
fi
exit "$status"
