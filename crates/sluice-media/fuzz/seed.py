#!/usr/bin/env python3
"""Builds the seed corpora of every fuzz target from the crate's test fixtures and test sources.

Each target's input framing is reproduced here (mode or flag byte, length prefixes), so the seeds
start the fuzzer on the paths the server runs instead of on random bytes.
Usage: python3 seed.py            (writes corpus/<target>/seed-*; existing files are kept)
"""

import pathlib
import re
import struct

HERE = pathlib.Path(__file__).resolve().parent
CRATE = HERE.parent
DRM = CRATE / "tests" / "fixtures" / "drm"
CORPUS = HERE / "corpus"
SCHEMES = ["cenc", "cens", "cbc1", "cbcs"]  # mode 1..4 of mp4_decrypt, in its INITS order
RAW = re.compile(r'r#"(.*?)"#', re.S)


def write(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / f"seed-{name}").write_bytes(data)


def strings_with(path, marker):
    """Raw string literals of a Rust test file that contain `marker`."""
    return [s for s in RAW.findall(path.read_text()) if marker in s]


def mp4_decrypt():
    for scheme in sorted(p.name for p in DRM.iterdir() if p.is_dir()):
        for track in ("video", "audio"):
            base = DRM / scheme / track
            init = (base / "init.mp4").read_bytes()
            seg = (base / "1.m4s").read_bytes()
            tag = f"{scheme}-{track}"
            write("mp4_decrypt", f"init-{tag}", b"\x00" + init)
            plain = scheme.split("-")[0]
            if plain in SCHEMES:
                write("mp4_decrypt", f"seg-{tag}", bytes([1 + SCHEMES.index(plain)]) + seg)
            write("mp4_decrypt", f"pair-{tag}", b"\x05" + struct.pack("<H", len(init)) + init + seg)


def remux_ts():
    for scheme in ("cenc", "cbcs"):
        for track in ("video", "audio"):
            base = DRM / scheme / track
            init = (base / "init.mp4").read_bytes()
            seg = (base / "1.m4s").read_bytes()
            write("remux_ts", f"{scheme}-{track}", struct.pack("<H", len(init)) + init + seg)


def mpd_parse():
    clock = struct.pack("<II", 0x7000_0000, 0)  # "now" well after 1970, so live windows exist
    for p in sorted(DRM.glob("*/manifest.mpd")):
        write("mpd_parse", p.parent.name, clock + p.read_bytes())
    for i, s in enumerate(strings_with(CRATE / "src" / "dash" / "tests.rs", "<MPD")):
        write("mpd_parse", f"unit-{i}", clock + s.encode())


def mpd_out():
    head = struct.pack("<IB", 0x7000_0000, 1)  # "now" well after 1970; strip protection
    for p in sorted(DRM.glob("*/manifest.mpd")):
        write("mpd_out", p.parent.name, head + p.read_bytes())
    for src in ("tests.rs", "out/tests.rs"):
        for i, s in enumerate(strings_with(CRATE / "src" / "dash" / src, "<MPD")):
            write("mpd_out", f"unit-{src.split('/')[0]}-{i}", head + s.encode())


def hls_rewrite():
    for i, s in enumerate(strings_with(CRATE / "src" / "hls" / "tests.rs", "#EXTM3U")):
        for flags in (0, 0x3F):
            write("hls_rewrite", f"unit-{i}-{flags}", bytes([flags]) + s.encode())


def query():
    for i, q in enumerate([
        "d=https%3A%2F%2Fcdn.example%2Fv.m3u8&h_referer=https%3A%2F%2Fsite.example%2F&api_password=pw",
        "d=aHR0cDovL2Nkbi5leGFtcGxlL3YubXA0&r_content-type=video%2Fmp4&rp_x-a=1&x_headers=server,etag",
        "d=http://h/v&h_content-length=5&h_x=a%0d%0aEvil:%201",
        "d=https%22//h.example/x&transformer=ts_stream&ratelimit=vidoza",
    ]):
        write("query", f"q-{i}", q.encode())


def sealed_token():
    # Mode byte, then what drives the mutation (see the target).
    for i, data in enumerate([b"\x00\x05\x01", b"\x01\x20", b"\x02=", b"\x03\x00\x10A",
                              b"s1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"]):
        write("sealed_token", f"m-{i}", data)


def ts_unwrap():
    packet = b"\x47" + bytes(187)
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(17) + b"\x00\x00\x00\x00IEND\xaeB`\x82"
    write("ts_unwrap", "png", b"\x10\x40" + png + packet * 6)
    write("ts_unwrap", "css", b"\x01\x07" + b"body{color:red}" + packet * 3)
    write("ts_unwrap", "plain", b"\xff\xff" + packet * 5)


def echo_ip():
    write("echo_ip", "text", b"ip\n203.0.113.7\n")
    write("echo_ip", "json", b'origin\n{"origin": "203.0.113.7, 10.0.0.1"}')


def xtream():
    import base64
    user = base64.b64encode(b"http://xc.example:8080:alice:pw").decode()
    write("xtream", "username", user.encode())
    write("xtream", "path", f"/live/{user}/secret/42.ts".encode())
    write("xtream", "body", b'alice\n{"stream_url":"http:\\/\\/xc.example:8080\\/live\\/alice\\/p\\/1.ts"}')


def acestream():
    write("acestream", "session", b'{"response":{"playback_url":"http://e/ace/r/1","stat_url":"http://e/s","command_url":"http://e/c"},"error":null}')
    write("acestream", "ids", b"0123456789abcdef0123456789abcdef01234567&ffff")


def m3u_merge():
    """`d` on the first line, then a channel list using every option the merger reads."""
    lists = [
        "#EXTM3U url-tvg=\"http://epg/g.xml\"\n#EXTINF:-1 tvg-id=\"a\" group-title=\"x, y\",A\n"
        "#EXTVLCOPT:http-user-agent=UA\n#EXTVLCOPT:http-referrer=http://r/\nhttp://cdn/a.m3u8\n",
        "#EXTM3U\n#EXTINF:-1,B\n#EXTHTTP:{\"Origin\":\"http://o\",\"Cookie\":\"c=1\"}\nhttp://cdn/b.ts\n",
        "#EXTINF:-1,C\n#KODIPROP:inputstream.adaptive.license_type=clearkey\n"
        "#KODIPROP:inputstream.adaptive.license_key=00112233445566778899aabbccddeeff:"
        "ffeeddccbbaa99887766554433221100\n"
        "#KODIPROP:inputstream.adaptive.stream_headers=User-Agent=K&Referer=http%3A%2F%2Fr\n"
        "https://d/m.mpd?key_id=aa&key=bb&x=1\n",
    ]
    defs = [
        "http://a/1.m3u",
        "sort:http://a/1.m3u;no_proxy:http://b/2.m3u;sort:no_proxy:http://c/3",
        "https://mfp.example:pw&http://p/list.m3u",
    ]
    for i, d in enumerate(defs):
        for j, body in enumerate(lists):
            write("m3u_merge", f"hand-{i}-{j}", (d + "\n" + body).encode())


def rtsp():
    """A DESCRIBE answer with SDP, a Digest 401, interleaved RTP, and catch-up ranges."""
    sdp = (b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=S\r\nt=0 0\r\na=control:*\r\n"
           b"m=video 0 RTP/AVP 33\r\na=rtpmap:33 MP2T/90000\r\na=control:stream=0\r\n")
    describe = (b"RTSP/1.0 200 OK\r\nCSeq: 2\r\nContent-Base: rtsp://h/live/\r\n"
                b"Content-Type: application/sdp\r\nContent-Length: %d\r\n\r\n" % len(sdp)) + sdp
    challenge = (b"RTSP/1.0 401 Unauthorized\r\nCSeq: 1\r\nWWW-Authenticate: Basic realm=\"r\"\r\n"
                 b"WWW-Authenticate: Digest realm=\"r\", nonce=\"n\", qop=\"auth\"\r\n\r\n")
    setup = (b"RTSP/1.0 200 OK\r\nCSeq: 3\r\nSession: abc;timeout=60\r\n"
             b"Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n\r\n")
    rtp = b"\x80\x21\x00\x01" + b"\x00" * 8 + b"\x47" + b"\x00" * 187
    frame = b"$\x00" + struct.pack(">H", len(rtp)) + rtp
    write("rtsp", "describe", describe)
    write("rtsp", "challenge", challenge)
    write("rtsp", "setup-frames", setup + frame + frame)
    write("rtsp", "playseek", b"20240101200000-20240101210000")
    write("rtsp", "iso", b"2024-01-01T12:00:00+08:00-2024-01-01T13:00:00+08:00")


def gzip_members():
    """Members with every optional header field, two members back to back, and an empty one."""
    import gzip as gz
    import zlib
    guide = b'<?xml version="1.0"?>\n<tv><channel id="a"><display-name>A</display-name></channel></tv>\n'
    write("gzip", "plain", gz.compress(guide, mtime=0))
    write("gzip", "two-members", gz.compress(guide[:40], mtime=0) + gz.compress(guide[40:], mtime=0))
    write("gzip", "empty", gz.compress(b"", mtime=0))
    body = zlib.compressobj(6, zlib.DEFLATED, -15)
    deflated = body.compress(guide) + body.flush()
    header = b"\x1f\x8b\x08\x1e" + b"\x00" * 4 + b"\x00\xff"
    header += struct.pack("<H", 4) + b"abcd" + b"guide.xml\x00" + b"comment\x00"
    header += struct.pack("<H", zlib.crc32(header) & 0xFFFF)
    trailer = struct.pack("<II", zlib.crc32(guide), len(guide))
    write("gzip", "all-fields", header + deflated + trailer)


def segmenter():
    """A few seconds of TS (PAT, PMT, pictures and AAC frames with DTS, keyframes flagged) for
    each timing codec, framed as the target reads it: settings, chunk and size bytes."""
    def packet(cc, pid, start, ra, payload):
        room = 184 - (2 if ra else 0)
        body = payload[:room]
        stuffing = room - len(body)
        head = bytes([0x47, (pid >> 8) | (0x40 if start else 0), pid & 0xFF])
        if ra:
            af = bytes([1 + stuffing, 0x40]) + b"\xff" * stuffing
        elif stuffing:
            af = bytes([stuffing - 1]) + (b"\x00" + b"\xff" * (stuffing - 2) if stuffing > 1 else b"")
        else:
            af = None
        n = cc.get(pid, 0)
        cc[pid] = (n + 1) & 15
        if af is None:
            return head + bytes([0x10 | n]) + body
        return head + bytes([0x30 | n]) + af + body

    def stamp(flag, t):
        return bytes([flag << 4 | (t >> 29) & 0x0E | 1, (t >> 22) & 0xFF, (t >> 14) & 0xFE | 1,
                      (t >> 7) & 0xFF, (t << 1) & 0xFE | 1])

    def pes(sid, dts, es):
        return b"\x00\x00\x01" + bytes([sid, 0, 0, 0x80, 0xC0, 10]) + stamp(3, dts + 3600) + stamp(1, dts) + es

    def section(cc, pid, sec):
        return packet(cc, pid, True, False, (b"\x00" + sec).ljust(184, b"\xff"))

    units = {
        0x1B: (b"\x00\x00\x00\x01\x09\xf0\x00\x00\x00\x01\x67\x42\x00\x00\x00\x01\x65", b"\x00\x00\x00\x01\x09\xf0\x00\x00\x00\x01\x41"),
        0x24: (b"\x00\x00\x00\x01\x46\x01\x10\x00\x00\x00\x01\x26\x01", b"\x00\x00\x00\x01\x46\x01\x30\x00\x00\x00\x01\x02\x01"),
        0x02: (b"\x00\x00\x01\xb3\x00\x00\x01\x00\x00\x08", b"\x00\x00\x01\x00\x00\x10"),
    }
    for kind, (stype, (key, other)) in enumerate(units.items()):
        cc = {}
        pat = bytes([0, 0xB0, 13, 0, 1, 0xC1, 0, 0, 0, 1, 0xF0, 0, 0, 0, 0, 0])
        pmt = bytes([2, 0xB0, 23, 0, 1, 0xC1, 0, 0, 0xE1, 0, 0xF0, 0, stype, 0xE1, 0, 0xF0, 0,
                     0x0F, 0xE1, 1, 0xF0, 0, 0, 0, 0, 0])
        ts = bytearray()
        for i in range(150):  # 6 s at 25 pictures a second, a keyframe a second
            dts = 900000 + i * 3600
            if i % 25 == 0:
                ts += section(cc, 0, pat) + section(cc, 0x1000, pmt)
            es = (key if i % 25 == 0 else other) + bytes(200)
            data = pes(0xE0, dts, es)
            ts += packet(cc, 0x100, True, i % 25 == 0 and kind == 0, data)
            for at in range(184, len(data), 184):
                ts += packet(cc, 0x100, False, False, data[at:at + 184])
            if i % 2 == 0:
                ts += packet(cc, 0x101, True, False, pes(0xC0, dts, b"\xff\xf1" + bytes(30)))
        ts = bytes(ts)
        # Target 2 s, parts 500 ms; chunks of 1316 bytes (an RTP payload), whole, and aligned.
        write("segmenter", f"ts-{kind}", bytes([0x11, 0xFF, 0x7F]) + ts)
        write("segmenter", f"ts-{kind}-once", bytes([0x03, 0x00, 0x10]) + ts)
        write("segmenter", f"ts-{kind}-gap", bytes([0x19, 0x40, 0x87]) + ts[:188 * 200] + b"\xff\x00\xff\x00" + ts[188 * 300:])
        # The target's own tables and this codec in front of a stream without any.
        bare = b"".join(ts[i:i + 188] for i in range(0, len(ts), 188) if ((ts[i + 1] & 0x1F) << 8 | ts[i + 2]) not in (0, 0x1000))
        write("segmenter", f"bare-{kind}", bytes([0x29 | kind << 6, 0x10, 0x20]) + bare)
    # Runs of 0x47 that never line up 188 bytes apart, pushed at once, then a stream.
    noise = (b"\x47" * 188 + b"\x00" * 188) * 170 + b"\x00" * 400
    write("segmenter", "noise", bytes([0x01, 0x00, 0x10]) + noise + ts)


def xmltv():
    """Guides plain and gzip-compressed, with a BOM and a DOCTYPE, and pages that are not guides."""
    import gzip as gz
    guide = (b'<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE tv SYSTEM "xmltv.dtd">\n'
             b'<tv generator-info-name="x"><channel id="a.example"><display-name>A</display-name>'
             b'</channel><programme start="20240101120000 +0000" stop="20240101130000 +0000" '
             b'channel="a.example"><title>News</title></programme></tv>\n')
    big = struct.pack("<H", 0xFFFF)
    write("xmltv", "plain", big + guide)
    write("xmltv", "bom", big + b"\xef\xbb\xbf  \n" + guide)
    write("xmltv", "gzip", big + gz.compress(guide, mtime=0))
    write("xmltv", "small-bound", struct.pack("<H", 100) + guide)
    write("xmltv", "html", big + b"<html><body>502</body></html>")
    write("xmltv", "json", big + b'{"error":"no guide"}')


if __name__ == "__main__":
    mp4_decrypt()
    remux_ts()
    mpd_parse()
    mpd_out()
    hls_rewrite()
    query()
    sealed_token()
    ts_unwrap()
    echo_ip()
    xtream()
    acestream()
    m3u_merge()
    rtsp()
    gzip_members()
    segmenter()
    xmltv()
    for d in sorted(CORPUS.iterdir()):
        print(f"{d.name}: {len(list(d.iterdir()))} seeds")
