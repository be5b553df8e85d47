"""`bench/run --budget` for the media proxy (S1: `/proxy/stream` of a 7 MiB file) and the slice
cache (S4: (b) hits under equal budgets and open loop; (a) the coalesced first byte restated on a
setup this two-core machine can show)."""

import time
import urllib.parse

from . import budget, peers
from . import s4 as s4_cases
from .budget_runs import closed_and_open
from .context import MiB
from .scenarios import PASSWORD

LIGHT = "MediaFlow Proxy Light"
LIGHT_MISSING = ("not installable here: it ships as GitHub release binaries and a container "
                 "image only, and neither is on a package registry this machine reaches")
S1_CLIENTS = 10


def _stream_peer(start):
    """A media proxy started by `start(ctx, cpus)`, asked for `/proxy/stream?d=<origin URL>`."""
    def run(ctx, origin_port, cpus):
        peer = start(ctx, cpus)

        def path_for(path):
            d = urllib.parse.quote(f"http://127.0.0.1:{origin_port}{path}", safe="")
            return f"/proxy/stream?d={d}&api_password={PASSWORD}"
        peer.path_for = path_for
        return peer
    return run


def _light(ctx, origin_port, cpus):
    raise peers.Unavailable(LIGHT_MISSING)


def s1(ctx):
    """7 MiB through each media proxy at c = 10 under the same quota, beside nginx `proxy_pass`
    (the fair proxy peer) and nginx serving the file itself (the ceiling)."""
    big = ctx.test_file("7m.bin", 7 * MiB)
    starters = {
        "sluice": _stream_peer(lambda ctx, cpus: peers.start_sluice(ctx, PASSWORD, cpus)),
        LIGHT: _light,
        "MediaFlow": _stream_peer(lambda ctx, cpus: peers.start_mediaflow(ctx, PASSWORD, cpus)),
        "nginx proxy_pass": peers.start_nginx_proxy,
        "nginx direct (ceiling)": lambda ctx, port, cpus: peers.start_origin(
            ctx, ctx.files_dir, cpus),
    }
    origin = peers.start_origin(ctx, ctx.files_dir, ctx.origin_cpus)
    helpers = None
    try:
        out, helpers = closed_and_open(
            ctx, starters, origin, [(big, "7 MiB stream", {"warm": 2})], {}, "sluice", None,
            secs=5 if ctx.quick else 10, c=S1_CLIENTS)
    finally:
        origin.stop()
        if helpers:
            helpers.remove()
    out.update({"id": "S1", "sluice": "sluice", "bytes_view": True, "note": (
        f"`/proxy/stream?d=<origin>/7m.bin` through each media proxy at c = {S1_CLIENTS}; nginx "
        "`proxy_pass` to the same origin is the fair proxy peer, and nginx serving the file "
        "itself from its own quota (sendfile) is the ceiling, not a rival. MB/s = req/s × 7 MiB; "
        "CPU s / GB = the proxy cgroup's CPU seconds per 10⁹ bytes delivered, the cost a "
        f"media proxy's operator pays per GB whatever the client side could take. {LIGHT}: "
        f"{LIGHT_MISSING}, so its row and the goal against it have no number; MediaFlow "
        "(Python 2.4.9, 2 uvicorn workers) is shown instead.")})
    return out


MEMORY_MIB, DISK_MIB = 256, 4096
# (a) restated: the origin sends each body at this rate, so a 16 MiB miss fills for about
# 0.3 s and the burst's 100 clients all arrive while it is being written.
A_BYTES, A_C, A_PACE_MBPS = 16 * MiB, 100, 50


def _cache_peer(name):
    def run(ctx, origin_port, cpus):
        store = ctx.tempdir(f"s4-budget-{s4_cases._slug(name)}")
        return s4_cases.STARTERS[name](ctx, origin_port, cpus, store, MEMORY_MIB, DISK_MIB)
    return run


def s4(ctx):
    """(b) 1 KB and 7 MB hits through each cache under the same quota (each cell's warm-up stores
    the object first), the open loop on the 1 KB hit; then (a) restated (`coalesced`)."""
    run_id = str(int(time.time()))
    starters = {name: _cache_peer(name) for name in s4_cases.STARTERS}
    plan = []
    for size, label in ((1024, "1 KB hit"), (7 * MiB, "7 MB hit")):
        digest = s4_cases._digest(ctx, size)
        plan.append(((f"gen-{size}", size, digest), label,
                     {"path": f"/gen/{size}/budget-{run_id}", "warm": 1}))
    origin = peers.start_gen_origin(ctx, ctx.origin_cpus, s4_cases.SWR_DELAY_MS)
    helpers = None
    try:
        out, helpers = closed_and_open(ctx, starters, origin, plan, {}, "sluice", plan[0][0],
                                       plan[0][2])
    finally:
        origin.stop()
        if helpers:
            helpers.remove()
    out["coalesced"] = coalesced(ctx, starters, run_id)
    out.update({"id": "S4", "sluice": "sluice"})
    return out


def coalesced(ctx, starters, run_id):
    """(a) restated: 100 clients released at once on a cold 16 MiB object, the load client alone
    on core 0 in its own high-weight cgroup, the origin on core 1 sending each body at
    `A_PACE_MBPS` (a slow miss), each cache on core 1 in a high-weight cgroup without a quota
    (a first byte is latency, and a 100 ms quota period would add stalls that have nothing to do
    with coalescing). Per round and cache: first bytes from the release against the origin's own
    TTFB measured just before, and the origin bytes the burst cost."""
    rounds = 1 if ctx.quick else 3
    p = {"a_bytes": A_BYTES, "a_c": A_C, "settle_secs": 30}
    origin = peers.start_gen_origin(ctx, ctx.proxy_cpus, s4_cases.SWR_DELAY_MS,
                                    pace_mbps=A_PACE_MBPS)
    helpers = budget.helper_groups(ctx, origin)
    names = list(starters)
    got = {n: [] for n in names}
    status = {}
    try:
        for k in range(rounds):
            base = s4_cases._origin_ttfb(ctx, origin, p, f"{run_id}-ca{k}")
            for name in names[k % len(names):] + names[:k % len(names)]:
                try:
                    peer = starters[name](ctx, origin.port, ctx.proxy_cpus)
                except (peers.Unavailable, RuntimeError) as e:
                    status[name] = str(e)
                    continue
                group = budget.Cgroup(f"sluice-bench-a-{run_id}-{k}-{names.index(name)}", None)
                try:
                    group.enter(peer.pid)
                    lvl = s4_cases._case_a(ctx, peer, origin, p,
                                           f"{run_id}-{s4_cases._slug(name)}-ca{k}")
                    lvl["origin_ttfb"] = base
                    got[name].append(lvl)
                finally:
                    peer.stop()
                    group.remove()
    finally:
        origin.stop()
        if helpers:
            helpers.remove()
    rows = []
    for name in names:
        if not got[name]:
            rows.append({"peer": name, "status": status.get(name, "not run")})
            continue
        row = s4_cases._median_a(got[name], p)
        row["peer"] = name
        row["status"] = "ok" if "failed" not in row else row["failed"]
        rows.append(row)
    return {"bytes": A_BYTES, "c": A_C, "pace_mbps": A_PACE_MBPS, "rounds": rounds,
            "load": budget.machine_load(), "rows": rows}

