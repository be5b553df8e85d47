"""`bench/run --budget`: each scenario's proxies under equal CPU budgets (closed loop, busy polling
off for all and on for all that have it), open-loop latency at 25/50/75 % of the slowest proxy's
budget-capped peak, and memory per idle connection (HTTP/1.1 and h2c). S1 and S4 live in
`budget_media.py`."""

import functools
import os

from . import budget, peers
from .context import MiB

QUOTA_PCT = 25
CLIENTS = 50
BUSY_POLL_US = 200  # sluice's default until these tables, for the "on" table


def _params(ctx):
    if ctx.quick:
        return {"rounds": 1, "secs": 2, "warm": 0.5, "open_secs": 3,
                "idle_levels": [5000, 50000]}
    return {"rounds": 3, "secs": 5, "warm": 1, "open_secs": 10, "idle_levels": [5000, 50000]}


def _variants(poll_names):
    """Busy polling off for every proxy, and on for each that has it (`poll_names`: peer →
    its start argument). Without such a peer, one table: every proxy as shipped."""
    if not poll_names:
        return {"as shipped": {}}
    off = {name: {arg: off_value} for name, (arg, off_value, _) in poll_names.items()}
    on = {name: {arg: on_value} for name, (arg, _, on_value) in poll_names.items()}
    return {"off": off, "on": on}


def closed_and_open(ctx, starters, origin, plan, poll_names, sluice, open_file, open_opt=None,
                    secs=None, c=CLIENTS):
    """The budget tables for every cell of `plan`, then (unless `open_file` is None) the open
    loop on `open_file` (`open_opt`: its path and warm-up). The client and the origin each get
    their own high-weight cgroup for the whole run (`budget.Helpers`)."""
    helpers = budget.helper_groups(ctx, origin)
    try:
        out = _closed_and_open(ctx, starters, origin, plan, poll_names, sluice, open_file,
                               open_opt, secs, c)
    finally:
        # The origin is stopped by the caller; its group is removed at exit if not empty now.
        if helpers:
            helpers.remove_client()
    out["helpers_metered"] = helpers is not None
    return out, helpers


def _closed_and_open(ctx, starters, origin, plan, poll_names, sluice, open_file, open_opt, secs,
                     c):
    p = _params(ctx)
    out = {"quota_pct": QUOTA_PCT, "c": c, "params": dict(p, secs=secs or p["secs"]),
           "budget": {}, "open_loop": {}, "instructions": budget.instructions_note()}
    peaks = {}
    for mode, variant in _variants(poll_names).items():
        cells, load = budget.budget_cells(ctx, starters, origin, plan, QUOTA_PCT, p["rounds"],
                                          secs or p["secs"], p["warm"], c, variant)
        rows = budget.summarize_budget(cells, sluice, QUOTA_PCT)
        out["budget"][mode] = {"rows": rows, "load": load}
        peaks[mode] = [r["rps"] for r in rows
                       if r["cell"] == plan[0][1] and r.get("rps")]
    if open_file is None:
        return out
    # Rates from the slowest proxy's budget-capped peak on the first cell, busy polling off.
    first = peaks.get("off") or peaks.get("as shipped") or [0]
    slowest = min(first) or 1000
    rates = [round(slowest * f) for f in (0.25, 0.5, 0.75)]
    out["open_rates"] = rates
    for mode, variant in _variants(poll_names).items():
        load = budget.machine_load()
        rows = budget.open_loop(ctx, starters, origin, open_file, rates, QUOTA_PCT,
                                p["open_secs"], p["warm"], c, variant, open_opt)
        out["open_loop"][mode] = {"rows": rows, "load": load}
    return out


def s2(ctx):
    small = ctx.test_file("1k.bin", 1024)
    mid = ctx.test_file("64k.bin", 64 * 1024)
    big = ctx.test_file("7m.bin", 7 * MiB)
    sluice = "sluice"
    starters = {
        sluice: functools.partial(peers.start_sluice_reverse, runtime="work-stealing"),
        "nginx proxy_pass": peers.start_nginx_proxy,
        "HAProxy http": peers.start_haproxy_http,
        "Varnish pass": peers.start_varnish_pass,
    }
    poll = {sluice: ("busy_poll_us", 0, BUSY_POLL_US), "HAProxy http": ("busy_polling", False, True)}
    origin = peers.start_origin(ctx, ctx.files_dir, ctx.origin_cpus)
    helpers = None
    try:
        out, helpers = closed_and_open(ctx, starters, origin,
                                       [(small, "1 KB"), (mid, "64 KiB"), (big, "7 MB")], poll,
                                       sluice, small)
        out["callgrind"] = budget.callgrind_per_request(ctx, starters[sluice], origin, small)
        out["callgrind"].pop("dump", None)
        if os.environ.get("BENCH_BUDGET_IDLE", "1") != "0":
            out["idle"] = idle(ctx, origin, small)
    finally:
        origin.stop()
        if helpers:
            helpers.remove()
    out.update({"id": "S2", "sluice": sluice})
    return out


# Connections one load-client process holds at most; above it the idle test adds processes.
IDLE_PER_CLIENT = 10_000


def idle(ctx, origin, small):
    """Memory per idle keep-alive connection, HTTP/1.1 and h2c, beside nginx and HAProxy."""
    nofile = budget.raise_nofile_for_children()
    # Every proxy needs a descriptor per idle client, and so does the load client. Where the
    # hard open-file limit is below the wanted level (a container without CAP_SYS_RESOURCE
    # cannot raise it), the top level is what one process can hold with room to spare, and
    # the load client is spread over several processes, each under the limit.
    wanted = _params(ctx)["idle_levels"]
    levels = sorted({min(lv, nofile - 1000) for lv in wanted})
    client_procs = -(-max(levels) // min(IDLE_PER_CLIENT, nofile - 1000))
    big = max(levels) + 200
    starters = {
        # The same upstream keep-alive cap as nginx's `keepalive 256`: the ramp fills the pool,
        # and sluice's default cap (1,024) would count a larger fixed pool as per-connection cost.
        "sluice": functools.partial(peers.start_sluice_reverse, runtime="work-stealing",
                                    max_connections=big, pool_max_idle=256),
        # worker_connections counts upstream connections too, and at the limit nginx closes
        # idle keep-alive clients to make room: twice the level keeps every client open.
        "nginx proxy_pass": functools.partial(peers.start_nginx_proxy, connections=2 * big),
        # HAProxy reserves two descriptors per connection (maxsock = 2 × maxconn) and by default
        # refuses to start when the limit is lower (`strict-limits`); an idle client holds one,
        # since the upstream connections are pooled and shared.
        "HAProxy http": functools.partial(peers.start_haproxy_http, maxconn=big,
                                          ulimit_n=nofile, strict_limits=False),
    }
    out = {"levels": levels, "wanted_levels": wanted, "nofile": nofile,
           "client_procs": client_procs, "load": budget.machine_load()}
    out["http1"] = budget.idle_memory(ctx, starters, origin, small, levels,
                                      client_procs=client_procs)
    h2 = {"nginx proxy_pass": {"h2c": True}, "HAProxy http": {"h2c": True}}
    out["h2c"] = budget.idle_memory(ctx, starters, origin, small, levels, h2=True, variant=h2,
                                    client_procs=client_procs)
    return out


def s3(ctx):
    files = [ctx.test_file("hello.txt", 13, b"Hello, world!"), ctx.test_file("64k.bin", 64 * 1024),
             ctx.test_file("256m.bin", 256 * MiB)]
    sluice = "sluice"
    starters = {sluice: peers.start_sluice_tcp, "HAProxy tcp": peers.start_haproxy_tcp,
                "Go io.Copy": peers.start_goproxy}
    origin = peers.start_origin(ctx, ctx.files_dir, ctx.origin_cpus)
    helpers = None
    try:
        out, helpers = closed_and_open(ctx, starters, origin,
                                       [(files[0], "13 B"), (files[1], "64 KiB"),
                                        # Two long transfers at a time: CPU per GB of a stream.
                                        (files[2], "256 MB stream", {"c": 2})],
                                       {sluice: ("busy_poll_us", 0, BUSY_POLL_US)}, sluice,
                                       files[0])
    finally:
        origin.stop()
        if helpers:
            helpers.remove()
    out.update({"id": "S3", "sluice": sluice, "bytes_view": True})
    return out


def tls(ctx):
    """The TLS and HTTP/2 cells (`suite/tls_budget.py`), a budget-only run."""
    from . import tls_budget
    return tls_budget.tls(ctx)


def s1(ctx):
    from . import budget_media
    return budget_media.s1(ctx)


def s4(ctx):
    from . import budget_media
    return budget_media.s4(ctx)


def h3(ctx):
    """HTTP/3 against sluice's own HTTP/2 and HTTP/1.1 (`suite/h3_budget.py`), budget-only."""
    from . import h3_budget
    return h3_budget.h3(ctx)


ALL = {"S1": s1, "S2": s2, "S3": s3, "S4": s4, "TLS": tls, "H3": h3}
