"""S4's tables: one per case (a)–(f), each row a peer with its goal and whether it was met."""

DASH = "–"
MiB = 1024 * 1024


def _f(v, digits=1):
    return DASH if v is None else f"{v:,.{digits}f}"


def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _met(ok):
    return DASH if ok is None else ("**yes**" if ok else "no")


def _errors(lvl):
    n = lvl.get("errors", 0)
    if not n:
        return "0"
    kinds = ", ".join(f"{k} {v}" for k, v in (lvl.get("error_kinds") or {}).items())
    return f"{n} ({kinds})"


def _case(row, key):
    """The case's result, or the reason it has none."""
    if row.get("status") != "ok":
        return None, row.get("status", "not run")
    c = (row.get("cases") or {}).get(key)
    if c is None:
        return None, "not run"
    if isinstance(c, dict) and "failed" in c:
        return None, c["failed"]
    return c, None


def _a(result):
    p = result["params"]
    rows, bases = [], []
    for row in result["rows"]:
        c, why = _case(row, "a")
        if c is None:
            rows.append([row["peer"]] + [DASH] * 8 + [why])
            continue
        rows.append(_a_rounds_row(row["peer"], c, p))
        bases = bases or [r.get("origin_ttfb_ms") for r in c["rounds"]]
    burst = p.get("origin_burst")
    if burst and "failed" not in burst:
        t = burst["ttfb_from_release"]
        rows.insert(0, ["origin straight (no cache, one round)",
                        f"{p['a_c']}× (one per client)", DASH, DASH, DASH, DASH, DASH,
                        f"{_f(t['min_ms'], 2)} / {_f(t['p50_ms'], 2)} / {_f(t['p99_ms'], 2)}",
                        DASH, str(burst.get("errors", 0))])
    head = ["peer", "origin bytes (goal 1× in every round)", "met",
            "first TTFB − origin TTFB ms, median (per round) (goal ≤ 1)", "met",
            "p99 TTFB − origin TTFB ms, median (per round) (goal ≤ 5)", "met",
            "TTFB first / p50 / p99 ms, median round", "peak RSS MB", "errors (all rounds)"]
    intro = (f"**(a) Cold {p['a_bytes'] // MiB} MiB object, {p['a_c']} clients released at "
             f"once** (connections open beforehand). TTFB is counted from the release, the same "
             f"instant for every client, so the first TTFB is when the first byte reached anyone "
             f"and the p99 when 99 % of the clients had theirs. Measured in {p['rounds']} "
             f"rounds, the peers in a rotated order each round, each round on a fresh cold object "
             f"and held to the origin's own TTFB for this object straight from one client (p50 "
             f"of 5 requests), measured just before that round: "
             f"{' / '.join(_f(b, 2) for b in bases) or DASH} ms. The goals are judged on the "
             f"medians of the per-round margins. *Origin straight* is the same release sent to "
             f"the origin itself (no cache): what the clients get when the origin serves all "
             f"{p['a_c']} requests, on the core it shares with the client. Origin bytes are "
             f"counted by the origin (body bytes it sent) until it has been quiet for 1 s.")
    return intro + "\n\n" + table(head, rows)


def _a_rounds_row(peer, c, p):
    """One peer's (a) over its rounds (`s4._median_a`)."""
    rounds = c["rounds"]
    done = [r for r in rounds if "failed" not in r]

    def per_round(key):
        return " / ".join(DASH if "failed" in r else _f(r[key] - r["origin_ttfb_ms"], 2)
                          for r in rounds)

    first, p99 = c["first_over_origin_ms"], c["p99_over_origin_ms"]
    ob = max(r["origin_bytes"] for r in done) if done else 0
    req = "/".join(str(r["origin_requests"]) for r in done)
    t = c.get("ttfb_from_release") or c["ttfb"]
    errors = c.get("errors_all_rounds", 0) + sum(1 for r in rounds if "failed" in r)
    return [peer, f"{ob / p['a_bytes']:.2f}× at most ({req} req)",
            _met(c["origin_once_every_round"]), f"{_f(first, 2)} ({per_round('first_ms')})",
            _met(first <= 1), f"{_f(p99, 2)} ({per_round('p99_ms')})", _met(p99 <= 5),
            f"{_f(t['min_ms'], 2)} / {_f(t['p50_ms'], 2)} / {_f(t['p99_ms'], 2)}",
            _f(c.get("peak_rss_mb")), str(errors)]


def _b(result):
    p = result["params"]
    found = {}
    for row in result["rows"]:
        c, _ = _case(row, "b")
        for r in c or []:
            rep = r["report"]
            if "failed" not in rep:
                found[(row["peer"], r["bytes"])] = rep
    rows = []
    for row in result["rows"]:
        c, why = _case(row, "b")
        if c is None:
            rows.append([DASH, row["peer"]] + [DASH] * 8 + [why])
            continue
        for r in c:
            rep = r["report"]
            if "failed" in rep:
                rows.append([f"{r['bytes']:,} B", row["peer"]] + [DASH] * 8 + [rep["failed"]])
                continue
            v = found.get(("Varnish malloc", r["bytes"]))
            ok = None
            if v is not None and not row["peer"].startswith("Varnish"):
                ok = rep["rps"] >= v["rps"] and rep["throughput_mb_s"] >= v["throughput_mb_s"]
            u = rep.get("usage") or {}
            per_round = " / ".join(_f(x, 0) for x in r.get("rounds_rps") or [rep["rps"]])
            rows.append([f"{r['bytes']:,} B", row["peer"], _f(rep["rps"], 0), per_round,
                         _f(rep["throughput_mb_s"], 0),
                         _f(rep["rps"] / v["rps"], 2) if v and v["rps"] else DASH, _met(ok),
                         _f(rep["latency"]["p50_ms"], 3), _f(rep["latency"]["p99_ms"], 3),
                         _f(u.get("cpu_pct"), 0), f"{rep['errors']} / {rep['warmup_errors']}"])
    head = ["object", "peer", "req/s", "req/s per round", "MB/s", "× Varnish", "met (≥ Varnish)", "p50 ms",
            "p99 ms", "CPU %", "errors (timed / warm-up)"]
    intro = (f"**(b) Hits at c={p['b_c']}**: a closed loop for {p['b_secs']} s after "
             f"{p['b_warmup_secs']} s of warm-up (whose first request stores the object)")
    if p.get("rounds"):
        intro += (f", in {p['rounds']} rounds with the peers in a rotated order each round; "
                  f"the row is the round with the median req/s")
    intro += "."
    return intro + "\n\n" + table(head, rows)


def _c(result):
    p = result["params"]
    rows = []
    for row in result["rows"]:
        c, why = _case(row, "c")
        if c is None:
            rows.append([row["peer"]] + [DASH] * 5 + [why])
            continue
        ob = c["origin"]["body_bytes"]
        rows.append([row["peer"], f"{ob / MiB:,.2f} MiB ({c['origin']['requests']} req)",
                     _met(ob <= 2 * p["slice_bytes"]), _f(c["ttfb"]["p50_ms"], 1),
                     _f(c["latency"]["p50_ms"], 1), _f(c.get("peak_rss_mb")), _errors(c)])
    head = ["peer", "origin bytes (goal ≤ 2 slices = 2 MiB)", "met", "TTFB ms", "total ms",
            "peak RSS MB", "errors"]
    intro = (f"**(c) Cold `Range: bytes={p['c_start']}-{p['c_start'] + p['c_len'] - 1}`** "
             f"({p['c_len'] // MiB} MiB at {p['c_start'] // MiB // 1024} GiB) into a "
             f"{p['c_object'] // MiB // 1024} GiB object, one client; the 206 body is checked "
             f"byte for byte (SHA-256). Origin bytes counted until the origin is quiet for 1 s "
             f"(at most {p['settle_secs']} s).")
    return intro + "\n\n" + table(head, rows)


def _d(result):
    p = result["params"]
    bound = p["memory_mib"] + 32
    rows = []
    for row in result["rows"]:
        c, why = _case(row, "d")
        if c is None:
            rows.append([row["peer"]] + [DASH] * 6 + [why])
            continue
        idle = c.get("idle") or {}
        rss = c.get("peak_rss_mb")
        # /proc counts RSS in MB of 10^6 bytes; the bound is MiB.
        ok = None if rss is None else rss * 1e6 <= bound * MiB
        rows.append([row["peer"], _f(idle.get("peak_rss_mb")), _f(rss), _met(ok),
                     _f(c.get("peak_uss_mb")), _f(c["throughput_mb_s"], 0),
                     f"{c['origin']['body_bytes'] / (p['d_c'] * p['d_bytes']):.2f}×", _errors(c)])
    head = ["peer", "idle RSS MB", f"peak RSS MB (goal ≤ {bound} MiB)", "met", "peak USS MB",
            "MB/s (all clients)", "origin bytes / object bytes", "errors"]
    intro = (f"**(d) {p['d_c']} clients, each streaming its own cold {p['d_bytes'] // MiB} MiB "
             f"object**, on a freshly started instance. Memory tier: {p['memory_mib']} MiB (sluice "
             f"`memory_bytes`, Varnish `-s malloc`; nginx keeps its cache on disk and in the "
             f"kernel's page cache, which RSS does not count). Peak RSS of the process tree, "
             f"sampled from /proc every 50 ms.")
    return intro + "\n\n" + table(head, rows)


def _e(result):
    p = result["params"]
    n = p["e_objects"]
    rows = []
    for row in result["rows"]:
        c, why = _case(row, "e")
        after = (c or {}).get("after_restart")
        fill = (c or {}).get("fill")
        if c is None or not after or "failed" in after or not fill or "failed" in fill:
            why = why or (after or fill or {}).get("failed", "not run")
            rows.append([row["peer"]] + [DASH] * 4 + [why])
            continue
        asked = min(n, after["origin"]["requests"])
        ratio = (n - asked) / n
        rows.append([row["peer"], fill["origin"]["requests"], after["origin"]["requests"],
                     f"{ratio * 100:.0f} %", _met(ratio >= 1.0),
                     f"{_errors(fill)} / {_errors(after)}"])
    head = ["peer", "origin requests, fill", "origin requests after restart",
            "hit ratio after restart (goal 100 %)", "met", "errors (fill / after)"]
    intro = (f"**(e) Restart**: {n} objects of {p['e_bytes'] // 1024} KiB fetched once (at once), "
             f"2 s for writes to land, the peer stopped (SIGTERM) and started again on the same "
             f"store and port (the Host is part of a key), the {n} objects asked for again. "
             f"Hit ratio = objects the origin was not asked for again / {n}. Varnish's malloc "
             f"storage is memory only.")
    return intro + "\n\n" + table(head, rows)


def _f_case(result):
    p = result["params"]
    rows = []
    for row in result["rows"]:
        c, why = _case(row, "f")
        if c is None or "failed" in c["hit"] or "failed" in c["swr"]:
            why = why or (c["hit"].get("failed") or c["swr"].get("failed"))
            rows.append([row["peer"]] + [DASH] * 6 + [why])
            continue
        hit, swr = c["hit"]["latency"], c["swr"]["latency"]
        ok = swr["p99_ms"] <= max(2 * hit["p99_ms"], hit["p99_ms"] + 2)
        rows.append([row["peer"], _f(hit["p99_ms"], 2), _f(swr["p50_ms"], 2),
                     _f(swr["p99_ms"], 2), _met(ok), _f(swr["max_ms"], 1),
                     c["origin"]["requests"],
                     f"{c['hit']['errors']} / {c['swr']['errors']}"])
    head = ["peer", "hit p99 ms", "across refreshes p50 ms", "p99 ms (goal ≈ hit)", "met",
            "max ms", "origin requests in the window", "errors (hit / swr)"]
    intro = (f"**(f) `stale-while-revalidate`**: a 1 KB object with `max-age=1, "
             f"stale-while-revalidate=60` whose origin answers after {p['swr_delay_ms']} ms, read "
             f"by {p['f_c']} clients in a closed loop for {p['f_secs']} s (several lifetimes, so "
             f"several refreshes), next to the same loop on an object that stays fresh (hit "
             f"latency). Met when p99 ≤ max(2 × hit p99, hit p99 + 2 ms): a refresh that "
             f"blocked a client would cost {p['swr_delay_ms']} ms.")
    return intro + "\n\n" + table(head, rows)


def render(result, out_dir, charts_rel):
    del out_dir, charts_rel
    p = result["params"]
    md = [f"One origin for every peer: `sluice-loadgen origin` (generated bytes, computable at any "
          f"offset, so multi-GB objects need no disk; `Range`, `ETag`, `Last-Modified`, 304; it "
          f"counts requests and body bytes sent). Each peer is configured the way its users run "
          f"it as a slice cache: sluice `cache = true` with {p['memory_mib']} MiB memory + "
          f"{p['disk_mib']} MiB disk tiers and 1 MiB slices; nginx `proxy_cache` + `slice 1m` + "
          f"`proxy_cache_lock` + `proxy_cache_use_stale updating` + `proxy_cache_background_update`"
          f" ({p['disk_mib']} MiB `max_size`); Varnish `-s malloc,{p['memory_mib']}m` with the "
          f"built-in VCL. Every body is checked for length and status, and hashed where stated.",
          "", _a(result), "", _b(result), "", _c(result), "", _d(result), "", _e(result), "",
          _f_case(result)]
    versions = [f"{r['peer']}: {r['version']}" for r in result["rows"] if r.get("version")]
    if versions:
        md += ["", "Versions: " + "; ".join(versions) + "."]
    return "\n".join(md)
