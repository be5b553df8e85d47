//! The reverse proxy through the real binary: `check-config` prints the route table, and a running
//! sluice reloads its routes on `sluice reload` (SIGHUP) and `POST /admin/reload`, keeping the old
//! config when the new file is invalid; busy polling spins only just after requests.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// A tiny origin answering every request with `body`.
fn fixed_origin(body: &'static str) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    addr
}

fn get(addr: &str, method: &str, path: &str, extra: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// A loopback address with a port nothing listens on.
fn free_listen() -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// Starts `sluice serve` on `file` and waits until it listens on `listen` and wrote `pid`.
fn start(file: &std::path::Path, listen: &str, pid: &std::path::Path) -> std::process::Child {
    let child = Command::new(BIN)
        .args(["serve", "--config", file.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(listen).is_err() || !pid.exists() {
        assert!(Instant::now() < deadline, "sluice did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// SIGTERM, and waits for the process to end.
fn stop(child: &mut std::process::Child) {
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "sluice did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn config(listen: &str, origin: &str, pid: &std::path::Path, threads: usize) -> String {
    format!(
        r#"
[server]
listen = ["{listen}"]
pid_file = "{}"
threads = {threads}

[auth]
api_password = "pw"

[[upstreams]]
name = "app"
servers = ["{origin}"]

[[routes]]
path = "/"
upstream = "app"
"#,
        pid.display()
    )
}

#[test]
fn check_config_prints_the_route_table() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    std::fs::write(
        &file,
        r#"
[[upstreams]]
name = "app"
servers = ["127.0.0.1:9000", { addr = "127.0.0.1:9001", weight = 2 }]

[[routes]]
host = "*.example.com"
path = "/api/"
upstream = "app"
strip_prefix = true

[[routes]]
path = "/"
upstream = "app"
"#,
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["check-config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let table: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("# effective route table"))
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .map(|l| Box::leak(l.into_boxed_str()) as &str)
        .collect();
    assert_eq!(
        table[0],
        "main *.example.com /api/ -> upstream \"app\" (strip prefix)"
    );
    assert!(
        table.contains(&"main * /health -> built-in health"),
        "{table:?}"
    );
    assert!(
        table.contains(&"main * /proxy/ -> built-in media"),
        "{table:?}"
    );
    assert_eq!(*table.last().unwrap(), "main * / -> upstream \"app\"");
}

#[test]
fn check_config_shows_built_ins_moved_to_a_named_listener() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    std::fs::write(
        &file,
        r#"
[[server.listeners]]
name = "admin"
listen = ["127.0.0.1:9901"]

[endpoints]
listener = "admin"

[[upstreams]]
name = "app"
servers = ["127.0.0.1:9000"]

[[routes]]
path = "/"
upstream = "app"
"#,
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["check-config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let table: Vec<String> = text
        .lines()
        .skip_while(|l| !l.starts_with("# effective route table"))
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(table[0], "main * / -> upstream \"app\"", "{table:?}");
    assert!(
        table.contains(&"admin * /metrics -> built-in metrics".to_string()),
        "{table:?}"
    );
    // Nothing but the user route is left on main.
    assert_eq!(
        table.iter().filter(|l| l.starts_with("main ")).count(),
        1,
        "{table:?}"
    );
    // A listener name nobody declared is refused before anything binds.
    std::fs::write(
        &file,
        "[endpoints]\nlistener = \"adnim\"\n[[server.listeners]]\nname = \"admin\"\nlisten = [\"127.0.0.1:9901\"]\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["check-config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("endpoints.listener \"adnim\" names no listener (have: main, admin)"),
        "{err}"
    );
}

#[test]
fn reloads_on_signal_and_admin_endpoint() {
    reload_cycle(0);
}

/// One thread: `main` runs everything on a current-thread runtime (`runtime::main_runtime`);
/// serving, signals, reload and shutdown work the same.
#[test]
fn reloads_on_one_thread() {
    reload_cycle(1);
}

fn reload_cycle(threads: usize) {
    let config =
        |listen: &str, origin: &str, pid: &std::path::Path| config(listen, origin, pid, threads);
    let (a, b, c) = (
        fixed_origin("from-a"),
        fixed_origin("from-b"),
        fixed_origin("from-c"),
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    let pid = dir.path().join("sluice.pid");
    let listen = free_listen();
    std::fs::write(&file, config(&listen, &a, &pid)).unwrap();
    let mut child = start(&file, &listen, &pid);
    assert!(get(&listen, "GET", "/", "").ends_with("from-a"));

    let wait_for = |want: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = get(&listen, "GET", "/", "");
            if got.ends_with(want) {
                break;
            }
            assert!(Instant::now() < deadline, "still {got:?}, wanted {want}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // `sluice reload --pid-file` sends SIGHUP.
    std::fs::write(&file, config(&listen, &b, &pid)).unwrap();
    let out = Command::new(BIN)
        .args(["reload", "--pid-file", pid.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("from-b");

    // An invalid file is refused; the running routes stay.
    std::fs::write(&file, "[[routes]]\npath = \"/\"\nupstream = \"nowhere\"\n").unwrap();
    let r = get(&listen, "POST", "/admin/reload", "api_password: pw\r\n");
    assert!(r.starts_with("HTTP/1.1 422"), "{r}");
    assert!(r.contains("nowhere"), "{r}");
    assert!(get(&listen, "GET", "/", "").ends_with("from-b"));

    // The admin endpoint needs the password, in a header.
    std::fs::write(&file, config(&listen, &c, &pid)).unwrap();
    let r = get(&listen, "POST", "/admin/reload", "");
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    let r = get(&listen, "POST", "/admin/reload?api_password=pw", "");
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    let r = get(&listen, "POST", "/admin/reload", "api_password: pw\r\n");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(get(&listen, "GET", "/", "").ends_with("from-c"));

    stop(&mut child);
    assert!(!pid.exists(), "pid file left behind");
}

/// A reload that takes out group and route `a` for `b` drops their series from `/metrics`;
/// `both`, in both files, keeps its counts. Kept for good, frozen, the series of a config
/// churning names grew the scrape with every reload.
#[test]
fn a_reload_drops_the_series_of_what_it_took_out() {
    let origin = fixed_origin("ok");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    let pid = dir.path().join("sluice.pid");
    let listen = free_listen();
    let config = |g: &str| {
        format!(
            r#"
[server]
listen = ["{listen}"]
pid_file = "{}"

[auth]
api_password = "pw"

[[upstreams]]
name = "{g}"
servers = ["{origin}"]

[[upstreams]]
name = "both"
servers = ["{origin}"]

[[routes]]
path = "/{g}"
upstream = "{g}"

[[routes]]
path = "/both"
upstream = "both"
"#,
            pid.display()
        )
    };
    std::fs::write(&file, config("a")).unwrap();
    let mut child = start(&file, &listen, &pid);
    let scrape = || get(&listen, "GET", "/metrics", "api_password: pw\r\n");
    // Series with `label` in them.
    let lines = |text: &str, label: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains(label))
            .map(str::to_string)
            .collect()
    };
    assert!(get(&listen, "GET", "/a", "").ends_with("ok"));
    assert!(get(&listen, "GET", "/both", "").ends_with("ok"));
    let before = scrape();
    for label in ["/a\"", "group=\"a\""] {
        assert!(!lines(&before, label).is_empty(), "no {label} in {before}");
    }

    std::fs::write(&file, config("b")).unwrap();
    let r = get(&listen, "POST", "/admin/reload", "api_password: pw\r\n");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(get(&listen, "GET", "/b", "").ends_with("ok"));
    assert!(get(&listen, "GET", "/both", "").ends_with("ok"));
    let after = scrape();
    for label in ["/a\"", "group=\"a\""] {
        let left = lines(&after, label);
        assert!(
            left.is_empty(),
            "series of {label} left after the reload: {left:#?}"
        );
    }
    for label in ["/b\"", "group=\"b\""] {
        assert!(!lines(&after, label).is_empty(), "no {label} in {after}");
    }
    // One request to `/both` before the reload, one after: counted on, not reset.
    let both = lines(&after, "sluice_reverse_requests_total{route=\"*/both\"");
    assert_eq!(both.len(), 1, "{after}");
    assert!(both[0].ends_with(" 2"), "{both:?}");
    stop(&mut child);
}

/// CPU time (user + system) of process `pid` so far, in milliseconds (10 ms ticks).
fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks * 1000 / 100
}

/// With `busy_poll_us`, one thread spins for that long after a request and then sleeps: an idle
/// sluice spends no CPU, whatever came before.
#[test]
fn busy_polling_spins_only_after_a_request() {
    let origin = fixed_origin("ok");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    let pid = dir.path().join("sluice.pid");
    let listen = free_listen();
    // A window long enough to see on the process's CPU clock.
    let text = config(&listen, &origin, &pid, 1)
        .replace("threads = 1", "threads = 1\nbusy_poll_us = 300000");
    std::fs::write(&file, text).unwrap();
    let mut child = start(&file, &listen, &pid);
    let id = child.id();
    let spent = |d: Duration| {
        let before = cpu_ms(id);
        std::thread::sleep(d);
        cpu_ms(id) - before
    };
    // No request yet: asleep.
    std::thread::sleep(Duration::from_millis(400));
    let idle = spent(Duration::from_secs(1));
    assert!(idle <= 50, "{idle} ms of CPU in an idle second");
    // Right after a request: polling.
    assert!(get(&listen, "GET", "/", "").ends_with("ok"));
    let busy = spent(Duration::from_millis(200));
    assert!(
        busy >= 40,
        "only {busy} ms of CPU in the 200 ms after a request"
    );
    // The window is over: asleep again.
    std::thread::sleep(Duration::from_millis(300));
    let after = spent(Duration::from_secs(1));
    assert!(
        after <= 50,
        "{after} ms of CPU in an idle second after the window"
    );
    stop(&mut child);
}

/// An origin that lets every answer be cached for an hour; counts the requests it gets.
fn cacheable_origin() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = seen.clone();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let count = count.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nCache-Control: public, max-age=3600\r\n\
                      Content-Length: 6\r\nConnection: close\r\n\r\ncached",
                );
            });
        }
    });
    (addr, seen)
}

/// A sluice started without a cache (the media front end caches by default: off), and the
/// config texts of a reload that builds its first cache (the route caches; `[cache]` with
/// `cache_extra(listen)` appended) and of the same reload refused by a later part (the TLS
/// part: a certificate file that is not there).
struct Uncached {
    child: std::process::Child,
    dir: tempfile::TempDir,
    file: std::path::PathBuf,
    listen: String,
    caching: String,
    broken: String,
    seen: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

fn uncached(cache_extra: impl Fn(&str) -> String) -> Uncached {
    let (origin, seen) = cacheable_origin();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    let pid = dir.path().join("sluice.pid");
    let listen = free_listen();
    let plain = format!(
        "{}\n[media]\ncache = false\n",
        config(&listen, &origin, &pid, 0)
    );
    std::fs::write(&file, &plain).unwrap();
    let child = start(&file, &listen, &pid);
    let r = get(&listen, "GET", "/", "");
    assert!(r.ends_with("cached") && !r.contains("cache-status"), "{r}");
    let caching = format!(
        "{}\n[cache]\nmemory_bytes = \"8MiB\"\n{}",
        plain.replace("upstream = \"app\"", "upstream = \"app\"\ncache = true"),
        cache_extra(&listen)
    );
    let missing = dir.path().join("missing.pem");
    let broken = caching.replace(
        "threads = 0",
        &format!(
            "threads = 0\ntls_cert = \"{0}\"\ntls_key = \"{0}\"",
            missing.display()
        ),
    );
    Uncached {
        child,
        dir,
        file,
        listen,
        caching,
        broken,
        seen,
    }
}

impl Uncached {
    /// Writes `text` to the config file and reloads through `/admin/reload`.
    fn reload(&self, text: &str) -> String {
        std::fs::write(&self.file, text).unwrap();
        get(
            &self.listen,
            "POST",
            "/admin/reload",
            "api_password: pw\r\n",
        )
    }

    /// The refused reload: a 422 naming the missing certificate.
    fn refused(&self) {
        let r = self.reload(&self.broken);
        assert!(r.starts_with("HTTP/1.1 422"), "{r}");
        assert!(r.contains("missing.pem"), "{r}");
    }
}

/// A reload that would build the first cache but is refused by a later part (here the TLS part:
/// a certificate file that is not there) builds nothing: when the file is fixed, with the same
/// `[cache]`, the next reload applies it (`[cache]` is still live while no cache runs) and the
/// route caches. The refused reload used to keep the cache it built in its prepare step, so the
/// next one was refused with "cache.… needs a restart".
#[test]
fn a_refused_reload_leaves_no_cache_behind() {
    let mut s = uncached(|_| String::new());
    s.refused();
    // Nothing was applied: the route still does not cache.
    let r = get(&s.listen, "GET", "/", "");
    assert!(!r.contains("cache-status"), "{r}");

    let r = s.reload(&s.caching);
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let first = get(&s.listen, "GET", "/", "");
    assert!(first.ends_with("cached"), "{first}");
    let again = get(&s.listen, "GET", "/", "");
    assert!(
        again
            .to_ascii_lowercase()
            .contains("cache-status: sluice; hit"),
        "{again}"
    );
    assert!(again.ends_with("cached"), "{again}");
    assert_eq!(s.seen.load(std::sync::atomic::Ordering::SeqCst), 3);
    stop(&mut s.child);
}

/// Every file under `root` (relative path, bytes, mode), and every directory (mode), in order.
fn snapshot(root: &std::path::Path) -> Vec<(String, Option<Vec<u8>>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let md = std::fs::symlink_metadata(&path).unwrap();
            let name = path.strip_prefix(root).unwrap().display().to_string();
            let mode = md.permissions().mode();
            if md.is_dir() {
                todo.push(path);
                out.push((name, None, mode));
            } else {
                out.push((name, Some(std::fs::read(&path).unwrap()), mode));
            }
        }
    }
    out.sort();
    out
}

/// A reload that would build the first cache over a disk directory cut with another slice size
/// and is refused by a later part leaves that directory byte for byte as it was: the prepare
/// step only looks at it. Opening the tier there used to empty it (and stamp it) before the
/// reload was refused. The reload that goes through empties and stamps it, as documented.
#[test]
fn a_refused_reload_leaves_the_disk_directory_as_it_was() {
    let tier = tempfile::tempdir().unwrap();
    let root = tier.path().join("cache");
    std::fs::create_dir_all(root.join("slices")).unwrap();
    std::fs::create_dir_all(root.join("objects")).unwrap();
    std::fs::write(root.join("layout"), "slice_bytes 524288\n").unwrap();
    std::fs::write(root.join("slices").join("kept-by-operator"), b"old bytes").unwrap();
    std::fs::write(root.join("objects").join("0123.meta"), b"old record").unwrap();
    let before = snapshot(tier.path());
    let mut s = uncached(|_| format!("disk_path = \"{}\"\n", root.display()));
    s.refused();
    assert_eq!(snapshot(tier.path()), before);
    // A path not there yet is not created either.
    let absent = tier.path().join("absent");
    let r = s.reload(
        &s.broken
            .replace(&root.display().to_string(), &absent.display().to_string()),
    );
    assert!(r.starts_with("HTTP/1.1 422"), "{r}");
    assert!(!absent.exists());
    assert_eq!(snapshot(tier.path()), before);

    let r = s.reload(&s.caching);
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(!root.join("slices").join("kept-by-operator").exists());
    assert!(!root.join("objects").join("0123.meta").exists());
    assert_eq!(
        std::fs::read_to_string(root.join("layout")).unwrap(),
        format!("slice_bytes {}\n", 1 << 20)
    );
    let r = get(&s.listen, "GET", "/", "");
    assert!(r.ends_with("cached"), "{r}");
    stop(&mut s.child);
    drop(s.dir);
}

/// A directory this process cannot write to, without writing or skipping anything: as root, a
/// read-only tmpfs mounted for the test (unmounted on drop) or, where mounting is not allowed, a
/// filesystem already mounted read-only; otherwise a directory of mode 0500.
struct Unwritable {
    dir: tempfile::TempDir,
    /// The read-only directory: the mount, or one found read-only, or `dir` made 0500.
    path: std::path::PathBuf,
    mounted: bool,
}

impl Unwritable {
    fn new() -> Unwritable {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mut u = Unwritable {
            path: dir.path().to_path_buf(),
            dir,
            mounted: false,
        };
        // SAFETY: geteuid takes nothing and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            std::fs::set_permissions(&u.path, std::fs::Permissions::from_mode(0o500)).unwrap();
        } else {
            let mount = Command::new("mount")
                .args(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"])
                .arg(&u.path)
                .output();
            match mount {
                Ok(o) if o.status.success() => u.mounted = true,
                _ => {
                    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
                    u.path = mounts
                        .lines()
                        .filter_map(|l| {
                            let f: Vec<&str> = l.split_whitespace().collect();
                            (f.len() > 3 && f[3].split(',').any(|o| o == "ro"))
                                .then(|| std::path::PathBuf::from(f[1]))
                        })
                        .find(|p| p.starts_with("/sys") || p.starts_with("/proc"))
                        .unwrap_or_else(|| {
                            panic!(
                                "cannot set up a read-only directory: mounting a read-only tmpfs \
                                 failed ({mount:?}) and no read-only /sys or /proc is mounted"
                            )
                        });
                }
            }
        }
        let probe = u.path.join("probe");
        assert!(
            std::fs::write(&probe, b"").is_err(),
            "{} takes writes: cannot set up a read-only directory",
            u.path.display()
        );
        u
    }
}

impl Drop for Unwritable {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        if self.mounted {
            let ok = Command::new("umount").arg(&self.path).status();
            if !ok.is_ok_and(|s| s.success()) {
                let _ = Command::new("umount").arg("-l").arg(&self.path).status();
            }
        } else {
            let _ =
                std::fs::set_permissions(self.dir.path(), std::fs::Permissions::from_mode(0o700));
        }
    }
}

/// A reload whose disk directory cannot be written (here on a read-only filesystem, which
/// stops root too) is refused with an error naming the directory, and the old config keeps
/// serving; so is a start with it. The prepare step only checked that the directory could be
/// read, so such a reload committed and every write of the tier was dropped.
#[test]
fn a_disk_directory_that_cannot_be_written_is_refused() {
    let ro = Unwritable::new();
    let absent = ro.path.join("cache");
    for disk in [ro.path.clone(), absent] {
        let mut s = uncached(|_| format!("disk_path = \"{}\"\n", disk.display()));
        let r = s.reload(&s.caching);
        assert!(r.starts_with("HTTP/1.1 422"), "{}: {r}", disk.display());
        assert!(r.contains("not writable"), "{r}");
        assert!(r.contains(&ro.path.display().to_string()), "{r}");
        // The old config still serves: the route does not cache.
        let r = get(&s.listen, "GET", "/", "");
        assert!(r.ends_with("cached") && !r.contains("cache-status"), "{r}");
        stop(&mut s.child);

        // A start with it stops with the same error.
        let file = s.dir.path().join("disk.toml");
        std::fs::write(&file, &s.caching).unwrap();
        let mut child = Command::new(BIN)
            .args(["serve", "--config", file.to_str().unwrap()])
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > deadline {
                stop(&mut child);
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(
            status.is_some_and(|s| !s.success()),
            "a start over {} did not stop: {status:?} {err}",
            disk.display()
        );
        assert!(err.contains("not writable"), "{err}");
        assert!(err.contains(&ro.path.display().to_string()), "{err}");
    }
}

/// A reload that would build the first cache with `[cache.cluster]` and is refused by a later
/// part leaves no control port open: a connection to it is refused at once. The prepare step
/// binds the port (a port in use refuses the reload) and only the commit serves it; the
/// candidate's listener task used to keep the port until a connection came, so the first
/// connection after the refusal was accepted by a cache that no longer existed. The reload that
/// goes through serves it.
#[test]
fn a_refused_reload_leaves_no_cluster_port_open() {
    let control = free_listen();
    let mut s = uncached(|listen| {
        format!(
            "\n[cache.cluster]\nself = \"{listen}\"\npeers = [\"{listen}\"]\n\
             secret = \"0123456789abcdef\"\ncontrol_listen = \"{control}\"\n"
        )
    });
    s.refused();
    let err = std::net::TcpStream::connect(&control).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");

    let r = s.reload(&s.caching);
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    std::net::TcpStream::connect(&control).unwrap();
    stop(&mut s.child);
}

/// After SIGTERM, while an open `[[tcp]]` connection keeps the process draining, a SIGHUP
/// applies nothing: a listener the new file adds is never bound (it was, with its accept loop
/// started in a process on its way out), and the outcome beside the pid file says "draining".
#[cfg(feature = "tcp")]
#[test]
fn a_reload_while_draining_binds_no_listener() {
    // An origin that holds each connection open until the client's side ends, and says when
    // it has one.
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let origin_addr = origin.local_addr().unwrap().to_string();
    let (seen_tx, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for mut s in origin.incoming().flatten() {
            let _ = seen_tx.send(());
            std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                while s.read(&mut buf).is_ok_and(|n| n > 0) {}
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    let pid = dir.path().join("sluice.pid");
    let report = dir.path().join("sluice.pid.reload");
    let (listen, relay, added) = (free_listen(), free_listen(), free_listen());
    let text = |tcp: &[&str]| {
        let mut t = format!(
            "[server]\nlisten = [\"{listen}\"]\npid_file = \"{}\"\nshutdown_grace_secs = 60\n\n\
             [[upstreams]]\nname = \"db\"\nservers = [\"{origin_addr}\"]\n",
            pid.display()
        );
        for l in tcp {
            t.push_str(&format!("\n[[tcp]]\nlisten = \"{l}\"\nupstream = \"db\"\n"));
        }
        t
    };
    std::fs::write(&file, text(&[&relay])).unwrap();
    let mut child = start(&file, &listen, &pid);
    let held = std::net::TcpStream::connect(&relay).unwrap();
    seen.recv_timeout(Duration::from_secs(10))
        .expect("the relay never reached the origin");

    // SIGTERM: the HTTP listener closes, and the relayed connection keeps the process draining.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&listen).is_ok() {
        assert!(Instant::now() < deadline, "sluice did not start draining");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "nothing held the drain"
    );

    std::fs::write(&file, text(&[&relay, &added])).unwrap();
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    refused_as_draining(&report, &added);

    // The last connection closes: the drain ends, and so does the process.
    drop(held);
    exits_after_the_drain(&mut child);
}

/// SIGTERM while a SIGHUP reload is stuck reading its file (a config on a hung NFS mount, here a
/// FIFO nobody writes) starts the drain at once: it waited for the reload, so the listeners kept
/// accepting until SIGKILL. Once the file is read, the reload is refused ("draining": the
/// listener it adds is never bound), and the service manager, told STOPPING meanwhile, hears no
/// READY after it.
#[cfg(feature = "tcp")]
#[test]
fn a_reload_stuck_on_its_file_does_not_hold_the_drain() {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::net::UnixDatagram;
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let origin_addr = origin.local_addr().unwrap().to_string();
    let (seen_tx, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for mut s in origin.incoming().flatten() {
            let _ = seen_tx.send(());
            std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                while s.read(&mut buf).is_ok_and(|n| n > 0) {}
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    let pid = dir.path().join("sluice.pid");
    let report = dir.path().join("sluice.pid.reload");
    let notify_path = dir.path().join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let next = || {
        let mut buf = [0u8; 1024];
        let n = notify.recv(&mut buf).expect("a notification in time");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let (listen, relay, added) = (free_listen(), free_listen(), free_listen());
    let text = |tcp: &[&str]| {
        let mut t = format!(
            "[server]\nlisten = [\"{listen}\"]\npid_file = \"{}\"\nshutdown_grace_secs = 60\n\n\
             [[upstreams]]\nname = \"db\"\nservers = [\"{origin_addr}\"]\n",
            pid.display()
        );
        for l in tcp {
            t.push_str(&format!("\n[[tcp]]\nlisten = \"{l}\"\nupstream = \"db\"\n"));
        }
        t
    };
    std::fs::write(&file, text(&[&relay])).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--config", file.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .env_remove("WATCHDOG_USEC")
        .env("NOTIFY_SOCKET", &notify_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = next();
    assert!(ready.starts_with("READY=1\n"), "{ready:?}");
    let held = std::net::TcpStream::connect(&relay).unwrap();
    seen.recv_timeout(Duration::from_secs(10))
        .expect("the relay never reached the origin");

    // The config file becomes a FIFO: a reload blocks opening it, then reading it.
    std::fs::remove_file(&file).unwrap();
    let c_file = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c_file.as_ptr(), 0o600) }, 0);
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let reloading = next();
    assert!(reloading.starts_with("RELOADING=1\n"), "{reloading:?}");
    // A writer opens only once the reload holds the FIFO open: from then on it is stuck in
    // `read` (holding its turn) until the writer writes and closes.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut writer = loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&file)
        {
            Ok(w) => break w,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENXIO), "{e}");
                assert!(
                    Instant::now() < deadline,
                    "the reload never opened its file"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };

    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let stopping = next();
    assert!(stopping.starts_with("STOPPING=1\n"), "{stopping:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&listen).is_ok()
        || std::net::TcpStream::connect(&relay).is_ok()
    {
        assert!(
            Instant::now() < deadline,
            "the listeners still accept: the drain waits for the stuck reload"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "nothing held the drain"
    );

    // The file comes through (adding a listener): the reload is refused, nothing is bound.
    writer
        .write_all(text(&[&relay, &added]).as_bytes())
        .unwrap();
    drop(writer);
    refused_as_draining(&report, &added);

    drop(held);
    exits_after_the_drain(&mut child);
    // Every notification the process sent is queued: none after STOPPING says it serves.
    notify.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 1024];
    while let Ok(n) = notify.recv(&mut buf) {
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(!text.contains("READY=1"), "after STOPPING: {text:?}");
    }
}

/// The reload outcome written beside the pid file says the reload was refused while draining,
/// and the listener it would have added at `added` is not bound.
fn refused_as_draining(report: &std::path::Path, added: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let outcome = loop {
        if let Ok(text) = std::fs::read_to_string(report) {
            break text;
        }
        assert!(Instant::now() < deadline, "no reload outcome written");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        outcome.contains("\"reloaded\":false") && outcome.contains("draining"),
        "{outcome}"
    );
    let err = std::net::TcpStream::connect(added).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
}

/// Waits (at most 20 s) for `child` to exit once its drain has nothing left to wait for.
fn exits_after_the_drain(child: &mut std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "sluice did not exit after the drain"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
