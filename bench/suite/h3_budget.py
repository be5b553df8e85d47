"""`bench/run --budget --only H3`: HTTP/3 against sluice's own HTTP/2 and HTTP/1.1 over TLS, on
the same reverse route and the same certificate (ECDSA P-256), under the same CPU quota: 1 KB
requests/s, 7 MB MB/s, CPU µs per request, and callgrind's instructions per 1 KB request with
the functions they go to."""

import functools

from . import budget, peers
from .budget_runs import CLIENTS, QUOTA_PCT, _params
from .context import MiB
from .tls_budget import make_certs

SLUICE = "sluice"

# (label, client connections, extra load-client arguments); every cell is keep-alive.
PROTOCOLS = [
    ("HTTP/1.1", None, []),
    ("HTTP/2", 10, ["--h2-streams", "10"]),
    ("HTTP/3", 10, ["--h3-streams", "10"]),
]
# The 7 MB cells: 10 connections, one request at a time on each, whatever the protocol.
BIG = [
    ("HTTP/1.1", 10, []),
    ("HTTP/2", 10, ["--h2-streams", "1"]),
    ("HTTP/3", 10, ["--h3-streams", "1"]),
]


def h3(ctx):
    small = ctx.test_file("1k.bin", 1024)
    big = ctx.test_file("7m.bin", 7 * MiB)
    cert = make_certs(ctx)["ECDSA P-256"]
    start = functools.partial(peers.start_sluice_reverse, runtime="work-stealing",
                              busy_poll_us=0, tls=cert, http3=True)
    starters = {SLUICE: start}
    p = _params(ctx)
    origin = peers.start_origin(ctx, ctx.files_dir, ctx.origin_cpus)
    helpers = budget.helper_groups(ctx, origin)
    plan = []
    for f, size, cells in ((small, "1 KB", PROTOCOLS), (big, "7 MB", BIG)):
        for label, c, args in cells:
            plan.append((f, f"{size}, {label}",
                         {"scheme": "https", "c": c or CLIENTS, "args": ["--ca", cert.ca, *args]}))
    out = {"quota_pct": QUOTA_PCT, "c": CLIENTS, "params": p, "budget": {},
           "instructions": budget.instructions_note()}
    try:
        cells, load = budget.budget_cells(ctx, starters, origin, plan, QUOTA_PCT, p["rounds"],
                                          p["secs"], p["warm"], CLIENTS)
        rows = budget.summarize_budget(cells, SLUICE, QUOTA_PCT)
        out["budget"]["as shipped"] = {"rows": rows, "load": load}
        out["protocols"] = compare(rows)
        out["callgrind_cells"] = {
            label: _callgrind(ctx, start, origin, small, cert, args)
            for label, _, args in PROTOCOLS}
    finally:
        origin.stop()
        ctx.client_cgroup = []
        if helpers:
            helpers.remove()
    out.update({"id": "H3", "sluice": SLUICE, "shares_raised": helpers is not None,
                "note": note(out)})
    return out


def compare(rows):
    """Per size and protocol: req/s, MB/s, CPU µs per request, and each against HTTP/2."""
    by = {r["cell"]: r for r in rows if r.get("status") == "ok"}
    out = []
    for size, mb in (("1 KB", 1024 / MiB), ("7 MB", 7.0)):
        h2 = by.get(f"{size}, HTTP/2", {})
        for label, _, _ in PROTOCOLS:
            r = by.get(f"{size}, {label}")
            if not r:
                continue
            cpu, cpu2 = r.get("cpu_us_per_req"), h2.get("cpu_us_per_req")
            out.append({"size": size, "protocol": label, "rps": r["rps"],
                        "mb_s": r["rps"] * mb * MiB / 1e6 if r.get("rps") else None,
                        "cpu_us_per_req": cpu,
                        "cpu_vs_h2": cpu / cpu2 if cpu and cpu2 else None,
                        "rps_vs_h2": r["rps"] / h2["rps"] if r.get("rps") and h2.get("rps")
                        else None})
    return out


def _callgrind(ctx, start, origin, file, cert, args, top=12):
    """Instructions per 1 KB request over one connection under callgrind, and the functions
    (self cost) that take most of them."""
    r = budget.callgrind_per_request(ctx, start, origin, file, requests=400,
                                     warm_requests=50, scheme="https",
                                     extra=["--ca", cert.ca, *args], top=top)
    r.pop("dump", None)
    return r


def _f(v, digits=1):
    return "—" if v is None else f"{v:,.{digits}f}"


def note(result):
    """The protocol comparison and the callgrind split, as markdown before the budget table."""
    lines = ["HTTP/3 against HTTP/2 and HTTP/1.1 on sluice alone: the same reverse route, the "
             "same ECDSA P-256 certificate, the same quota. 1 KB: HTTP/1.1 over "
             f"{result['c']} keep-alive connections, HTTP/2 and HTTP/3 over 10 connections × 10 "
             "concurrent streams. 7 MB: 10 connections, one request at a time each.", "",
             "| size | protocol | req/s | MB/s | CPU µs / req | CPU ÷ HTTP/2 | req/s ÷ HTTP/2 |",
             "|---|---|---|---|---|---|---|"]
    for r in result.get("protocols", []):
        lines.append(f"| {r['size']} | {r['protocol']} | {_f(r['rps'], 0)} | {_f(r['mb_s'])} | "
                     f"{_f(r['cpu_us_per_req'])} | {_f(r['cpu_vs_h2'], 2)}× | "
                     f"{_f(r['rps_vs_h2'], 2)}× |")
    cg = result.get("callgrind_cells") or {}
    if cg:
        lines += ["", "Instructions per 1 KB request (callgrind, one connection, 10 concurrent "
                  "streams for HTTP/2 and HTTP/3, after a warm-up): " + "; ".join(
                      f"{k}: {_f(v.get('instructions_per_request'), 0)}"
                      if v.get("status") == "ok" else f"{k}: not measured ({v.get('status')})"
                      for k, v in cg.items()) + "."]
        for k, v in cg.items():
            if v.get("top"):
                lines += ["", f"Where {k}'s instructions go (self cost, top "
                          f"{len(v['top'])}):", ""]
                lines += [f"- {share} % `{name}`" for share, name in v["top"]]
    return "\n".join(lines)
