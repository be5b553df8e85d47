"""Child processes of the suite: start, wait for readiness, stop by PID, clean up on any exit."""

import atexit
import os
import signal
import socket
import subprocess
import time
import urllib.request

_children = []  # Popen objects we started and have not reaped yet
# Loopback only: never route readiness probes through a proxy from the environment.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv, log_path, cpus=None, env=None, cwd=None):
    """Starts argv in its own session (so its process group id is its PID), optionally pinned to
    `cpus` with taskset; output goes to log_path."""
    if cpus is not None:
        argv = ["taskset", "-c", cpus] + list(argv)
    log = open(log_path, "ab")
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         env=full_env, cwd=cwd, start_new_session=True)
    log.close()
    _children.append(p)
    return p


def stop(p, grace=5.0):
    """SIGTERM to the PID, then SIGKILL to its own process group (id = PID) if it lingers."""
    if p not in _children:
        return
    if p.poll() is None:
        try:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(p.pid, signal.SIGKILL)  # group created by start_new_session, id == our child's PID
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    _children.remove(p)


# Called first by `stop_all` (`budget` thaws the cgroups it froze there).
before_stop_all = []


def stop_all():
    for hook in before_stop_all:
        hook()
    for p in list(reversed(_children)):
        stop(p, grace=3.0)


def _on_signal(signum, _frame):
    stop_all()
    raise SystemExit(128 + signum)


def install_cleanup():
    atexit.register(stop_all)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)


def wait_tcp(port, proc, timeout=30.0):
    """Waits until 127.0.0.1:port accepts; fails early if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.pid} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"port {port} not ready after {timeout:.0f}s")


def wait_http(url, proc, timeout=60.0, ok=(200,)):
    """Waits until url answers with one of the `ok` statuses."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.pid} exited with {proc.returncode}")
        try:
            with _opener.open(url, timeout=2) as r:
                if r.status in ok:
                    return
                last = r.status
        except urllib.error.HTTPError as e:
            if e.code in ok:
                return
            last = e.code
        except OSError as e:
            last = e
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout:.0f}s (last: {last})")


def run(argv, timeout, **kw):
    """Runs a short command to completion, bounded in time; returns CompletedProcess."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
