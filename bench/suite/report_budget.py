"""Markdown for `bench/run --budget` results: equal-budget tables, open-loop tables, memory per
idle connection, and the issue's goals restated as met / not met."""

import statistics

DASH = "—"


def _f(v, digits=1):
    return DASH if v is None else f"{v:,.{digits}f}"


def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _load(load):
    if not load:
        return ""
    if "before" in load:
        b, a = load["before"], load["after"]
        return (f"Machine during the run: load average {b['loadavg']} before, {a['loadavg']} "
                f"after; whole machine {b['machine_busy_pct']} % / {a['machine_busy_pct']} % busy "
                "in the second before / after.")
    return f"Machine: load average {load['loadavg']}, {load['machine_busy_pct']} % busy."


BOUND_LABEL = {"client": " (client-bound here)", "neither": " (neither side saturated)"}


def _cpu_pairs(r):
    """This proxy's CPU per request over sluice's, round k against round k (> 1: sluice is
    cheaper, as the goal "1.2× the better peer" reads): the median, then the lowest and highest
    round ("1.09× (0.98–1.19)"), so a reader sees how firm it is. The results store the inverse
    (`sluice_cpu_ratios`, sluice over the proxy)."""
    ratios = [1 / x for x in r.get("sluice_cpu_ratios") or [] if x]
    if not ratios:
        return DASH
    spread = f" ({min(ratios):.2f}–{max(ratios):.2f})" if len(ratios) > 1 else ""
    return f"{statistics.median(ratios):.2f}×{spread}"


def _budget_table(rows, sluice, bytes_view=False, cpu_pairs=False):
    """`cpu_pairs`: a column with the paired CPU-per-request ratios' median and range."""
    head = ["cell", "proxy", "req/s (median)"] + (["MB/s", "CPU s / GB"] if bytes_view else []) + [
        "rounds", "CPU µs / req", "kernel %", "p99 ms", "quota used %", "client CPU %",
        "origin CPU %", "core 0 busy %", f"{sluice} ÷ this (paired)"] + (
        [f"CPU / req, this ÷ {sluice} (rounds min–max)"] if cpu_pairs else []) + ["errors"]
    out = []
    for r in rows:
        if r.get("status") != "ok":
            out.append([r["cell"], r["peer"], r.get("status", DASH)] + [DASH] * (len(head) - 3))
            continue
        ratio = r.get("sluice_ratio")
        bound = BOUND_LABEL.get(r.get("bound") or ("client" if r.get("client_bound") else ""),
                                "")
        out.append([r["cell"], r["peer"], _f(r["rps"], 0) + bound]
                   + ([_f(r.get("mb_per_s"), 0), _f(r.get("cpu_s_per_gb"), 2)]
                      if bytes_view else [])
                   + [" / ".join(_f(x, 0) for x in r["rounds_rps"]),
                      _f(r["cpu_us_per_req"]), _f(r.get("kernel_pct"), 0), _f(r["p99_ms"], 2),
                      _f(r.get("quota_use_pct"), 0), _f(r.get("client_cpu_pct"), 0),
                      _f(r.get("origin_cpu_pct"), 0), _f(r["client_core_busy_pct"], 0),
                      DASH if ratio is None else f"{ratio:.2f}×"]
                   + ([_cpu_pairs(r)] if cpu_pairs else []) + [r["errors"]])
    return table(head, out)


def _coalesced_table(block):
    head = ["cache", "origin bytes, every round (goal 1×)", "first byte − origin TTFB ms, "
            "median (per round) (goal ≤ 1)", "p99 first byte − origin TTFB ms, median (per round) "
            "(goal ≤ 5)", "first / p50 / p99 ms, median round", "origin TTFB ms (per round)",
            "errors"]
    out = []
    for r in block["rows"]:
        if r.get("status") != "ok":
            out.append([r["peer"], r.get("status", DASH)] + [DASH] * (len(head) - 2))
            continue
        rounds = [x for x in r.get("rounds", []) if "failed" not in x]
        ttfb = r.get("ttfb_from_release") or r.get("ttfb") or {}
        times = " / ".join(_f(x["origin_bytes"] / block["bytes"], 2) + "×" for x in rounds)
        out.append([
            r["peer"], times,
            f"{_f(r['first_over_origin_ms'], 2)} ("
            + " / ".join(_f(x["first_ms"] - x["origin_ttfb_ms"], 2) for x in rounds) + ")",
            f"{_f(r['p99_over_origin_ms'], 2)} ("
            + " / ".join(_f(x["p99_ms"] - x["origin_ttfb_ms"], 2) for x in rounds) + ")",
            f"{_f(ttfb.get('min_ms'), 2)} / {_f(ttfb.get('p50_ms'), 2)} / "
            f"{_f(ttfb.get('p99_ms'), 2)}",
            " / ".join(_f(x["origin_ttfb_ms"], 2) for x in rounds),
            r.get("errors_all_rounds", 0)])
    return table(head, out)


def _handshake_table(handshakes):
    """Per peer and cell: the TLS handshakes the load client made (warm-up included), how many
    resumed, and which protocol version they settled on."""
    out = []
    for peer, by_cell in handshakes.items():
        for cell, n in by_cell.items():
            total = n["full"] + n["resumed"]
            if not total:
                continue
            tls12 = n.get("tls12")
            version = ("not counted" if tls12 is None else "TLS 1.3" if tls12 == 0
                       else "TLS 1.2" if tls12 == total
                       else f"TLS 1.2 in {tls12:,}, TLS 1.3 in {total - tls12:,}")
            out.append([cell.split(", ", 1)[-1], peer, f"{total:,}", f"{n['resumed']:,}",
                        version])
    if not out:
        return ""
    return ("TLS handshakes the load client made in each cell (all rounds, warm-up included), "
            "how many resumed a session, and the protocol version the server settled on:\n\n"
            + table(["cell", "proxy", "handshakes", "resumed", "version"], out))


def _open_table(rows):
    head = ["proxy", "offered req/s", "achieved req/s", "p50 ms", "p99 ms", "p99.9 ms",
            "max ms", "late sends", "errors", "CPU µs / req", "client CPU %", "core 0 busy %"]
    out = []
    for r in rows:
        rep = r.get("report")
        if r.get("status") != "ok" or not rep:
            out.append([r["peer"], r.get("rate", DASH), r.get("status")] + [DASH] * 9)
            continue
        lat = rep["latency"]
        out.append([r["peer"], _f(rep["offered_rps"], 0), _f(rep["achieved_rps"], 0),
                    _f(lat["p50_ms"], 3), _f(lat["p99_ms"], 3), _f(lat["p999_ms"], 3),
                    _f(lat["max_ms"], 2), rep["late_sends"], rep["errors"],
                    _f(rep.get("cpu_us_per_request")),
                    _f(rep.get("window", {}).get("client_cpu_pct"), 0),
                    _f(rep.get("window", {}).get("client_core_busy_pct"), 0)])
    return table(head, out)


def _idle_table(rows):
    head = ["proxy", "connections", "open at reading", "failed", "USS growth MiB",
            "KiB per idle connection"]
    out = []
    for r in rows:
        rep = r.get("report") or {}
        if r.get("status") != "ok":
            out.append([r["peer"], r.get("status")] + [DASH] * 4)
            continue
        for lv in rep["levels"]:
            out.append([r["peer"], f"{lv['connections']:,}", f"{lv['open']:,}", lv["failed"],
                        _f(lv["growth_kb"] / 1024), _f(lv["kb_per_conn"], 2)])
        # The slope between the two top levels leaves out fixed costs (pools the ramp fills).
        lv = rep["levels"]
        if len(lv) >= 2 and lv[-1]["open"] > lv[-2]["open"]:
            a, z = lv[-2], lv[-1]
            out.append([r["peer"], f"marginal, {a['open']:,} → {z['open']:,}", DASH, DASH,
                        _f((z["growth_kb"] - a["growth_kb"]) / 1024),
                        _f((z["growth_kb"] - a["growth_kb"]) / (z["open"] - a["open"]), 2)])
        if rep.get("stopped_early"):
            out.append([r["peer"], rep["stopped_early"]] + [DASH] * 4)
    return table(head, out)


def _bound_text(result):
    if result.get("helpers_metered") is False:
        return ("No CPU cgroup was writable for the client and the origin: a cell is labelled "
                "client-bound when core 0 was ≥ 90 % busy while the proxy used < 90 % of its "
                "quota.")
    return ("Which side set a cell's rate is judged from the cgroups' own accounting, not from "
            "how busy core 0 was (other builds can keep it at 100 % whatever the suite does): "
            "the proxy is the bottleneck when it used ≥ 90 % of its quota; otherwise the cell is "
            "*client-bound here* when the client and the origin together used ≥ 90 % of a core "
            "(*client CPU %* + *origin CPU %*), and *neither side saturated* when not. A cell "
            "that is not proxy-bound for every proxy is judged by CPU per request (what the "
            "budget-capped rate would be if the client kept up), not by req/s.")


def _idle_limit(idle):
    """Why the top level is below the one wanted, and how the load client was spread."""
    wanted = max(idle.get("wanted_levels") or [0])
    top = max(idle.get("levels") or [0])
    procs = idle.get("client_procs") or 1
    spread = (f"The load client ran as {procs} processes, each holding under "
              f"{-(-top // procs):,} connections. " if procs > 1 else "")
    if top >= wanted:
        return spread
    return (f"The top level is {top:,}, not {wanted:,}: this machine's hard open-file limit is "
            f"{idle.get('nofile', 0):,} per process (`ulimit -Hn`), which a process without "
            "CAP_SYS_RESOURCE (a container's default) cannot raise, and each proxy holds one "
            "descriptor per idle client beside its upstream and listening sockets. "
            "50,000 needs the limit raised for the proxy (`LimitNOFILE=` in a unit, or a "
            "privileged container). " + spread)


def _idle_run(idle):
    """The idle run's own date and commit when it was re-run apart from the rest."""
    run = idle.get("run")
    if not run:
        return ""
    return f"Run on its own {run['date']} at commit {run['commit']} ({run['branch']}). "


def run_line(result):
    """**Run:** which sluice build, quick or full, rounds × seconds, when, and the machine's load
    before and after the section."""
    p = result.get("params") or {}
    shape = (f"{'quick' if result.get('quick') else 'full'} mode, {p.get('rounds', '?')} round(s) "
             f"× {p.get('secs', '?')} s per cell")
    if p.get("open_secs") and result.get("open_rates"):
        shape += f", open loop {p['open_secs']} s per rate"
    run = result.get("run")
    meta = result.get("meta") or {}
    if not run:
        return (f"**Run:** {shape}; written {meta.get('date', '?')} from commit "
                f"{meta.get('commit', '?')} (the build was not recorded).")
    version = "; ".join(run.get("sluice_version") or []) or "no `--version` output"
    took = result.get("seconds")
    took = f", {took / 60:.0f} min" if took else ""
    before, after = run.get("load_before") or {}, run.get("load_after") or {}
    build = f"{run['sluice_build']}; " if run.get("sluice_build") else ""
    return (f"**Run:** sluice `{run['sluice_bin']}` ({build}{version}; profile `{run['profile']}`), load "
            f"client `{run['loadgen_bin']}`; {shape}; {run['started']} to "
            f"{run.get('finished', '?')}{took}; load average {before.get('loadavg', '?')} before, "
            f"{after.get('loadavg', '?')} after (whole machine {before.get('machine_busy_pct', '?')} "
            f"% / {after.get('machine_busy_pct', '?')} % busy in the second before / after).")


def _top_list(title, top, n=8):
    if not top:
        return []
    if all(_unnamed(name) for _, name in top[:n]):
        # A stripped binary (the shipped `dist` build): callgrind has only addresses.
        return ["", title + " not named, since the binary is stripped and callgrind sees only "
                "addresses (an unstripped build of the same profile names them)."]
    return ["", title, ""] + [f"- {share} % `{name}`" for share, name in top[:n]]


def _unnamed(name):
    """Whether callgrind gave a function only as an address (`0x…`): a stripped binary."""
    return name.startswith("0x")


# The runs whose budget tables show the paired CPU-per-request ratios with their range.
CPU_PAIRS = ("TLS",)
_CPU_PAIRS_TEXT = ("; *CPU / req, this ÷ sluice (rounds min–max)* is the proxy's CPU per "
                   "request over sluice's, round k against round k (above 1: sluice is the "
                   "cheaper): the median, then the lowest and the highest round in brackets")


def _order_text(result):
    """How the rounds were taken: each cell's proxies back to back (`budget.budget_cells` since
    the paired order), or, in results written before it, each proxy through all the cells."""
    loads = [b.get("load") or {} for b in result.get("budget", {}).values()]
    if not loads or any(x.get("order") != "paired" for x in loads):
        return ", the proxies in a rotated order each round"
    waiting = ("frozen (cgroup freezer)" if all(x.get("waiting") == "frozen" for x in loads)
               else "idle")
    return (" per cell; each round starts every proxy, then takes the cells one by one and "
            "measures a cell's proxies back to back, the order rotated by round and by cell, "
            f"the proxies not being measured {waiting} meanwhile")


def render(result):
    sluice = result.get("sluice", "sluice")
    md = [f"### {result['id']} under equal CPU budgets", "", run_line(result), "",
          f"Each proxy, with all its threads and children, runs alone on core 1 in a CPU cgroup "
          f"capped at {result['quota_pct']} % of a core (v1 `cpu.cfs_quota_us`; `cpu.max` under "
          f"cgroup v2). The origin and the load client share core 0, each in a cgroup of its own "
          f"with no quota and the largest CPU weight (v1 `cpu.shares` 262144), as is the proxy's, "
          f"so other work on the machine (builds) yields to all three. c = {result['c']} "
          f"keep-alive connections, closed loop, {result['params']['rounds']} round(s) of "
          f"{result['params']['secs']} s{_order_text(result)}; medians; *{sluice} ÷ this "
          "(paired)* is the median of the per-round paired req/s ratios (sluice's round k over "
          "the proxy's round k)"
          + (_CPU_PAIRS_TEXT if result["id"] in CPU_PAIRS else "")
          + ". CPU µs per request is the proxy "
          "cgroup's own `cpuacct.usage` over the timed window divided by the requests answered; "
          "*kernel %* is the system-time share of that CPU (`cpuacct.usage_sys` over "
          "`usage_sys` + `usage_user`, tick-sampled), since a small request's cost is mostly "
          "the kernel's. "
          + _bound_text(result)
          + " Instructions per request: "
          + ("`perf stat`." if result.get("instructions") == "perf" else
             "this machine's `perf stat -e instructions` says `<not supported>` (no PMU in "
             "the VM), so they come from callgrind on sluice's path where measured (see "
             "docs/decisions/)."), ""]
    if result.get("note"):
        md += [result["note"], ""]
    for mode, block in result.get("budget", {}).items():
        cpu_pairs = result["id"] in CPU_PAIRS
        title = ("Every proxy as shipped (sluice's busy polling is off by default; the others "
                 "have none)" if mode == "as shipped" else f"Busy polling {mode}")
        md += [f"**{title}** (closed loop). {_load(block.get('load'))}", "",
               _budget_table(block["rows"], sluice, result.get("bytes_view"), cpu_pairs), ""]
        if block.get("handshakes"):
            md += [_handshake_table(block["handshakes"]), ""]
    cg = result.get("callgrind")
    if cg:
        if cg.get("status") == "ok":
            md += [f"**Instructions per request** (callgrind, sluice's user-space path, 1 KB, "
                   f"c = 1, {cg['requests']:,} requests after a warm-up): "
                   f"{_f(cg['instructions_per_request'], 0)}."]
            md += _top_list("Where they go (self cost, share of all instructions):",
                            cg.get("top"))
            md += [""]
        else:
            md += [f"**Instructions per request**: not measured ({cg.get('status')}).", ""]
    per_cell = result.get("callgrind_cells")
    if per_cell:
        md += ["**Instructions per request** (callgrind, sluice's user-space path, ECDSA, c = 1 "
               "connection, after a warm-up): " + "; ".join(
                   f"{cell}: {_f(r.get('instructions_per_request'), 0)}"
                   if r.get("status") == "ok" else f"{cell}: not measured ({r.get('status')})"
                   for cell, r in per_cell.items()) + "."]
        others = result.get("callgrind_peers") or {}
        if others:
            names = ["sluice", *others]
            md += ["", "The same count for each proxy (callgrind, user space only, ECDSA, c = 1; "
                   "under valgrind every proxy's crypto takes its portable code paths, so this "
                   "compares the proxies' own work, not the crypto that runs natively; the "
                   "kernel's share, which callgrind does not see, is in the *kernel %* column):",
                   "", "| cell | " + " | ".join(names) + " | sluice ÷ the fewer of the peers |",
                   "|---|" + "---|" * (len(names) + 1)]
            for cell, r in per_cell.items():
                counts = [r.get("instructions_per_request") if r.get("status") == "ok" else None]
                if not any(cell in o for o in others.values()):
                    continue
                counts += [(o.get(cell) or {}).get("instructions_per_request")
                           if (o.get(cell) or {}).get("status") == "ok" else None
                           for o in others.values()]
                peers_ = [c for c in counts[1:] if c]
                ratio = (f"{counts[0] / min(peers_):.2f}×" if counts[0] and peers_ else "—")
                md += [f"| {cell} | " + " | ".join(_f(c, 0) if c else "not measured"
                                                   for c in counts) + f" | {ratio} |"]
        for cell, r in per_cell.items():
            if result["id"] == "TLS" and ("resumed" in cell or "HTTP/2" in cell):
                md += _top_list(f"Where the *{cell}* cell's instructions go (self cost):",
                                r.get("top"))
        md += [""]
    rates = result.get("open_rates")
    if rates:
        md += [f"**Open loop** at {', '.join(map(str, rates))} req/s (25/50/75 % of the slowest "
               "proxy's budget-capped peak on the first cell, busy polling off), same quota, "
               "latency from each request's scheduled send time (HdrHistogram; no coordinated "
               "omission).", ""]
        for mode, block in result.get("open_loop", {}).items():
            md += [f"Busy polling {mode}. {_load(block.get('load'))}", "",
                   _open_table(block["rows"]), ""]
    co = result.get("coalesced")
    if co:
        md += [f"**(a) restated: the coalesced first byte.** {co['c']} clients released at once "
               f"(connections opened beforehand) on a cold {co['bytes'] // (1024 * 1024)} MiB "
               f"object, {co['rounds']} round(s), the caches in a rotated order, each round on a "
               "fresh object. The load client runs alone on core 0 in its own high-weight "
               "cgroup; the origin, on core 1, sends every body at "
               f"{co['pace_mbps']} MB/s after its first chunk, so a miss fetched in one request "
               f"takes about {co['bytes'] / co['pace_mbps'] / 1e6:.1f} s to fill (less for a "
               "cache that fetches several slices at once) and every client arrives while it is "
               "being written; each cache runs on core 1 in a high-weight cgroup "
               "without a quota. Why this setup: in S4 (a) above the 100 clients and the origin "
               "share core 0, so the p99 first byte measures how fast core 0 serves 100 "
               "receivers, not whether a cache streams the writer's bytes to its waiters; and a "
               "first byte is a latency, which a 100 ms quota period would stall for reasons "
               "unrelated to coalescing. First bytes are counted from the release and held to "
               "the origin's own TTFB straight from one client (p50 of 5), measured before each "
               f"round. {_load(co.get('load'))}", "", _coalesced_table(co), ""]
    idle = result.get("idle")
    if idle:
        md += ["**Memory per idle keep-alive connection**: clients spread over 127.0.0.2–9, "
               "each after one 1 KB request through the plain reverse route, then silent; USS "
               "growth of the proxy's process tree over its baseline (after one request), read "
               f"once it settled. {_idle_limit(idle)}{_idle_run(idle)}{_load(idle.get('load'))}",
               "",
               "HTTP/1.1:", "", _idle_table(idle.get("http1", [])), "",
               "HTTP/2 by prior knowledge (h2c):", "", _idle_table(idle.get("h2c", [])), ""]
    return "\n".join(md).rstrip()


def _verdict(value, goal, higher_better=True, unit="×"):
    if value is None:
        return "not shown (no number)"
    ok = value >= goal if higher_better else value <= goal
    if ok:
        return f"met ({value:.2f}{unit})"
    if unit.strip() == "ms over the origin":
        return f"not met ({value:.2f}{unit}; goal ≤ {goal:g} ms)"
    if higher_better:
        return f"not met ({value:.2f}{unit}; needs {(goal / value - 1) * 100:.0f} % more)"
    return f"not met ({value:.2f}{unit}; {(value / goal - 1) * 100:.0f} % over)"


# The goals under equal budgets: per scenario, (rival names to beat together, factor),
# and the open-loop rivals whose p99 sluice's must not exceed.
GOALS = {
    "S1": {"budget": [(("MediaFlow Proxy Light",), 1.5), (("nginx proxy_pass",), 1.0)],
           "open": ()},
    "S2": {"budget": [(("nginx proxy_pass", "HAProxy http"), 1.2), (("Varnish pass",), 3.0)],
           "open": ("nginx proxy_pass", "HAProxy http")},
    "S3": {"budget": [(("HAProxy tcp", "Go io.Copy"), 1.2)],
           "open": ("HAProxy tcp", "Go io.Copy"), "per_gb": ("256 MB stream",)},
    "S4": {"budget": [(("nginx proxy_cache + slice", "Varnish malloc"), 1.2)],
           "open": ("nginx proxy_cache + slice", "Varnish malloc")},
    "TLS": {"budget": [(("nginx proxy_pass", "HAProxy http"), 1.2)], "open": ()},
}


def _rounds_text(ratios, goal):
    """The paired per-round ratios' range, and whether they straddle the goal line."""
    ratios = [x for x in ratios or [] if x]
    if len(ratios) < 2:
        return ""
    lo, hi = min(ratios), max(ratios)
    straddle = ", straddling the goal" if lo < goal <= hi else ""
    return f"; rounds {lo:.2f}–{hi:.2f}×{straddle}"


def _with_rounds(verdict, rounds):
    """`verdict` ("met (1.23×)", "not met (…)") with the rounds' range inside its brackets."""
    if rounds and verdict.endswith(")"):
        return verdict[:-1] + rounds + ")"
    return verdict


def _budget_verdict(by_peer, sluice, rivals, factor, by_cpu=False):
    """sluice against the best of `rivals` in one cell: by req/s when every proxy was the
    bottleneck of its own run, else by CPU per request (requests per CPU-second). The paired
    per-round ratios against that rival follow, with a note when they straddle the goal."""
    mine = by_peer.get(sluice, {})
    if mine.get("status") != "ok":
        return f"not shown (sluice: {mine.get('status', 'not run')})"
    there = [by_peer[n] for n in rivals if by_peer.get(n, {}).get("status") == "ok"]
    if not there:
        why = "; ".join(f"{n}: {by_peer.get(n, {}).get('status', 'not run')}" for n in rivals)
        return f"not shown ({why})"
    rows = [mine, *there]
    if not by_cpu and all(r.get("bound", "proxy") == "proxy" for r in rows):
        best = max(there, key=lambda r: r.get("rps") or 0)
        ratio = mine["rps"] / best["rps"] if mine.get("rps") and best.get("rps") else None
        return _with_rounds(_verdict(ratio, factor),
                            _rounds_text(best.get("sluice_ratios"), factor))
    best = min(there, key=lambda r: r.get("cpu_us_per_req") or float("inf"))
    cpu, best_cpu = mine.get("cpu_us_per_req"), best.get("cpu_us_per_req")
    ratio = best_cpu / cpu if cpu and best_cpu else None
    sides = ", ".join(sorted({r["peer"] for r in rows if r.get("bound") != "proxy"}))
    why = f" (not proxy-bound here: {sides})" if sides else ""
    paired = [1 / x for x in best.get("sluice_cpu_ratios") or [] if x]
    verdict = _with_rounds(_verdict(ratio, factor), _rounds_text(paired, factor))
    return f"{verdict} by CPU per {'GB' if by_cpu else 'request'}{why}"


def goal_rows(result):
    """The goals table restated: one row per (goal, cell) with met / not met and by how much."""
    sid = result["id"]
    spec = GOALS.get(sid)
    rows = []
    if not spec:
        return rows
    sluice = result.get("sluice", "sluice")
    for mode, block in result.get("budget", {}).items():
        cells = {}
        for r in block["rows"]:
            cells.setdefault(r["cell"], {})[r["peer"]] = r
        for cell, by_peer in cells.items():
            measure = f"budget, {mode if mode == 'as shipped' else 'busy poll ' + mode}"
            if cell in spec.get("per_gb", ()):
                # A stream's goal: CPU per GB no more than each rival's.
                rivals = spec["budget"][0][0]
                rows.append([sid, measure, cell, f"CPU per GB ≤ each of {' / '.join(rivals)}",
                             _budget_verdict(by_peer, sluice, rivals, 1.0, by_cpu=True)])
                continue
            for rivals, factor in spec["budget"]:
                rows.append([sid, measure, cell, f"≥ {factor}× best of {' / '.join(rivals)}",
                             _budget_verdict(by_peer, sluice, rivals, factor)])
    for mode, block in result.get("open_loop", {}).items():
        by_rate = {}
        for r in block["rows"]:
            if r.get("status") == "ok":
                by_rate.setdefault(r["rate"], {})[r["peer"]] = r["report"]["latency"]["p99_ms"]
        for rate, p99 in sorted(by_rate.items()):
            mine = p99.get(sluice)
            rivals = [p99[n] for n in spec["open"] if n in p99]
            worst_ok = min(rivals) if rivals else None
            ratio = mine / worst_ok if mine is not None and worst_ok else None
            rows.append([sid, f"open loop, {mode if mode == 'as shipped' else 'busy poll ' + mode}",
                         f"{rate} req/s", f"p99 ≤ each of {' / '.join(spec['open'])}",
                         _verdict(ratio, 1.0, higher_better=False, unit="× the lower p99")])
    for r in (result.get("coalesced") or {}).get("rows", []):
        if r.get("peer") != sluice:
            continue
        if r.get("status") != "ok":
            rows.append([sid, "(a) restated", "cold burst", "coalesced first byte",
                         f"not shown ({r.get('status')})"])
            continue
        rows.append([sid, "(a) restated", "cold burst", "origin bytes 1× in every round",
                     "met" if r.get("origin_once_every_round") else "not met"])
        rows.append([sid, "(a) restated", "cold burst", "first byte ≤ origin TTFB + 1 ms",
                     _verdict(r["first_over_origin_ms"], 1.0, higher_better=False,
                              unit=" ms over the origin")])
        rows.append([sid, "(a) restated", "cold burst", "p99 first byte ≤ origin TTFB + 5 ms",
                     _verdict(r["p99_over_origin_ms"], 5.0, higher_better=False,
                              unit=" ms over the origin")])
    idle = result.get("idle") or {}
    for proto, goal in (("http1", 1.0), ("h2c", 4.0)):
        for r in idle.get(proto, []):
            if r.get("peer") != sluice or r.get("status") != "ok":
                continue
            for lv in r["report"]["levels"]:
                rows.append([sid, f"idle {proto}", f"{lv['connections']:,} connections",
                             f"≤ {goal:g} KiB each",
                             _verdict(lv["kb_per_conn"], goal, higher_better=False,
                                      unit=" KiB")])
    return rows


def render_goals(results):
    rows = []
    for r in results:
        rows += goal_rows(r)
    if not rows:
        return ""
    return "\n".join(["## Goals under equal budgets (met / not met)", "",
                      table(["scenario", "measure", "cell", "goal", "verdict"], rows)])


JOBS = {"S1": "Media proxy, `/proxy/stream` 7 MiB", "S2": "HTTP reverse proxy",
        "S3": "TCP (L4) proxy", "S4": "Slice cache, hits", "TLS": "TLS termination (1 KB)"}
# Rows that are a ceiling to read against, not a proxy an operator would run instead.
CEILINGS = ("nginx direct (ceiling)",)


# Within this much of 1.0, CPU per request is called level, not cheaper or dearer.
LEVEL_BAND = 0.05


def cell_verdict(ratio, paired):
    """"cheaper", "dearer" or "level" for sluice's CPU per request over a rival's: level when
    the ratio is within ±5 % of 1.0 or the paired per-round ratios fall on both sides of 1.0."""
    paired = [x for x in paired or [] if x]
    if abs(ratio - 1) <= LEVEL_BAND or (paired and min(paired) < 1 < max(paired)):
        return "level"
    return "cheaper" if ratio < 1 else "dearer"


def _cheapest_cells(result):
    """Per cell of the busy-polling-off (as shipped) tables: sluice's CPU per request over the
    cheapest other proxy's, that proxy's name, and the paired per-round ratios against it."""
    sluice = result.get("sluice", "sluice")
    out = []
    for mode, block in result.get("budget", {}).items():
        if not (mode == "as shipped" or mode.startswith("off")):
            continue
        cells = {}
        for r in block["rows"]:
            if r.get("status") == "ok" and r.get("cpu_us_per_req"):
                cells.setdefault(r["cell"], {})[r["peer"]] = r
        for cell, by_peer in cells.items():
            mine = by_peer.get(sluice)
            rivals = {n: r for n, r in by_peer.items() if n != sluice and n not in CEILINGS}
            if mine is None or not rivals:
                continue
            best = min(rivals, key=lambda n: rivals[n]["cpu_us_per_req"])
            ratio = mine["cpu_us_per_req"] / rivals[best]["cpu_us_per_req"]
            out.append((cell, ratio, best, rivals[best].get("sluice_cpu_ratios") or []))
    return out


def _missing_sentence(result):
    """Rivals that have no number in the budget tables (not installable, failed to start)."""
    missing = sorted({row["peer"] for block in result.get("budget", {}).values()
                      for row in block["rows"] if row.get("status") != "ok"})
    return f" Not measured (see its table): {', '.join(missing)}." if missing else ""


def _idle_sentence(result):
    """Memory per idle connection at the top level, each proxy, where the run measured it."""
    idle = result.get("idle") or {}
    parts = []
    for proto, name in (("http1", "HTTP/1.1"), ("h2c", "h2c")):
        per = []
        for r in idle.get(proto, []):
            levels = (r.get("report") or {}).get("levels") or []
            if r.get("status") == "ok" and levels:
                per.append(f"{r['peer']} {levels[-1]['kb_per_conn']:.2f}")
        if per:
            top = max(idle.get("levels") or [0])
            parts.append(f"{name} at {top:,}: " + ", ".join(per))
    if not parts:
        return ""
    return " Memory per idle connection (KiB): " + "; ".join(parts) + "."


def _build_tag(result):
    """", full run, <which sluice>" for a summary line: the build's own description where the run
    was given one (BENCH_SLUICE_BUILD), else the commit its `--version` names."""
    mode = ", quick run" if result.get("quick") else ", full run"
    run = result.get("run") or {}
    if run.get("sluice_build"):
        return f"{mode}, {run['sluice_build'].split(',')[0].split(';')[0]}"
    version = " ".join(run.get("sluice_version") or [])
    if "(commit " in version:
        return f"{mode}, sluice at {version.split('(commit ', 1)[1].split(')')[0]}"
    return mode


def render_summary(results):
    """For each job: is sluice the cheapest proxy to run (CPU per request under the same budget,
    busy polling off as shipped), yes / no, and by how much, cell by cell."""
    lines = []
    for sid, job in JOBS.items():
        r = results.get(sid + "-budget")
        if not r:
            lines.append(f"- **{job}** ({sid}): not measured under equal budgets yet.")
            continue
        cells = _cheapest_cells(r)
        if not cells:
            lines.append(f"- **{job}** ({sid}): no cell with sluice and a rival measured.")
            continue
        verdicts = [cell_verdict(ratio, paired) for _, ratio, _, paired in cells]
        n = len(cells)
        counts = {v: verdicts.count(v) for v in ("cheaper", "level", "dearer")}
        if counts["cheaper"] == n:
            verdict = "**yes**"
        elif counts["dearer"] == n:
            verdict = "**no**"
        elif counts["level"] == n:
            verdict = "**level**"
        else:
            verdict = "**mixed** (" + ", ".join(
                f"{word} in {counts[key]} of {n} cells"
                for key, word in (("cheaper", "cheapest"), ("level", "level"),
                                  ("dearer", "dearer"))
                if counts[key]) + ")"
        parts = []
        for (cell, ratio, best, paired), v in zip(cells, verdicts):
            rounds = (f", rounds {min(paired):.2f}–{max(paired):.2f}×" if len(paired) > 1
                      else "")
            if v == "level":
                parts.append(f"{cell}: level with {best} ({ratio:.2f}× its CPU per request"
                             f"{rounds})")
            elif v == "cheaper":
                parts.append(f"{cell}: {(1 - ratio) * 100:.0f} % less CPU per request than "
                             f"{best} ({ratio:.2f}×{rounds})")
            else:
                parts.append(f"{cell}: {(ratio - 1) * 100:.0f} % more than {best} "
                             f"({ratio:.2f}×{rounds})")
        lines.append(f"- **{job}** ({sid}{_build_tag(r)}): {verdict}. " + "; ".join(parts) + "."
                     + _missing_sentence(r) + _idle_sentence(r))
    return "\n".join(
        ["## Equal budgets: is sluice the cheapest to run?", "",
         "CPU per request (or per GB) of each proxy's cgroup, each alone on core 1 under the same "
         "quota, busy polling off (as every proxy ships), compared with the cheapest other "
         "proxy in the same cell (nginx serving the file itself, a ceiling, is left out). "
         "*Level* means within ±5 % of it, or cheaper in some rounds and dearer in others "
         "(the ratios of round k against round k); the ratio is sluice's CPU over the "
         "rival's. The tables per scenario are in its *under equal CPU budgets* section; the "
         "goals are below.", ""] + lines)
