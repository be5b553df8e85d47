#!/usr/bin/env bash
# Checks sluice's pages (home, URL generator, playlist builder) in headless Chromium: forms filled,
# generated URLs compared exactly and fetched, no JavaScript error, nothing stored.
# Everything listens on 127.0.0.1; every process started here is stopped on exit.
# Installs what it lacks (Debian's chromium, node; playwright-core from npm). Exits non-zero on failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
log() { echo "pages-check: $*" >&2; }

name=pages
source "$here/common.sh"

origin_port=$(free_port)
origin="http://127.0.0.1:$origin_port"
mkdir -p "$work/origin/live"
cat >"$work/origin/a.m3u" <<LIST
#EXTM3U
#EXTINF:-1 tvg-id="live",Live
#EXTVLCOPT:http-user-agent=BrowserCheck/1.0
$origin/live/index.m3u8
LIST
printf '#EXTM3U\n#EXTINF:-1,Delta\nhttp://cdn.example/d.m3u8\n#EXTINF:-1,Beta\nhttp://cdn.example/b.m3u8\n' >"$work/origin/b.m3u"
printf '#EXTM3U\n#EXTINF:-1,Direct\nhttp://direct.example/d.ts\n' >"$work/origin/c.m3u"
printf '#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXT-X-PLAYLIST-TYPE:VOD\n#EXTINF:2.0,\nseg0.ts\n#EXT-X-ENDLIST\n' \
  >"$work/origin/live/index.m3u8"
cp "$work/origin/live/index.m3u8" "$work/origin/live/other.m3u8"

python3 -m http.server "$origin_port" --bind 127.0.0.1 --directory "$work/origin" >"$work/origin.log" 2>&1 &
pids+=($!)
password="pages-check-$(python3 -c 'import secrets; print(secrets.token_hex(8))')"
sluice_port=$(free_port)
SLUICE_AUTH_API_PASSWORD="$password" "$sluice" serve --listen "127.0.0.1:$sluice_port" \
  --allow-private-upstreams >"$work/sluice.log" 2>&1 &
pids+=($!)
proxy="http://127.0.0.1:$sluice_port"
wait_http "$origin/a.m3u"
wait_http "$proxy/health"

status=0
node "$here/pages.mjs" "$proxy" "$origin" "$password" || status=$?
if ((status != 0)); then
  log "sluice log (last 30 lines):"; tail -n 30 "$work/sluice.log" >&2 || true
fi
exit "$status"
