"""S7, one cache across nodes: a Zipf workload through N = 1, 3, 5 sluice nodes as a cluster, as N
independent nodes, and as a Varnish shard-director cluster, each node in its own network namespace
(veth pairs on a bridge in a hub namespace that holds the origin and the load client)."""

import json
import os
import subprocess
import time

from . import peers, procs
from .context import MiB

PREFIX = "s7b"  # namespace names: s7b<pid>h (hub), s7b<pid>n<i> (nodes)
SUBNET = "10.78.0"
ORIGIN_PORT = 9000
NODE_PORT = 8080
SECRET = "s7-cluster-secret-0123456789abcdef"
NODES = (1, 3, 5)


def params_for(quick):
    # The catalogue is four times one node's memory: one node holds a quarter of it, three
    # nodes three quarters, five all of it (less what each keeps for fills in transit).
    mem = 32
    size = 256 * 1024
    return {
        "memory_mib": mem, "object_bytes": size, "objects": 4 * mem * MiB // size, "s": 1.0,
        "c": 15, "warm_requests": 3000 if quick else 6000,
        "requests": 4000 if quick else 12000, "max_secs": 240, "host": "s7.test",
    }


def _ip(*args):
    r = procs.run(["ip", *args], timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def _sweep():
    """Removes namespaces an earlier run left behind when its process is gone."""
    r = procs.run(["ip", "netns", "list"], timeout=30)
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(PREFIX):
            continue
        pid = "".join(c for c in name[len(PREFIX):] if c.isdigit())
        if name[len(PREFIX):].startswith(pid) and pid and not os.path.exists(f"/proc/{pid}"):
            procs.run(["ip", "netns", "del", name], timeout=30)


class Net:
    """A hub namespace with a bridge at <SUBNET>.1 and `n` node namespaces at <SUBNET>.11.. ."""

    def __init__(self, n):
        _sweep()
        tag = f"{PREFIX}{os.getpid()}"
        self.hub = tag + "h"
        self.nodes = []
        _ip("netns", "add", self.hub)
        try:
            _ip("-n", self.hub, "link", "set", "lo", "up")
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.hub, "addr", "add", f"{SUBNET}.1/24", "dev", "br0")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            for i in range(1, n + 1):
                ns = f"{tag}n{i}"
                _ip("netns", "add", ns)
                self.nodes.append(ns)
                outer = f"s7v{i}x{os.getpid() % 100000}"
                _ip("-n", self.hub, "link", "add", outer, "type", "veth", "peer", "name", "eth0",
                    "netns", ns)
                _ip("-n", self.hub, "link", "set", outer, "master", "br0")
                _ip("-n", self.hub, "link", "set", outer, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "addr", "add", f"{SUBNET}.{10 + i}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except Exception:
            self.close()
            raise

    @staticmethod
    def addr(i):
        return f"{SUBNET}.{10 + i}"

    def exec(self, ns, argv):
        return ["ip", "netns", "exec", ns, *argv]

    def close(self):
        for ns in [*self.nodes, self.hub]:
            procs.run(["ip", "netns", "del", ns], timeout=30)
        self.nodes = []


def _hub_get(net, url):
    """GET `url` from inside the hub namespace; the body."""
    code = ("import sys, urllib.request as u; o = u.build_opener(u.ProxyHandler({})); "
            "sys.stdout.write(o.open(sys.argv[1], timeout=10).read().decode())")
    r = procs.run(net.exec(net.hub, ["python3", "-c", code, url]), timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"GET {url}: {r.stderr.strip()[-300:]}")
    return r.stdout


def _wait_port(net, host, port, proc, timeout=30.0):
    code = ("import socket, sys, time\n"
            "end = time.monotonic() + float(sys.argv[3])\n"
            "while True:\n"
            "    try:\n"
            "        socket.create_connection((sys.argv[1], int(sys.argv[2])), 0.5).close(); break\n"
            "    except OSError:\n"
            "        if time.monotonic() > end: sys.exit(1)\n"
            "        time.sleep(0.1)\n")
    r = procs.run(net.exec(net.hub, ["python3", "-c", code, host, str(port), str(timeout)]),
                  timeout=timeout + 10)
    if r.returncode != 0 or proc.poll() is not None:
        raise RuntimeError(f"{host}:{port} did not come up")


def _tree_rss_kib(pid):
    """RSS of a process and all its descendants, KiB."""
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += kids.get(p, [])
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


SLUICE_NODE = """# S7: one sluice node (its memory tier only), in its own network namespace
[server]
listen = ["{me}:{port}"]
per_ip_exempt = ["{subnet}.0/24"]
[upstream]
allow_private = true
[reverse]
via = false
[[upstreams]]
name = "origin"
servers = ["{subnet}.1:{origin}"]
[[routes]]
path = "/"
upstream = "origin"
cache = true
[cache]
memory_bytes = "{memory_mib}MiB"
slice_bytes = "1MiB"
{cluster}"""

SLUICE_CLUSTER = """[cache.cluster]
self = "{me}:{port}"
peers = [{peers}]
secret = "{secret}"
rampup_secs = 0
"""

# Self-routing: each node looks a request up in its own cache; a miss goes to the URL's owner on
# the shard ring (marked, so the owner fills from the origin), or to the origin on the owner.
# `{non_owner}` is empty (non-owners keep a copy of what they fetched, the documented Varnish
# cluster) or `return (pass);` (non-owners keep nothing: one copy per object, like sluice).
VARNISH_SHARD = """vcl 4.1;
import directors;
{backends}
backend origin {{ .host = "{subnet}.1"; .port = "{origin}"; }}
sub vcl_init {{
    new ring = directors.shard();
{adds}
    ring.reconfigure();
}}
sub vcl_recv {{
    if (req.http.X-Shard-Hop) {{
        set req.backend_hint = origin;
    }} else {{
        set req.backend_hint = ring.backend(by=URL, resolve=NOW);
        if (req.backend_hint == n{me}) {{
            set req.backend_hint = origin;
        }} else {{
            set req.http.X-Shard-Hop = "1";
            {non_owner}
        }}
    }}
}}
"""

VARNISH_ALONE = """vcl 4.1;
backend origin {{ .host = "{subnet}.1"; .port = "{origin}"; }}
"""


def _start_nodes(ctx, net, kind, n, memory_mib):
    """Starts `n` nodes of `kind` ("cluster", "independent", "varnish", "varnish-pass"); their
    processes."""
    live = []
    peers_ = ", ".join(f'"{Net.addr(i)}:{NODE_PORT}"' for i in range(1, n + 1))
    for i in range(1, n + 1):
        me = Net.addr(i)
        d = ctx.tempdir(f"s7-{kind}-{i}")
        if kind in ("cluster", "independent"):
            cluster = "" if kind == "independent" or n == 1 else SLUICE_CLUSTER.format(
                me=me, port=NODE_PORT, peers=peers_, secret=SECRET)
            conf = os.path.join(d, "sluice.toml")
            with open(conf, "w") as f:
                f.write(SLUICE_NODE.format(me=me, port=NODE_PORT, subnet=SUBNET, origin=ORIGIN_PORT,
                                           memory_mib=memory_mib, cluster=cluster))
            argv = net.exec(net.nodes[i - 1], [ctx.sluice_bin, "serve", "--config", conf])
            # A listener other hosts can reach needs a password (routes do not ask for it).
            env = {"RUST_LOG": "warn", "SLUICE_AUTH_API_PASSWORD": "s7-password"}
        else:
            varnishd = peers.ensure_binary("varnishd")
            if n == 1:
                vcl = VARNISH_ALONE.format(subnet=SUBNET, origin=ORIGIN_PORT)
            else:
                vcl = VARNISH_SHARD.format(
                    backends="\n".join(f'backend n{j} {{ .host = "{Net.addr(j)}"; '
                                       f'.port = "{NODE_PORT}"; }}' for j in range(1, n + 1)),
                    adds="\n".join(f"    ring.add_backend(n{j});" for j in range(1, n + 1)),
                    subnet=SUBNET, origin=ORIGIN_PORT, me=i,
                    non_owner="return (pass);" if kind == "varnish-pass" else "")
            path = os.path.join(d, "s7.vcl")
            with open(path, "w") as f:
                f.write(vcl)
            argv = net.exec(net.nodes[i - 1], [
                varnishd, "-F", "-j", "none", "-n", os.path.join(d, "n"),
                "-a", f"{me}:{NODE_PORT}", "-f", path, "-s", f"malloc,{memory_mib}m",
                "-T", "none"])
            env = None
        ctx.note(argv)
        live.append(procs.start(argv, os.path.join(d, "out.log"), env=env))
    for i, p in enumerate(live, start=1):
        _wait_port(net, Net.addr(i), NODE_PORT, p, timeout=60)
    return live


def _zipf(ctx, net, n, p, requests, seed):
    targets = ",".join(f"{Net.addr(i)}:{NODE_PORT}" for i in range(1, n + 1))
    argv = net.exec(net.hub, [
        ctx.loadgen_bin, "zipf", "--targets", targets, "--objects", str(p["objects"]),
        "--size", str(p["object_bytes"]), "--s", str(p["s"]), "--requests", str(requests),
        "--c", str(p["c"]), "--seed", str(seed), "--host", p["host"],
        "--max-secs", str(p["max_secs"])])
    ctx.note(argv)
    r = procs.run(argv, timeout=p["max_secs"] + 60)
    if r.returncode != 0:
        raise RuntimeError(f"zipf client: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout)


def _one(ctx, net, kind, n, memory_mib, p):
    """One setup: nodes started cold, a warm-up pass, then the measured pass."""
    stats = f"http://{SUBNET}.1:{ORIGIN_PORT}/__stats"
    live = _start_nodes(ctx, net, kind, n, memory_mib)
    try:
        _zipf(ctx, net, n, p, p["warm_requests"], seed=1)
        before = json.loads(_hub_get(net, stats))
        run = _zipf(ctx, net, n, p, p["requests"], seed=2)
        # Fills run detached from their clients: let the last ones land.
        time.sleep(0.5)
        after = json.loads(_hub_get(net, stats))
        rss = [_tree_rss_kib(proc.pid) for proc in live]
    finally:
        for proc in live:
            procs.stop(proc)
    origin_bytes = after["body_bytes"] - before["body_bytes"]
    origin_requests = after["requests"] - before["requests"]
    return {
        "kind": kind, "n": n, "memory_mib": memory_mib,
        "requests": run["ok"], "errors": run["errors"], "error_kinds": run["error_kinds"],
        "client_bytes": run["bytes"], "origin_bytes": origin_bytes,
        "origin_requests": origin_requests,
        "hit_ratio": 1 - origin_requests / max(run["ok"], 1),
        "origin_per_client_byte": origin_bytes / max(run["bytes"], 1),
        "p50_ms": run["p50_ms"], "p99_ms": run["p99_ms"], "rps": run["rps"],
        "rss_mib": [round(k / 1024, 1) for k in rss],
    }


def run(ctx):
    p = params_for(ctx.quick)
    if os.geteuid() != 0:
        return {"id": "S7", "title": TITLE, "status": "needs root (ip netns)", "question": QUESTION}
    want = [k.strip() for k in os.environ.get("S7_KINDS", "").split(",") if k.strip()]
    kinds = want or ["cluster", "independent", "varnish", "varnish-pass"]
    net = Net(max(NODES))
    origin = None
    rows = []
    try:
        d = ctx.tempdir("s7-origin")
        argv = net.exec(net.hub, [ctx.loadgen_bin, "origin", "--bind", f"{SUBNET}.1",
                                  "--port", str(ORIGIN_PORT), "--threads", "1"])
        ctx.note(argv)
        origin = procs.start(argv, os.path.join(d, "out.log"))
        _wait_port(net, f"{SUBNET}.1", ORIGIN_PORT, origin)
        # The baselines the goal is held to: one sluice node with N times the memory.
        for n in NODES:
            for kind in kinds:
                if n == 1 and kind not in ("cluster", "varnish"):
                    continue  # one node: a cluster of one is an independent node
                print(f"S7: {kind} N={n}", flush=True)
                rows.append(_one(ctx, net, kind, n, p["memory_mib"], p))
                print(f"    {rows[-1]}", flush=True)
            if n > 1 and "cluster" in kinds:
                print(f"S7: one node with {n}x the memory", flush=True)
                rows.append(_one(ctx, net, "cluster", 1, n * p["memory_mib"], p))
                rows[-1]["kind"] = "one node, N x memory"
                rows[-1]["for_n"] = n
                print(f"    {rows[-1]}", flush=True)
    finally:
        if origin is not None:
            procs.stop(origin)
        net.close()
    return {"id": "S7", "title": TITLE, "status": "measured", "quick": ctx.quick, "params": p,
            "rows": rows, "question": QUESTION,
            "varnish": peers.version_of(["varnishd", "-V"])}


TITLE = "One cache across nodes"
QUESTION = ("A Zipf workload (s = 1.0) over a catalogue four times one node's memory, through "
            "N = 1, 3, 5 nodes each in its own network namespace: how often does the cluster "
            "answer without the origin, how many origin bytes per client byte, what p99, what "
            "memory per node; sluice as one cluster, as N independent nodes, and a Varnish "
            "cluster self-routing with the shard director.")

LABELS = {
    "cluster": "sluice cluster",
    "independent": "sluice, N independent nodes",
    "varnish": "Varnish shard (non-owners keep copies)",
    "varnish-pass": "Varnish shard (non-owners pass)",
    "one node, N x memory": "sluice, one node with N × the memory",
}


def render(r, _out_dir=None, _charts_rel=None):
    p = r["params"]
    lines = [
        f"Catalogue: {p['objects']} objects of {p['object_bytes'] // 1024} KiB "
        f"({p['objects'] * p['object_bytes'] // MiB} MiB), Zipf s = {p['s']}; each node "
        f"{p['memory_mib']} MiB of cache memory (sluice `memory_bytes`, memory tier only; "
        f"Varnish `-s malloc`). `sluice-loadgen zipf` from the hub namespace, c = {p['c']} "
        f"keep-alive connections, connection i to node i mod N (what an L4 balancer does with "
        f"persistent connections); the same seeded requests for every setup: "
        f"{p['warm_requests']} to warm up, then {p['requests']} measured. Hit ratio = 1 − origin "
        f"requests ÷ client requests (every object is one slice, one origin request per miss). "
        f"Memory: RSS of each node's process tree after the run. No CPU pinning; the machine is "
        f"shared, so p99 is indicative only.",
        "",
        "| setup | N | hit ratio | origin bytes / client byte | p50 ms | p99 ms | req/s | "
        "RSS per node MiB | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        label = LABELS.get(row["kind"], row["kind"])
        n = row.get("for_n", row["n"])
        if row["kind"] == "one node, N x memory":
            label += f" ({row['memory_mib']} MiB)"
        lines.append(
            f"| {label} | {n} | {row['hit_ratio']:.3f} | {row['origin_per_client_byte']:.3f} | "
            f"{row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['rps']:.0f} | "
            f"{', '.join(str(x) for x in row['rss_mib'])} | {row['errors']} |")
    lines += ["", *goals(r)]
    # Hand-written findings about these runs (kept beside the results, so a re-render keeps them).
    notes = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "benchmarks", "s7-notes.md")
    if os.path.exists(notes):
        with open(notes) as f:
            lines += ["", f.read().rstrip("\n")]
    return "\n".join(lines)


def goals(r):
    """The issue's two goals, judged per N."""
    rows = r["rows"]
    out = []
    for n in NODES[1:]:
        c = next((x for x in rows if x["kind"] == "cluster" and x["n"] == n), None)
        one = next((x for x in rows if x.get("for_n") == n), None)
        v = [x for x in rows if x["kind"].startswith("varnish") and x["n"] == n]
        if c and one:
            ratio = c["origin_bytes"] / max(one["origin_bytes"], 1)
            out.append(f"- N = {n}: origin bytes {ratio:.3f}× those of one node with {n}× the "
                       f"memory (goal ≤ 1.05: {'met' if ratio <= 1.05 else 'not met'}).")
        for x in v:
            if c:
                ok = c["hit_ratio"] >= x["hit_ratio"]
                out.append(f"- N = {n}: hit ratio {c['hit_ratio']:.3f} vs "
                           f"{LABELS[x['kind']]} {x['hit_ratio']:.3f} at equal memory "
                           f"(goal ≥: {'met' if ok else 'not met'}).")
    return out
