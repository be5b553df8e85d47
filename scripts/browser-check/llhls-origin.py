#!/usr/bin/env python3
"""A live LL-HLS origin for the browser check: serves ffmpeg's 0.2 s fMP4 fragments as parts
(four to a 0.8 s segment, a keyframe at each segment start), publishing one part every 0.2 s of
wall time. Blocking playlist reloads (_HLS_msn, _HLS_part) and preload-hinted parts wait until
the part exists. Logs each request line to stderr. Usage: llhls-origin.py DIR PORT"""
import http.server
import re
import sys
import threading
import time

DIR, PORT = sys.argv[1], int(sys.argv[2])
PARTS = 4  # parts per segment
PART = 0.2  # seconds
START = 8  # parts already published at start (two segments)
T0 = time.monotonic()
TOTAL = len(re.findall(r"^p\d+\.m4s$", open(f"{DIR}/out.m3u8").read(), re.M))


def published():
    return min(TOTAL, START + int((time.monotonic() - T0) / PART))


def wait_for(parts, limit=3.0):
    deadline = time.monotonic() + limit
    while published() < parts:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def playlist(now):
    complete = now // PARTS
    first = max(0, complete - 6)
    out = [
        "#EXTM3U", "#EXT-X-VERSION:9", "#EXT-X-TARGETDURATION:1",
        "#EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,PART-HOLD-BACK=0.75",
        "#EXT-X-PART-INF:PART-TARGET=0.25", f"#EXT-X-MEDIA-SEQUENCE:{first}",
        '#EXT-X-MAP:URI="init.mp4"',
    ]
    for msn in range(first, complete):
        # Parts are listed for the last two segments only, as the specification suggests.
        if msn >= complete - 2:
            for part in range(PARTS):
                independent = ",INDEPENDENT=YES" if part == 0 else ""
                out.append(f'#EXT-X-PART:DURATION={PART:.3f},URI="p{msn * PARTS + part}.m4s"{independent}')
        out += [f"#EXTINF:{PART * PARTS:.3f},", f"s{msn}.m4s"]
    for part in range(now % PARTS):
        independent = ",INDEPENDENT=YES" if part == 0 else ""
        out.append(f'#EXT-X-PART:DURATION={PART:.3f},URI="p{complete * PARTS + part}.m4s"{independent}')
    if now < TOTAL:
        out.append(f'#EXT-X-PRELOAD-HINT:TYPE=PART,URI="p{now}.m4s"')
    else:
        out.append("#EXT-X-ENDLIST")
    return "\n".join(out) + "\n"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write(f"{time.monotonic() - T0:7.3f} {self.requestline}\n")

    def send(self, status, body=b"", ctype="application/octet-stream"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path, _, query = self.path.partition("?")
        q = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
        if path == "/live.m3u8":
            if "_HLS_msn" in q:
                msn, part = int(q["_HLS_msn"]), int(q.get("_HLS_part", PARTS - 1))
                if not wait_for(msn * PARTS + part + 1):
                    return self.send(503)
            return self.send(200, playlist(published()).encode(), "application/vnd.apple.mpegurl")
        if path == "/init.mp4":
            return self.send(200, open(f"{DIR}/init.mp4", "rb").read(), "video/mp4")
        m = re.fullmatch(r"/([ps])(\d+)\.m4s", path)
        if not m:
            return self.send(404)
        n = int(m.group(2))
        parts = [n] if m.group(1) == "p" else list(range(n * PARTS, (n + 1) * PARTS))
        if parts[-1] >= TOTAL or not wait_for(parts[-1] + 1):
            return self.send(404)
        body = b"".join(open(f"{DIR}/p{i}.m4s", "rb").read() for i in parts)
        return self.send(200, body, "video/mp4")


server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
time.sleep(TOTAL * PART + 30)  # bounded: the content, then half a minute
