#!/usr/bin/env bash
# Manual check, not part of the test suite: a headless Chromium with hls.js plays a Shaka-packaged
# ClearKey DASH fixture through sluice's /proxy/mpd/manifest.m3u8 and must report currentTime > 1.
#
# Everything runs on loopback: a python3 file server holds the fixture (as an on-demand MPD) and
# the player page, sluice decrypts. The page is on another port than sluice, so the master URL
# asks for `rp_access-control-allow-origin=*`, which sluice puts on the playlists and segments.
#
# Needs: cargo, python3, npm (hls.js is installed under target/hlsjs), and Chromium:
#   apt-get update && apt-get install -y chromium
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
fixture="$root/crates/sluice-media/tests/fixtures/drm/cenc"
work="$(mktemp -d)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

browser="$(command -v chromium || command -v chromium-browser || true)"
[ -n "$browser" ] || { echo "chromium missing: apt-get update && apt-get install -y chromium" >&2; exit 1; }

cargo build --quiet -p sluice --manifest-path "$root/Cargo.toml"
if [ ! -f "$root/target/hlsjs/node_modules/hls.js/dist/hls.min.js" ]; then
    npm install --silent --no-audit --no-fund --prefix "$root/target/hlsjs" hls.js@1
fi

site="$work/site"
mkdir -p "$site"
cp -r "$fixture/video" "$fixture/audio" "$site/"
cp "$root/target/hlsjs/node_modules/hls.js/dist/hls.min.js" "$site/"
# The packager wrote a live MPD whose window has passed: serve the same content as on-demand.
python3 - "$fixture/manifest.mpd" "$site/manifest.mpd" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
text = text.replace('type="dynamic"', 'type="static" mediaPresentationDuration="PT2S"')
for attr in ("publishTime", "availabilityStartTime", "minimumUpdatePeriod", "timeShiftBufferDepth"):
    text = re.sub(r'\s%s="[^"]*"' % attr, "", text)
open(sys.argv[2], "w").write(text)
PY
cat >"$site/index.html" <<'HTML'
<!doctype html>
<html><body>
<video id="video" muted playsinline></video>
<pre id="result">PENDING</pre>
<script src="hls.min.js"></script>
<script>
  const video = document.getElementById("video");
  const result = document.getElementById("result");
  const source = new URLSearchParams(location.search).get("src");
  const hls = new Hls();
  hls.on(Hls.Events.ERROR, (_, data) => {
    if (data.fatal) result.textContent = "ERROR " + data.type + " " + data.details;

  });
  hls.on(Hls.Events.MANIFEST_PARSED, () => video.play());
  hls.loadSource(source);
  hls.attachMedia(video);
  // Chromium decides when to dump the DOM by a virtual clock that stands still while a request is
  // pending; playback runs on the real one. Alternate slow requests (real time passes) with short
  // virtual pauses (the page's timers run) until there is an outcome.
  (async () => {
    for (let i = 0; i < 40 && !/^(PLAYING|ERROR)/.test(result.textContent); i++) {
      await fetch("/wait?" + i);
      await new Promise((done) => setTimeout(done, 100));
    }
  })();
  video.addEventListener("error", () => {
    result.textContent = "ERROR media " + (video.error && video.error.message);
  });
  setInterval(() => {
    const state = result.textContent;
    if (state.startsWith("PLAYING") || state.startsWith("ERROR")) return;
    const b = video.buffered;
    const buffered = b.length ? b.start(0).toFixed(2) + "-" + b.end(b.length - 1).toFixed(2) : "none";
    result.textContent = (video.currentTime > 1 ? "PLAYING" : "PENDING") +
      " currentTime=" + video.currentTime.toFixed(2) + " readyState=" + video.readyState +
      " buffered=" + buffered + " paused=" + video.paused;
  }, 50);

</script>
</body></html>
HTML

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() {
    python3 - "$1" <<'PY'
import socket, sys, time
for _ in range(100):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit("port %s never opened" % sys.argv[1])
PY
}
urlencode() { python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$1"; }

site_port="$(free_port)"
sluice_port="$(free_port)"
# A file server with one extra path, /wait, that answers after half a second (see the page).
python3 - "$site_port" "$site" >"$work/site.log" 2>&1 <<'PY' &
import functools, http.server, sys, time
class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/wait"):
            time.sleep(0.5)
            self.send_response(204)
            self.end_headers()
            return
        super().do_GET()
handler = functools.partial(Handler, directory=sys.argv[2])
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), handler).serve_forever()
PY
pids+=($!)
"$root/target/debug/sluice" serve --listen "127.0.0.1:$sluice_port" --allow-private-upstreams \
    >"$work/sluice.log" 2>&1 &
pids+=($!)
wait_port "$site_port"
wait_port "$sluice_port"

keys="$(awk '{ kids = kids sep $2; keys = keys sep $3; sep = "," } END { print "key_id=" kids "&key=" keys }' \
    "$fixture/../keys.txt")"
master="http://127.0.0.1:$sluice_port/proxy/mpd/manifest.m3u8?d=$(urlencode "http://127.0.0.1:$site_port/manifest.mpd")&$keys&rp_access-control-allow-origin=*"
page="http://127.0.0.1:$site_port/index.html?src=$(urlencode "$master")"

"$browser" --headless --no-sandbox --disable-gpu --disable-background-networking \
    --disable-component-update --no-first-run --autoplay-policy=no-user-gesture-required \
    --virtual-time-budget=60000 --dump-dom "$page" \
    >"$work/dom.html" 2>"$work/browser.log" || true
outcome="$(grep -o '<pre id="result">[^<]*' "$work/dom.html" | sed 's/.*>//' || true)"
echo "browser says: ${outcome:-nothing}"
if [[ "$outcome" == PLAYING* ]]; then
    echo "OK: hls.js in headless Chromium played the decrypted stream through sluice"
else
    echo "FAILED; page server, sluice and browser logs:" >&2
    tail -n 20 "$work/site.log" "$work/sluice.log" "$work/browser.log" >&2
    exit 1
fi
