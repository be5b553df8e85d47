#!/usr/bin/env bash
# Plays a two-period DASH presentation (the Shaka Packager ClearKey fixture twice, one Period
# after the other) as HLS through /proxy/mpd/manifest.m3u8 with hls.js in headless Chromium:
# sluice merges the periods into one timeline with EXT-X-DISCONTINUITY and a new EXT-X-MAP, and
# the player must play past the boundary (media time > 3 s of 4 s; the first period ends at 2 s).
# Checks the playlist's discontinuity and maps too. Everything listens on 127.0.0.1; every process
# started here is stopped on exit by PID.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
fixtures="$repo/crates/sluice-media/tests/fixtures/drm"
shot="${SCREENSHOT:-}"
log() { echo "multiperiod-check: $*" >&2; }
name=multiperiod
source "$here/common.sh"

# Keys of the fixture package (crates/sluice-media/tests/fixtures/drm/keys.txt).
VIDEO_KID=6d76f25cb17f5e16b8eaef6bbf582d8e VIDEO_KEY=ce1b07f0b4c5f1b8c2a9f6ba2a8c7e41
AUDIO_KID=1fba7ed02bb85aa8b8c0dbf0d1ac2e7a AUDIO_KEY=4c2d8a6e3e5b9a7c1d0f2e4b6a8c9d1e

mkdir -p "$work/origin/dash" "$work/page"
[[ -n "$shot" ]] || shot="$work/screenshot.png"
cp -r "$fixtures/cenc/video" "$fixtures/cenc/audio" "$work/origin/dash/"
# The second period has its own copy of the files, so its init segment has its own address.
cp -r "$fixtures/cenc/video" "$work/origin/dash/video2"
cp -r "$fixtures/cenc/audio" "$work/origin/dash/audio2"
# The packager wrote a live MPD of one 2 s period: make it a static one of two such periods, the
# second from its own folders.
python3 - "$fixtures/cenc/manifest.mpd" "$work/origin/dash/manifest.mpd" <<'PY'
import re, sys
mpd = open(sys.argv[1]).read()
mpd = mpd.replace('type="dynamic"', 'type="static" mediaPresentationDuration="PT4S"')
mpd = re.sub(r' (publishTime|availabilityStartTime|minimumUpdatePeriod|timeShiftBufferDepth)="[^"]*"', '', mpd)
period = re.search(r'<Period .*?</Period>', mpd, re.S).group(0)
first = period.replace('<Period id="0" start="PT0S">', '<Period id="0" start="PT0S" duration="PT2S">')
second = period.replace('<Period id="0" start="PT0S">', '<Period id="1" start="PT2S" duration="PT2S">')
second = second.replace('"video/', '"video2/').replace('"audio/', '"audio2/')
assert first != period and second != period, "the fixture's Period element changed"
open(sys.argv[2], 'w').write(mpd.replace(period, first + '\n  ' + second))
PY
cp "$here/page.html" "$work/page/index.html"
cp "$here/node_modules/hls.js/dist/hls.min.js" "$work/page/"

serve_dir origin_port "$work/origin"
serve_dir page_port "$work/page"
start_sluice_with_password
origin="http://127.0.0.1:$origin_port"
wait_http "$origin/dash/manifest.mpd"
wait_http "http://127.0.0.1:$page_port/index.html"

dash_url="$proxy/proxy/mpd/manifest.m3u8?d=$(enc "$origin/dash/manifest.mpd")&key_id=$VIDEO_KID,$AUDIO_KID&key=$VIDEO_KEY,$AUDIO_KEY&api_password=$password"

# The video playlist: one discontinuity between the periods and a map for each.
master="$(curl -fsS "$dash_url")"
video="$(printf '%s\n' "$master" | grep -v '^#' | grep . | head -n 1)"
playlist="$(curl -fsS "$video")"
disc=$(printf '%s\n' "$playlist" | grep -c '^#EXT-X-DISCONTINUITY$' || true)
maps=$(printf '%s\n' "$playlist" | grep -c '^#EXT-X-MAP' || true)
if [[ "$disc" != 1 || "$maps" != 2 ]]; then
  log "FAIL playlist: $disc discontinuities and $maps maps (want 1 and 2)"; printf '%s\n' "$playlist" >&2
  exit 1
fi
echo "PASS playlist: one discontinuity, a map per period"

# ffmpeg decodes each period (its map, then its segments, as sluice sent them) frame-exactly
# against the source's frames. (ffmpeg's own HLS reader drops the frames after a discontinuity
# whose timestamps start over, so the periods are decoded one by one.)
printf '%s\n' "$playlist" | python3 -c '
import re, sys, urllib.request
work = sys.argv[1]
period, n = None, 0
for line in sys.stdin.read().splitlines():
    m = re.match(r"#EXT-X-MAP:URI=\"([^\"]+)\"", line)
    if m:
        n += 1
        period = open(f"{work}/period{n}.mp4", "wb")
        period.write(urllib.request.urlopen(m.group(1)).read())
    elif line and not line.startswith("#"):
        period.write(urllib.request.urlopen(line).read())
' "$work"
for k in 1 2; do
  ffmpeg -nostdin -hide_banner -loglevel error -i "$work/period$k.mp4" -map 0:v:0 -f framemd5 - |
    grep -v '^#' | awk -F, '{print $NF}' | tr -d ' ' >"$work/period$k.hashes"
  if ! cmp -s "$work/period$k.hashes" <(grep -v '^#' "$fixtures/source-video.md5"); then
    log "FAIL ffmpeg: period $k decodes to $(wc -l <"$work/period$k.hashes") frames that differ from the source's"
    exit 1
  fi
done
echo "PASS ffmpeg: each period decodes to the source's $(wc -l <"$work/period1.hashes") frames exactly"

status=0
CHECK_THRESHOLD=3.0 CHECK_DASH_LABEL="DASH two periods" \
  node "$here/check.mjs" "http://127.0.0.1:$page_port/index.html?dash=$(enc "$dash_url")" "$shot" || status=$?
if ((status != 0)); then
  log "sluice log (last 30 lines):"; tail -n 30 "$work/sluice.log" >&2 || true
fi
exit "$status"
