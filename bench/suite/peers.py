"""Peers under test: idempotent installation from package registries, config files, start/stop."""

import os
import shutil
import subprocess
import sys

from . import procs

MEDIAFLOW_VERSION = "2.4.9"
APT_PACKAGES = {"nginx": ["nginx-light", "nginx"], "varnishd": ["varnish"], "haproxy": ["haproxy"]}


class Peer:
    """One running server: its process (the root of the tree we sample) and where it listens."""

    def __init__(self, name, proc, port, version=""):
        self.name, self.proc, self.port, self.version = name, proc, port, version

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        procs.stop(self.proc)


class Unavailable(Exception):
    """A peer that could not be installed or started; reported in the output, never hidden."""


# === installation ===

_apt_updated = False


def _apt_install(names):
    global _apt_updated
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if not _apt_updated:
        procs.run(["apt-get", "update", "-qq"], timeout=300, env=env)
        _apt_updated = True
    for name in names:
        r = procs.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", name],
                      timeout=600, env=env)
        if r.returncode == 0:
            return name
    return None


def ensure_binary(binary):
    """Returns the path of `binary` (nginx, varnishd, haproxy), installing its Debian package if
    missing. Installing never starts anything we use: the suite runs its own instances."""
    path = shutil.which(binary) or (f"/usr/sbin/{binary}" if os.path.exists(f"/usr/sbin/{binary}") else None)
    if path:
        return path
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Unavailable(f"{binary} is not installed and apt-get is not usable here")
    if not _apt_install(APT_PACKAGES[binary]):
        raise Unavailable(f"apt-get could not install {' or '.join(APT_PACKAGES[binary])}")
    path = shutil.which(binary) or f"/usr/sbin/{binary}"
    if not os.path.exists(path):
        raise Unavailable(f"{binary} still missing after installing its package")
    return path


def ensure_mediaflow(work):
    """A venv under bench/work with mediaflow-proxy pinned; returns its uvicorn path."""
    venv = os.path.join(work, "venv")
    uvicorn = os.path.join(venv, "bin", "uvicorn")
    marker = os.path.join(venv, f".mediaflow-{MEDIAFLOW_VERSION}")
    if os.path.exists(marker) and os.path.exists(uvicorn):
        return uvicorn
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        r = procs.run([sys.executable, "-m", "venv", venv], timeout=300)
        if r.returncode != 0:
            raise Unavailable(f"python venv failed: {r.stderr.strip()[-300:]}")
    pip = os.path.join(venv, "bin", "pip")
    r = procs.run([pip, "install", "-q", f"mediaflow-proxy=={MEDIAFLOW_VERSION}"], timeout=1200)
    if r.returncode != 0 or not os.path.exists(uvicorn):
        raise Unavailable(f"pip install mediaflow-proxy=={MEDIAFLOW_VERSION} failed: "
                          f"{r.stderr.strip()[-300:]}")
    open(marker, "w").close()
    return uvicorn


def ensure_goproxy(bench_dir, work):
    """Builds bench/goproxy when the binary is missing or older than its source."""
    src = os.path.join(bench_dir, "goproxy")
    out = os.path.join(work, "bin", "goproxy")
    newest = max(os.path.getmtime(os.path.join(src, f)) for f in os.listdir(src))
    if os.path.exists(out) and os.path.getmtime(out) >= newest:
        return out
    if not shutil.which("go"):
        raise Unavailable("go toolchain not found")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    r = procs.run(["go", "build", "-o", out, "."], timeout=600, cwd=src)
    if r.returncode != 0:
        raise Unavailable(f"go build failed: {r.stderr.strip()[-300:]}")
    return out


def sluice_has_serve(binary):
    """True when the sluice binary exists and its CLI offers `serve`."""
    if not os.path.exists(binary):
        return False
    try:
        r = procs.run([binary, "serve", "--help"], timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "--listen" in (r.stdout + r.stderr)


def version_of(argv):
    try:
        r = procs.run(argv, timeout=20)
        text = (r.stdout + r.stderr).strip().splitlines()
        return text[0] if text else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


# === configs and start ===

# What every nginx config here starts with (one worker pool, no daemon, logs and pid in its own
# directory), and the temp paths nginx insists on even when nothing is buffered to disk.
_NGINX_TOP = """worker_processes {workers};
daemon off;
master_process on;
user root;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
worker_rlimit_nofile {nofile};
events {{ worker_connections {connections}; use epoll; }}
http {{
    access_log off;
"""
_NGINX_TEMP_PATHS = """    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
"""

NGINX_ORIGIN = """# origin for the benchmark: static files, keep-alive, sendfile
""" + _NGINX_TOP + """    default_type application/octet-stream;
    types {{ application/vnd.apple.mpegurl m3u8; video/mp2t ts; }}
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 90s;
    keepalive_requests 100000;
    open_file_cache max=64 inactive=60s;
""" + _NGINX_TEMP_PATHS + """    server {{
        listen 127.0.0.1:{port} reuseport backlog=4096;
        root {root};
        location / {{ }}
    }}
}}
"""

NGINX_PROXY = """# nginx as a plain reverse proxy (proxy_pass, pooled keep-alive to the origin, no cache)
""" + _NGINX_TOP + """    keepalive_timeout 90s;
    keepalive_requests 100000;
""" + _NGINX_TEMP_PATHS + """    upstream origin {{
{servers}
        keepalive 256;
        keepalive_requests 100000;
    }}
    server {{
        listen 127.0.0.1:{port} reuseport backlog=4096{listen_opts};
{server_extra}        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""

VARNISH_PASS = """vcl 4.1;
# Varnish in pass mode: every request goes to the origin(s), round robin, nothing is cached
import directors;
{backends}
sub vcl_init {{
    new rr = directors.round_robin();
{adds}
}}
sub vcl_recv {{
    set req.backend_hint = rr.backend();
    return (pass);
}}
"""

HAPROXY_HTTP = """# HAProxy in HTTP mode in front of the origin, connection reuse on
global
    maxconn {maxconn}
    nbthread {threads}
{global_extra}defaults
    mode http
    http-reuse always
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
frontend in
    bind 127.0.0.1:{port}{bind_opts}
    default_backend origin
backend origin
    balance roundrobin
{servers}
"""

HAPROXY_TCP = """# HAProxy in TCP mode in front of the origin
global
    maxconn 8000
    nbthread {threads}
defaults
    mode tcp
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend in
    bind 127.0.0.1:{port}
    default_backend origin
backend origin
    server o1 127.0.0.1:{upstream}
"""


def start_origin(ctx, root, cpus):
    nginx = ensure_binary("nginx")
    d = ctx.tempdir("origin")
    port = procs.free_port()
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_ORIGIN.format(workers=ctx.origin_workers, dir=d, port=port, root=root,
                                    connections=8192, nofile=17408))
    argv = [nginx, "-p", d, "-c", conf]
    ctx.note(argv)
    p = procs.start(argv, os.path.join(d, "out.log"), cpus=cpus)
    procs.wait_tcp(port, p)
    return Peer("nginx origin", p, port, version_of([nginx, "-v"]))


def start_mediaflow(ctx, password, cpus):
    uvicorn = ensure_mediaflow(ctx.work)
    d = ctx.tempdir("mediaflow")
    port = procs.free_port()
    argv = [uvicorn, "mediaflow_proxy.main:app", "--host", "127.0.0.1", "--port", str(port),
            "--workers", "2", "--no-access-log", "--log-level", "warning"]
    ctx.note(argv, {"API_PASSWORD": password})
    p = procs.start(argv, os.path.join(d, "out.log"), cpus=cpus, cwd=d,
                    env={"API_PASSWORD": password})
    procs.wait_http(f"http://127.0.0.1:{port}/health", p, timeout=120)
    return Peer("MediaFlow", p, port, f"mediaflow-proxy {MEDIAFLOW_VERSION}, uvicorn 2 workers")


def start_sluice(ctx, password, cpus, extra_args=(), env=None, binary=None):
    """sluice on a free loopback port; `extra_args` and `env` (SLUICE_* overrides) are added.
    `binary` picks another build (the gateway-only router build) than the release one."""
    binary = binary or ctx.sluice_bin
    if not os.path.exists(binary):
        raise Unavailable(f"not built ({os.path.relpath(binary, ctx.repo)})")
    if not sluice_has_serve(binary):
        raise Unavailable("not built (this branch's sluice has no `serve` command yet)")
    d = ctx.tempdir("sluice")
    port = procs.free_port()
    # The password goes through the environment: argv is readable by every user in /proc.
    env = {"SLUICE_AUTH_API_PASSWORD": password, **(env or {})}
    argv = [binary, "serve", "--listen", f"127.0.0.1:{port}",
            "--allow-private-upstreams", *extra_args]
    ctx.note(argv, env)
    p = procs.start(argv, os.path.join(d, "out.log"), cpus=cpus,
                    env={"RUST_LOG": "warn", **env})
    procs.wait_tcp(port, p)
    return Peer("sluice", p, port, version_of([binary, "--version"]))


SLUICE_REVERSE = """# sluice as a plain reverse proxy: one route, one upstream group, no access log
[server]
listen = ["127.0.0.1:{port}"]
runtime = "{runtime}"
threads = {threads}
h1_fast_path = {fast}
{server_extra}[reverse]
via = false
{reverse_extra}[[upstreams]]
name = "origin"
servers = [{servers}]
[[routes]]
path = "/"
upstream = "origin"
"""


def start_sluice_reverse(ctx, upstream_port, cpus, runtime="work-stealing", fast_path=True,
                         busy_poll_us=None, wrapper=(), max_connections=None, tls=None,
                         http3=False, pool_max_idle=None):
    """sluice's reverse proxy in front of one origin port or a round-robin group of them, under
    the runtime model `runtime` ("work-stealing" or "per-core"), with as many threads as the
    other proxies get (`ctx.proxy_threads`); `fast_path` is `server.h1_fast_path`;
    `busy_poll_us` sets `server.busy_poll_us` (None: the default); `wrapper` is put before the
    command (callgrind); `max_connections` sets `server.max_connections` (the idle test); `tls`
    (a `tls_budget.Certs`) makes the listener TLS (HTTP/2 and 1.1 by ALPN); `http3` (with
    `tls`) serves HTTP/3 on the same port over UDP; `pool_max_idle` sets
    `reverse.pool_max_idle_per_server` (the idle test: nginx's `keepalive 256`)."""
    if not sluice_has_serve(ctx.sluice_bin):
        raise Unavailable("not built (this branch's sluice has no `serve` command yet)")
    d = ctx.tempdir("sluice-reverse")
    port = procs.free_port()
    servers = ", ".join(f'"127.0.0.1:{p}"' for p in _ports(upstream_port))
    conf = _write(d, "sluice.toml", SLUICE_REVERSE.format(
        port=port, servers=servers, runtime=runtime, threads=ctx.proxy_threads,
        fast="true" if fast_path else "false",
        server_extra=("" if busy_poll_us is None else f"busy_poll_us = {busy_poll_us}\n")
        + ("" if max_connections is None else f"max_connections = {max_connections}\n")
        + ("" if tls is None else f'tls_cert = "{tls.cert}"\ntls_key = "{tls.key}"\n')
        + ("[server.http3]\nenabled = true\n" if http3 else ""),
        reverse_extra=("" if pool_max_idle is None
                       else f"pool_max_idle_per_server = {pool_max_idle}\n")))
    argv = [*wrapper, ctx.sluice_bin, "serve", "--config", conf]
    ctx.note(argv)
    p = procs.start(argv, os.path.join(d, "out.log"), cpus=cpus, env={"RUST_LOG": "warn"})
    procs.wait_tcp(port, p, timeout=120 if wrapper else 30)
    name = f"sluice ({runtime})" if fast_path else f"sluice ({runtime}, hyper path)"
    return Peer(name, p, port, version_of([ctx.sluice_bin, "--version"]))


SLUICE_TCP = """\
[server]
listen = ["127.0.0.1:{http_port}"]
{server_extra}
[[upstreams]]
name = "origin"
servers = ["127.0.0.1:{upstream}"]

[[tcp]]
listen = "127.0.0.1:{port}"
upstream = "origin"
"""


def start_sluice_tcp(ctx, upstream_port, cpus, busy_poll_us=None):
    """sluice's TCP front end (`[[tcp]]`, splice relay) in front of `upstream_port`;
    `busy_poll_us` sets `server.busy_poll_us` (None: the default)."""
    if not sluice_has_serve(ctx.sluice_bin):
        raise Unavailable("not built (this branch's sluice has no `serve` command yet)")
    d = ctx.tempdir("sluice-tcp")
    port, http_port = procs.free_port(), procs.free_port()
    conf = _write(d, "sluice.toml", SLUICE_TCP.format(
        port=port, http_port=http_port, upstream=upstream_port,
        server_extra="" if busy_poll_us is None else f"busy_poll_us = {busy_poll_us}\n"))
    argv = [ctx.sluice_bin, "serve", "--config", conf]
    ctx.note(argv)
    p = procs.start(argv, os.path.join(d, "out.log"), cpus=cpus, env={"RUST_LOG": "warn"})
    procs.wait_tcp(port, p)
    return Peer("sluice", p, port, version_of([ctx.sluice_bin, "--version"]))


def start_haproxy_tcp(ctx, upstream_port, cpus):
    haproxy = ensure_binary("haproxy")
    d = ctx.tempdir("haproxy")
    port = procs.free_port()
    conf = os.path.join(d, "haproxy.cfg")
    with open(conf, "w") as f:
        f.write(HAPROXY_TCP.format(threads=ctx.proxy_threads, port=port, upstream=upstream_port))
    argv = [haproxy, "-db", "-f", conf]
    ctx.note(argv)
    p = procs.start(argv, os.path.join(d, "out.log"), cpus=cpus)
    procs.wait_tcp(port, p)
    return Peer("HAProxy tcp", p, port, version_of([haproxy, "-v"]))


def start_goproxy(ctx, upstream_port, cpus):
    binary = ensure_goproxy(ctx.bench_dir, ctx.work)
    d = ctx.tempdir("goproxy")
    port = procs.free_port()
    argv = [binary, "-listen", f"127.0.0.1:{port}", "-upstream", f"127.0.0.1:{upstream_port}"]
    ctx.note(argv)
    p = procs.start(argv, os.path.join(d, "out.log"), cpus=cpus)
    procs.wait_tcp(port, p)
    return Peer("Go io.Copy", p, port, version_of(["go", "version"]))


def _write(d, name, text):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def _ports(upstream):
    """One origin port, or a list of them (a round-robin group)."""
    return list(upstream) if isinstance(upstream, (list, tuple)) else [upstream]


def start_nginx_proxy(ctx, upstream_port, cpus, connections=8192, h2c=False, tls=None,
                      wrapper=()):
    """nginx `proxy_pass`; `connections` is worker_connections (the idle test raises it), `h2c`
    makes the listener HTTP/2 by prior knowledge; `tls` (a `tls_budget.Certs`) makes it TLS with
    HTTP/2 and 1.1 by ALPN, TLS 1.2 and 1.3, a shared session cache beside the default
    tickets; `wrapper` is put before the command (callgrind), and then nginx runs as one process
    (`master_process off`), so the wrapper sees the process that serves."""
    nginx = ensure_binary("nginx")
    d = ctx.tempdir("nginx-proxy")
    port = procs.free_port()
    servers = "\n".join(f"        server 127.0.0.1:{p};" for p in _ports(upstream_port))
    conf = _write(d, "nginx.conf", NGINX_PROXY.format(
        workers=ctx.proxy_threads, dir=d, port=port, servers=servers,
        connections=connections, nofile=2 * connections + 1024,
        listen_opts=" ssl http2" if tls else " http2" if h2c else "",
        server_extra="" if tls is None else (
            f"        ssl_certificate {tls.cert};\n        ssl_certificate_key {tls.key};\n"
            # nginx 1.22 (Debian 12) still defaults to TLSv1 TLSv1.1 TLSv1.2; 1.23.4 added
            # TLS 1.3 to the default. Offer what sluice and HAProxy offer.
            "        ssl_protocols TLSv1.2 TLSv1.3;\n"
            "        ssl_session_cache shared:SSL:10m;\n")))
    if wrapper:
        with open(conf) as f:
            text = f.read()
        with open(conf, "w") as f:
            f.write(text.replace("master_process on;", "master_process off;"))
    argv = [*wrapper, nginx, "-p", d, "-c", conf]
    ctx.note(argv)
    p = procs.start(argv, os.path.join(d, "out.log"), cpus=cpus)
    procs.wait_tcp(port, p, timeout=120 if wrapper else 30)
    return Peer("nginx proxy_pass", p, port, version_of([nginx, "-v"]))


def start_varnish_pass(ctx, upstream_port, cpus):
    varnishd = ensure_binary("varnishd")
    d = ctx.tempdir("varnish")
    port = procs.free_port()
    ports = _ports(upstream_port)
    backends = "\n".join(f'backend o{i} {{ .host = "127.0.0.1"; .port = "{p}"; }}'
                          for i, p in enumerate(ports))
    adds = "\n".join(f"    rr.add_backend(o{i});" for i in range(len(ports)))
    vcl = _write(d, "pass.vcl", VARNISH_PASS.format(backends=backends, adds=adds))
    # -F: foreground; -j none: no privilege separation, so the temp dir needs no special owner.
    argv = [varnishd, "-F", "-j", "none", "-n", os.path.join(d, "n"), "-a", f"127.0.0.1:{port}",
            "-f", vcl, "-s", "malloc,64m", "-T", "none"]
    ctx.note(argv)
    p = procs.start(argv, os.path.join(d, "out.log"), cpus=cpus)
    procs.wait_tcp(port, p, timeout=60)
    return Peer("Varnish pass", p, port, version_of([varnishd, "-V"]))


def start_haproxy_http(ctx, upstream_port, cpus, maxconn=8000, h2c=False, busy_polling=False,
                       ulimit_n=None, tls=None, strict_limits=True, wrapper=()):
    """HAProxy `mode http`; `maxconn` and `ulimit_n` (the idle test raises the one and pins the
    other to the hard limit it may not exceed; `strict_limits=False` lets HAProxy start when
    that limit is below the two descriptors per connection it reserves), `h2c` (`proto h2` on
    the bind), `busy_polling` (its global `busy-polling`), `tls` (a `tls_budget.Certs`: `ssl
    crt` with ALPN h2 and http/1.1; its session cache and tickets as shipped); `wrapper` is put
    before the command (callgrind)."""
    haproxy = ensure_binary("haproxy")
    d = ctx.tempdir("haproxy-http")
    port = procs.free_port()
    servers = "\n".join(f"    server o{i} 127.0.0.1:{p}"
                         for i, p in enumerate(_ports(upstream_port)))
    conf = _write(d, "haproxy.cfg", HAPROXY_HTTP.format(
        threads=ctx.proxy_threads, port=port, servers=servers, maxconn=maxconn,
        global_extra=("    busy-polling\n" if busy_polling else "")
        + (f"    ulimit-n {ulimit_n}\n" if ulimit_n else "")
        + ("" if strict_limits else "    no strict-limits\n"),
        bind_opts=(f" ssl crt {tls.combined} alpn h2,http/1.1" if tls
                   else " proto h2" if h2c else "")))
    argv = [*wrapper, haproxy, "-db", "-f", conf]
    ctx.note(argv)
    p = procs.start(argv, os.path.join(d, "out.log"), cpus=cpus)
    procs.wait_tcp(port, p, timeout=120 if wrapper else 30)
    return Peer("HAProxy http", p, port, version_of([haproxy, "-v"]))


# === S4: caches in front of the generated origin ===

def start_gen_origin(ctx, cpus, swr_delay_ms, pace_mbps=0):
    """`sluice-loadgen origin`: generated objects of any size (`/gen/<size>/<name>`, fresh for a
    day; `/swr/<size>/<name>`, fresh for 1 s with stale-while-revalidate and a slow answer), with
    Range, ETag / Last-Modified, 304s, and counters of requests and body bytes sent (`/__stats`);
    `pace_mbps` sends each body at that rate after its first chunk (a slow miss)."""
    if not os.path.exists(ctx.loadgen_bin):
        raise Unavailable(f"not built ({os.path.relpath(ctx.loadgen_bin, ctx.repo)})")
    d = ctx.tempdir("gen-origin")
    port = procs.free_port()
    argv = [ctx.loadgen_bin, "origin", "--port", str(port), "--swr-delay-ms", str(swr_delay_ms),
            "--threads", "1" if ctx.pin else "2", *(["--pace-mbps", str(pace_mbps)] if pace_mbps
                                                   else [])]
    ctx.note(argv)
    p = procs.start(argv, os.path.join(d, "out.log"), cpus=cpus)
    procs.wait_tcp(port, p)
    return Peer("generated origin", p, port, "sluice-loadgen origin")


SLUICE_CACHE = """# sluice's reverse proxy with the slice cache on its one route: memory and disk tiers
[server]
listen = ["127.0.0.1:{port}"]
[reverse]
via = false
[cache]
memory_bytes = "{memory_mib}MiB"
disk_path = "{cache_dir}"
disk_bytes = "{disk_mib}MiB"
slice_bytes = "1MiB"
[[upstreams]]
name = "origin"
servers = ["127.0.0.1:{upstream}"]
[[routes]]
path = "/"
upstream = "origin"
cache = true
"""

NGINX_CACHE = """# nginx proxy_cache with the slice module, cache lock and background stale updates
""" + _NGINX_TOP + """    keepalive_timeout 90s;
    keepalive_requests 100000;
""" + _NGINX_TEMP_PATHS + """    proxy_cache_path {cache_dir} levels=1:2 keys_zone=s4:32m max_size={disk_mib}m inactive=1d
                     use_temp_path=off;
    upstream origin {{
        server 127.0.0.1:{upstream};
        keepalive 256;
        keepalive_requests 100000;
    }}
    server {{
        listen 127.0.0.1:{port} reuseport backlog=4096;
        location / {{
            slice 1m;
            proxy_cache s4;
            proxy_cache_key $uri$is_args$args$slice_range;
            proxy_set_header Range $slice_range;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass http://origin;
            proxy_cache_valid 200 206 1h;
            proxy_cache_lock on;
            proxy_cache_use_stale updating error timeout;
            proxy_cache_background_update on;
            add_header X-Cache-Status $upstream_cache_status;
        }}
    }}
}}
"""

VARNISH_CACHE = """vcl 4.1;
# Varnish with its built-in caching logic (Cache-Control, stale-while-revalidate as grace)
backend origin {{ .host = "127.0.0.1"; .port = "{upstream}"; }}
"""


def start_sluice_cache(ctx, upstream_port, cpus, cache_dir, memory_mib, disk_mib, port=None):
    """sluice's reverse proxy with `cache = true`; `cache_dir` holds the disk tier (reuse it, and
    `port`, to restart warm: the cache key names the Host the client sent)."""
    if not sluice_has_serve(ctx.sluice_bin):
        raise Unavailable("not built (this branch's sluice has no `serve` command yet)")
    d = ctx.tempdir("sluice-cache")
    port = port or procs.free_port()
    conf = _write(d, "sluice.toml", SLUICE_CACHE.format(
        port=port, upstream=upstream_port, cache_dir=cache_dir, memory_mib=memory_mib,
        disk_mib=disk_mib))
    argv = [ctx.sluice_bin, "serve", "--config", conf]
    ctx.note(argv)
    p = procs.start(argv, os.path.join(d, "out.log"), cpus=cpus, env={"RUST_LOG": "warn"})
    procs.wait_tcp(port, p)
    return Peer("sluice", p, port, version_of([ctx.sluice_bin, "--version"]))


def start_nginx_cache(ctx, upstream_port, cpus, cache_dir, memory_mib, disk_mib, port=None):
    """nginx `proxy_cache` + `slice 1m`; its store is the disk (`cache_dir`, reuse it to restart
    warm) plus the kernel's page cache, so `memory_mib` has no nginx setting."""
    del memory_mib
    nginx = ensure_binary("nginx")
    d = ctx.tempdir("nginx-cache")
    port = port or procs.free_port()
    conf = _write(d, "nginx.conf", NGINX_CACHE.format(
        workers=ctx.proxy_threads, dir=d, port=port, upstream=upstream_port,
        cache_dir=cache_dir, disk_mib=disk_mib, connections=8192, nofile=17408))
    argv = [nginx, "-p", d, "-c", conf]
    ctx.note(argv)
    p = procs.start(argv, os.path.join(d, "out.log"), cpus=cpus)
    procs.wait_tcp(port, p)
    return Peer("nginx proxy_cache + slice", p, port, version_of([nginx, "-v"]))


def start_varnish_cache(ctx, upstream_port, cpus, cache_dir, memory_mib, disk_mib, port=None):
    """Varnish with `-s malloc,<memory_mib>m`: memory only, nothing survives a restart."""
    del disk_mib
    varnishd = ensure_binary("varnishd")
    d = ctx.tempdir("varnish-cache")
    port = port or procs.free_port()
    vcl = _write(d, "cache.vcl", VARNISH_CACHE.format(upstream=upstream_port))
    argv = [varnishd, "-F", "-j", "none", "-n", os.path.join(cache_dir, "n"),
            "-a", f"127.0.0.1:{port}", "-f", vcl, "-s", f"malloc,{memory_mib}m", "-T", "none"]
    ctx.note(argv)
    p = procs.start(argv, os.path.join(d, "out.log"), cpus=cpus)
    procs.wait_tcp(port, p, timeout=60)
    return Peer("Varnish malloc", p, port, version_of([varnishd, "-V"]))
