"""Scenarios S1–S6: each runs its peers and returns a JSON-serialisable result for the report."""

import functools
import json
import os
import subprocess
import time
import urllib.parse
import urllib.request

from . import peers, procs
from . import s4 as s4_cases
from . import s7 as s7_cases
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
    elif name == S1_UNSPLICED:
        p = peers.start_sluice(ctx, PASSWORD, ctx.proxy_cpus,
                               env={"SLUICE_MEDIA_SPLICE_STREAM": "false"})
    elif name == "MediaFlow":
        p = peers.start_mediaflow(ctx, PASSWORD, ctx.proxy_cpus)
    else:
        raise ValueError(name)

    def url_for(path):
        d = urllib.parse.quote(f"http://127.0.0.1:{origin.port}{path}", safe="")
        return f"http://127.0.0.1:{p.port}/proxy/stream?d={d}&api_password={PASSWORD}"

    return p, url_for


# === S1: media proxy, /proxy/stream ===

# The second sluice row is the same binary with the body copied through user space instead of
# spliced (media.splice_stream), measured side by side for the A/B in docs/history/tcp-proxy-tuning.md.
S1_UNSPLICED = "sluice (splice_stream = false)"
S1_PEERS = ["nginx direct", "sluice", S1_UNSPLICED, "MediaFlow"]


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

# sluice runs twice, once per runtime model, so S2 also answers design.md's question of which
# model to ship as the default; a third row is work-stealing with the HTTP/1.1 fast path off
# (`server.h1_fast_path = false`: every request through hyper), for the A/B in
# docs/reverse-proxy.md.
S2_HYPER = "sluice (work-stealing, hyper path)"
S2_PEERS = ["direct", "sluice (work-stealing)", S2_HYPER, "sluice (per-core)", "Varnish pass",
            "nginx proxy_pass", "HAProxy http"]


def s2(ctx):
    q = ctx.quick
    levels = [1, 100] if q else [1, 10, 100, 1000]
    big_levels = [10] if q else [10, 100]
    # Full mode measures every cell in three rounds, the peers in a rotated order each round, and
    # keeps the round with the median req/s: one 10 s run per peer let the machine's drift (it is
    # shared) decide a 5 % comparison.
    rounds = 1 if q else 3
    secs, warm = (2, 0.5) if q else (5, 1)
    small = ctx.test_file("1k.bin", 1024)
    mid = ctx.test_file("64k.bin", 64 * 1024)
    big = ctx.test_file("7m.bin", 7 * MiB)
    plan = [(small, levels), (mid, big_levels), (big, big_levels)]
    origin = peers.start_origin(ctx, ctx.files_dir, ctx.origin_cpus)
    second = peers.start_origin(ctx, ctx.files_dir, ctx.origin_cpus)
    runs = {}
    try:
        for k in range(rounds):
            order = S2_PEERS[k % len(S2_PEERS):] + S2_PEERS[:k % len(S2_PEERS)]
            for name in order:
                runs.setdefault(name, []).append(
                    _duration_peer(ctx, name, origin, plan, secs, warm, S2_STARTERS))
            # The same peers in front of a 2-server round-robin group (1 KB, one level).
            for name in order:
                if name == "direct":
                    continue
                row = _duration_peer(ctx, name, [origin, second], [(small, [100])], secs, warm,
                                     S2_STARTERS)
                runs.setdefault(f"{name}, 2 servers rr", []).append(row)
    finally:
        origin.stop()
        second.stop()
    rows = [_median_round(name, runs[name]) for name in S2_PEERS]
    rows += [_median_round(f"{name}, 2 servers rr", runs[f"{name}, 2 servers rr"])
             for name in S2_PEERS[1:]]
    return {"id": "S2", "title": "HTTP reverse proxy: 1 KB, 64 KiB and 7 MB responses",
            "status": "measured", "quick": q,
            "params": {"levels": levels, "big_levels": big_levels, "secs": secs,
                       "warmup_secs": warm, "rounds": rounds},
            "rows": rows, "origin": origin.version,
            "question": "Requests/s, p99 and CPU per request for 1 KB (c = 1, 10, 100, 1000), "
                        "64 KiB and 7 MB responses, and a 2-server round-robin group: direct, "
                        "sluice (work-stealing and per-core runtimes, and work-stealing with the HTTP/1.1 fast path off), Varnish (pass), nginx proxy_pass, HAProxy (http)."}


def _median_round(name, rounds):
    """One row from a peer's rounds: per (body, c), the report of the round with the median
    req/s, and every round's req/s beside it (`rounds_rps`, in round order)."""
    ok = [r for r in rounds if r.get("status") == "ok"]
    if not ok:
        return dict(rounds[0], peer=name)
    row = {"peer": name, "status": "ok", "version": ok[0].get("version"), "results": []}
    for i, first in enumerate(ok[0]["results"]):
        cells = [r["results"][i] for r in ok if i < len(r["results"])]
        measured = [c for c in cells if "failed" not in c["report"]]
        if not measured:
            row["results"].append(first)
            continue
        by_rps = sorted(measured, key=lambda c: c["report"]["rps"])
        pick = dict(by_rps[(len(by_rps) - 1) // 2])
        pick["rounds_rps"] = [c["report"]["rps"] if "failed" not in c["report"] else None
                              for c in cells]
        row["results"].append(pick)
    return row


# === S3: TCP proxy ===

S3_PEERS = ["direct", "sluice", "HAProxy tcp", "Go io.Copy"]


def s3(ctx):
    q = ctx.quick
    levels = [1, 10] if q else [1, 10, 100]
    secs, warm = (2, 0.5) if q else (10, 2)
    files = [ctx.test_file("64k.bin", 64 * 1024), ctx.test_file("hello.txt", 13, b"Hello, world!")]
    stream_files = [ctx.test_file("7m.bin", 7 * MiB), ctx.test_file("256m.bin", 256 * MiB)]
    stream = {"c": 4, "rounds": 1 if q else 3, "warmup": 1}
    origin = peers.start_origin(ctx, ctx.files_dir, ctx.origin_cpus)
    rows = []
    try:
        for name in S3_PEERS:
            row = _duration_peer(ctx, name, origin, [(f, levels) for f in files], secs, warm,
                                 S3_STARTERS)
            if row.get("status") == "ok":
                row["stream"] = _s3_stream(ctx, name, origin, stream_files, stream)
            rows.append(row)
    finally:
        origin.stop()
    return {"id": "S3", "title": "TCP (L4) proxy: 64 KiB and 13-byte responses, 7 MB / 256 MB streams",
            "status": "measured",
            "quick": q, "params": {"levels": levels, "secs": secs, "warmup_secs": warm,
                                   "stream": stream},
            "rows": rows, "origin": origin.version,
            "question": "Added latency and requests/s of an L4 proxy in front of nginx, for a "
                        "body that needs many segments (64 KiB) and one that fits in one (13 B); "
                        "streaming MB/s and proxy CPU per GB for 7 MB and 256 MB bodies."}


def _s3_stream(ctx, name, origin, files, p):
    """Throughput and CPU per GB of large bodies through one freshly started peer."""
    if name == "direct":
        peer = origin
    elif name == "sluice":
        peer = peers.start_sluice_tcp(ctx, origin.port, ctx.proxy_cpus)
    else:
        peer = _DURATION_PEERS[name](ctx, origin.port, ctx.proxy_cpus)
    out = []
    try:
        for f in files:
            name_ = f[0].rsplit("/", 1)[1]
            r = ctx.batch(f"http://127.0.0.1:{peer.port}/{name_}", f, [p["c"]], p["rounds"],
                          p["warmup"], 0, 1, peer.pid, 150 if ctx.quick else 600, timeout_secs=300)
            out.append({"file": name_, "bytes": f[1], "c": p["c"], "report": r})
    finally:
        if peer is not origin:
            peer.stop()
    return out


_DURATION_PEERS = {
    "HAProxy tcp": peers.start_haproxy_tcp,
    "Go io.Copy": peers.start_goproxy,
    "Varnish pass": peers.start_varnish_pass,
    "nginx proxy_pass": peers.start_nginx_proxy,
    "HAProxy http": peers.start_haproxy_http,
}

# S2's sluice rows are the reverse proxy, under each runtime model.
S2_STARTERS = {
    **_DURATION_PEERS,
    "sluice (work-stealing)": functools.partial(peers.start_sluice_reverse,
                                                runtime="work-stealing"),
    "sluice (per-core)": functools.partial(peers.start_sluice_reverse, runtime="per-core"),
    S2_HYPER: functools.partial(peers.start_sluice_reverse, runtime="work-stealing",
                                fast_path=False),
}

# S3's sluice row is the TCP front end.
S3_STARTERS = {**_DURATION_PEERS, "sluice": peers.start_sluice_tcp}


def _duration_peer(ctx, name, origin, plan, secs, warm, starters=None):
    """Closed-loop runs of every (file, levels) in `plan` through one peer placed in front of
    `origin` (one origin, or a list of them for a round-robin group); `starters` maps peer names
    to start functions (the scenario's sluice front end among them)."""
    row = {"peer": name}
    origins = origin if isinstance(origin, list) else [origin]
    starters = starters or _DURATION_PEERS
    try:
        if name == "direct":
            peer = origins[0]
        elif name not in starters:
            raise peers.Unavailable(PENDING)
        else:
            ports = [o.port for o in origins]
            peer = starters[name](ctx, ports if len(ports) > 1 else ports[0],
                                         ctx.proxy_cpus)
    except peers.Unavailable as e:
        row["status"] = str(e)
        return row
    except RuntimeError as e:
        row["status"] = f"failed to start: {e}"
        return row
    try:
        row["version"] = peer.version
        row["results"] = []
        for f, levels in plan:
            name_ = f[0].rsplit("/", 1)[1]
            url = f"http://127.0.0.1:{peer.port}/{name_}"
            for c in levels:
                r = ctx.duration(url, f, c, secs, warm, peer.pid)
                row["results"].append({"file": name_, "bytes": f[1], "c": c, "report": r})
        row["status"] = "ok"
    finally:
        if peer not in origins:
            peer.stop()
    return row


# === S4: slice cache ===

def s4(ctx):
    """Cold miss with 100 clients, hits, cold Range, memory bound, restart, stale-while-revalidate:
    see s4.py."""
    return s4_cases.run(ctx)


# === S5: IPTV gateway ===

# Published by rtp2httpd's benchmark (Ubuntu 24.04 aarch64 VM on an M3 Max; rtp2httpd v3.8.3,
# msd_lite 79a6c62, udpxy 56fc563, tvgate v2.1.8). CPU % (100 = one core) / USS MB.
S5_PUBLISHED = [
    ("8 clients, 8 groups, ~40 Mb/s each", "17 / 4.5", "25.8 / 10.3", "106 / 12.5", "331 / 182"),
    ("8 clients, 1 group, ~40 Mb/s", "14 / 4.9", "14.2 / 2.6", "85 / 12.5", "51 / 33"),
    ("1 client, ~400 Mb/s", "26.7 / 3.9", "39.5 / 2.6", "30.9 / 3.2", "89.5 / 47"),
]


# Each case follows the published report: groups share ONE port; rate is per group, in Mbit/s of
# RTP datagrams (7 × 188-byte TS payloads + 12-byte RTP header).
S5_CASES = [
    {"case": "8 clients, 8 groups, one port, 40 Mb/s each", "groups": 8, "clients": 8, "mbps": 40},
    {"case": "8 clients, 1 group, 40 Mb/s", "groups": 1, "clients": 8, "mbps": 40},
    {"case": "1 client, 400 Mb/s", "groups": 1, "clients": 1, "mbps": 400},
]
S5_PORT = 4056
# sluice as shipped, then with less instant-start history (iptv.burst_bytes, the knob that
# drives its per-channel memory), down to none. Nothing else is tuned.
# The third field picks the binary: "full" is the release build with every front end; "router"
# is the gateway-only build (`scripts/build-router`: `--profile router --no-default-features
# --features iptv`, linked for size).
S5_GATEWAYS = [
    ("sluice (defaults: burst_bytes 1 MiB)", {}, "full"),
    ("sluice (SLUICE_IPTV_BURST_BYTES=256 KiB)", {"SLUICE_IPTV_BURST_BYTES": str(256 * 1024)}, "full"),
    ("sluice (SLUICE_IPTV_BURST_BYTES=0, live start)", {"SLUICE_IPTV_BURST_BYTES": "0"}, "full"),
    ("sluice gateway-only router build (defaults)", {}, "router"),
    ("sluice gateway-only router build (burst_bytes=0, live start)",
     {"SLUICE_IPTV_BURST_BYTES": "0"}, "router"),
]
S5_USS_GOAL_MB = 2.0
# Issue 13's goals for the gateway-only build: stripped binary, idle USS, USS with 8 clients on
# 1 group at 40 Mb/s with live start (burst_bytes = 0).
S5_ROUTER_GOALS = {"binary_mib": 1.5, "idle_uss_mib": 1.0, "live_uss_mib": 2.0}
# Seconds between the gateway answering and the idle memory sample.
S5_SETTLE_SECS = 2.0


def s5(ctx):
    q = ctx.quick
    # A freshly written binary's page-cache pages count as the process's own dirty pages until
    # they are written back: flush them, or the build written last looks bigger in USS.
    os.sync()
    warm, secs = (2.0, 5.0) if q else (5.0, 30.0)
    rows = []
    for i, case in enumerate(S5_CASES):
        groups = [f"239.81.{i}.{g + 1}" for g in range(case["groups"])]
        rows.append(_s5_sender_only(ctx, case, groups, warm, secs))
        for label, env, build in S5_GATEWAYS:
            rows.append(_s5_gateway(ctx, case, groups, label, env, warm, secs, build))
    return {"id": "S5", "title": "IPTV gateway: multicast RTP to HTTP", "status": "measured",
            "quick": q, "rows": rows, "published": S5_PUBLISHED,
            "params": {"warmup_secs": warm, "secs": secs, "port": S5_PORT,
                       "uss_goal_mb": S5_USS_GOAL_MB, "router_goals": S5_ROUTER_GOALS},
            "question": "CPU (the gateway's own, and the whole machine's with softirq) and memory "
                        "for 8 groups × 8 clients on one port, 8 clients on 1 group, 1 client at "
                        "400 Mb/s, with every byte checked as delivered."}


def _s5_sender(ctx, groups, mbps, run_secs, name):
    d = ctx.tempdir(name)
    argv = [ctx.loadgen_bin, "mcast-send", "--groups", ",".join(groups), "--port", str(S5_PORT),
            "--interface", "lo", "--mbps", str(mbps), "--secs", f"{run_secs:g}"]
    ctx.note(argv)
    log = os.path.join(d, "send.json")
    return procs.start(argv, log, cpus=ctx.client_cpus), log


def _s5_sender_report(proc, log, timeout):
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        procs.stop(proc)
        return {"failed": "sender did not finish in time"}
    procs.stop(proc)
    with open(log) as f:
        text = f.read()
    try:
        return json.loads(text[text.index("{"):])
    except ValueError:
        return {"failed": text.strip()[-300:]}


def _s5_sender_only(ctx, case, groups, warm, secs):
    """Baseline: the sender alone, no gateway and no receivers, so the machine's CPU with the
    gateway can be read against it."""
    row = {"case": case["case"], "gateway": "sender only (baseline, no gateway)"}
    proc, log = _s5_sender(ctx, groups, case["mbps"], warm + secs + 1, "s5-baseline")
    time.sleep(warm)
    row["usage"] = ctx.loadgen(["sample", "--pid", str(proc.pid), "--secs", f"{secs:g}"],
                               timeout=secs + 30)
    row["sender"] = _s5_sender_report(proc, log, timeout=30)
    row["status"] = "ok"
    return row


_STRIPPED = {}


def _stripped_mib(ctx, binary):
    """The binary's size without symbols and debug info, which is what a router stores (the
    release build keeps debug info for profiling): a stripped temporary copy is measured."""
    if binary not in _STRIPPED:
        out = os.path.join(ctx.tempdir("strip"), "sluice")
        try:
            r = procs.run(["strip", "-o", out, binary], timeout=120)
            _STRIPPED[binary] = os.path.getsize(out) / 2**20 if r.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            _STRIPPED[binary] = None
    return _STRIPPED[binary]


def _s5_gateway(ctx, case, groups, label, env, warm, secs, build="full"):
    binary = ctx.sluice_router_bin if build == "router" else ctx.sluice_bin
    row = {"case": case["case"], "gateway": label, "build": build,
           "live_start": env.get("SLUICE_IPTV_BURST_BYTES") == "0"}
    if os.path.exists(binary):
        # Both builds side by side: the size on flash is part of what a router pays.
        row["binary_mib"] = _stripped_mib(ctx, binary)
    try:
        peer = peers.start_sluice(ctx, PASSWORD, ctx.proxy_cpus,
                                  ["--multicast-interface", "lo"], env, binary=binary)
    except (peers.Unavailable, RuntimeError) as e:
        row["status"] = str(e)
        return row
    sender = None
    try:
        row["version"] = peer.version
        # Idle means settled: start-up is over and the process waits for its first channel.
        time.sleep(S5_SETTLE_SECS)
        row["idle"] = _idle_usage(ctx, peer.pid)
        lead, drain = 0.5, 10.0
        sender, log = _s5_sender(ctx, groups, case["mbps"], lead + warm + secs + 1, "s5-send")
        time.sleep(lead)
        urls = [f"http://127.0.0.1:{peer.port}/rtp/{g}:{S5_PORT}?api_password={PASSWORD}"
                for g in groups]
        row["recv"] = ctx.loadgen(["iptv-recv", "--urls", ",".join(urls),
                                   "--clients", str(case["clients"]),
                                   "--warmup-secs", f"{warm:g}", "--secs", f"{secs:g}",
                                   "--max-drain-secs", f"{drain:g}", "--pid", str(peer.pid)],
                                  timeout=warm + secs + drain + 60)
        row["sender"] = _s5_sender_report(sender, log, timeout=30)
        sender = None
        row["status"] = "ok"
    finally:
        if sender is not None:
            procs.stop(sender)
        peer.stop()
    return row


# === S5-HLS: the gateway's HLS output ===

# (build, HLS viewers, raw-TS viewers, channel Mb/s, container). The budget cell is 4 HLS
# + 4 raw at 8 Mb/s; 8 HLS viewers at 40 Mb/s is rtp2httpd's published "8 clients, 1 group, ~40
# Mb/s" raw-TS case, watched through HLS instead.
S5H_RUNS = [
    ("full", 0, 8, 8, "ts"),
    ("full", 8, 0, 8, "ts"),
    ("full", 4, 4, 8, "ts"),
    ("full", 8, 0, 40, "ts"),
    ("router", 0, 8, 8, "ts"),
    ("router", 8, 0, 8, "ts"),
    ("router", 4, 4, 8, "ts"),
    ("router", 8, 0, 40, "ts"),
    ("router", 8, 0, 8, "fmp4"),
]
S5H_SCRIPT = ("bench", "s5-hls")


def s5_hls(ctx):
    """Runs `bench/s5-hls` for each of S5H_RUNS: one channel on lo, HLS and raw-TS viewers at
    once, the gateway's CPU and USS over a window."""
    warm, secs = (4, 10) if ctx.quick else (8, 30)
    sources = ctx.tempdir("s5-hls-sources")
    rows = []
    for build, hls, raw, mbps, container in S5H_RUNS:
        binary = ctx.sluice_router_bin if build == "router" else ctx.sluice_bin
        row = {"build": build, "hls": hls, "raw": raw, "mbps": mbps, "container": container,
               "binary": ctx.relative(binary)}
        rows.append(row)
        if not os.path.exists(binary):
            row["status"] = f"not built: {ctx.relative(binary)}"
            continue
        row["binary_mib"] = _stripped_mib(ctx, binary)
        argv = [os.path.join(ctx.repo, *S5H_SCRIPT), "--sluice", binary, "--label", build,
                "--hls", str(hls), "--raw", str(raw), "--mbps", str(mbps), "--container", container,
                "--warmup", str(warm), "--secs", str(secs), "--source-dir", sources, "--json"]
        ctx.note(argv)
        try:
            out = procs.run(argv, timeout=warm + secs + 180)
        except subprocess.TimeoutExpired:
            row["status"] = "timed out"
            continue
        line = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
        try:
            row.update(json.loads(line[0]))
            row["status"] = "ok"
        except (IndexError, ValueError):
            row["status"] = (out.stderr.strip() or out.stdout.strip())[-300:] or "no output"
    return {"id": "S5-HLS", "title": "IPTV gateway: HLS output", "status": "measured",
            "quick": ctx.quick, "rows": rows,
            "params": {"warmup_secs": warm, "secs": secs, "target_duration_secs": 2},
            "published": S5_PUBLISHED,
            "question": "CPU and memory of HLS output: one multicast channel to HLS viewers, raw-TS "
                        "viewers, and both at once, full and router builds; beside rtp2httpd's "
                        "published raw-TS figures for the same number of viewers."}


# === S6: ClearKey decryption ===

CENC_BENCH = ("crates", "sluice-media", "benches", "cenc.rs")


def s6(ctx):
    r = _pending("S6", "ClearKey (CENC) decryption; HLS and DASH end to end",
                 "Decryption throughput of sluice-media's cenc module against the AES-128-CTR "
                 "ceiling of this CPU (openssl speed), and the fMP4 to MPEG-TS remuxer's MB/s; and HLS, and ClearKey DASH served as HLS, "
                 "through the proxy: how many segments/s c players get, at what latency and cost.")
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
    r["hls"] = _s6_hls(ctx)
    r["dash"] = _s6_dash(ctx)
    if r["hls"].get("rows") or r["dash"].get("rows"):
        r["status"] = "measured"
    return r


S6_HLS_PEERS = ["sluice", "MediaFlow"]


def _s6_hls(ctx):
    """HLS end to end: c players each fetch the playlist through the proxy, then every segment
    URL of the playlist they received, in order, as fast as they can."""
    levels = [10] if ctx.quick else [10, 30, 50]
    try:
        path, count, total = ctx.hls_vod(60)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    out = {"levels": levels, "segments": count, "segment_bytes": total, "rows": []}
    _players(ctx, out, lambda d: f"/proxy/hls/manifest.m3u8?d={d}", path,
             ["--expect-segments", str(count)])
    return out


DASH_SEGMENTS = 60


def _s6_dash(ctx):
    """DASH to HLS end to end: c players each fetch `/proxy/mpd/manifest.m3u8` for a ClearKey
    DASH VOD, follow the master to the video variant and its audio rendition, then fetch both
    tracks' init sections and segments in order; the proxy decrypts every segment on the fly."""
    levels = [10] if ctx.quick else [10, 30, 50]
    try:
        path, counts, kid, key = ctx.dash_vod(DASH_SEGMENTS)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    expect = sum(counts.values())
    out = {"levels": levels, "segments": expect, "tracks": counts, "rows": []}
    _players(ctx, out, lambda d: f"/proxy/mpd/manifest.m3u8?d={d}&key_id={kid}&key={key}", path,
             ["--expect-segments", str(expect), "--check-fmp4"], decode_check=True)
    return out


def _players(ctx, out, endpoint, path, expect_args, decode_check=False):
    """Runs `sluice-loadgen hls` players at `out["levels"]` through each S6 peer in turn, against
    the origin file at `path`; `endpoint(d)` is the proxy path and query for the encoded origin
    URL. One row per peer lands in `out["rows"]`."""
    levels = out["levels"]
    origin = peers.start_origin(ctx, ctx.files_dir, ctx.origin_cpus)
    try:
        for name in S6_HLS_PEERS:
            row = {"peer": name}
            out["rows"].append(row)
            try:
                p = (peers.start_sluice(ctx, PASSWORD, ctx.proxy_cpus) if name == "sluice"
                     else peers.start_mediaflow(ctx, PASSWORD, ctx.proxy_cpus))
            except (peers.Unavailable, RuntimeError) as e:
                row["status"] = str(e)
                continue
            try:
                row["version"] = p.version
                d = urllib.parse.quote(f"http://127.0.0.1:{origin.port}{path}", safe="")
                url = f"http://127.0.0.1:{p.port}{endpoint(d)}&api_password={PASSWORD}"
                if decode_check:
                    row["decode"] = _decode_check(ctx, url)
                row["report"] = ctx.loadgen(
                    ["hls", "--url", url, "--levels", ",".join(map(str, levels)), *expect_args,
                     "--timeout-secs", "30", "--max-secs", "300", "--pid", str(p.pid)],
                    timeout=300 * len(levels) + 60)
                row["status"] = "ok"
            finally:
                p.stop()
    finally:
        origin.stop()


def _get(url, timeout=30):
    if not url.startswith("http://127.0.0.1:"):
        raise ValueError(f"not a loopback URL: {url}")
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _decode_check(ctx, url):
    """Before the load: one player's worth of the video track (master, best variant, its init
    section and first segment) through the proxy, decoded by ffmpeg. A segment left encrypted,
    or decrypted with the wrong bytes, fails to decode cleanly."""
    try:
        master = _get(url).decode("utf-8", "replace")
        lines = [ln.strip() for ln in master.splitlines()]
        best, uri = -1, None
        for i, ln in enumerate(lines):
            if ln.startswith("#EXT-X-STREAM-INF:") and i + 1 < len(lines):
                bw = int((ln.split("BANDWIDTH=", 1) + ["0"])[1].split(",", 1)[0] or 0)
                if bw > best:
                    best, uri = bw, lines[i + 1]
        if uri is None:
            return {"ok": False, "why": "no variant in the master playlist"}
        media_url = urllib.parse.urljoin(url, uri)
        media = _get(media_url).decode("utf-8", "replace")
        init = [ln.split('URI="', 1)[1].split('"', 1)[0] for ln in media.splitlines()
                if ln.startswith("#EXT-X-MAP:")]
        segs = [ln.strip() for ln in media.splitlines() if ln.strip() and not ln.startswith("#")]
        body = b"".join(_get(urllib.parse.urljoin(media_url, u)) for u in init + segs[:1])
    except (OSError, ValueError, IndexError) as e:
        return {"ok": False, "why": f"fetch failed: {e}"}
    f = os.path.join(ctx.tempdir("s6-decode"), "first.mp4")
    with open(f, "wb") as fh:
        fh.write(body)
    argv = ["ffmpeg", "-hide_banner", "-v", "error", "-i", f, "-map", "0:v", "-f", "framemd5", "-"]
    try:
        r = procs.run(argv, timeout=60)
    except subprocess.TimeoutExpired:
        return {"ok": False, "why": "ffmpeg timed out"}
    frames = sum(1 for ln in r.stdout.splitlines() if ln and not ln.startswith("#"))
    errs = r.stderr.strip()
    return {"ok": r.returncode == 0 and not errs and frames > 0, "frames": frames,
            "init": bool(init), "bytes": len(body), "why": errs[-300:]}


def _criterion(ctx):
    """Runs the pure crate's criterion benches (ClearKey decryption, rewriting a 5000-segment
    HLS playlist, and remuxing fMP4 to MPEG-TS) and keeps each benchmark's median time and
    throughput."""
    found = []
    for bench in ("cenc", "hls_rewrite", "remux"):
        argv = ["cargo", "bench", "-p", "sluice-media", "--bench", bench, "--"]
        if ctx.quick:
            argv += ["--warm-up-time", "1", "--measurement-time", "2"]
        ctx.note(argv)
        try:
            out = procs.run(argv, timeout=1800, cwd=ctx.repo)
        except (OSError, subprocess.TimeoutExpired) as e:
            return {"error": str(e)}
        if out.returncode != 0:
            return {"error": out.stderr.strip()[-400:]}
        name, time = "", ""
        for ln in out.stdout.splitlines():
            if ln and not ln[0].isspace():
                name = ln.split()[0]
            if "time:" in ln and "[" in ln:
                parts = ln.split("[", 1)[1].rstrip("]").split()
                time = f"{parts[2]} {parts[3]}" if len(parts) >= 4 else ""
            if "thrpt:" in ln and "[" in ln:
                parts = ln.split("[", 1)[1].rstrip("]").split()
                if len(parts) >= 4:
                    found.append({"bench": name, "time": time, "median": f"{parts[2]} {parts[3]}"})
    return {"results": found}


def s7(ctx):
    """One cache across nodes (Zipf, N = 1, 3, 5, beside independent nodes and Varnish's shard
    director): see s7.py."""
    return s7_cases.run(ctx)


ALL = {"S1": s1, "S2": s2, "S3": s3, "S4": s4, "S5": s5, "S5-HLS": s5_hls, "S6": s6, "S7": s7}
# Slots that measure nothing yet: cheap to produce, so the report always shows them.
SLOTS = set()
