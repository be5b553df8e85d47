"""S4, the slice cache: sluice, nginx proxy_cache + slice and Varnish before a generated origin."""

import json
import os
import shutil
import time
import urllib.request

from . import peers, procs
from .context import MiB

GiB = 1024 * MiB
SLICE = MiB
# The origin answers every /swr/ request (revalidations included) after this delay, so a cache
# that refreshes in the foreground shows it in its p99.
SWR_DELAY_MS = 200
# Loopback only: never route the origin's counters through a proxy from the environment.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

STARTERS = {
    "sluice": peers.start_sluice_cache,
    "nginx proxy_cache + slice": peers.start_nginx_cache,
    "Varnish malloc": peers.start_varnish_cache,
}
PEERS = list(STARTERS)
CASES = "abcdef"


def _selected():
    """Peers and cases to run: all, or those named in S4_PEERS (first words, e.g. `sluice`) and
    S4_CASES (letters, e.g. `de`), to iterate on one case without the whole scenario. A filtered
    run's tables say "not run" for the rest; it is not a result to publish."""
    want = [w.strip().lower() for w in os.environ.get("S4_PEERS", "").split(",") if w.strip()]
    peers_ = [n for n in PEERS if not want or _slug(n) in want]
    unknown = set(want) - {_slug(n) for n in PEERS}
    cases = "".join(c for c in os.environ.get("S4_CASES", "").lower() if c.isalpha()) or CASES
    if unknown or set(cases) - set(CASES) or not peers_:
        raise RuntimeError(f"S4_PEERS={os.environ.get('S4_PEERS', '')!r} / "
                           f"S4_CASES={os.environ.get('S4_CASES', '')!r}: peers are "
                           f"{', '.join(_slug(n) for n in PEERS)}, cases {CASES}")
    return peers_, cases


def params_for(quick):
    return {
        "memory_mib": 256, "disk_mib": 4096, "slice_bytes": SLICE,
        "a_bytes": 64 * MiB, "a_c": 100,
        "b_c": 50, "b_secs": 2 if quick else 10, "b_warmup_secs": 0.5 if quick else 2,
        "b_sizes": [1024, 7 * MiB],
        "c_object": 4 * GiB, "c_start": 3 * GiB, "c_len": MiB,
        "d_c": 20, "d_bytes": (256 if quick else 1024) * MiB,
        "e_objects": 100, "e_bytes": 256 * 1024,
        "f_c": 10, "f_secs": 4 if quick else 10, "swr_delay_ms": SWR_DELAY_MS,
        "settle_secs": 30 if quick else 90,
        # (a) and (b) are measured in rounds, the peers in turn (`_rounds`).
        "rounds": 3,
    }


def run(ctx):
    p = params_for(ctx.quick)
    peers_, cases = _selected()
    run_id = str(int(time.time()))
    origin = peers.start_gen_origin(ctx, ctx.origin_cpus, SWR_DELAY_MS)
    rows = {name: {"peer": name, "cases": {}} for name in peers_}
    live = {}
    try:
        p["origin_ttfb"] = _origin_ttfb(ctx, origin, p, run_id)
        if "a" in cases:
            p["origin_burst"] = _origin_burst(ctx, origin, p, run_id)
        if any(c in cases for c in "abcf"):
            live = _start_all(ctx, peers_, origin, p, rows)
        if "a" in cases or "b" in cases:
            _rounds(ctx, live, origin, p, run_id, cases, rows)
        for name in peers_:
            _peer_rest(ctx, name, live, origin, p, f"{run_id}-{_slug(name)}", cases, rows[name])
    finally:
        for peer, store in live.values():
            peer.stop()
            _drop(store)
        origin.stop()
    return {"id": "S4", "title": "Streaming slice cache", "status": "measured", "quick": ctx.quick,
            "params": p, "rows": [rows[n] for n in peers_], "origin": origin.version,
            "question": "Cold miss with 100 clients at once (coalescing and first byte), hits, a "
                        "Range into a cold 4 GiB object, memory with 20 cold 1 GiB streams, a "
                        "restart with the disk tier, latency across a stale-while-revalidate "
                        "refresh: sluice vs nginx proxy_cache + slice vs Varnish."}


def _slug(name):
    return name.split()[0].lower()


def _stats(origin):
    with _opener.open(f"http://127.0.0.1:{origin.port}/__stats", timeout=5) as r:
        return json.loads(r.read())


def _settled(origin, before, limit):
    """Origin counters once the peer stopped fetching (no new body bytes for 1 s; fills and
    read-aheads detached from the client keep going after it is answered), minus `before`."""
    deadline = time.monotonic() + limit
    last, quiet_since = _stats(origin), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = _stats(origin)
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= 1.0:
            break
    return {k: last[k] - before[k] for k in last}


def _digest(ctx, size, start=0, end=None):
    args = ["gen-digest", "--size", str(size), "--start", str(start)]
    if end is not None:
        args += ["--end", str(end)]
    r = ctx.loadgen(args, timeout=300)
    if isinstance(r, dict):
        raise RuntimeError(r.get("failed", "gen-digest failed"))
    return r


def _batch(ctx, url, c, length, digest, pid, timeout, headers=(), status=200, hash_every=1):
    """One round of c requests released together (no warm-up: the round is the cold one)."""
    args = ["batch", "--url", url, "--levels", str(c), "--rounds", "1", "--warmup", "0",
            "--global-warmup", "0", "--expect-len", str(length), "--expect-sha256", digest,
            "--expect-status", str(status), "--hash-every", str(hash_every),
            "--timeout-secs", str(timeout), "--max-secs", str(timeout)]
    if pid is not None:
        args += ["--pid", str(pid)]
    for h in headers:
        args += ["--header", h]
    r = ctx.loadgen(args, timeout=2 * timeout + 30)
    if "failed" in r:
        return r
    lvl = (r.get("levels") or [None])[0]
    return lvl if lvl is not None else {"failed": "no level ran"}


def _origin_ttfb(ctx, origin, p, run_id):
    """The origin's own time to first byte for the (a) object, straight from the client: the
    baseline the cache's first byte is held to."""
    size = p["a_bytes"]
    digest = _digest(ctx, size)
    url = f"http://127.0.0.1:{origin.port}/gen/{size}/ttfb-{run_id}"
    r = ctx.loadgen(["batch", "--url", url, "--levels", "1", "--rounds", "5", "--warmup", "1",
                     "--global-warmup", "0", "--expect-len", str(size), "--expect-sha256", digest,
                     "--timeout-secs", "60", "--max-secs", "120"], timeout=300)
    lvl = (r.get("levels") or [None])[0] if "failed" not in r else None
    return {"failed": r.get("failed", "no level")} if lvl is None else lvl["ttfb"]


def _origin_burst(ctx, origin, p, run_id):
    """(a)'s release straight to the origin: the same clients, released at once on connections
    opened beforehand. What the clients get with no cache (the origin serves every request),
    beside the one-client baseline the goals are held to."""
    size = p["a_bytes"]
    url = f"http://127.0.0.1:{origin.port}/gen/{size}/burst-{run_id}"
    lvl = _batch(ctx, url, p["a_c"], size, _digest(ctx, size), origin.pid, 120, hash_every=10)
    if "failed" in lvl:
        return lvl
    return {"ttfb_from_release": lvl.get("ttfb_from_release") or lvl["ttfb"],
            "latency": lvl["latency"], "errors": lvl.get("errors", 0)}


def _start(ctx, name, origin, p, cache_dir, port=None):
    return STARTERS[name](ctx, origin.port, ctx.proxy_cpus, cache_dir, p["memory_mib"],
                          p["disk_mib"], port)


def _start_all(ctx, names, origin, p, rows):
    """One instance of each peer for the cases that share it ((a), (b), (c), (f)), all started
    before the rounds so that the rounds can take the peers in turn. A peer that cannot start
    says why in its row."""
    live = {}
    for name in names:
        store = ctx.tempdir(f"s4-{_slug(name)}-store")
        try:
            peer = _start(ctx, name, origin, p, store)
        except (peers.Unavailable, RuntimeError) as e:
            rows[name]["status"] = str(e)
            _drop(store)
            continue
        rows[name]["version"] = peer.version
        live[name] = (peer, store)
    return live


def _rounds(ctx, live, origin, p, run_id, cases, rows):
    """(a) and (b) in rounds, the peers in a rotated order each round: a single cold burst or a
    2 s loop lets the shared machine's drift decide a comparison of a few per cent or a few
    milliseconds. Each round of (a) has a fresh cold object and its own origin TTFB, measured
    just before it, that the round's first bytes are held to."""
    names = list(live)
    for k in range(p["rounds"]):
        order = names[k % len(names):] + names[:k % len(names)] if names else []
        if "a" in cases:
            base = _origin_ttfb(ctx, origin, p, f"{run_id}-r{k}")
            for name in order:
                lvl = _case_a(ctx, live[name][0], origin, p, f"{run_id}-{_slug(name)}-r{k}")
                lvl["origin_ttfb"] = base
                rows[name]["cases"].setdefault("a_rounds", []).append(lvl)
        if "b" in cases:
            for name in order:
                got = _case_b(ctx, live[name][0], p, f"{run_id}-{_slug(name)}")
                rows[name]["cases"].setdefault("b_rounds", []).append(got)
    for name in names:
        got = rows[name]["cases"]
        if "a_rounds" in got:
            got["a"] = _median_a(got.pop("a_rounds"), p)
        if "b_rounds" in got:
            got["b"] = _median_b(got.pop("b_rounds"))


def _median_a(rounds, p):
    """(a) over its rounds: the round with the median p99 over its own origin TTFB, with every
    round's first byte, p99 and origin TTFB beside it, the medians of both margins, and whether
    every round fetched the object exactly once."""
    ok = [r for r in rounds
          if "failed" not in r and "failed" not in (r.get("origin_ttfb") or {"failed": 1})]
    if not ok:
        why = [r.get("failed") or r["origin_ttfb"].get("failed") for r in rounds]
        return {"failed": next((w for w in why if w), "no round ran")}

    def ttfb(r):
        return r.get("ttfb_from_release") or r["ttfb"]

    def margin(r, key):
        return ttfb(r)[key] - r["origin_ttfb"]["p50_ms"]

    def median(values):
        return sorted(values)[(len(values) - 1) // 2]

    pick = dict(sorted(ok, key=lambda r: margin(r, "p99_ms"))[(len(ok) - 1) // 2])
    pick["rounds"] = [{"failed": r["failed"]} if r not in ok else {
        "first_ms": ttfb(r)["min_ms"], "p50_ms": ttfb(r)["p50_ms"], "p99_ms": ttfb(r)["p99_ms"],
        "origin_ttfb_ms": r["origin_ttfb"]["p50_ms"], "origin_bytes": r["origin"]["body_bytes"],
        "origin_requests": r["origin"]["requests"], "errors": r.get("errors", 0)}
        for r in rounds]
    pick["first_over_origin_ms"] = median([margin(r, "min_ms") for r in ok])
    pick["p99_over_origin_ms"] = median([margin(r, "p99_ms") for r in ok])
    pick["origin_once_every_round"] = len(ok) == len(rounds) and all(
        r["origin"]["body_bytes"] == p["a_bytes"] for r in ok)
    pick["errors_all_rounds"] = sum(r.get("errors", 0) for r in ok)
    return pick


def _median_b(rounds):
    """(b) over its rounds: per object size, the round with the median req/s, and every round's
    req/s beside it (`rounds_rps`, in round order)."""
    out = []
    for i, first in enumerate(rounds[0]):
        cells = [r[i] for r in rounds if i < len(r)]
        measured = [c for c in cells if "failed" not in c["report"]]
        if not measured:
            out.append(first)
            continue
        pick = dict(sorted(measured, key=lambda c: c["report"]["rps"])[(len(measured) - 1) // 2])
        pick["rounds_rps"] = [c["report"].get("rps") for c in cells]
        out.append(pick)
    return out


def _peer_rest(ctx, name, live, origin, p, tag, cases, row):
    """The rest of one peer's cases: (c) and (f) on its shared instance, which is then stopped
    (Varnish keeps fetching the whole 4 GiB object of (c) in the background), and (d) and (e)
    on fresh ones, (d) so its memory peak is its own."""
    if name in live:
        peer, store = live.pop(name)
        try:
            for c in "cf":
                if c in cases:
                    fn = {"c": _case_c, "f": _case_f}[c]
                    row["cases"][c] = fn(ctx, peer, origin, p, tag)
        finally:
            peer.stop()
            _drop(store)
    elif "status" in row:
        return
    if "d" in cases:
        row["cases"]["d"] = _case_d(ctx, name, origin, p, tag)
    if "e" in cases:
        row["cases"]["e"] = _case_e(ctx, name, origin, p, tag)
    row["status"] = "ok"


def _case_a(ctx, peer, origin, p, tag):
    """(a) 100 clients at once on a cold 64 MiB object: origin bytes, first byte of every client."""
    size, c = p["a_bytes"], p["a_c"]
    url = f"http://127.0.0.1:{peer.port}/gen/{size}/a-{tag}"
    before = _stats(origin)
    lvl = _batch(ctx, url, c, size, _digest(ctx, size), peer.pid, 120, hash_every=10)
    if "failed" not in lvl:
        lvl["origin"] = _settled(origin, before, p["settle_secs"])
    return lvl


def _case_c(ctx, peer, origin, p, tag):
    """(c) a 1 MiB Range at 3 GiB into a cold 4 GiB object: origin bytes fetched."""
    start, end = p["c_start"], p["c_start"] + p["c_len"]
    url = f"http://127.0.0.1:{peer.port}/gen/{p['c_object']}/c-{tag}"
    before = _stats(origin)
    lvl = _batch(ctx, url, 1, p["c_len"], _digest(ctx, p["c_object"], start, end), peer.pid, 120,
                 headers=[f"Range: bytes={start}-{end - 1}"], status=206)
    if "failed" not in lvl:
        lvl["origin"] = _settled(origin, before, p["settle_secs"])
    return lvl


def _case_b(ctx, peer, p, tag):
    """(b) hits at c=50: requests/s and MB/s of a 1 KB and a 7 MB object already stored (the
    warm-up's first request fills it)."""
    out = []
    for size in p["b_sizes"]:
        url = f"http://127.0.0.1:{peer.port}/gen/{size}/b-{tag}"
        r = ctx.duration(url, ("", size, _digest(ctx, size)), p["b_c"], p["b_secs"],
                         p["b_warmup_secs"], peer.pid)
        out.append({"bytes": size, "report": r})
    return out


def _case_f(ctx, peer, origin, p, tag):
    """(f) latency across stale-while-revalidate refreshes: a 1 KB object fresh for 1 s whose
    origin answers after 200 ms, read in a closed loop for several of its lifetimes, next to the
    same loop on an object that stays fresh (the hit latency it is held to)."""
    size, c, secs = 1024, p["f_c"], p["f_secs"]
    digest = _digest(ctx, size)
    ref = ctx.duration(f"http://127.0.0.1:{peer.port}/gen/{size}/f-{tag}", ("", size, digest),
                       c, secs, 0.5, peer.pid)
    url = f"http://127.0.0.1:{peer.port}/swr/{size}/f-{tag}"
    warm = _batch(ctx, url, 1, size, digest, None, 30)
    before = _stats(origin)
    swr = ctx.duration(url, ("", size, digest), c, secs, 0, peer.pid)
    return {"hit": ref, "swr": swr, "fill": warm, "origin": _settled(origin, before, 10)}


def _case_d(ctx, name, origin, p, tag):
    """(d) 20 clients, each streaming its own cold object, on a fresh instance: peak RSS from
    /proc over the round."""
    store = ctx.tempdir(f"s4-{_slug(name)}-d")
    try:
        peer = _start(ctx, name, origin, p, store)
    except (peers.Unavailable, RuntimeError) as e:
        return {"failed": str(e)}
    try:
        size = p["d_bytes"]
        idle = ctx.loadgen(["sample", "--pid", str(peer.pid), "--secs", "0.3"], timeout=30)
        url = f"http://127.0.0.1:{peer.port}/gen/{size}/d-{tag}-{{i}}"
        before = _stats(origin)
        lvl = _batch(ctx, url, p["d_c"], size, _digest(ctx, size), peer.pid, 600, hash_every=5)
        if "failed" not in lvl:
            lvl["idle"] = None if "failed" in idle else idle
            lvl["origin"] = _settled(origin, before, p["settle_secs"])
        return lvl
    finally:
        peer.stop()
        _drop(store)


def _case_e(ctx, name, origin, p, tag):
    """(e) fill N objects, stop the peer, start it again on the same store, ask for them again:
    the hit ratio is the share the origin was not asked for."""
    store = ctx.tempdir(f"s4-{_slug(name)}-e")
    digest = _digest(ctx, p["e_bytes"])
    # The same port after the restart: the Host header is part of a cache key (sluice's and
    # Varnish's), and clients of a restarted cache come back to the same address.
    port = procs.free_port()
    out = {}
    try:
        for phase in ("fill", "after_restart"):
            out[phase] = _e_phase(ctx, name, origin, p, tag, store, digest, port)
            if "failed" in out[phase]:
                break
            if phase == "fill":
                # Disk writes are off the request path: give them a moment to land.
                time.sleep(2.0)
    finally:
        _drop(store)
    return out


def _e_phase(ctx, name, origin, p, tag, store, digest, port):
    """One pass over the (e) objects on a peer started on `store` and `port`, stopped afterwards
    (SIGTERM)."""
    try:
        peer = _start(ctx, name, origin, p, store, port)
    except (peers.Unavailable, RuntimeError) as e:
        return {"failed": str(e)}
    try:
        size = p["e_bytes"]
        url = f"http://127.0.0.1:{peer.port}/gen/{size}/e-{tag}-{{i}}"
        before = _stats(origin)
        lvl = _batch(ctx, url, p["e_objects"], size, digest, None, 60)
        if "failed" not in lvl:
            lvl["origin"] = _settled(origin, before, p["settle_secs"])
        return lvl
    finally:
        peer.stop()


def _drop(store):
    """A peer's store is gone once its case is measured: several GiB each, on a shared disk."""
    shutil.rmtree(store, ignore_errors=True)
