#!/usr/bin/env python3
"""Builds the seed corpora of the sluice-http fuzz targets that have one, each seed framed the way
its target reads input (a step byte, flag bytes, lines), from the shapes the unit tests use.
Usage: python3 seed.py            (writes corpus/<target>/seed-*; existing files are kept)
"""

import pathlib

HERE = pathlib.Path(__file__).resolve().parent
CORPUS = HERE / "corpus"


def write(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / f"seed-{name}").write_bytes(data)


def chunked_trailer():
    bodies = [
        b"0\r\n\r\n",
        b"3\r\nabc\r\n0\r\nGrpc-Status: 0\r\nx-sum: a b\r\n\r\nNEXT",
        b"5\r\nhello\r\n6;name=\"v\"\r\n world\r\nA \r\n0123456789\r\n0\r\nExpires: x\r\n\r\n",
        b"1\r\nx\r\n0\r\nbad name: 1\r\n\r\n",
        b"0\r\nA: 1\r\nB: 2\r\nA: 3\r\n\r\nHTTP/1.1 200 OK\r\n",
        b"0\r\nX: \x80\xff\r\n\r\n",
    ]
    for i, b in enumerate(bodies):
        for step in (1, 7, 255):
            write("chunked_trailer", f"{i}-{step}", bytes([step]) + b)


def path():
    for i, p in enumerate([
        "/", "/api/../admin", "/api/%2e%2e/admin", "/%7Euser/%41", "/a%2fb/%20x",
        "/docs/..%2F..%2Fsecret", "/docs/..;/..;/secret", "/docs/..%252F..%252Fsecret",
        "/docs/..%20/secret", "/docs/..../secret", "/docs/%252E%252E%252Fsecret",
        "/docs/a%20b..", "/docs/file;jsessionid=1", "/docs/%2525/x", "/docs/. /x",
        "/unsafe/https%3A%2F%2Fh%2Fa%2F..%2Fb.jpg", "//a///b/", "/a/b/..",
    ]):
        write("path", str(i), p.encode())


def settle_length():
    for i, s in enumerate([
        b"5", b"5\n5", b" 05 \n5", b"5\n6", b"5, 5", b"0", b"#x\n12\n#y\n12",
        b"9999999999999999999\n9999999999999999999", b"00000000000000000005", b"+5", b"",
    ]):
        write("settle_length", str(i), s)


def host_normalize():
    for i, h in enumerate([
        "Example.COM.:80", "example.com", "[::1]:80", "[2001:DB8::1]", "127.0.0.1:8080",
        "a.Wild.example.com.", "under_score.example", "x", " A.b ", "a.com:80:80",
    ]):
        write("host_normalize", str(i), h.encode())


def route_table():
    tables = [
        ["www.example.com", "/only/x", "* /", "*.example.com /", "*.a.example.com /",
         "www.example.com /only"],
        ["X.Example.Com:8080", "/api/v2", " /", " /api", " /api/v2/", " /api"],
        ["b.com", "/api/x", "a.com /", " /api/"],
        ["", "/apix", "* /api", "* /"],
        ["x.a.example.com", "/a/../b", "*.example.com /b", "*.a.example.com /", "a /b/"],
    ]
    for i, t in enumerate(tables):
        write("route_table", str(i), "\n".join(t).encode())


def forwarded():
    # flags: 1 trusted, 2 Forwarded, 4 Via, 8 https, 0x10/0x20 client (peer/other), 0x40 IPv6
    # peer, 0x80 a host line. Then the peer (4 or 16 bytes), another client (4), the host line,
    # then fields: a name index byte and a value per line.
    peer4, peer6, other = bytes([10, 0, 0, 2]), bytes(15) + b"\x01", bytes([192, 0, 2, 7])
    fields = b"\n".join([
        b"\x00" + b"1.2.3.4", b"\x00" + b"5.6.7.8", b"\x01" + b"https", b"\x02" + b"evil",
        b"\x03" + b"for=1.2.3.4;proto=https", b"\x04" + b"6.6.6.6", b"\x05" + b"1.1 edge",
        b"\x06" + b"http", b"\x07" + b"443", b"\x08" + b"traefik-7", b"\x0c" + b"*/*",
    ])
    plain = b"\x0c*/*\n\x0dx"
    for flags in (0x00, 0x01, 0x07, 0x96, 0xA7, 0xD3, 0xFF, 0x80, 0x84):
        peer = peer6 if flags & 0x40 else peer4
        host = b"example.com\n" if flags & 0x80 else b""
        write("forwarded", f"{flags:02x}", bytes([flags]) + peer + other + host + fields)
        write("forwarded", f"{flags:02x}-plain", bytes([flags]) + peer + other + host + plain)
    write("forwarded", "odd-host", bytes([0x83]) + peer4 + other + b"[::1]:8080 \"q\"\\\n" + fields)


for make in (chunked_trailer, path, settle_length, host_normalize, route_table, forwarded):
    make()
