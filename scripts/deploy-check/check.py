#!/usr/bin/env python3
"""The install paths, tested for real on this machine (run by scripts/deploy-check/run.sh).

  image     the container image runs: config from a mounted file, and from environment variables
            only (MediaFlow's names); /health, a byte-exact /proxy/stream, a reverse route;
            `podman stop` exits 0 within the grace period while a request in flight completes
  router    the aarch64 router binary under qemu-aarch64-static: --version, serve, /health
  deb       dpkg-deb --info/--contents; installed with dpkg -i into a scratch Debian root;
            `sluice --version` there; `systemd-analyze verify` of the installed unit
  ipk       the OpenWrt package's layout: outer tar.gz, control (architecture, conffiles), data
            (binary, procd init script, UCI config)
  helm      helm lint, helm template, and the rendered manifests against the Kubernetes schemas
            (kubernetes-validate, offline)

Every server is on 127.0.0.1 (containers share the host's network); every wait is bounded.
"""

import hashlib
import http.server
import json
import os
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE = os.environ.get("SLUICE_IMAGE", "localhost/sluice:latest")
ROUTER_BIN = os.environ.get("ROUTER_BIN", "")
DEB = os.environ.get("DEB", "")
DEB_ROOT = os.environ.get("DEB_ROOT", "")
HELM = os.environ.get("HELM", "helm")
IPK = os.environ.get("IPK", "")
# A binary of this machine's architecture, to load generated configs with.
ROUTER_BIN_HOST = os.environ.get("HOST_BIN", "")

# sluice reads every SLUICE_* variable as config (and refuses unknown sections): none of the
# build's (SLUICE_GIT_COMMIT, SLUICE_IMAGE) may reach the binaries started here.
for key in [k for k in os.environ if k.startswith("SLUICE_")]:
    del os.environ[key]


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def ok(msg):
    print(f"ok: {msg}")


def run(cmd, check=True, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        fail(f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pattern(n):
    return bytes((i * 31 % 251) for i in range(n))


BIG = pattern(2 << 20)
PAGE = b"<h1>reverse route</h1>\n" * 40
SLOW = pattern(1 << 20)


class Origin(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        body = {"/big": BIG, "/page": PAGE, "/slow": SLOW}.get(self.path)
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path == "/slow":
            # About 3 s: still in flight when the container is told to stop.
            step = len(body) // 30
            for i in range(0, len(body), step):
                self.wfile.write(body[i : i + step])
                self.wfile.flush()
                time.sleep(0.1)
        else:
            self.wfile.write(body)


class ThreadingServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def start_origin():
    srv = ThreadingServer(("127.0.0.1", 0), Origin)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv.server_address[1]


def get(port, path, host="localhost", timeout=30):
    """One HTTP/1.1 GET; (status, headers dict, body)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            out += rest[:size]
            rest = rest[size + 2 :]
        body = out
    return status, headers, body


def wait_health(port, limit=30, proc=None):
    deadline = time.time() + limit
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            fail(f"exited {proc.returncode} before /health answered: "
                 f"{proc.stderr.read().decode(errors='replace')[-3000:]}")
        try:
            status, _, body = get(port, "/health", timeout=2)
            if status == 200 and b"healthy" in body:
                return
        except OSError:
            pass
        time.sleep(0.2)
    fail(f"no /health on port {port} within {limit} s")


def sha(b):
    return hashlib.sha256(b).hexdigest()


def stream_path(origin, path, password):
    d = urllib.parse.quote(f"http://127.0.0.1:{origin}{path}", safe="")
    return f"/proxy/stream?d={d}&api_password={password}"


# === the container image ===


def podman(*args, check=True):
    return run(
        ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs", "--storage-driver=vfs", *args],
        check=check,
    )


def container_logs(name):
    r = podman("logs", name, check=False)
    return r.stdout + r.stderr


def image():
    origin = start_origin()
    tmp = tempfile.mkdtemp()
    port = free_port()
    config = os.path.join(tmp, "sluice.toml")
    with open(config, "w") as f:
        f.write(
            f"""[server]
listen = ["0.0.0.0:{port}"]
shutdown_grace_secs = 10

[auth]
api_password = "file-pw"

[upstream]
allow_private = true

[[upstreams]]
name = "origin"
servers = ["127.0.0.1:{origin}"]

[[routes]]
host = "rev.test"
path = "/"
upstream = "origin"
"""
        )
    os.chmod(config, 0o644)
    name = "sluice-check-file"
    podman("rm", "-f", name, check=False)
    podman("run", "-d", "--name", name, "--network=host",
           "-v", f"{config}:/etc/sluice/sluice.toml:ro,Z", IMAGE)
    try:
        wait_health(port)
        user = podman("exec", name, "/usr/bin/sluice", "--version", check=False)
        status, _, body = get(port, stream_path(origin, "/big", "file-pw"))
        if status != 200 or sha(body) != sha(BIG):
            fail(f"/proxy/stream through the image: {status}, {len(body)} bytes")
        ok("image (mounted config): /health, /proxy/stream byte-exact (2 MiB)")
        status, _, body = get(port, "/page", host="rev.test")
        if status != 200 or body != PAGE:
            fail(f"reverse route through the image: {status}, {body[:80]!r}")
        ok("image (mounted config): reverse route byte-exact")
        hc = podman("healthcheck", "run", name, check=False)
        if hc.returncode != 0:
            fail(f"HEALTHCHECK (sluice health) failed: {hc.stdout} {hc.stderr}")
        ok("image: HEALTHCHECK (sluice health) passes")
        inspect = json.loads(podman("image", "inspect", IMAGE).stdout)[0]
        cfg = inspect.get("Config", {})
        if cfg.get("User") != "65532:65532" or cfg.get("StopSignal") not in ("SIGTERM", "15"):
            fail(f"image config: User {cfg.get('User')!r}, StopSignal {cfg.get('StopSignal')!r}")
        ok(f"image: non-root user {cfg.get('User')}, STOPSIGNAL {cfg.get('StopSignal')}, "
           f"{user.stdout.splitlines()[0] if user.stdout else '?'}")
        # A request in flight when the container is stopped completes; sluice exits 0 in time.
        result = {}

        def slow():
            try:
                result["r"] = get(port, stream_path(origin, "/slow", "file-pw"))
            except OSError as e:
                result["e"] = e

        t = threading.Thread(target=slow)
        t.start()
        time.sleep(0.7)
        started = time.time()
        podman("stop", "-t", "15", name)
        took = time.time() - started
        t.join(20)
        if "r" not in result:
            fail(f"in-flight request during podman stop: {result.get('e')}")
        status, _, body = result["r"]
        if status != 200 or body != SLOW:
            fail(f"in-flight request during podman stop: {status}, {len(body)} of {len(SLOW)} bytes")
        code = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        if code != "0":
            fail(f"sluice exited {code} on podman stop\n{container_logs(name)}")
        if took >= 10:
            fail(f"podman stop took {took:.1f} s (grace 10 s)")
        ok(f"image: podman stop -> exit 0 after {took:.1f} s, the in-flight stream completed byte-exact")
    finally:
        podman("rm", "-f", name, check=False)

    # Environment variables only, MediaFlow's names: the image is a drop-in.
    port2 = free_port()
    name = "sluice-check-env"
    podman("rm", "-f", name, check=False)
    podman("run", "-d", "--name", name, "--network=host",
           "-e", "API_PASSWORD=env-pw", "-e", f"PORT={port2}", "-e", "LOG_LEVEL=WARNING",
           "-e", "SLUICE_UPSTREAM_ALLOW_PRIVATE=true", IMAGE)
    try:
        wait_health(port2)
        status, _, body = get(port2, stream_path(origin, "/big", "env-pw"))
        if status != 200 or sha(body) != sha(BIG):
            fail(f"/proxy/stream (env config): {status}, {len(body)} bytes")
        status, _, _ = get(port2, stream_path(origin, "/big", "wrong"))
        if status != 403:
            fail(f"a wrong password got {status}, not 403: API_PASSWORD was not applied")
        # At WARNING the startup's INFO lines ("listening ...") are filtered out.
        logs = container_logs(name)
        if " INFO " in logs:
            fail(f"LOG_LEVEL=WARNING did not reach the log filter:\n{logs}")
        ok("image (MediaFlow env: API_PASSWORD, PORT, LOG_LEVEL=WARNING): /health, /proxy/stream byte-exact, "
           "wrong password 403")
    finally:
        podman("rm", "-f", name, check=False)

    # No password in a container: refuses to start, and says why.
    name = "sluice-check-nopw"
    podman("rm", "-f", name, check=False)
    podman("run", "--name", name, "--network=host", "-e", f"PORT={free_port()}", IMAGE, check=False)
    code = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
    logs = container_logs(name)
    podman("rm", "-f", name, check=False)
    if code == "0" or "no password is set" not in logs:
        fail(f"without a password the image should refuse to start: exit {code}\n{logs}")
    ok(f"image: without a password it refuses to start (exit {code})")


# === the aarch64 router build under qemu ===


def router():
    if not ROUTER_BIN:
        fail("ROUTER_BIN is not set")
    qemu = ["qemu-aarch64-static", ROUTER_BIN]
    v = run(qemu + ["--version"]).stdout
    if "features: iptv" not in v or "aarch64" not in v:
        fail(f"router --version: {v!r}")
    port = free_port()
    log = tempfile.TemporaryFile()
    p = subprocess.Popen(qemu + ["serve", "--listen", f"127.0.0.1:{port}"],
                         stdout=subprocess.DEVNULL, stderr=log)
    p.stderr = log
    try:
        log_tail = lambda: (log.seek(0), log.read().decode(errors="replace")[-3000:])[1]
        try:
            wait_health(port, limit=60, proc=p)
        except SystemExit:
            print(log_tail(), file=sys.stderr)
            raise
    finally:
        p.terminate()
        try:
            rc = p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            fail("router binary did not stop on SIGTERM")
    if rc != 0:
        fail(f"router binary exited {rc}: {log_tail()}")
    ok(f"aarch64 router binary under qemu: {v.splitlines()[0]}; serve, /health, SIGTERM exit 0")


# === the Debian package ===


def deb():
    if not DEB or not DEB_ROOT:
        fail("DEB and DEB_ROOT must be set")
    info = run(["dpkg-deb", "--info", DEB]).stdout
    for want in ("Package: sluice", "Architecture: amd64", "conffiles", "postinst"):
        if want not in info:
            fail(f"dpkg-deb --info lacks {want!r}:\n{info}")
    contents = run(["dpkg-deb", "--contents", DEB]).stdout
    for want in ("./usr/bin/sluice", "./etc/sluice/sluice.toml",
                 "./lib/systemd/system/sluice.service", "./lib/systemd/system/sluice.socket",
                 "./usr/share/doc/sluice/copyright"):
        if want not in contents:
            fail(f"dpkg-deb --contents lacks {want}:\n{contents}")
    conffiles = run(["dpkg-deb", "-I", DEB, "conffiles"]).stdout.split()
    if conffiles != ["/etc/sluice/sluice.toml"]:
        fail(f"conffiles: {conffiles}")
    ok("deb: --info and --contents (binary, conffile, unit, socket, copyright)")
    staged = os.path.join(DEB_ROOT, "tmp", "sluice.deb")
    run(["cp", DEB, staged])
    run(["chroot", DEB_ROOT, "dpkg", "-i", "/tmp/sluice.deb"])
    v = run(["chroot", DEB_ROOT, "/usr/bin/sluice", "--version"]).stdout
    user = run(["chroot", DEB_ROOT, "getent", "passwd", "sluice"]).stdout
    if not user.startswith("sluice:"):
        fail("the package did not create the sluice user")
    status = run(["chroot", DEB_ROOT, "dpkg-query", "-W", "-f=${Status}", "sluice"]).stdout
    if status != "install ok installed":
        fail(f"dpkg status: {status}")
    ok(f"deb: dpkg -i into a scratch Debian root: {status}; user sluice; {v.splitlines()[0]}")
    verify = run(["systemd-analyze", "verify", f"--root={DEB_ROOT}", "--man=no",
                  "/lib/systemd/system/sluice.service", "/lib/systemd/system/sluice.socket"],
                 check=False)
    # verify exits 0 on directives it cannot parse ("ignoring"): any output is a finding.
    problems = [l for l in (verify.stdout + verify.stderr).splitlines() if l.strip()]
    if verify.returncode != 0 or problems:
        fail(f"systemd-analyze verify:\n{verify.stdout}{verify.stderr}")
    ok("systemd-analyze verify: sluice.service and sluice.socket as installed")
    run(["chroot", DEB_ROOT, "dpkg", "--purge", "sluice"])
    ok("deb: purged again")


# === the Helm chart ===


def helm():
    chart = os.path.join(ROOT, "deploy", "helm", "sluice")
    run([HELM, "lint", "--strict", chart, "--set", "password.value=x"])
    missing = run([HELM, "template", "t", chart], check=False)
    if missing.returncode == 0 or "password" not in missing.stderr:
        fail("the chart must refuse to render without a password")
    rendered = []
    for extra in ([], ["--set", "hostNetwork=true", "--set", "password.existingSecret=s"],
                  ["--set", "persistence.existingClaim=cache", "--set", "preStopSleepSeconds=0"],
                  ["--set", "cluster.enabled=true"]):
        out = run([HELM, "template", "t", chart, "--set", "password.value=x", *extra]).stdout
        path = tempfile.mktemp(suffix=".yaml")
        with open(path, "w") as f:
            f.write(out)
        rendered.append((path, out))
    for path, out in rendered:
        r = run(["kubernetes-validate", "--strict", "-k", "1.32.0", path], check=False)
        if r.returncode != 0:
            fail(f"kubernetes-validate:\n{r.stdout}{r.stderr}")
    out = rendered[0][1]
    for want in ("terminationGracePeriodSeconds: 40", "path: /health", "kind: PodDisruptionBudget",
                 "secretKeyRef", "SLUICE_SERVER_SHUTDOWN_GRACE_SECS"):
        if want not in out:
            fail(f"rendered chart lacks {want!r}")
    if "hostNetwork: true" not in rendered[1][1]:
        fail("hostNetwork=true is not rendered")
    for want in ("clusterIP: None", "[cache.cluster]", "t-sluice-peers.default.svc.cluster.local:8888",
                 "secret_file = \"/etc/sluice-cluster/cluster-secret\"", "containerPort: 8899",
                 "seconds: 15", "terminationGracePeriodSeconds: 50"):
        if want not in rendered[3][1]:
            fail(f"the chart's cluster mode lacks {want!r}")
    if "[cache.cluster]" in out:
        fail("cluster mode is rendered without cluster.enabled")
    ok("helm: lint --strict, template (4 value sets), kubernetes-validate --strict against 1.32")


# === the OpenWrt package ===


def ipk():
    import io
    import tarfile

    if not IPK:
        fail("IPK is not set")
    outer = tarfile.open(IPK, "r:gz")
    names = sorted(outer.getnames())
    if names != ["./control.tar.gz", "./data.tar.gz", "./debian-binary"]:
        fail(f"ipk members: {names}")
    if outer.extractfile("./debian-binary").read() != b"2.0\n":
        fail("debian-binary is not 2.0")
    control = tarfile.open(fileobj=io.BytesIO(outer.extractfile("./control.tar.gz").read()))
    text = control.extractfile("./control").read().decode()
    for want in ("Package: sluice", "Architecture: aarch64_generic", "License: Apache-2.0"):
        if want not in text:
            fail(f"ipk control lacks {want!r}:\n{text}")
    if control.extractfile("./conffiles").read().decode().split() != ["/etc/config/sluice"]:
        fail("ipk conffiles")
    data = tarfile.open(fileobj=io.BytesIO(outer.extractfile("./data.tar.gz").read()))
    members = {m.name: m for m in data.getmembers()}
    for want, mode in (("./usr/bin/sluice", 0o755), ("./etc/init.d/sluice", 0o755),
                       ("./etc/config/sluice", 0o600)):
        if want not in members or members[want].mode != mode:
            fail(f"ipk data: {want} missing or mode {oct(members[want].mode) if want in members else '-'}")
    binary = data.extractfile("./usr/bin/sluice").read()
    with open(ROUTER_BIN, "rb") as f:
        if f.read() != binary:
            fail("the ipk's binary is not the router build")
    # The init script turns UCI into TOML that sluice accepts: run its generator with a stub
    # of OpenWrt's config functions.
    with tempfile.TemporaryDirectory() as tmp:
        conf = os.path.join(tmp, "sluice.toml")
        run(["sh", os.path.join(ROOT, "scripts/deploy-check/uci-stub.sh"),
             os.path.join(ROOT, "deploy/openwrt/sluice/files/sluice.init"), conf])
        check = run([ROUTER_BIN_HOST, "check-config", conf], check=False) if ROUTER_BIN_HOST else None
        text = open(conf).read()
        for want in ('listen = ["0.0.0.0:5140", "127.0.0.1:5141"]', 'api_password = "p\\"w\\\\x"',
                     'interface = "lo"'):
            if want not in text:
                fail(f"UCI -> TOML lacks {want!r}:\n{text}")
        if check is not None and check.returncode != 0:
            fail(f"the generated TOML does not load:\n{text}\n{check.stderr}")
    ok("ipk: layout, control, conffiles, modes, the router binary; UCI -> TOML loads in sluice")


# === measurements for docs/deploy.md (by hand: `check.py measure`, not part of the test) ===


def uss_kib(pid):
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total


def measure():
    size = podman("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout.strip()
    print(f"image {IMAGE}: {int(size) / 1e6:.2f} MB")
    starts = []
    for i in range(5):
        port = free_port()
        name = f"sluice-measure-{i}"
        podman("rm", "-f", name, check=False)
        t0 = time.time()
        podman("run", "-d", "--name", name, "--network=host", "-e", "API_PASSWORD=pw",
               "-e", f"PORT={port}", IMAGE)
        wait_health(port)
        starts.append(time.time() - t0)
        if i == 4:
            time.sleep(2)
            pid = podman("inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
            print(f"idle USS in the container: {uss_kib(int(pid)) / 1024:.1f} MiB")
        podman("rm", "-f", name, check=False)
    starts.sort()
    print(f"podman run to /health answering: median {starts[2] * 1000:.0f} ms "
          f"(min {starts[0] * 1000:.0f}, max {starts[-1] * 1000:.0f})")
    # The process alone: exec to READY=1 on a notify socket, median of 5.
    host_bin = ROUTER_BIN_HOST
    if host_bin:
        ready = []
        for _ in range(5):
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "n")
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sock.bind(path)
                sock.settimeout(10)
                t0 = time.time()
                p = subprocess.Popen([host_bin, "serve", "--listen", f"127.0.0.1:{free_port()}"],
                                     env={"NOTIFY_SOCKET": path}, stderr=subprocess.DEVNULL)
                sock.recv(1024)
                ready.append(time.time() - t0)
                p.terminate()
                p.wait(10)
        ready.sort()
        print(f"exec to READY=1: median {ready[2] * 1000:.1f} ms")


STEPS = {"image": image, "router": router, "ipk": ipk, "deb": deb, "helm": helm}
EXTRA = {"measure": measure}

if __name__ == "__main__":
    for step in sys.argv[1:] or list(STEPS):
        {**STEPS, **EXTRA}[step]()
