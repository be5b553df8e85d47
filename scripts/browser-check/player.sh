#!/usr/bin/env bash
# Plays a live multicast channel in headless Chromium through sluice's /player page: the channel
# list from /playlist.m3u, the current programme from /epg.xml, hls.js (embedded in the binary)
# playing /hls/rtp/... Checks that the video advances, that the programme shown is the guide's,
# and that no JavaScript error, CSP violation or failed request happened.
# With --low-latency the gateway serves low-latency HLS (2 s segments in 0.5 s parts) and the check
# also asserts that hls.js follows the parts with blocking reloads and plays less than 4.5 s behind
# the moment the gateway received the picture (non-low-latency HLS of 2 s segments sits at 6 s or more).
# With --timeshift the channel is recorded to disk from start-up ([iptv.timeshift]); the page plays
# it live, then seeks 10 s back: the check asserts the seekable range covers the recorded window,
# that the seek lands there, that an older segment is fetched for it and that playback goes on.
# The multicast sender (ffmpeg, paced, bounded by -stream_loop) sends on lo only; everything listens
# on 127.0.0.1; every process started here is stopped on exit by its PID.
# Installs what it lacks (Debian's chromium, ffmpeg, node; playwright-core from npm). Exits non-zero on failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
shot="${SCREENSHOT:-}"
mode="${1:-}"
log() { echo "player-check: $*" >&2; }

name=player
extra_apt=ffmpeg
source "$here/common.sh"

ip link set lo multicast on 2>/dev/null || true
group=239.255.42.$((RANDOM % 200 + 1))
port=$((20000 + RANDOM % 20000))

# 20 s of H.264 + AAC, a keyframe a second, sent in real time three times over (60 s at most).
ffmpeg -hide_banner -loglevel error -f lavfi -i testsrc2=size=320x240:rate=25 \
  -f lavfi -i sine=frequency=440:sample_rate=48000 -t 20 \
  -c:v libx264 -preset ultrafast -pix_fmt yuv420p -g 25 -c:a aac -b:a 64k -f mpegts "$work/source.ts"
ffmpeg -hide_banner -loglevel error -re -stream_loop 2 -i "$work/source.ts" -c copy \
  -f rtp_mpegts "rtp://$group:$port?localaddr=127.0.0.1&ttl=0&pkt_size=1328" >"$work/sender.log" 2>&1 &
pids+=($!)

# The guide: one programme on air now, one after it (UTC).
mkdir -p "$work/origin"
python3 - "$work/origin/epg.xml" <<'PY'
import sys, datetime
now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
f = lambda t: t.strftime('%Y%m%d%H%M%S +0000')
a, b, c = now - datetime.timedelta(minutes=30), now + datetime.timedelta(minutes=30), now + datetime.timedelta(minutes=90)
open(sys.argv[1], 'w').write(f'''<?xml version="1.0" encoding="UTF-8"?>
<tv><channel id="check.1"><display-name>Check One</display-name></channel>
<programme start="{f(a)}" stop="{f(b)}" channel="check.1"><title>Browser check live</title></programme>
<programme start="{f(b)}" stop="{f(c)}" channel="check.1"><title>After the check</title></programme>
</tv>
''')
PY
origin_port=$(free_port)
python3 -m http.server "$origin_port" --bind 127.0.0.1 --directory "$work/origin" >"$work/origin.log" 2>&1 &
pids+=($!)
cat >"$work/channels.m3u" <<LIST
#EXTM3U x-tvg-url="http://127.0.0.1:$origin_port/epg.xml"
#EXTINF:-1 tvg-id="check.1" group-title="Check",Check One
rtp://$group:$port
LIST

sluice_port=$(free_port)
cat >"$work/sluice.toml" <<CONF
[server]
listen = ["127.0.0.1:$sluice_port"]
[upstream]
allow_private = true
[iptv]
interface = "lo"
playlist = "$work/channels.m3u"
CONF
if [[ "$mode" == --low-latency ]]; then
  printf '[iptv.hls]\ntarget_duration_secs = 2\nwindow = 6\npart_target_ms = 500\n' >>"$work/sluice.toml"
elif [[ "$mode" == --timeshift ]]; then
  printf '[iptv.hls]\ntarget_duration_secs = 1\nwindow = 6\n' >>"$work/sluice.toml"
  printf '[iptv.timeshift]\ndir = "%s"\nminutes = 2\nchannels = ["/rtp/%s:%s?iface=lo"]\n' \
    "$work/timeshift" "$group" "$port" >>"$work/sluice.toml"
else
  printf '[iptv.hls]\ntarget_duration_secs = 1\nwindow = 6\n' >>"$work/sluice.toml"
fi
# The guide's origin answers before sluice starts: its first fetch is at start, and a guide that
# never loaded is not fetched again for a few seconds.
wait_http "http://127.0.0.1:$origin_port/epg.xml"
"$sluice" serve --config "$work/sluice.toml" >"$work/sluice.log" 2>&1 &
pids+=($!)
proxy="http://127.0.0.1:$sluice_port"
wait_http "$proxy/health"
if [[ "$mode" == --timeshift ]]; then
  # The recording starts with sluice, watched or not: let the window grow past the seek distance.
  sleep 16
fi

status=0
node "$here/player.mjs" "$proxy" "$shot" "$mode" || status=$?
if ((status != 0)); then
  log "sluice log (last 30 lines):"; tail -n 30 "$work/sluice.log" >&2 || true
  log "sender log:"; tail -n 5 "$work/sender.log" >&2 || true
fi
exit "$status"
