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


if __name__ == "__main__":
    mp4_decrypt()
    remux_ts()
    mpd_parse()
    hls_rewrite()
    query()
    sealed_token()
    ts_unwrap()
    echo_ip()
    xtream()
    acestream()
    for d in sorted(CORPUS.iterdir()):
        print(f"{d.name}: {len(list(d.iterdir()))} seeds")
