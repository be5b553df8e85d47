"""docs/benchmarks.md: machine facts, method, one section per scenario, stdout tables, SVG charts."""

import datetime
import os
import platform
import subprocess

from . import report_s4, s7, svg

DASH = "–"


def machine_info(repo):
    cpu, cores = "", 0
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and not cpu:
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("processor"):
                cores += 1
    mem_gib = 0.0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_gib = int(line.split()[1]) / 1024 / 1024

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                                  timeout=20).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    # The report's own outputs are rewritten by every run; only other changes make the tree dirty.
    dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", ".",
                     ":!docs/benchmarks.md", ":!docs/benchmarks"))
    return {"cpu": cpu, "cores": cores, "loadavg": load, "kernel": platform.release(), "mem_gib": round(mem_gib, 1),
            "commit": git("rev-parse", "--short=12", "HEAD") + (" (with uncommitted changes)" if dirty else ""),
            "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def _f(v, digits=1):
    return DASH if v is None else f"{v:,.{digits}f}"


def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


# === S1 ===

def _s1_level_rows(result):
    rows = []
    levels = result["params"]["levels"]
    for c in levels:
        for row in result["rows"]:
            small = row.get("small") or {}
            lvl = next((x for x in small.get("levels", []) if x["c"] == c), None)
            if row.get("status") != "ok" or lvl is None:
                why = row.get("status") if row.get("status") != "ok" else small.get("failed", "skipped")
                rows.append([c, row["peer"]] + [DASH] * 9 + [why])
                continue
            u = lvl.get("usage") or {}
            errs = f"{lvl['errors']} / {lvl['warmup_errors']}"
            if lvl["error_kinds"]:
                errs += " (" + ", ".join(f"{k} {v}" for k, v in lvl["error_kinds"].items()) + ")"
            rows.append([c, row["peer"], _f(lvl["latency"]["avg_ms"]), _f(lvl["latency"]["p90_ms"]),
                         _f(lvl["latency"]["p99_ms"]), _f(lvl["throughput_mb_s"], 0),
                         _f(u.get("cpu_s"), 2), _f(u.get("cpu_pct"), 0),
                         _f(lvl.get("peak_rss_mb")), _f(lvl.get("peak_uss_mb")),
                         _f(u.get("sys_busy_pct"), 0), errs])
    return rows


def _s1_big_rows(result):
    rows = []
    for row in result["rows"]:
        big = row.get("big") or {}
        lvl = (big.get("levels") or [None])[0]
        idle = row.get("big_idle") or row.get("idle") or {}
        if row.get("status") != "ok" or lvl is None:
            why = row.get("status") if row.get("status") != "ok" else big.get("failed", "skipped")
            rows.append([row["peer"]] + [DASH] * 8 + [why])
            continue
        u = lvl.get("usage") or {}
        rows.append([row["peer"], _f(lvl["throughput_mb_s"], 0), _f(lvl["latency"]["avg_ms"] / 1e3, 2),
                     _f(u.get("cpu_s"), 2), _f(u.get("cpu_pct"), 0),
                     f"{_f(idle.get('peak_rss_mb'))} / {_f(idle.get('peak_uss_mb'))}",
                     _f(lvl.get("peak_rss_mb")), _f(lvl.get("peak_uss_mb")),
                     _f(u.get("sys_busy_pct"), 0), f"{lvl['errors']} / {lvl['warmup_errors']}"])
    return rows


S1_HEAD = ["c", "peer", "avg ms", "p90 ms", "p99 ms", "MB/s", "CPU s", "CPU %", "RSS MB",
           "USS MB", "machine busy %", "errors (timed / warm-up)"]
S1_BIG_HEAD = ["peer", "MB/s", "avg s", "CPU s", "CPU %", "idle RSS / USS MB", "peak RSS MB",
               "peak USS MB", "machine busy %", "errors (timed / warm-up)"]


def _s1_charts(result, out_dir):
    levels = result["params"]["levels"]
    tput, lat = [], []
    for row in result["rows"]:
        small = row.get("small") or {}
        by_c = {x["c"]: x for x in small.get("levels", [])}
        if row.get("status") != "ok" or not by_c:
            continue
        tput.append((row["peer"], [by_c[c]["throughput_mb_s"] if c in by_c else None for c in levels]))
        lat.append((row["peer"], [by_c[c]["latency"]["avg_ms"] if c in by_c else None for c in levels]))
    files = []
    for name, title, ylab, series, log in (
            ("s1-throughput.svg", "S1: throughput vs concurrency (7 MiB file)", "MB/s", tput, False),
            ("s1-latency.svg", "S1: average latency vs concurrency (7 MiB file)", "ms (log scale)",
             lat, True)):
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(svg.line_chart(title, "concurrent clients (c)", ylab, levels, series, log=log))
        files.append(name)
    return files


def _faster_than_direct(result):
    """Levels where a proxy beat the direct fetch by more than 10 %: a result to explain, not a win."""
    by_peer = {}
    for row in result["rows"]:
        for lvl in (row.get("small") or {}).get("levels", []):
            by_peer.setdefault(row["peer"], {})[lvl["c"]] = lvl["throughput_mb_s"]
    direct = by_peer.pop("nginx direct", {})
    notes = []
    for peer, levels in by_peer.items():
        for c, v in levels.items():
            if c in direct and direct[c] > 0 and v > 1.1 * direct[c]:
                notes.append(f"{peer} at c={c}: {v:,.0f} MB/s vs direct {direct[c]:,.0f} MB/s")
    return notes


def render_s1(result, out_dir, charts_rel):
    p = result["params"]
    md = [f"Origin: {result.get('origin', '')}, serving a {p['small_bytes'] / 2**20:g} MiB file of "
          f"seeded random bytes, requested as `/proxy/stream?d=<origin URL>&api_password=…` "
          f"(direct: the origin URL). Each level: {p['warmup']} warm-up round(s), then the round "
          f"with the median wall time out of {p['rounds']}; {p['global_warmup']} global warm-up "
          f"round(s) at c={p['global_warmup_c']} first. All peers run side by side and the levels "
          f"are interleaved (every peer at c=10, then every peer at the next level, rotating the "
          f"order), so background load on the machine falls on all of them alike. Latency is time to last byte of the successful requests "
          f"of that round; MB/s = bytes received / round wall time. CPU and memory are the "
          f"process tree of the server under test (for *nginx direct*, the origin itself), CPU "
          f"from the median round, RSS/USS the peak over the level's timed rounds. *Machine busy %* is "
          f"the whole machine's CPU use in that round (all cores, softirq included; 100 = every "
          f"core busy): it shows how much else was running.", "",
          table(S1_HEAD, _s1_level_rows(result)), ""]
    odd = _faster_than_direct(result)
    if odd:
        md += ["**Faster than the direct fetch (to be explained, most likely noise from other load "
               "on the machine during that round):** " + "; ".join(odd) + ".", ""]
    for name in _s1_charts(result, out_dir):
        md.append(f"![{name}]({charts_rel}/{name})")
    md += ["", f"**Large file**: {p['big_bytes'] / 2**20:g} MiB at c={p['big_c']} "
               f"({p['big_warmup']} warm-up, median of {p['big_rounds']}) on a freshly started "
               f"instance of each proxy; memory must not grow with file size.", "", table(S1_BIG_HEAD, _s1_big_rows(result))]
    versions = [f"{r['peer']}: {r['version']}" for r in result["rows"] if r.get("version")]
    if versions:
        md += ["", "Versions: " + "; ".join(versions) + "."]
    return "\n".join(md)


# === S2 and S3 (closed-loop duration runs) ===

S3_HEAD = ["body", "c", "peer", "req/s", "avg ms", "p50 ms", "p99 ms", "CPU %", "CPU µs/req",
           "RSS MB", "USS MB", "errors"]


def _cpu_per_request(cpu_pct, rps):
    """Proxy CPU time per request in microseconds (100 % = one core for one second)."""
    if cpu_pct is None or not rps:
        return None
    return cpu_pct / 100 * 1e6 / rps


def _duration_rows(result, per_round):
    rows = []
    width = 9 if per_round else 8
    for row in result["rows"]:
        if row.get("status") != "ok":
            rows.append([DASH, DASH, row["peer"]] + [DASH] * width + [row.get("status", "")])
            continue
        for r in row["results"]:
            rep = r["report"]
            if "failed" in rep:
                rows.append([r["file"], r["c"], row["peer"]] + [DASH] * width + [rep["failed"]])
                continue
            u = rep.get("usage") or {}
            rounds = [" / ".join(_f(x, 0) for x in r.get("rounds_rps") or [])] if per_round else []
            rows.append([f"{r['bytes']:,} B", r["c"], row["peer"], _f(rep["rps"], 0)] + rounds +
                        [_f(rep["latency"]["avg_ms"], 3), _f(rep["latency"]["p50_ms"], 3),
                         _f(rep["latency"]["p99_ms"], 3), _f(u.get("cpu_pct"), 0),
                         _f(_cpu_per_request(u.get("cpu_pct"), rep["rps"]), 1),
                         _f(u.get("peak_rss_mb")), _f(u.get("peak_uss_mb")),
                         f"{rep['errors']} / {rep['warmup_errors']}"])
    rows.sort(key=lambda r: (str(r[0]), r[1] if isinstance(r[1], int) else 0))
    return rows


def render_s3(result, out_dir, charts_rel):
    rows = _duration_rows(result, False)
    p = result["params"]
    md = [f"Closed loop over c keep-alive connections for {p['secs']} s after "
          f"{p['warmup_secs']} s of warm-up; origin {result.get('origin', '')}. CPU "
          f"and memory are the proxy's process tree (origin's for *direct*).", "",
          table(S3_HEAD, rows)]
    stream = _s3_stream_rows(result)
    if stream:
        sp = p.get("stream") or {}
        md += ["", f"**Streaming**: each body fetched by c={sp.get('c')} clients at once "
                   f"({sp.get('warmup')} warm-up round, median of {sp.get('rounds')}), each peer "
                   f"freshly started. CPU per GB = the proxy's CPU seconds in the median round / "
                   f"GB relayed in it (for *direct*: the origin's).", "",
               table(S3_STREAM_HEAD, stream)]
    return "\n".join(md)


# S2's goals: the default sluice row against each peer, per 1 KB level and the 2-server group.
S2_SLUICE = "sluice (work-stealing)"
S2_RIVALS = [("Varnish pass", 1.5), ("nginx proxy_pass", 1.0), ("HAProxy http", 1.0)]
S2_GOALS_HEAD = ["body", "c", "sluice req/s", "× Varnish (≥ 1.5)", "× nginx (≥ 1.0)",
                 "× HAProxy (≥ 1.0)", "sluice p99 ms", "peers' p99 ms (Varnish / nginx / HAProxy)",
                 "met", "sluice × direct", "1.5 × Varnish as × direct"]


def _s2_goal_rows(result):
    cells = {}
    for row in result["rows"]:
        if row.get("status") != "ok":
            continue
        for r in row["results"]:
            if "failed" not in r["report"]:
                cells[(row["peer"], r["bytes"], r["c"])] = r["report"]
    out = []
    keys = sorted({(b, c) for (peer, b, c) in cells if peer == S2_SLUICE})
    for suffix in ["", ", 2 servers rr"]:
        for b, c in keys:
            mine = cells.get((S2_SLUICE + suffix, b, c))
            if mine is None or (suffix and b != 1024):
                continue
            ratios, p99s, met = [], [], True
            for peer, goal in S2_RIVALS:
                theirs = cells.get((peer + suffix, b, c))
                if theirs is None or not theirs["rps"]:
                    ratios.append(DASH)
                    p99s.append(DASH)
                    met = False
                    continue
                x = mine["rps"] / theirs["rps"]
                met &= x >= goal and mine["latency"]["p99_ms"] < theirs["latency"]["p99_ms"]
                ratios.append(f"{x:.2f}")
                p99s.append(_f(theirs["latency"]["p99_ms"], 3))
            # The client and the origin share one core: *direct* (no proxy) is about the most
            # that core lets through, so a goal above it cannot be shown on this machine.
            direct = cells.get(("direct", b, c))
            varnish = cells.get((S2_RIVALS[0][0] + suffix, b, c))
            ceiling = [DASH, DASH]
            if direct and direct["rps"]:
                ceiling[0] = f"{mine['rps'] / direct['rps']:.2f}"
                if varnish:
                    ceiling[1] = f"{1.5 * varnish['rps'] / direct['rps']:.2f}"
            out.append([f"{b:,} B", f"{c}{suffix}", _f(mine["rps"], 0)] + ratios +
                       [_f(mine["latency"]["p99_ms"], 3), " / ".join(p99s),
                        "**yes**" if met else "no"] + ceiling)
    return out


def render_s2(result, out_dir, charts_rel):
    p = result["params"]
    rounds = p.get("rounds", 1)
    head = S3_HEAD[:4] + (["req/s per round"] if rounds > 1 else []) + S3_HEAD[4:]
    how = (f"Each cell was measured in {rounds} rounds (every peer once per round, the peers' "
           f"order rotated each round) and the row shows the round with the median req/s; "
           f"*req/s per round* lists all of them in round order. " if rounds > 1 else "")
    md = [f"Closed loop over c keep-alive connections for {p['secs']} s after "
          f"{p['warmup_secs']} s of warm-up; origin {result.get('origin', '')}. {how}CPU "
          f"and memory are the proxy's process tree (origin's for *direct*).", "",
          "**Goals** (issue: ≥ 1.5× Varnish pass, ≥ 1.0× nginx and HAProxy, p99 below all three; "
          f"the default `{S2_SLUICE}` row, median rounds). The client and the origin share one "
          f"core, so *direct* (the client straight to the origin) is about the most that core "
          f"lets through; the last two columns put sluice and the Varnish goal against it (the "
          f"2-server rows against the one-server *direct*):", "",
          table(S2_GOALS_HEAD, _s2_goal_rows(result)), "",
          table(head, _duration_rows(result, rounds > 1))]
    return "\n".join(md)


S3_STREAM_HEAD = ["body", "peer", "MB/s", "avg s", "CPU s", "CPU s per GB", "peak RSS MB",
                  "errors (timed / warm-up)"]


def _s3_stream_rows(result):
    rows = []
    for row in result["rows"]:
        for r in row.get("stream") or []:
            rep = r["report"]
            lvl = (rep.get("levels") or [None])[0]
            if "failed" in rep or lvl is None:
                rows.append([f"{r['bytes']:,} B", row["peer"]] + [DASH] * 5
                            + [rep.get("failed", "skipped")])
                continue
            u = lvl.get("usage") or {}
            gb = r["bytes"] * r["c"] / 1e9
            cpu = u.get("cpu_s")
            rows.append([f"{r['bytes']:,} B", row["peer"], _f(lvl["throughput_mb_s"], 0),
                         _f(lvl["latency"]["avg_ms"] / 1e3, 2), _f(cpu, 2),
                         _f(cpu / gb if cpu is not None and gb else None, 3),
                         _f(lvl.get("peak_rss_mb")), f"{lvl['errors']} / {lvl['warmup_errors']}"])
    rows.sort(key=lambda r: (len(r[0]), r[0]))
    return rows


# === S5 ===

S5_HEAD = ["case", "gateway", "binary MiB (stripped)", "gateway CPU %", "machine CPU % (softirq)", "idle USS MB",
           "peak RSS MB", "peak USS MB", "peak anon MB", "Mbit/s per client (min)", "delivered / sent after cut, MB", "lost",
           "sender Mbit/s per group"]


def _s5_delivery(row):
    """Sums over clients: bytes delivered from the cut to the end, bytes the sender sent from
    each client's cut position on, and losses (gaps, damaged or repeated packets, errors)."""
    recv, sender = row.get("recv") or {}, row.get("sender") or {}
    groups = sender.get("groups") or []
    delivered = sent = 0
    lost = 0
    for c in recv.get("clients", []):
        g = groups[c["group"]] if c["group"] < len(groups) else None
        if c.get("error") or g is None or c.get("ts_at_cut") is None:
            lost += 1
            continue
        delivered += c["bytes_after_cut"]
        sent += (g["ts_packets"] - c["ts_at_cut"]) * 188
        lost += c["lost_ts"] + c["corrupt_ts"] + c["behind_ts"]
    return delivered, sent, lost


def _s5_rows(result):
    rows = []
    for row in result["rows"]:
        head = [row["case"], row["gateway"], _f(row.get("binary_mib"), 2) if "build" in row else DASH]
        if row.get("status") != "ok":
            rows.append(head + [DASH] * 9 + [row.get("status", "")])
            continue
        sender = row.get("sender") or {}
        rate = _f(sender.get("achieved_mbit_per_s")) if "failed" not in sender else sender["failed"]
        if "recv" not in row:
            u = row.get("usage") or {}
            wall = u.get("wall_s") or 0
            sys_pct = f"{_f(100 * u['sys_busy_s'] / wall, 0)} ({_f(100 * u['sys_softirq_s'] / wall, 0)})" if wall else DASH
            rows.append(head + [f"sender {_f(u.get('cpu_pct'), 0)}", sys_pct] + [DASH] * 7 + [rate])
            continue
        recv = row["recv"]
        if "failed" in recv:
            rows.append(head + [DASH] * 9 + [recv["failed"]])
            continue
        u = recv.get("usage") or {}
        wall = u.get("wall_s") or 0
        sys_pct = (f"{_f(100 * u['sys_busy_s'] / wall, 0)} ({_f(100 * u['sys_softirq_s'] / wall, 0)})"
                   if wall else DASH)
        rates = [c["window_mbit_per_s"] for c in recv.get("clients", [])]
        delivered, sent, lost = _s5_delivery(row)
        uss = u.get("peak_uss_mb")
        goal = "" if uss is None else (" ✔" if uss <= result["params"]["uss_goal_mb"] else " ✘")
        idle = row.get("idle") or {}
        rows.append(head + [_f(u.get("cpu_pct"), 1), sys_pct, _f(idle.get("peak_uss_mb")),
                            _f(u.get("peak_rss_mb")),
                            _f(uss) + goal, _f(u.get("peak_anon_mb")),
                            _f(min(rates) if rates else None),
                            f"{delivered / 1e6:,.1f} / {sent / 1e6:,.1f}",
                            "0" if lost == 0 and delivered == sent else f"{lost} pkts, {(sent - delivered) / 1e6:,.2f} MB",
                            rate])
    return rows


def render_s5(result, out_dir, charts_rel):
    p = result["params"]
    md = [f"A native sender (`sluice-loadgen mcast-send`, `sendmmsg`, 1 ms pacing "
          f"tick) multicasts RTP datagrams of 7 × 188-byte TS packets to every group on port "
          f"{p['port']}, bound to 127.0.0.1 and pinned to `lo` (`SO_BINDTODEVICE`, "
          f"`IP_MULTICAST_IF` by index, TTL 1, loop on); sluice runs with "
          f"`--multicast-interface lo`. Each TS packet carries its index and seeded bytes, so "
          f"every client (`sluice-loadgen iptv-recv`) checks every delivered byte, in order. "
          f"{p['warmup_secs']:g} s warm-up, then a {p['secs']:g} s timed window in which the "
          f"gateway's process tree is sampled; then the clients read on until the stream goes "
          f"quiet after the sender stops. *Delivered / sent after cut*: bytes each client got from "
          f"the window's start to the end of its stream, against what the sender sent from that "
          f"client's position on (equal = nothing lost, nothing stuck). *Machine CPU %* is "
          f"/proc/stat over the window (100 = one core; sender, clients and softirq included); "
          f"compare it with the *sender only* baseline. Goal: USS ≤ {p['uss_goal_mb']:g} MiB "
          f"(✔/✘), and less CPU and memory than rtp2httpd's and msd_lite's published figures "
          f"below.", "", table(S5_HEAD, _s5_rows(result))]
    md += ["", "*Idle USS* is the same sluice process before its first channel. *Peak anon* is the "
               "anonymous part of USS (heap, stacks, buffers); the rest of USS is pages of the "
               "binary itself (code and read-only data) that only this process maps. When the sender-only "
               "baseline itself shows about 200 % machine CPU, other work was saturating both cores "
               "during the run and that column says nothing about the gateway."]
    goal = _s5_goal(result)
    if goal:
        md += ["", "**Goal check** (sluice as shipped, against the published figures; different "
                   "machines and methods, so a rough comparison): " + "; ".join(goal) + ". "
                   "What drives USS: the idle process (mostly the binary's own code pages, which "
                   "a C gateway a fraction of the size does not pay), plus per joined channel "
                   "`iptv.burst_bytes` of history kept for instant start (packed payload, 1 MiB by "
                   "default) and a few tens of KiB of blocks in flight; history beyond that is kept "
                   "only while a subscriber still has it to read, up to `iptv.buffer_bytes`. The "
                   "`burst_bytes=0` rows start viewers live, as rtp2httpd and udpxy do."]
    router = _s5_router(result)
    if router:
        md += ["", "**Both builds against the router goals** (issue 13; the router build is "
                   "`scripts/build-router` (`--profile router --no-default-features --features "
                   "iptv`, linked for size and with its hot code first), the full one `cargo build "
                   "--release`; sizes are of stripped copies):",
               "", table(["goal", "full build", "gateway-only router build"], router)]
    versions = sorted({r["version"] for r in result["rows"] if r.get("version")})
    if versions:
        md += ["", "Versions: " + "; ".join(versions) + "."]
    md += ["", _published(result)]
    return "\n".join(md)


def _s5_router(result):
    """The router goals, one row each, measured for both builds: stripped binary size, idle USS,
    and peak USS for 8 clients on 1 group at 40 Mb/s with live start (burst_bytes = 0)."""
    goals = result["params"].get("router_goals")
    rows = [r for r in result["rows"] if r.get("build") and r.get("status") == "ok"]
    if not goals or not any(r["build"] == "router" for r in rows):
        return []

    def mark(v, goal):
        return DASH if v is None else f"{v:.2f} {'✔' if v <= goal else '✘'}"

    def cell(build, key):
        mine = [r for r in rows if r["build"] == build]
        if key == "binary_mib":
            v = next((r.get("binary_mib") for r in mine if r.get("binary_mib")), None)
        elif key == "idle_uss_mib":
            idle = [(r.get("idle") or {}).get("peak_uss_mb") for r in mine]
            idle = [v for v in idle if v is not None]
            v = min(idle) if idle else None
        else:
            live = [r for r in mine if r.get("live_start") and r["case"].startswith("8 clients, 1 group")]
            v = next((((r.get("recv") or {}).get("usage") or {}).get("peak_uss_mb")
                      for r in live), None)
        return mark(v, goals[key])

    names = [("binary_mib", f"binary ≤ {goals['binary_mib']:g} MiB (stripped)"),
             ("idle_uss_mib", f"idle USS ≤ {goals['idle_uss_mib']:g} MiB"),
             ("live_uss_mib", f"USS ≤ {goals['live_uss_mib']:g} MiB, 8 clients on 1 group at "
                              f"40 Mb/s, live start")]
    return [[name, cell("full", key), cell("router", key)] for key, name in names]


def _s5_goal(result):
    """One phrase per case: sluice's default row against rtp2httpd's and msd_lite's figures."""
    out = []
    published = result.get("published") or []
    cases = [r for r in result["rows"] if "defaults" in r["gateway"] and r.get("status") == "ok"
             and r.get("build", "full") == "full"]
    for i, row in enumerate(cases):
        u = ((row.get("recv") or {}).get("usage")) or {}
        if i >= len(published) or "cpu_pct" not in u:
            continue
        (r_cpu, r_uss), (m_cpu, m_uss) = ([float(x) for x in published[i][k].split("/")]
                                          for k in (1, 2))
        cpu, uss = u["cpu_pct"], u["peak_uss_mb"]
        delivered, sent, lost = _s5_delivery(row)
        verdict = lambda ok: "less" if ok else "more"  # noqa: E731
        out.append(f"{row['case']}: CPU {cpu:.1f} % ({verdict(cpu < min(r_cpu, m_cpu))} than "
                   f"{r_cpu:g} / {m_cpu:g}), USS {uss:.1f} MB ({verdict(uss < min(r_uss, m_uss))} "
                   f"than {r_uss:g} / {m_uss:g}; ≤ {result['params']['uss_goal_mb']:g} MiB "
                   f"{'met' if uss <= result['params']['uss_goal_mb'] else 'not met'}; of it "
                   f"{u.get('peak_anon_mb', 0):.1f} MB anonymous), "
                   f"{'no loss' if lost == 0 and delivered == sent else 'LOSS'}")
    return out


def _published(result):
    return "\n".join([
        "Published reference figures (rtp2httpd's own benchmark: Ubuntu 24.04 aarch64 VM on an "
        "Apple M3 Max, 10 s runs, `top` samples, USS from smaps_rollup). **Published, not measured "
        "here**; their harness charges loopback softirq to the sender and does not check delivery. "
        "CPU % (100 = one core) / USS MB:", "",
        table(["case", "rtp2httpd", "msd_lite", "udpxy", "tvgate"], result["published"])])


# === S6: HLS end to end ===

HLS_HEAD = ["c", "proxy", "segments/s", "MB/s", "p50 segment ms", "p90 segment ms",
            "manifest p90 ms", "CPU %", "peak RSS MB", "peak USS MB", "errors"]


def _hls_rows(h, exact_bytes):
    rows = []
    for row in h.get("rows", []):
        rep = row.get("report") or {}
        if row.get("status") != "ok" or "failed" in rep:
            rows.append([DASH, row["peer"]] + [DASH] * 8 + [rep.get("failed") or row.get("status", "")])
            continue
        for lvl in rep.get("levels", []):
            u = lvl.get("usage") or {}
            errs = str(lvl["errors"])
            if lvl["error_kinds"]:
                errs += " (" + ", ".join(f"{k} {v}" for k, v in lvl["error_kinds"].items()) + ")"
            want = lvl["players_ok"] * h["segment_bytes"] if exact_bytes else None
            if want is not None and lvl["errors"] == 0 and lvl["bytes"] != want:
                errs += f"; bytes {lvl['bytes']:,} ≠ {want:,}"
            rows.append([lvl["c"], row["peer"], _f(lvl["segments_per_s"], 0),
                         _f(lvl["throughput_mb_s"], 0), _f(lvl["segment_latency"]["p50_ms"]),
                         _f(lvl["segment_latency"]["p90_ms"]), _f(lvl["manifest_latency"]["p90_ms"]),
                         _f(u.get("cpu_pct"), 0), _f(u.get("peak_rss_mb")), _f(u.get("peak_uss_mb")),
                         errs])
    rows.sort(key=lambda r: (r[0] if isinstance(r[0], int) else 0))
    return rows


def _versions(h):
    versions = [f"{r['peer']}: {r['version']}" for r in h.get("rows", []) if r.get("version")]
    return ["", "Versions: " + "; ".join(versions) + "."] if versions else []


def _render_hls(h):
    if h.get("error"):
        return f"HLS end to end: could not run ({h['error']})."
    return "\n".join([
        f"**HLS end to end.** A clear HLS VOD made by ffmpeg ({h['segments']} × 2 s segments of "
        f"`testsrc` 1280x720, H.264 ~1.5 Mbit/s, {h['segment_bytes'] / 1e6:,.1f} MB in all), served "
        f"by the origin nginx. Each of c players (`sluice-loadgen hls`), released together, fetches "
        f"`/proxy/hls/manifest.m3u8?d=<origin playlist>&api_password=…` through the proxy, then "
        f"every segment URL of the playlist it received, in order, as fast as it can, on one "
        f"keep-alive connection. Segments/s and MB/s over the level's wall time (release to the "
        f"last player's last byte); every player must get all {h['segments']} segments with status "
        f"200 and the exact total byte count. CPU and memory: the proxy's process tree over the "
        f"level.", "", table(HLS_HEAD, _hls_rows(h, True))] + _versions(h))


def _render_dash(h):
    if h.get("error"):
        return f"DASH to HLS end to end: could not run ({h['error']})."
    t = h.get("tracks", {})
    checks = []
    for row in h.get("rows", []):
        dc = row.get("decode")
        if not dc:
            continue
        if dc.get("ok"):
            checks.append(f"{row['peer']}: {dc['frames']} frames decoded cleanly")
        else:
            checks.append(f"{row['peer']}: **failed** ({dc.get('why') or 'no frames'})")
    return "\n".join([
        f"**DASH (ClearKey) to HLS end to end.** The same `testsrc` 1280x720 H.264 (~1.5 Mbit/s) "
        f"plus mono AAC, packaged by Shaka Packager as a `cenc` DASH VOD with one key for both "
        f"tracks ({t.get('video', '?')} video and {t.get('audio', '?')} audio segments of 2 s), "
        f"served by the origin nginx. Each of c players, released together, fetches "
        f"`/proxy/mpd/manifest.m3u8?d=<origin MPD>&key_id=…&key=…&api_password=…`, follows the "
        f"master playlist to its highest-bandwidth variant and that variant's audio rendition, "
        f"then fetches both tracks' init sections (`EXT-X-MAP`, when listed) and all "
        f"{h['segments']} segments, video and audio interleaved, in order, on one keep-alive "
        f"connection. All players ask for the same segments; sluice fetches them from the origin "
        f"through its segment cache and prefetcher and decrypts every response it sends. "
        f"Every segment must be 200 and non-empty; each player's init sections and first segment "
        f"of each track must parse as fragmented MP4 with no encryption left (no `encv`/`enca`/"
        f"`sinf` in the init, no `senc` in a track fragment). Manifest latency covers the master "
        f"and both media playlists. Before the load, the first video segment through each proxy "
        f"(with its init section) is decoded by ffmpeg: " + ("; ".join(checks) or "not run") + ".",
        "", table(HLS_HEAD, _hls_rows(h, False))] + _versions(h))


# === pending scenarios ===

def render_pending(result, out_dir, charts_rel):
    crit = result.get("criterion")
    if crit and crit.get("results"):
        md = ["`cargo bench -p sluice-media --bench cenc` and `--bench hls_rewrite` (criterion, "
              "medians; the HLS rows rewrite a 5000-segment media playlist):", "",
              table(["benchmark", "time", "throughput"],
                    [[x["bench"], x.get("time", ""), x["median"]] for x in crit["results"]])]
    elif crit:
        md = [f"criterion bench failed: {crit.get('error', 'no throughput lines in its output')}"]
    else:
        md = [f"*{result['note']}.*"]
    if result.get("published"):
        md += ["", _published(result)]
    if result.get("hls"):
        md += ["", _render_hls(result["hls"])]
    if result.get("dash"):
        md += ["", _render_dash(result["dash"])]
    o = result.get("openssl")
    if o and "line" in o:
        md += ["", f"Measured now: `openssl speed -evp aes-128-ctr` ({o['version']}), bytes/s in "
                   "thousands per block size, one core:", "", "```", o["header"], o["line"], "```"]
    elif o:
        md += ["", f"openssl speed failed: {o.get('error')}"]
    return "\n".join(md)


# === S5-HLS ===

S5H_HEAD = ["build", "channel", "HLS + raw viewers", "segments", "binary MiB", "gateway CPU %",
            "USS MiB", "RSS MiB", "Mbit/s per raw viewer", "Mbit/s per HLS viewer"]


def render_s5_hls(result, out_dir, charts_rel):
    p = result["params"]
    rows = []
    for r in result["rows"]:
        head = [r["build"], f"{r['mbps']} Mb/s", f"{r['hls']} + {r['raw']}", r["container"].upper()]
        if r.get("status") != "ok":
            rows.append(head + [DASH] * 5 + [r.get("status", "")])
            continue
        size = r.get("binary_mib") or r["binary_bytes"] / 2**20
        rows.append(head + [_f(size, 2), _f(r["cpu_pct"], 1), _f(r["uss_mib"]),
                            _f(r["rss_mib"]), _f(r.get("raw_mbps_each"), 2),
                            _f(r.get("hls_mbps_each"), 2)])
    md = [f"`bench/s5-hls` (run once per row): one channel of ffmpeg-made H.264/AAC (720p25, 1 s "
          f"GOP) at a constant mux rate, sent as RTP multicast on `lo` by a paced Python sender; "
          f"sluice joins it on `lo` with `[iptv.hls] target_duration_secs = "
          f"{p['target_duration_secs']}` (window 4); raw-TS viewers read `/rtp/G:P`, HLS viewers "
          f"fetch the playlist every second and every new segment (and the init segment, for "
          f"fMP4), as a player does. {p['warmup_secs']:g} s warm-up, then the gateway's CPU "
          f"(utime + stime over {p['secs']:g} s; 100 = one core) and its USS and RSS at the end. "
          f"*full* is the build with every front end, *router* the gateway-only "
          f"`scripts/build-router` build (binary sizes of stripped copies).", "",
          table(S5H_HEAD, rows)]
    binaries = {}
    for r in result["rows"]:
        binaries.setdefault(r["build"], r.get("binary"))
    if all(binaries.values()):
        md += ["", "Binaries: " + "; ".join(f"{b} `{path}`" for b, path in binaries.items()) + "."]
    pub = result.get("published") or []
    one_group = next((r for r in pub if r[0].startswith("8 clients, 1 group")), None)
    if one_group:
        md += ["", f"For comparison (**published, not measured here**; an aarch64 VM on an M3 Max, "
                   f"raw TS, no HLS): rtp2httpd's {one_group[0]}: {one_group[1]} (CPU % / USS MB); "
                   f"msd_lite {one_group[2]}; tvgate {one_group[4]}. No tvgate row: in its sources "
                   f"(qist/tvgate, `handler/udp_handler.go`) `/udp/` and `/rtp/` stream the "
                   f"multicast as raw TS, and no path segments a multicast channel into HLS, with "
                   f"ffmpeg or otherwise, so there is nothing of it to run here."]
    return "\n".join(md)


RENDER = {"S1": render_s1, "S2": render_s2, "S3": render_s3, "S4": report_s4.render,
          "S5": render_s5, "S5-HLS": render_s5_hls, "S6": render_pending, "S7": s7.render}


def render_section(result, out_dir, charts_rel):
    fn = RENDER.get(result["id"]) if result.get("status") == "measured" else render_pending
    head = f"## {result['id']}. {result['title']}"
    q = f"*Question:* {result['question']}"
    meta = result.get("meta")
    when = (f"*Run:* {meta['date']}, commit {meta['commit']}, load average before the run "
            f"{meta.get('loadavg', '?')}, "
            f"{'quick' if result.get('quick') else 'full'} mode." if meta and result.get("status") == "measured" else "")
    return "\n\n".join(x for x in (head, q, when, fn(result, out_dir, charts_rel)) if x)
