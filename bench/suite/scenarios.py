"""Scenarios S1–S6: each runs its peers and returns a JSON-serialisable result for the report."""

import os
import subprocess
import urllib.parse

from . import peers, procs
from .context import MiB

PASSWORD = "bench-pw"
PENDING = "not yet measured — filled in by the change that builds this part of sluice"


def _pending(sid, title, question):
    return {"id": sid, "title": title, "question": question, "status": "pending", "note": PENDING}


def _idle_usage(ctx, pid):
    """RSS/USS of a freshly started peer before any load."""
    r = ctx.loadgen(["sample", "--pid", str(pid), "--secs", "0.3"], timeout=30)
    return None if "failed" in r else r


def _start(ctx, name, origin):
    """Starts the peer called `name` in front of `origin`; returns (peer, url_for(path)) where
    url_for builds the request URL for an origin path. Raises peers.Unavailable."""
    if name == "nginx direct":
        return origin, lambda path: f"http://127.0.0.1:{origin.port}{path}"
    if name == "sluice":
        p = peers.start_sluice(ctx, PASSWORD, ctx.proxy_cpus)
    elif name == "MediaFlow":
        p = peers.start_mediaflow(ctx, PASSWORD, ctx.proxy_cpus)
    else:
        raise ValueError(name)

    def url_for(path):
        d = urllib.parse.quote(f"http://127.0.0.1:{origin.port}{path}", safe="")
        return f"http://127.0.0.1:{p.port}/proxy/stream?d={d}&api_password={PASSWORD}"

    return p, url_for


# === S1: media proxy, /proxy/stream ===

S1_PEERS = ["nginx direct", "sluice", "MediaFlow"]


def s1(ctx):
    q = ctx.quick
    levels = [10, 50] if q else [10, 20, 30, 50, 100]
    rounds, warmup, gw, gwc = (3, 1, 1, 10) if q else (5, 3, 5, 50)
    big_mib = 256 if q else 1024
    big_rounds, big_warmup = (1, 1) if q else (3, 1)
    small = ctx.test_file("7m.bin", 7 * MiB)
    big = ctx.test_file(f"{big_mib}m.bin", big_mib * MiB)
    params = {"levels": levels, "rounds": rounds, "warmup": warmup, "global_warmup": gw,
              "global_warmup_c": gwc, "small_bytes": small[1], "big_bytes": big[1], "big_c": 4,
              "big_rounds": big_rounds, "big_warmup": big_warmup}
    origin = peers.start_origin(ctx, ctx.files_dir, ctx.origin_cpus)
    rows = [{"peer": name} for name in S1_PEERS]
    try:
        _s1_levels(ctx, origin, rows, small, params)
        for row in rows:
            if row.get("status") == "ok":
                _s1_big(ctx, origin, row, big, params)
    finally:
        origin.stop()
    return {"id": "S1", "title": "Media proxy: /proxy/stream byte pipe", "status": "measured",
            "quick": q, "params": params, "rows": rows, "origin": origin.version,
            "question": "How fast and how cheaply does each proxy pipe a file from the origin to "
                        "many concurrent clients, and does its memory stay flat with file size?"}


def _start_row(ctx, row, origin):
    """Starts the row's peer; on failure records why in the row and returns None."""
    try:
        peer, url_for = _start(ctx, row["peer"], origin)
    except peers.Unavailable as e:
        row["status"] = str(e)
        return None
    except RuntimeError as e:
        row["status"] = f"failed to start: {e}"
        return None
    row["version"] = peer.version
    return peer, url_for


def _s1_levels(ctx, origin, rows, small, params):
    """All peers run side by side, and levels are interleaved (c=10 for every peer, then c=20, …,
    with the peer order rotated each level), so drifting background load on a shared machine
    hits every peer alike instead of whichever ran last."""
    budget = 150 if ctx.quick else 600
    running = []
    try:
        for row in rows:
            started = _start_row(ctx, row, origin)
            if started:
                row["idle"] = _idle_usage(ctx, started[0].pid)
                row["small"] = {"levels": [], "global_warmup_errors": 0}
                running.append((row, started))
        for i, c in enumerate(params["levels"]):
            k = i % max(len(running), 1)
            for row, (peer, url_for) in running[k:] + running[:k]:
                r = ctx.batch(url_for("/7m.bin"), small, [c], params["rounds"], params["warmup"],
                              params["global_warmup"] if i == 0 else 0, params["global_warmup_c"],
                              peer.pid, budget)
                if "failed" in r:
                    row["small"].setdefault("failed", r["failed"])
                    continue
                row["small"]["levels"] += r["levels"]
                row["small"]["global_warmup_errors"] += r["global_warmup_errors"]
        for row, _ in running:
            row["status"] = "ok"
    finally:
        for _, (peer, _) in running:
            if peer is not origin:
                peer.stop()


def _s1_big(ctx, origin, row, big, params):
    """The large file on a freshly started instance, so its memory peak is its own."""
    started = _start_row(ctx, row, origin)
    if not started:
        return
    peer, url_for = started
    try:
        row["big_idle"] = _idle_usage(ctx, peer.pid)
        path = "/" + big[0].rsplit("/", 1)[1]
        row["big"] = ctx.batch(url_for(path), big, [params["big_c"]], params["big_rounds"],
                               params["big_warmup"], 0, 1, peer.pid,
                               150 if ctx.quick else 600, timeout_secs=300)
    finally:
        if peer is not origin:
            peer.stop()


# === S2: reverse proxy, small responses ===

S2_PEERS = ["direct", "sluice", "Varnish pass", "nginx proxy_pass", "HAProxy http"]


def s2(ctx):
    q = ctx.quick
    levels = [1, 100] if q else [1, 10, 100, 1000]
    secs, warm = (2, 0.5) if q else (10, 2)
    files = [ctx.test_file("1k.bin", 1024)]
    origin = peers.start_origin(ctx, ctx.files_dir, ctx.origin_cpus)
    rows = []
    try:
        for name in S2_PEERS:
            rows.append(_duration_peer(ctx, name, origin, files, levels, secs, warm))
    finally:
        origin.stop()
    return {"id": "S2", "title": "HTTP reverse proxy: 1 KB responses", "status": "measured",
            "quick": q, "params": {"levels": levels, "secs": secs, "warmup_secs": warm},
            "rows": rows, "origin": origin.version,
            "question": "Requests/s and p99 for a 1 KB response at c = 1, 10, 100, 1000: direct, "
                        "sluice, Varnish (pass), nginx proxy_pass, HAProxy (http)."}


# === S3: TCP proxy ===

S3_PEERS = ["direct", "sluice", "HAProxy tcp", "Go io.Copy"]


def s3(ctx):
    q = ctx.quick
    levels = [1, 10] if q else [1, 10, 100]
    secs, warm = (2, 0.5) if q else (10, 2)
    files = [ctx.test_file("64k.bin", 64 * 1024), ctx.test_file("hello.txt", 13, b"Hello, world!")]
    origin = peers.start_origin(ctx, ctx.files_dir, ctx.origin_cpus)
    rows = []
    try:
        for name in S3_PEERS:
            rows.append(_duration_peer(ctx, name, origin, files, levels, secs, warm))
    finally:
        origin.stop()
    return {"id": "S3", "title": "TCP (L4) proxy: 64 KiB and 13-byte responses", "status": "measured",
            "quick": q, "params": {"levels": levels, "secs": secs, "warmup_secs": warm},
            "rows": rows, "origin": origin.version,
            "question": "Added latency and requests/s of an L4 proxy in front of nginx, for a "
                        "body that needs many segments (64 KiB) and one that fits in one (13 B)."}


_DURATION_PEERS = {
    "HAProxy tcp": peers.start_haproxy_tcp,
    "Go io.Copy": peers.start_goproxy,
    "Varnish pass": peers.start_varnish_pass,
    "nginx proxy_pass": peers.start_nginx_proxy,
    "HAProxy http": peers.start_haproxy_http,
}


def _duration_peer(ctx, name, origin, files, levels, secs, warm):
    """Closed-loop runs of every file × level through one peer placed in front of `origin`."""
    row = {"peer": name}
    try:
        if name == "direct":
            peer = origin
        elif name == "sluice":
            raise peers.Unavailable(PENDING)
        else:
            peer = _DURATION_PEERS[name](ctx, origin.port, ctx.proxy_cpus)
    except peers.Unavailable as e:
        row["status"] = str(e)
        return row
    except RuntimeError as e:
        row["status"] = f"failed to start: {e}"
        return row
    try:
        row["version"] = peer.version
        row["results"] = []
        for f in files:
            name_ = f[0].rsplit("/", 1)[1]
            url = f"http://127.0.0.1:{peer.port}/{name_}"
            for c in levels:
                r = ctx.duration(url, f, c, secs, warm, peer.pid)
                row["results"].append({"file": name_, "bytes": f[1], "c": c, "report": r})
        row["status"] = "ok"
    finally:
        if peer is not origin:
            peer.stop()
    return row


# === S4: slice cache ===

def s4(ctx):
    return _pending("S4", "Streaming slice cache",
                    "Cold miss with N concurrent clients (coalescing), hit, Range on a cold large "
                    "object, memory bound for any object size: sluice vs nginx proxy_cache + slice "
                    "vs Varnish.")


# === S5: IPTV gateway ===

# Published by rtp2httpd's benchmark (Ubuntu 24.04 aarch64 VM on an M3 Max; rtp2httpd v3.8.3,
# msd_lite 79a6c62, udpxy 56fc563, tvgate v2.1.8). CPU % (100 = one core) / USS MB.
S5_PUBLISHED = [
    ("8 clients, 8 groups, ~40 Mb/s each", "17 / 4.5", "25.8 / 10.3", "106 / 12.5", "331 / 182"),
    ("8 clients, 1 group, ~40 Mb/s", "14 / 4.9", "14.2 / 2.6", "85 / 12.5", "51 / 33"),
    ("1 client, ~400 Mb/s", "26.7 / 3.9", "39.5 / 2.6", "30.9 / 3.2", "89.5 / 47"),
]


def s5(ctx):
    r = _pending("S5", "IPTV gateway: multicast RTP/UDP to HTTP",
                 "CPU (system-wide, softirq included) and USS per stream, with every byte "
                 "delivered, for 8 groups × 8 clients, 8 clients on 1 group, 1 client at 400 Mb/s.")
    r["published"] = S5_PUBLISHED
    return r


# === S6: ClearKey decryption ===

CENC_BENCH = ("crates", "sluice-media", "benches", "cenc.rs")


def s6(ctx):
    r = _pending("S6", "ClearKey (CENC) decryption",
                 "Decryption throughput of sluice-media's cenc module against the AES-128-CTR "
                 "ceiling of this CPU (openssl speed).")
    argv = ["openssl", "speed", "-evp", "aes-128-ctr", "-seconds", "1" if ctx.quick else "3"]
    ctx.note(argv)
    try:
        out = procs.run(argv, timeout=120)
        line = [ln for ln in out.stdout.splitlines() if ln.lower().startswith("aes-128-ctr")]
        head = [ln for ln in out.stdout.splitlines() if ln.startswith("type")]
        r["openssl"] = {"header": head[-1] if head else "", "line": line[-1] if line else "",
                        "version": peers.version_of(["openssl", "version"])}
    except (OSError, subprocess.TimeoutExpired) as e:
        r["openssl"] = {"error": str(e)}
    if os.path.exists(os.path.join(ctx.repo, *CENC_BENCH)):
        r["criterion"] = _criterion(ctx)
        r["status"] = "measured"
    return r


def _criterion(ctx):
    """Runs the cenc criterion bench and keeps each benchmark's median throughput."""
    argv = ["cargo", "bench", "-p", "sluice-media", "--bench", "cenc", "--"]
    if ctx.quick:
        argv += ["--warm-up-time", "1", "--measurement-time", "2"]
    ctx.note(argv)
    try:
        out = procs.run(argv, timeout=1800, cwd=ctx.repo)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    if out.returncode != 0:
        return {"error": out.stderr.strip()[-400:]}
    found, name = [], ""
    for ln in out.stdout.splitlines():
        if ln and not ln[0].isspace():
            name = ln.split()[0]
        if "thrpt:" in ln and "[" in ln:
            parts = ln.split("[", 1)[1].rstrip("]").split()
            if len(parts) >= 4:
                found.append({"bench": name, "median": f"{parts[2]} {parts[3]}"})
    return {"results": found}


ALL = {"S1": s1, "S2": s2, "S3": s3, "S4": s4, "S5": s5, "S6": s6}
# Slots that measure nothing yet: cheap to produce, so the report always shows them.
SLOTS = {"S4", "S5"}
