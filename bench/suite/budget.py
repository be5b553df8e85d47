"""Equal budgets: each proxy in a CPU cgroup with a quota, alone on core 1; requests/s and CPU per
request under the same budget, open-loop latency at fixed rates, and memory per idle connection."""

import atexit
import os
import signal
import statistics
import subprocess
import time

from . import procs
from .peers import Unavailable

V1_CPU = "/sys/fs/cgroup/cpu"
V1_ACCT = "/sys/fs/cgroup/cpuacct"
V1_FREEZER = "/sys/fs/cgroup/freezer"
V2 = "/sys/fs/cgroup"
PERIOD_US = 100_000
# The machine may be shared with other work (compiles): the groups the suite makes get the
# largest CPU weight, so that work yields to the proxy (within its quota), the origin and the
# load client instead of shrinking their share unevenly from round to round.
V1_SHARES = 262_144
V2_WEIGHT = 10_000


def _write(path, text):
    with open(path, "w") as f:
        f.write(str(text))


def _tree(root):
    """The root PID and every live descendant (ppid links over /proc/*/stat)."""
    parent = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                text = f.read()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        parent[int(name)] = int(fields[1])
    members = [root]
    for pid in members:
        members += [p for p, pp in parent.items() if pp == pid and p not in members]
    return members


class Cgroup:
    """A CPU cgroup with a quota: v1 `cpu` (quota) + `cpuacct` (usage) where those hierarchies
    are mounted, else v2 (`cpu.max`, `cpu.stat`). Every process of a tree is moved in; children
    forked later are born inside. A `freezable` group can also be frozen and thawed whole (v1
    `freezer`, v2 `cgroup.freeze`) where the kernel offers it."""

    def __init__(self, name, quota_pct, freezable=False):
        """`quota_pct` of a core, or no quota when None (the origin's and client's group)."""
        self.name = name
        self.freezer = None
        if os.path.exists(os.path.join(V1_CPU, "cpu.cfs_quota_us")):
            self.kind = "v1"
            self.dirs = [os.path.join(V1_CPU, name), os.path.join(V1_ACCT, name)]
            for d in self.dirs:
                os.makedirs(d, exist_ok=True)
            _write(os.path.join(self.dirs[0], "cpu.shares"), V1_SHARES)
            if quota_pct is not None:
                _write(os.path.join(self.dirs[0], "cpu.cfs_period_us"), PERIOD_US)
                _write(os.path.join(self.dirs[0], "cpu.cfs_quota_us"),
                       int(PERIOD_US * quota_pct / 100))
            self.usage_file = os.path.join(self.dirs[1], "cpuacct.usage")
            if freezable and os.path.isdir(V1_FREEZER):
                d = os.path.join(V1_FREEZER, name)
                try:
                    os.makedirs(d, exist_ok=True)
                except OSError:
                    d = None  # not writable: the group's processes idle instead (`freeze`)
                if d:
                    self.dirs.append(d)
                    if os.path.exists(os.path.join(d, "freezer.state")):
                        self.freezer = ("v1", d)
        elif "cpu" in open(os.path.join(V2, "cgroup.controllers")).read().split():
            self.kind = "v2"
            d = os.path.join(V2, name)
            os.makedirs(d, exist_ok=True)
            self.dirs = [d]
            _write(os.path.join(d, "cpu.weight"), V2_WEIGHT)
            if quota_pct is not None:
                _write(os.path.join(d, "cpu.max"),
                       f"{int(PERIOD_US * quota_pct / 100)} {PERIOD_US}")
            self.usage_file = os.path.join(d, "cpu.stat")
            if freezable and os.path.exists(os.path.join(d, "cgroup.freeze")):
                self.freezer = ("v2", d)
        else:
            raise Unavailable("no writable CPU cgroup (v1 cpu/cpuacct or v2 cpu controller)")
        self.quota_pct = quota_pct
        _LIVE.append(self)

    def enter(self, root_pid):
        for pid in _tree(root_pid):
            for d in self.dirs:
                try:
                    _write(os.path.join(d, "cgroup.procs"), pid)
                except OSError:
                    pass  # exited meanwhile

    def freeze(self):
        """Stops every process of the group until `thaw` (no-op without a freezer). The kernel
        does it without a signal the processes could see, and waits here until all are stopped
        (a task in an uninterruptible wait can delay that; after 5 s this gives up waiting)."""
        if self.freezer is None:
            return
        kind, d = self.freezer
        if kind == "v1":
            _write(os.path.join(d, "freezer.state"), "FROZEN")
            done = (os.path.join(d, "freezer.state"), "FROZEN")
        else:
            _write(os.path.join(d, "cgroup.freeze"), 1)
            done = (os.path.join(d, "cgroup.events"), "frozen 1")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with open(done[0]) as f:
                if done[1] in f.read():
                    return
            time.sleep(0.01)

    def thaw(self):
        if self.freezer is None:
            return
        kind, d = self.freezer
        try:
            if kind == "v1":
                _write(os.path.join(d, "freezer.state"), "THAWED")
            else:
                _write(os.path.join(d, "cgroup.freeze"), 0)
        except OSError:
            pass  # already removed

    def remove(self):
        self.thaw()  # a frozen task cannot exit, so its group could not be removed
        if self in _LIVE:
            _LIVE.remove(self)
        for d in self.dirs:
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)  # tasks still exiting


class Helpers:
    """The load client and the origin, each in its own CPU cgroup without a quota but with the
    largest weight (see `V1_SHARES`), so other work on their core yields to them, and each
    metered on its own: "client-bound" is judged from what they used, not from how busy their
    core was (other builds keep it busy whatever the suite does). `origin_quota_pct` throttles
    the origin instead (S4 (a): a slow miss)."""

    def __init__(self, ctx, origin, origin_quota_pct=None):
        tag = f"{os.getpid()}-{id(self) % 10_000}"
        self.ctx = ctx
        self.client = Cgroup(f"sluice-bench-client-{tag}", None)
        self.origin = Cgroup(f"sluice-bench-origin-{tag}", origin_quota_pct)
        self.origin.enter(origin.pid)
        ctx.client_cgroup = [os.path.join(d, "cgroup.procs") for d in self.client.dirs]
        ctx.meter_args = ["--client-cgroup-usage", self.client.usage_file,
                          "--origin-cgroup-usage", self.origin.usage_file]

    def remove_client(self):
        """The load client's group (no client runs after this)."""
        self.ctx.client_cgroup = []
        self.ctx.meter_args = []
        self.client.remove()

    def remove(self):
        """Call once the origin has stopped."""
        self.remove_client()
        self.origin.remove()


def helper_groups(ctx, origin, origin_quota_pct=None):
    """`Helpers` for this origin, or None where no CPU cgroup is writable (the cells then fall
    back to the client core's busy share)."""
    try:
        return Helpers(ctx, origin, origin_quota_pct)
    except (Unavailable, OSError):
        return None


# Every group made and not yet removed, removed at exit too (after a failure or Ctrl-C the
# suite's children are already stopped by `procs`, so the groups are empty by then).
_LIVE = []


def _thaw_live():
    """Every group thawed: a frozen process neither acts on SIGTERM nor dies of SIGKILL (v1)."""
    for g in list(_LIVE):
        g.thaw()


def _remove_live():
    """At exit: a group still here was left by a failure; what still runs in it is ours (a load
    client outliving an interrupted run), so it is ended before the group is removed."""
    _thaw_live()
    for g in list(_LIVE):
        for d in g.dirs:
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    pids = [int(x) for x in f.read().split()]
            except OSError:
                continue
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        g.remove()


atexit.register(_remove_live)
# After a failure or Ctrl-C the suite stops its children before the exit handlers run: a peer
# frozen between its turns (`budget_cells`) must be thawed first to be stopped.
procs.before_stop_all.append(_thaw_live)


def machine_load():
    """Load average and the whole machine's busy share over the last second."""
    def busy():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return sum(v) - v[3] - v[4], sum(v)
    b0, t0 = busy()
    time.sleep(1)
    b1, t1 = busy()
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    return {"loadavg": load, "machine_busy_pct": round(100 * (b1 - b0) / max(1, t1 - t0), 1)}


CLIENT_BOUND_PCT = 90.0
PROXY_BOUND_PCT = 90.0


def _start(ctx, starters, name, origin_port, variant):
    start = starters[name]
    return start(ctx, origin_port, ctx.proxy_cpus, **variant.get(name, {}))


def url_of(peer, file, opt=None):
    """The URL of a cell through `peer`: the cell's `path` (default: the file's name at the root),
    through the peer's `path_for` where it has one (the media proxy's `/proxy/stream?d=…`)."""
    opt = opt or {}
    path = opt.get("path") or f"/{os.path.basename(file[0])}"
    path_for = getattr(peer, "path_for", None)
    return (f"{opt.get('scheme', 'http')}://127.0.0.1:{peer.port}"
            f"{path_for(path) if path_for else path}")


def _meter(ctx, group):
    return ["--cgroup-usage", group.usage_file, "--client-core", "0",
            *getattr(ctx, "meter_args", [])]


def budget_cells(ctx, starters, origin, plan, quota_pct, rounds, secs, warm, c, variant=None):
    """Closed loop at c connections through each peer in its own cgroup capped at `quota_pct`
    of a core, for every (file, label[, options]) in `plan`, in `rounds` rounds. A round starts
    every peer, then takes the cells one by one and measures the peers of a cell back to back,
    so the rounds k of two peers, which give the paired ratios, are seconds apart instead of a
    whole round: the machine's speed drifts over tens of seconds, and a pair taken that close
    shares most of it. The peers' order is rotated by round and by cell, so no peer is always
    first. Only the measured peer runs on core 1: the others are frozen (`Cgroup.freeze`)
    between their turns, so their timers, and a busy-polling peer's polling (HAProxy
    `busy-polling` spins even when idle), take nothing from it. Where no freezer is offered
    they idle there instead. Either way each load-client run reads the usage of its own peer's
    group only (`_meter`), so no peer is charged for another's work.
    Returns {peer: {label: [report per round]}} and the machine's load around the run."""
    variant = variant or {}
    names = list(starters)
    out = {n: {} for n in names}
    load_before = machine_load()
    frozen = False
    for k in range(rounds):
        running = {}
        try:
            for i, name in enumerate(names):
                try:
                    peer = _start(ctx, starters, name, origin.port, variant)
                except (Unavailable, RuntimeError) as e:
                    out[name]["status"] = str(e)
                    continue
                # Every starter takes its own free port and temp directory (config, pid file,
                # logs), so the peers can all be up at once.
                group = Cgroup(f"sluice-bench-{os.getpid()}-{k}-{i}", quota_pct, freezable=True)
                running[name] = (peer, group)
                group.enter(peer.pid)
                group.freeze()
                frozen = frozen or group.freezer is not None
                out[name]["version"] = peer.version
            for j, (f, label, *opts) in enumerate(plan):
                # A cell may name its scheme, path, connection count, warm-up and extra
                # client arguments (the TLS cells: `--ca`, `--handshake`, `--h2-streams`).
                opt = opts[0] if opts else {}
                shift = (k + j) % len(names)
                for name in names[shift:] + names[:shift]:
                    if name not in running:
                        continue
                    peer, group = running[name]
                    group.thaw()
                    try:
                        r = ctx.duration(url_of(peer, f, opt), f, opt.get("c", c), secs,
                                         opt.get("warm", warm), peer.pid,
                                         extra=[*_meter(ctx, group), *opt.get("args", [])])
                    finally:
                        group.freeze()
                    r["bytes"] = f[1]
                    out[name].setdefault(label, []).append(r)
        finally:
            for peer, group in running.values():
                group.thaw()
                peer.stop()
                group.remove()
    # How the rounds were taken, for the report: in the order above, the waiting peers frozen
    # or idle.
    return out, {"before": load_before, "after": machine_load(), "order": "paired",
                 "waiting": "frozen" if frozen else "idle"}


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def bound_by(quota_use, client_pct, origin_pct, core_busy):
    """Which side set a cell's rate: "proxy" when it used ≥ 90 % of its quota; else "client"
    when the load client and the origin (both on core 0) used ≥ 90 % of a core between them by
    their own cgroups' accounting (by the core's busy share where they have no cgroups); else
    "neither" (other work took core 0 despite their weight, or the load was too light)."""
    if quota_use is not None and quota_use >= PROXY_BOUND_PCT:
        return "proxy"
    if client_pct is not None:
        helpers = client_pct + (origin_pct or 0)
        return "client" if helpers >= CLIENT_BOUND_PCT else "neither"
    if core_busy is not None and core_busy >= CLIENT_BOUND_PCT:
        return "client"
    return "neither"


def summarize_budget(cells, sluice, quota_pct):
    """Per peer and cell: median req/s, MB/s, CPU µs per request, the kernel's share of it, the
    proxy's share of its quota, the client's and the origin's CPU, which side bound the cell,
    the rounds' req/s and CPU per request; per rival: sluice's paired per-round ratios (req/s and
    CPU per request, round k against round k) and the median of each."""
    rows = []
    labels = []
    for peer in cells.values():
        for label in peer:
            if label not in ("status", "version") and label not in labels:
                labels.append(label)
    for label in labels:
        mine = cells.get(sluice, {}).get(label, [])
        for name, peer in cells.items():
            runs = peer.get(label)
            if not runs:
                rows.append({"peer": name, "cell": label, "status": peer.get("status", "not run")})
                continue
            ok = [r for r in runs if "failed" not in r]

            def window(key):
                return _median([r.get("window", {}).get(key) for r in ok])
            core = window("client_core_busy_pct")
            client, origin = window("client_cpu_pct"), window("origin_cpu_pct")
            # The share of its quota the proxy used: near 100 % it was the bottleneck, whatever
            # the client did.
            quota_use = _median([100 * r["window"]["cgroup_cpu_us"] / (r["elapsed_s"] * 1e6
                                                                       * quota_pct / 100)
                                 for r in ok if r.get("window", {}).get("cgroup_cpu_us")
                                 and r.get("elapsed_s")])
            rps = _median([r["rps"] for r in ok])
            cpu = _median([r.get("cpu_us_per_request") for r in ok])
            kernel = window("cgroup_sys_pct")
            size = runs[0].get("bytes")
            bound = bound_by(quota_use, client, origin, core)
            row = {"peer": name, "cell": label, "status": "ok" if ok else runs[0]["failed"],
                   "rps": rps, "rounds_rps": [r.get("rps") for r in runs],
                   "cpu_us_per_req": cpu,
                   "rounds_cpu": [r.get("cpu_us_per_request") for r in runs],
                   "kernel_pct": kernel,
                   "mb_per_s": rps * size / 1e6 if rps is not None and size else None,
                   # CPU seconds per GB (10^9 bytes) delivered.
                   "cpu_s_per_gb": cpu * 1e-6 * 1e9 / size if cpu is not None and size else None,
                   "p99_ms": _median([r["latency"]["p99_ms"] for r in ok]),
                   "errors": sum(r.get("errors", 0) for r in ok),
                   "client_core_busy_pct": core, "client_cpu_pct": client,
                   "origin_cpu_pct": origin, "quota_use_pct": quota_use, "bound": bound,
                   "client_bound": bound == "client"}
            if name != sluice and mine:
                pairs = [(a, b) for a, b in zip(mine, runs)
                         if "failed" not in a and "failed" not in b]
                ratios = [a["rps"] / b["rps"] for a, b in pairs if b["rps"] > 0]
                row["sluice_ratio"] = _median(ratios)
                row["sluice_ratios"] = ratios
                # Round k's CPU per request, sluice's over this proxy's (< 1: sluice cheaper).
                row["sluice_cpu_ratios"] = [
                    a["cpu_us_per_request"] / b["cpu_us_per_request"] for a, b in pairs
                    if a.get("cpu_us_per_request") and b.get("cpu_us_per_request")]
                row["sluice_cpu_ratio"] = _median(row["sluice_cpu_ratios"])
            rows.append(row)
    return rows


def open_loop(ctx, starters, origin, file, rates, quota_pct, secs, warm, c, variant=None,
              opt=None):
    """Fixed offered rates through each peer under the same cgroup quota: p50/p99/p99.9 from
    the scheduled send times, achieved vs offered, errors, CPU per request. `opt` names the
    cell's path and warm-up as in `budget_cells`."""
    variant = variant or {}
    opt = opt or {}
    rows = []
    for name in starters:
        try:
            peer = _start(ctx, starters, name, origin.port, variant)
        except (Unavailable, RuntimeError) as e:
            rows.append({"peer": name, "status": str(e)})
            continue
        group = Cgroup(f"sluice-bench-open-{os.getpid()}-{len(rows)}", quota_pct)
        try:
            group.enter(peer.pid)
            for rate in rates:
                r = ctx.rate(url_of(peer, file, opt), file, rate, c, secs,
                             opt.get("warm", warm), peer.pid, extra=_meter(ctx, group))
                rows.append({"peer": name, "rate": rate, "status": "ok" if "failed" not in r
                             else r["failed"], "report": r})
        finally:
            peer.stop()
            group.remove()
    return rows


NOFILE = 200_000


def raise_nofile_for_children():
    """Children inherit the suite's open-file limit: raise it (soft and hard) for the idle
    test, where each proxy holds tens of thousands of client sockets."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, max(NOFILE, hard)))
    except (ValueError, OSError):
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def idle_memory(ctx, starters, origin, file, levels, h2=False, variant=None, client_procs=1):
    """USS growth per idle keep-alive connection through each peer: `levels` (cumulative)
    clients, each after one request for `file`, spread over 8 source addresses and over
    `client_procs` load-client processes (each needs one descriptor per connection, and none
    may hold more than the hard open-file limit)."""
    variant = variant or {}
    nofile = raise_nofile_for_children()
    rows = []
    for name in starters:
        try:
            peer = _start(ctx, starters, name, origin.port, variant)
        except (Unavailable, RuntimeError) as e:
            rows.append({"peer": name, "status": str(e)})
            continue
        try:
            url = f"http://127.0.0.1:{peer.port}/{os.path.basename(file[0])}"
            args = ["idle", "--url", url, "--expect-len", str(file[1]), "--levels",
                    ",".join(map(str, levels)), "--pid", str(peer.pid),
                    "--procs", str(client_procs)]
            if h2:
                args.append("--h2")
            r = ctx.loadgen(args, timeout=600)
            rows.append({"peer": name, "status": "ok" if "failed" not in r else r["failed"],
                         "version": peer.version, "report": r, "nofile": nofile})
        finally:
            peer.stop()
    return rows


def instructions_note():
    """How instructions per request are counted on this machine."""
    try:
        r = subprocess.run(["perf", "stat", "-x,", "-e", "instructions", "true"],
                           capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and "<not supported>" not in r.stderr and "<not counted>" not in r.stderr:
            return "perf"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "callgrind"


def callgrind_self_costs(path):
    """Self (exclusive) `Ir` per function of one callgrind dump, and the dump's total: read from
    the file itself (cost lines under each `fn=`, less the inclusive cost lines that follow a
    `calls=` line), so no `callgrind_annotate` version's defaults or thresholds are involved."""
    names = {}
    costs = {}
    fn = None
    after_call = False
    total = None

    def name_of(value):
        # Name compression: "(12) name" defines 12, "(12)" refers to it.
        value = value.strip()
        if value.startswith("("):
            ref, _, rest = value.partition(")")
            rest = rest.strip()
            if rest:
                names[ref] = rest
            return names.get(ref, value)
        return value

    with open(path, errors="replace") as f:
        for line in f:
            c = line[:1]
            if c.isdigit() or c in "+-*":
                if after_call:
                    after_call = False
                    continue
                parts = line.split()
                if fn is not None and len(parts) >= 2:
                    try:
                        costs[fn] = costs.get(fn, 0) + int(parts[-1])
                    except ValueError:
                        pass
                continue
            if line.startswith("fn="):
                fn = name_of(line[3:])
            elif line.startswith("cfn="):
                name_of(line[4:])  # may define a name used later
            elif line.startswith("calls="):
                after_call = True
            elif line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
    return costs, total


def callgrind_top(path, n=12):
    """The `n` functions with the most self `Ir` in a callgrind dump: [(share %, name)]."""
    costs, total = callgrind_self_costs(path)
    total = total or sum(costs.values()) or 1
    top = sorted(costs.items(), key=lambda kv: -kv[1])[:n]
    return [(f"{100 * v / total:.1f}", name[:140]) for name, v in top]


def callgrind_per_request(ctx, start, origin, file, requests=2000, warm_requests=200,
                          scheme="http", extra=(), top=12):
    """Instructions per request of one proxy's user-space path under callgrind: started under
    valgrind (`start(ctx, origin_port, cpus, wrapper=[...])`), warmed, its counters zeroed with
    `callgrind_control -z`, `requests` requests at c = 1, then dumped (`-d`): the dump's total
    `Ir` divided by the requests. Valgrind runs the program about 50× slower, so only a count,
    never a time, is taken from it. `scheme` and `extra` (load-client arguments) pick a TLS cell.
    The result names the dump and, with `top`, the functions with the most self cost."""
    import glob
    import shutil
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        return {"status": "valgrind (callgrind) is not installed"}
    out_dir = ctx.tempdir("callgrind")
    wrapper = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_dir}/cg.%p"]
    try:
        peer = start(ctx, origin.port, ctx.proxy_cpus, wrapper=wrapper)
    except (Unavailable, RuntimeError) as e:
        return {"status": str(e)}
    try:
        url = url_of(peer, file, {"scheme": scheme})
        ctx.duration(url, file, 1, 120, 0, peer.pid, max_requests=warm_requests, extra=extra)
        procs.run(["callgrind_control", "-z", str(peer.pid)], timeout=60)
        r = ctx.duration(url, file, 1, 300, 0, peer.pid, max_requests=requests, extra=extra)
        procs.run(["callgrind_control", "-d", str(peer.pid)], timeout=60)
        time.sleep(1)
        dumps = sorted(glob.glob(f"{out_dir}/cg.{peer.pid}.*"), key=os.path.getmtime)
        if not dumps or "failed" in r:
            return {"status": r.get("failed", "no callgrind dump")}
        total = None
        with open(dumps[-1]) as f:
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    total = int(line.split()[1])
        done = r.get("ok", 0)
        out = {"status": "ok", "requests": done, "instructions": total, "dump": dumps[-1],
               "instructions_per_request": total / done if total and done else None}
        if top:
            try:
                out["top"] = callgrind_top(dumps[-1], top)
            except (OSError, ValueError, IndexError):
                pass
        return out
    finally:
        peer.stop()
