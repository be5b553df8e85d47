#!/usr/bin/env python3
"""Generate MediaFlow Proxy test vectors for sluice's token, URL-generation and base64 code.

Runs MediaFlow Proxy's own functions and endpoints (pip install mediaflow-proxy==2.4.9 httpx)
with a fixed IV and a fixed clock, and writes JSON fixtures that the Rust tests replay:

    python scripts/mediaflow-token-vectors.py            # rewrite the fixtures
    python scripts/mediaflow-token-vectors.py --check F  # decrypt sluice-made tokens listed in F

F is a JSON list of {"password", "token", "params", "exp", "ip"} objects, for example the file
written by `cargo test -p sluice-media --test token_vectors -- --ignored`.
"""

import json
import logging
import sys
import types
from pathlib import Path

import mediaflow_proxy.utils.crypto_utils as crypto_utils
from mediaflow_proxy.utils.base64_utils import decode_base64_url, encode_url_to_base64, is_base64_url
from mediaflow_proxy.utils.crypto_utils import EncryptionHandler

logging.disable(logging.CRITICAL)
ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates" / "sluice-media" / "tests" / "fixtures"
NOW = 1_800_000_000
IVS = [bytes(range(16)), bytes.fromhex("f0e1d2c3b4a5968778695a4b3c2d1e0f"), b"\xff" * 16]

state = {"iv": IVS[0]}
# MediaFlow draws the IV from os randomness and exp from the wall clock: pin both.
crypto_utils.get_random_bytes = lambda n: state["iv"][:n]
crypto_utils.time = types.SimpleNamespace(time=lambda: NOW)

TOKEN_CASES = [
    ("short", [("d", "https://example.com/video.mp4")], None, None),
    ("mediaflow", [("d", "https://cdn.example.com/live/index.m3u8"), ("h_User-Agent", "Mozilla/5.0"),
                   ("h_referer", "https://example.com/")], 3600, "203.0.113.7"),
    ("a-password-that-is-longer-than-thirty-two-bytes", [("d", "https://x.test/a b?c=d&e=f")], 60, None),
    ("pässwörd-ünïcode-ëxactly-thirty-two", [("d", "https://例え.jp/ストリーム.m3u8"),
                                              ("h_cookie", "a=\"q\"; b=\\x"), ("r_content-type", "video/mp2t")],
     None, "2001:db8::1"),
    ("", [("d", "https://empty.password/"), ("api_password", "")], None, None),
    ("ctl", [("d", "https://c.test/\u0001\t\u007f\u0080\u00a0\u2028</script>"), ("h_x", "\\\"'")], 1, "127.0.0.1"),
    ("exactly-32-bytes-long-password!!", [("d", "https://e.test/🎬.mkv"), ("x_headers", "a,b"),
                                         ("rp_content-type", "video/mp4"), ("key_id", "0123"), ("key", "abcd")],
     86400, "10.1.2.3"),
]

GENERATE_CASES = [
    ("/generate_url", {"mediaflow_proxy_url": "http://127.0.0.1:8888", "endpoint": "/proxy/stream",
                       "destination_url": "https://example.com/video.mp4"}),
    ("/generate_url", {"mediaflow_proxy_url": "http://127.0.0.1:8888/", "endpoint": "/proxy/hls/manifest.m3u8",
                       "destination_url": "https://cdn.example.com/live/index.m3u8?token=a b&x=é",
                       "query_params": {"api_password": "secret", "max_res": True, "n": 3},
                       "request_headers": {"User-Agent": "Mozilla/5.0", "h_referer": "https://r.test/", "range": "bytes=0-",
                                           "If-Range": "x", "empty": ""},
                       "response_headers": {"content-type": "application/vnd.apple.mpegurl", "r_x-a": "1"},
                       "propagate_response_headers": {"content-type": "video/mp2t"},
                       "remove_response_headers": ["content-length", "etag"], "filename": "my movie (2024).mkv"}),
    ("/generate_url", {"mediaflow_proxy_url": "https://mfp.example.com", "endpoint": "/proxy/stream",
                       "destination_url": "https://example.com/video.mp4", "api_password": "secret",
                       "expiration": 3600, "ip": "203.0.113.7", "filename": "video.mp4",
                       "request_headers": {"User-Agent": "UA"}}),
    ("/generate_url", {"mediaflow_proxy_url": "https://mfp.example.com/base/", "endpoint": "proxy/mpd/manifest.m3u8",
                       "destination_url": "https://example.com/manifest.mpd", "api_password": "secret",
                       "query_params": {"key_id": "kid", "key": "k", "api_password": "other"}}),
    ("/generate_url", {"mediaflow_proxy_url": "http://mfp.example.com/prefix", "endpoint": "proxy/stream",
                       "destination_url": "https://example.com/a.mp4", "base64_encode_destination": True}),
    ("/generate_url", {"mediaflow_proxy_url": "http://mfp.example.com/", "destination_url": "https://example.com/a"}),
    ("/generate_url", {"mediaflow_proxy_url": "HTTP://MFP.example.com:8080/x/", "endpoint": "/proxy/stream/",
                       "api_password": "pw", "ip": "0:0:0:0:0:0:0:1", "expiration": 0}),
    ("/generate_url", {"mediaflow_proxy_url": "http://h", "endpoint": "/proxy/stream", "ip": "2001:0db8::0001",
                       "api_password": "pw", "destination_url": "", "expiration": -5}),
    ("/generate_url", {"mediaflow_proxy_url": "http://h", "endpoint": "/proxy/stream", "ip": "not-an-ip"}),
    ("/generate_url", {"mediaflow_proxy_url": "http://h", "endpoint": "/proxy/stream", "destination_url": "x",
                       "query_params": {"f1": 1e16, "f2": 0.1, "f3": 1.5e-7, "f4": 123456789.125, "f5": -0.0,
                                        "i": 18446744073709551615, "n": None, "b": False, "l": ["a", 1, None],
                                        "o": {"k": "it's"}, "u": "\u00e9\u2028\U0001f3ac"}}),
    ("/generate_url", {"mediaflow_proxy_url": "http://h", "endpoint": "/proxy/stream", "destination_url": "x",
                       "api_password": "pw",
                       "query_params": {"f1": 1e16, "f2": 0.1, "f3": 1.5e-7, "f4": 123456789.125, "f5": -0.0,
                                        "i": 18446744073709551615, "n": None, "b": False, "l": ["a", 1, None],
                                        "o": {"k": "it's"}, "u": "\u00e9\u2028\U0001f3ac"}}),
    ("/generate_url", {"mediaflow_proxy_url": "http://h", "endpoint": "/proxy/stream", "api_password": "pw",
                       "expiration": "120", "destination_url": "https://e.test/x",
                       "response_headers": {"x-n": 5, "x-zero": 0, "x-null": None, "x-t": True}}),
    ("/generate_url", {"endpoint": "/proxy/stream"}),
    ("/generate_url", {"mediaflow_proxy_url": "http://h", "endpoint": "../proxy/./stream", "query_params": {}}),
    ("/generate_encrypted_or_encoded_url", {"mediaflow_proxy_url": "http://127.0.0.1:8888",
                                            "endpoint": "/proxy/stream", "destination_url": "https://e.test/v.mp4",
                                            "api_password": "pw"}),
    ("/generate_urls", {"mediaflow_proxy_url": "http://127.0.0.1:8888", "api_password": "pw", "expiration": 60,
                        "ip": "198.51.100.2",
                        "urls": [{"endpoint": "/proxy/stream", "destination_url": "https://e.test/1.mp4",
                                  "filename": "1.mp4"},
                                 {"endpoint": "/proxy/hls/manifest.m3u8", "destination_url": "https://e.test/2.m3u8",
                                  "request_headers": {"referer": "https://e.test/"},
                                  "remove_response_headers": ["content-length"]}]}),
    ("/generate_urls", {"mediaflow_proxy_url": "http://127.0.0.1:8888",
                        "urls": [{"endpoint": "/proxy/stream", "destination_url": "https://e.test/1.mp4",
                                  "query_params": {"api_password": "pw"}},
                                 {"destination_url": "https://e.test/2.mp4"}]}),
]

BASE64_CASES = [
    "https://example.com/video.mp4",
    "aHR0cHM6Ly9leGFtcGxlLmNvbS92aWRlby5tcDQ",
    "aHR0cHM6Ly9leGFtcGxlLmNvbS92aWRlby5tcDQ=",
    "aHR0cHM6Ly9leGFtcGxlLmNvbS8_YT0-Pz8_",
    "aHR0cHM6Ly9leGFtcGxlLmNvbS8/YT0+Pz8/",
    "aGVsbG8gd29ybGQ",
    "short",
    "https%3A%2F%2Fexample.com%2Fa.m3u8",
    "https%22//example.com/a.m3u8",
    "https://example.com/a.mpd&key_id=abc&key=def",
    "ftp://files.example.com/a",
    "Zm9vOi8vYmFy",
    "////////////",
    "aHR0cHM6Ly9leGFtcGxlLmNvbQ==",
    "aHR0cHM6Ly9leGFtcGxlLmNvbQ",
    "aHR0cHM6Ly9leGFtcGxlLmNvbQ=",
    "aHR0cHM6Ly9leGFtcGxlLmNvbQ===",
    "aHR0cHM6Ly9leGFtcGxlLmNvbQ==garbage",
    "aHR0cHM6Ly9 leGFtcGxlLmNvbQ",
    "aHR0cHM6Ly9é",
    "aHR0cHM6Ly9bOjoxXQ",
    "aHR0cHM6Ly9bOjoxXQ=a",
]


def token_vectors():
    out = []
    for i, (password, params, expiration, ip) in enumerate(TOKEN_CASES):
        state["iv"] = IVS[i % len(IVS)]
        handler = EncryptionHandler(password)
        token = handler.encrypt_data(dict(params), expiration, ip)
        exp = NOW + expiration if expiration else None
        back = handler.decrypt_data(token, ip)
        assert list(back.items()) == params, back
        out.append({"password": password, "iv": state["iv"].hex(), "params": params, "exp": exp, "ip": ip,
                    "now": NOW, "token": token})
    return out


def generate_vectors():
    from fastapi.testclient import TestClient

    from mediaflow_proxy.main import app

    client = TestClient(app)
    state["iv"] = IVS[1]
    out = []
    for path, body in GENERATE_CASES:
        response = client.post(path, json=body)
        # The body also as text: key order matters and not every JSON reader keeps it.
        out.append({"path": path, "now": NOW, "iv": state["iv"].hex(), "request": json.dumps(body),
                    "status": response.status_code, "response": response.json() if response.status_code == 200 else None})
    return out


def base64_vectors():
    from mediaflow_proxy.routes.proxy import sanitize_url

    return [{"input": s, "is_base64": is_base64_url(s), "decoded": decode_base64_url(s),
             "encoded": encode_url_to_base64(s), "sanitized": sanitize_url(s)} for s in BASE64_CASES]


def check(path):
    cases = json.loads(Path(path).read_text())
    for case in cases:
        handler = EncryptionHandler(case["password"])
        crypto_utils.time = types.SimpleNamespace(time=lambda: (case["exp"] or NOW) - 1)
        data = handler.decrypt_data(case["token"], case["ip"])
        assert list(data.items()) == [tuple(p) for p in case["params"]], (data, case)
    print(f"MediaFlow decrypted {len(cases)} sluice tokens")


def write(name, value):
    (FIXTURES / name).write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check(sys.argv[2])
    else:
        FIXTURES.mkdir(parents=True, exist_ok=True)
        write("tokens.json", token_vectors())
        write("generate.json", generate_vectors())
        write("base64.json", base64_vectors())
