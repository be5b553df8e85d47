"""Markdown for `bench/run --budget` results: equal-budget tables, open-loop tables, memory per
idle connection, and the issue's goals restated as met / not met."""

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


def _budget_table(rows, sluice):
    head = ["cell", "proxy", "req/s (median)", "rounds", "CPU µs / req", "p99 ms",
            "quota used %", "client core busy %", f"{sluice} ÷ this (paired)", "errors"]
    out = []
    for r in rows:
        if r.get("status") != "ok":
            out.append([r["cell"], r["peer"], r.get("status", DASH)] + [DASH] * 7)
            continue
        ratio = r.get("sluice_ratio")
        bound = " (client-bound here)" if r.get("client_bound") else ""
        out.append([r["cell"], r["peer"], _f(r["rps"], 0) + bound,
                    " / ".join(_f(x, 0) for x in r["rounds_rps"]),
                    _f(r["cpu_us_per_req"]), _f(r["p99_ms"], 2),
                    _f(r.get("quota_use_pct"), 0), _f(r["client_core_busy_pct"]), DASH if ratio is None else f"{ratio:.2f}×",
                    r["errors"]])
    return table(head, out)


def _handshake_line(handshakes):
    """How many TLS handshakes each peer's run resumed, per cell that made new connections."""
    parts = []
    for peer, by_cell in handshakes.items():
        for cell, n in by_cell.items():
            if n["full"] + n["resumed"] > 1000:
                parts.append(f"{peer}, {cell.split(', ', 1)[-1]}: {n['resumed']:,} of "
                             f"{n['full'] + n['resumed']:,} resumed")
    return "TLS handshakes (warm-up included): " + "; ".join(parts) + "." if parts else ""


def _open_table(rows):
    head = ["proxy", "offered req/s", "achieved req/s", "p50 ms", "p99 ms", "p99.9 ms",
            "max ms", "late sends", "errors", "CPU µs / req", "client core busy %"]
    out = []
    for r in rows:
        rep = r.get("report")
        if r.get("status") != "ok" or not rep:
            out.append([r["peer"], r.get("rate", DASH), r.get("status")] + [DASH] * 8)
            continue
        lat = rep["latency"]
        out.append([r["peer"], _f(rep["offered_rps"], 0), _f(rep["achieved_rps"], 0),
                    _f(lat["p50_ms"], 3), _f(lat["p99_ms"], 3), _f(lat["p999_ms"], 3),
                    _f(lat["max_ms"], 2), rep["late_sends"], rep["errors"],
                    _f(rep.get("cpu_us_per_request")),
                    _f(rep.get("window", {}).get("client_core_busy_pct"))])
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


def _idle_run(idle):
    """The idle run's own date and commit when it was re-run apart from the rest."""
    run = idle.get("run")
    if not run:
        return ""
    return f"Run on its own {run['date']} at commit {run['commit']} ({run['branch']}). "


def render(result):
    sluice = result.get("sluice", "sluice")
    md = [f"### {result['id']} under equal CPU budgets", "",
          f"Each proxy, with all its threads and children, runs alone on core 1 in a CPU cgroup "
          f"capped at {result['quota_pct']} % of a core (v1 `cpu.cfs_quota_us`; `cpu.max` under "
          f"cgroup v2); the origin and the load client share core 0, whose busy share is "
          f"measured in every cell (≥ 90 % while the proxy used less than 90 % of its quota: the cell "
          f"is labelled client-bound and not judged). c = "
          f"{result['c']} keep-alive connections, closed loop, "
          f"{result['params']['rounds']} round(s) of {result['params']['secs']} s, the proxies "
          "in a rotated order each round; medians; the ratio is the median of per-round paired "
          "ratios. CPU µs per request is the cgroup's own `cpuacct.usage` over the timed window "
          "divided by the requests answered. Instructions per request: "
          + ("`perf stat`." if result.get("instructions") == "perf" else
             "this machine's `perf stat -e instructions` says `<not supported>` (no PMU in "
             "the VM), so they come from callgrind on sluice's path where measured (see "
             "docs/decisions/)."), ""]
    if result.get("note"):
        md += [result["note"], ""]
    for mode, block in result.get("budget", {}).items():
        md += [f"**Busy polling {mode}** (closed loop). {_load(block.get('load'))}", "",
               _budget_table(block["rows"], sluice), ""]
        if block.get("handshakes"):
            md += [_handshake_line(block["handshakes"]), ""]
    cg = result.get("callgrind")
    if cg:
        if cg.get("status") == "ok":
            md += [f"**Instructions per request** (callgrind, sluice's user-space path, 1 KB, "
                   f"c = 1, {cg['requests']:,} requests after a warm-up): "
                   f"{_f(cg['instructions_per_request'], 0)}.", ""]
        else:
            md += [f"**Instructions per request**: not measured ({cg.get('status')}).", ""]
    per_cell = result.get("callgrind_cells")
    if per_cell:
        md += ["**Instructions per request** (callgrind, sluice's user-space path, ECDSA, c = 1 "
               "connection, after a warm-up): " + "; ".join(
                   f"{cell}: {_f(r.get('instructions_per_request'), 0)}"
                   if r.get("status") == "ok" else f"{cell}: not measured ({r.get('status')})"
                   for cell, r in per_cell.items()) + ".", ""]
    rates = result.get("open_rates")
    if rates:
        md += [f"**Open loop** at {', '.join(map(str, rates))} req/s (25/50/75 % of the slowest "
               "proxy's budget-capped peak on the first cell, busy polling off), same quota, "
               "latency from each request's scheduled send time (HdrHistogram; no coordinated "
               "omission).", ""]
        for mode, block in result.get("open_loop", {}).items():
            md += [f"Busy polling {mode}. {_load(block.get('load'))}", "",
                   _open_table(block["rows"]), ""]
    idle = result.get("idle")
    if idle:
        md += ["**Memory per idle keep-alive connection**: clients spread over 127.0.0.2–9, "
               "each after one 1 KB request through the plain reverse route, then silent; USS "
               "growth of the proxy's process tree over its baseline (after one request), read "
               f"once it settled. {_idle_run(idle)}{_load(idle.get('load'))}", "",
               "HTTP/1.1:", "", _idle_table(idle.get("http1", [])), "",
               "HTTP/2 by prior knowledge (h2c):", "", _idle_table(idle.get("h2c", [])), ""]
    return "\n".join(md).rstrip()


def _verdict(value, goal, higher_better=True, unit="×"):
    if value is None:
        return "not shown (no number)"
    ok = value >= goal if higher_better else value <= goal
    if ok:
        return f"met ({value:.2f}{unit})"
    if higher_better:
        return f"not met ({value:.2f}{unit}; {(goal / value - 1) * 100:.0f} % short)"
    return f"not met ({value:.2f}{unit}; {(value / goal - 1) * 100:.0f} % over)"


# The goals under equal budgets: per scenario, (rival names to beat together, factor),
# and the open-loop rivals whose p99 sluice's must not exceed.
GOALS = {
    "S2": {"budget": [(("nginx proxy_pass", "HAProxy http"), 1.2), (("Varnish pass",), 3.0)],
           "open": ("nginx proxy_pass", "HAProxy http")},
    "S3": {"budget": [(("HAProxy tcp", "Go io.Copy"), 1.2)],
           "open": ("HAProxy tcp", "Go io.Copy")},
    "TLS": {"budget": [(("nginx proxy_pass", "HAProxy http"), 1.2)], "open": ()},
}


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
            mine = by_peer.get(sluice, {}).get("rps")
            bound = any(r.get("client_bound") for r in by_peer.values())
            for rivals, factor in spec["budget"]:
                best = max((by_peer.get(n, {}).get("rps") or 0 for n in rivals), default=0)
                ratio = mine / best if mine and best else None
                verdict = ("client-bound here (not counted)" if bound
                           else _verdict(ratio, factor))
                rows.append([sid, f"budget, busy poll {mode}", cell,
                             f"≥ {factor}× best of {' / '.join(rivals)}", verdict])
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
            rows.append([sid, f"open loop, busy poll {mode}", f"{rate} req/s",
                         f"p99 ≤ each of {' / '.join(spec['open'])}",
                         _verdict(ratio, 1.0, higher_better=False, unit="× the lower p99")])
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
