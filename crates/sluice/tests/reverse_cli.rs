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

/// A reload that would build the first cache but is refused by a later part (here the TLS part:
/// a certificate file that is not there) builds nothing: when the file is fixed, with the same
/// `[cache]`, the next reload applies it (`[cache]` is still live while no cache runs) and the
/// route caches. The refused reload used to keep the cache it built in its prepare step, so the
/// next one was refused with "cache.… needs a restart".
#[test]
fn a_refused_reload_leaves_no_cache_behind() {
    let (origin, seen) = cacheable_origin();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    let pid = dir.path().join("sluice.pid");
    let listen = free_listen();
    // The media front end caches by default: off, so nothing builds a cache at start.
    let plain = format!(
        "{}\n[media]\ncache = false\n",
        config(&listen, &origin, &pid, 0)
    );
    std::fs::write(&file, &plain).unwrap();
    let mut child = start(&file, &listen, &pid);
    let r = get(&listen, "GET", "/", "");
    assert!(r.ends_with("cached") && !r.contains("cache-status"), "{r}");

    let caching = format!(
        "{}\n[cache]\nmemory_bytes = \"8MiB\"\n",
        plain.replace("upstream = \"app\"", "upstream = \"app\"\ncache = true")
    );
    let missing = dir.path().join("missing.pem");
    let broken = caching.replace(
        "threads = 0",
        &format!(
            "threads = 0\ntls_cert = \"{0}\"\ntls_key = \"{0}\"",
            missing.display()
        ),
    );
    let reload = |text: &str| {
        std::fs::write(&file, text).unwrap();
        get(&listen, "POST", "/admin/reload", "api_password: pw\r\n")
    };
    let r = reload(&broken);
    assert!(r.starts_with("HTTP/1.1 422"), "{r}");
    assert!(r.contains("missing.pem"), "{r}");
    // Nothing was applied: the route still does not cache.
    let r = get(&listen, "GET", "/", "");
    assert!(!r.contains("cache-status"), "{r}");

    let r = reload(&caching);
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let first = get(&listen, "GET", "/", "");
    assert!(first.ends_with("cached"), "{first}");
    let again = get(&listen, "GET", "/", "");
    assert!(
        again
            .to_ascii_lowercase()
            .contains("cache-status: sluice; hit"),
        "{again}"
    );
    assert!(again.ends_with("cached"), "{again}");
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 3);
    stop(&mut child);
}
