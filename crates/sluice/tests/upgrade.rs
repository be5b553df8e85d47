//! Operating the binary as a service: the sd_notify sequence a service manager sees, and a binary
//! upgrade under load (keep-alive requests, a long `/proxy/stream`, a TCP relay) with zero failed
//! requests, then an upgrade to a process with a config error that leaves the old one serving.
//!
//! Every sluice here is a child process on `127.0.0.1`; every loop is bounded in count and time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn sha(b: &[u8]) -> String {
    format!("{:x}", Sha256::digest(b))
}

/// Deterministic body bytes.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

/// Waits for `/health` on `addr`.
fn wait_healthy(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(mut s) = TcpStream::connect(addr) {
            let _ = s
                .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            if out.contains("healthy") {
                return;
            }
        }
        assert!(Instant::now() < deadline, "sluice did not become healthy");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a pid this test started.
    unsafe { libc::kill(pid, sig) };
}

/// Waits for a child of this process (direct, or adopted as subreaper) to exit; its status.
fn wait_exit(pid: i32, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        let mut status = 0;
        // SAFETY: waitpid on a pid that is (or was reparented as) our child.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if rc == pid {
            return Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            });
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// === the notify protocol ===

#[test]
fn notify_sequence_ready_reloading_ready_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let port = free_port();
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "400000")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    // Reads datagrams until one that is not a watchdog ping; counts the pings.
    let mut pings = 0;
    let mut next = |sock: &UnixDatagram| -> String {
        let mut buf = [0u8; 1024];
        loop {
            let n = sock.recv(&mut buf).expect("a notification in time");
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            if text == "WATCHDOG=1" {
                pings += 1;
                continue;
            }
            return text;
        }
    };
    let ready = next(&sock);
    assert!(ready.starts_with("READY=1\n"), "{ready:?}");
    assert!(ready.contains(&format!("MAINPID={pid}")), "{ready:?}");
    // READY comes only once the listener is bound: the port answers now.
    wait_healthy(SocketAddr::from(([127, 0, 0, 1], port)));

    kill(pid, libc::SIGHUP);
    let reloading = next(&sock);
    let mut lines = reloading.lines();
    assert_eq!(lines.next(), Some("RELOADING=1"), "{reloading:?}");
    let usec: u64 = lines
        .next()
        .and_then(|l| l.strip_prefix("MONOTONIC_USEC="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("MONOTONIC_USEC in {reloading:?}"));
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let now_usec = now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1000;
    assert!(
        usec <= now_usec && now_usec - usec < 10_000_000,
        "{usec} vs {now_usec}"
    );
    let after = next(&sock);
    assert!(after.starts_with("READY=1\n"), "{after:?}");

    // Sleep past the watchdog interval, so pings (every 200 ms) must have come.
    std::thread::sleep(Duration::from_millis(700));
    kill(pid, libc::SIGTERM);
    let stopping = next(&sock);
    assert!(stopping.starts_with("STOPPING=1"), "{stopping:?}");
    assert!(pings >= 2, "watchdog pings: {pings}");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

// === upgrade under load ===

/// The origin: `/1k` (1 KiB), `/big` (`BIG` bytes paced over about `BIG_SECS`), keep-alive.
const BIG: usize = 4 << 20;
const BIG_SECS: u64 = 4;

fn origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            std::thread::spawn(move || serve_origin(conn));
        }
    });
    addr
}

fn serve_origin(conn: TcpStream) {
    let _ = conn.set_nodelay(true);
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut conn = conn;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
        }
        let body = if path.starts_with("/big") {
            pattern(BIG)
        } else {
            pattern(1024)
        };
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        if path.starts_with("/big") {
            if conn.write_all(head.as_bytes()).is_err() {
                return;
            }
            let chunk = BIG / 40;
            for part in body.chunks(chunk) {
                if conn.write_all(part).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(BIG_SECS * 1000 / 40));
            }
        } else if conn.write_all(&[head.as_bytes(), &body].concat()).is_err() {
            return;
        }
    }
}

/// A TCP echo server (the TCP relay's upstream).
fn echo() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = conn.try_clone().unwrap();
                let mut w = conn;
                let _ = std::io::copy(&mut r, &mut w);
            });
        }
    });
    addr
}

/// Reads one HTTP/1.1 response with a Content-Length body; whether the server will close.
fn read_response(reader: &mut BufReader<TcpStream>) -> std::io::Result<(u16, Vec<u8>, bool)> {
    let mut status = String::new();
    if reader.read_line(&mut status)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let code: u16 = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or(std::io::ErrorKind::InvalidData)?;
    let (mut len, mut close) = (0usize, false);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let lower = h.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v
                .trim()
                .parse()
                .map_err(|_| std::io::ErrorKind::InvalidData)?;
        }
        if lower.starts_with("connection:") && lower.contains("close") {
            close = true;
        }
        if h == "\r\n" {
            break;
        }
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body)?;
    Ok((code, body, close))
}

/// Keep-alive GETs of `path` until `stop` (at most `MAX_REQUESTS`): reconnects only where the
/// server said `Connection: close`. Every other end of a connection is a failure.
fn keep_alive_loop(
    addr: SocketAddr,
    path: &str,
    want: &[u8],
    stop: &AtomicBool,
    ok: &AtomicU64,
) -> Vec<String> {
    const MAX_REQUESTS: u64 = 200_000;
    let mut failures = Vec::new();
    let mut conn: Option<BufReader<TcpStream>> = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !stop.load(Ordering::Relaxed)
        && ok.load(Ordering::Relaxed) < MAX_REQUESTS
        && Instant::now() < deadline
    {
        let reader = match conn.as_mut() {
            Some(r) => r,
            None => match TcpStream::connect(addr) {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    conn.insert(BufReader::new(s))
                }
                Err(e) => {
                    failures.push(format!("connect: {e}"));
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            },
        };
        let req = format!("GET {path} HTTP/1.1\r\nHost: app.test\r\n\r\n");
        let sent = reader.get_mut().write_all(req.as_bytes());
        let result = sent.and_then(|_| read_response(reader));
        match result {
            Ok((200, body, close)) if body == want => {
                ok.fetch_add(1, Ordering::Relaxed);
                if close {
                    conn = None;
                }
            }
            Ok((code, body, _)) => {
                failures.push(format!("status {code}, {} bytes", body.len()));
                conn = None;
            }
            Err(e) => {
                failures.push(format!("request: {e}"));
                conn = None;
            }
        }
    }
    failures
}

/// The config both processes read: a reverse route and the media front end to the origin, a
/// TCP relay to the echo server.
fn config_text(http: u16, tcp: u16, origin: SocketAddr, echo: SocketAddr, pid: &Path) -> String {
    format!(
        r#"[server]
listen = ["127.0.0.1:{http}"]
pid_file = "{pid}"
shutdown_grace_secs = 30

[upstream]
allow_private = true

[[upstreams]]
name = "origin"
servers = ["{origin}"]

[[routes]]
host = "app.test"
path = "/"
upstream = "origin"

[[upstreams]]
name = "echo"
servers = ["{echo}"]

[[tcp]]
name = "echo"
listen = "127.0.0.1:{tcp}"
upstream = "echo"
"#,
        pid = pid.display()
    )
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Kills whatever sluice the test leaves behind, however it ends.
struct Cleanup(Vec<PathBuf>, Vec<i32>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for pid in self
            .0
            .iter()
            .filter_map(|p| read_pid(p))
            .chain(self.1.iter().copied())
        {
            kill(pid, libc::SIGKILL);
            let _ = wait_exit(pid, Duration::from_secs(2));
        }
    }
}

#[test]
fn upgrade_under_load_drops_nothing_and_a_bad_new_config_keeps_the_old() {
    // Processes the old sluice starts outlive it; as subreaper this test can wait for them.
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER only changes this process's reaping.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("sluice");
    // `UPGRADE_TEST_BIN`: another build to run (docs/deploy.md measures a release build so).
    let source = std::env::var("UPGRADE_TEST_BIN").unwrap_or_else(|_| BIN.to_string());
    std::fs::copy(&source, &bin).unwrap();
    let (origin, echo) = (origin(), echo());
    let (http, tcp) = (free_port(), free_port());
    let pid_file = dir.path().join("sluice.pid");
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, config_text(http, tcp, origin, echo, &pid_file)).unwrap();
    let log_path = dir.path().join("sluice.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let old: Child = Command::new(&bin)
        .args(["serve", "--config", config.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let old_pid = old.id() as i32;
    let _cleanup = Cleanup(vec![pid_file.clone()], vec![old_pid]);
    let addr = SocketAddr::from(([127, 0, 0, 1], http));
    wait_healthy(addr);

    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let one_k = pattern(1024);
    let loops: Vec<_> = (0..2)
        .map(|_| {
            let (stop, ok, want) = (stop.clone(), ok.clone(), one_k.clone());
            std::thread::spawn(move || keep_alive_loop(addr, "/1k", &want, &stop, &ok))
        })
        .collect();
    // The long stream through the media front end.
    let stream = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let d = format!("http://{origin}/big");
        let req = format!(
            "GET /proxy/stream?d={} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
            url::form_urlencoded::byte_serialize(d.as_bytes()).collect::<String>()
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut r = BufReader::new(s);
        read_response(&mut r).map(|(code, body, _)| (code, sha(&body), body.len()))
    });
    // The TCP relay: 1 MiB written in 40 paced pieces, echoed back whole.
    let relay = std::thread::spawn(move || {
        let data = pattern(1 << 20);
        let mut s = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], tcp))).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut r = s.try_clone().unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; 1 << 20];
            r.read_exact(&mut got).map(|_| got)
        });
        for part in data.chunks(data.len() / 40) {
            s.write_all(part).unwrap();
            std::thread::sleep(Duration::from_millis(100));
        }
        let got = reader.join().unwrap();
        got.map(|g| g == data)
    });

    // Let the load run, then put a "new binary" in place and upgrade.
    std::thread::sleep(Duration::from_millis(1000));
    let before = ok.load(Ordering::Relaxed);
    assert!(before > 0, "load is running");
    let staged = dir.path().join("sluice.new");
    std::fs::copy(&source, &staged).unwrap();
    std::fs::rename(&staged, &bin).unwrap();
    let signalled = Instant::now();
    let out = Command::new(BIN)
        .args(["upgrade", "--pid-file", pid_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // The new process writes the pid file once it serves.
    let deadline = Instant::now() + Duration::from_secs(20);
    let new_pid = loop {
        match read_pid(&pid_file) {
            Some(p) if p != old_pid => break p,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "no new process took over: {}",
            std::fs::read_to_string(&log_path).unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let _cleanup_new = Cleanup(vec![], vec![new_pid]);
    let took_over = signalled.elapsed();
    // The old one drains: it is still there while the long stream and the relay run.
    let (code, digest, len) = stream.join().unwrap().expect("the long stream completes");
    assert_eq!((code, len), (200, BIG));
    assert_eq!(digest, sha(&pattern(BIG)), "the long stream is byte-exact");
    assert!(
        relay.join().unwrap().expect("the relay completes"),
        "relay bytes echoed exactly"
    );
    let mut old = old;
    let status = {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if let Some(s) = old.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "the old process did not exit after draining"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    assert!(status.success(), "old process: {status}");
    eprintln!(
        "upgrade: new process serving {} ms after `sluice upgrade`; old one exited {} ms after \
         (it waited for the long stream)",
        took_over.as_millis(),
        signalled.elapsed().as_millis()
    );
    // Load goes on against the new process alone for a moment.
    let at_exit = ok.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let failures: Vec<String> = loops.into_iter().flat_map(|l| l.join().unwrap()).collect();
    let total = ok.load(Ordering::Relaxed);
    assert!(
        failures.is_empty(),
        "{} failed of {total}: {failures:?}",
        failures.len()
    );
    eprintln!("upgrade: {total} keep-alive requests across the upgrade, 0 failed");
    assert!(total > at_exit, "the new process served the loop");
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        log.contains("took over the previous process's listening sockets"),
        "{log}"
    );

    // A new binary whose config does not load: the running one stays and keeps serving.
    std::fs::write(
        &config,
        "[server]\nlisten = [\"127.0.0.1:1\"]\nno_such_key = 1\n",
    )
    .unwrap();
    kill(new_pid, libc::SIGUSR2);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log_path)
        .unwrap()
        .contains("upgrade failed, this process goes on serving")
    {
        assert!(Instant::now() < deadline, "no upgrade failure logged");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(read_pid(&pid_file), Some(new_pid));
    let (stop, ok) = (AtomicBool::new(false), AtomicU64::new(0));
    std::thread::scope(|s| {
        let h = s.spawn(|| keep_alive_loop(addr, "/1k", &one_k, &stop, &ok));
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        assert!(h.join().unwrap().is_empty());
    });
    assert!(
        ok.load(Ordering::Relaxed) > 0,
        "the old process still serves"
    );
    kill(new_pid, libc::SIGTERM);
    assert_eq!(wait_exit(new_pid, Duration::from_secs(40)), Some(0));
}

// === signals, the pid file, a second upgrade ===

/// A config on `127.0.0.1:<http>` with `pid_file`.
fn plain_config(dir: &Path, http: u16) -> (PathBuf, PathBuf) {
    let pid_file = dir.join("sluice.pid");
    let config = dir.join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = [\"127.0.0.1:{http}\"]\npid_file = \"{}\"\nshutdown_grace_secs = 5\n",
            pid_file.display()
        ),
    )
    .unwrap();
    (config, pid_file)
}

/// `bin serve --config config`, its log in `log`; its pid. The test reaps it with [`wait_exit`]
/// (`waitpid`), as it does the processes its upgrades start.
#[allow(clippy::zombie_processes)]
fn serve(bin: &Path, config: &Path, log: &Path, notify: Option<&Path>) -> i32 {
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--config", config.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    if let Some(n) = notify {
        cmd.env("NOTIFY_SOCKET", n);
    }
    cmd.spawn().unwrap().id() as i32
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A notify socket whose queue is full: the server's `READY=1` blocks in `sendto` until
/// [`drain`] reads it, so the process is held between writing its pid file and running on.
fn full_notify_socket(path: &Path) -> UnixDatagram {
    let sock = UnixDatagram::bind(path).unwrap();
    let filler = UnixDatagram::unbound().unwrap();
    filler.set_nonblocking(true).unwrap();
    for i in 0.. {
        match filler.send_to(b"filler", path) {
            Ok(_) => assert!(i < 1_000_000, "the notify queue never fills"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    sock
}

/// Reads the notify socket from now on; what came, filler left out.
fn drain(sock: UnixDatagram) -> Arc<std::sync::Mutex<Vec<String>>> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let out = seen.clone();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1024];
        while let Ok(n) = sock.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            if text != "filler" {
                out.lock().unwrap().push(text);
            }
        }
    });
    seen
}

/// SIGHUP, SIGUSR2 and SIGTERM that come once the pid file names the process, before it has
/// said it is ready (held there by a full notify socket), are not the default action (the
/// process killed): they reload, upgrade, drain.
#[test]
fn signals_once_the_pid_file_is_written_are_handled_not_fatal() {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER only changes this process's reaping.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let dir = tempfile::tempdir().unwrap();
    let http = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], http));
    let (config, pid_file) = plain_config(dir.path(), http);
    let log = dir.path().join("sluice.log");
    let notify = dir.path().join("notify.sock");

    // SIGHUP and SIGUSR2: a reload, then an upgrade.
    let sock = full_notify_socket(&notify);
    let old_pid = serve(Path::new(BIN), &config, &log, Some(&notify));
    let mut cleanup = Cleanup(vec![pid_file.clone()], vec![old_pid]);
    wait_for("the pid file", Duration::from_secs(20), || {
        read_pid(&pid_file) == Some(old_pid)
    });
    // Well inside the window: the process is blocked sending READY=1.
    std::thread::sleep(Duration::from_millis(300));
    kill(old_pid, libc::SIGHUP);
    kill(old_pid, libc::SIGUSR2);
    std::thread::sleep(Duration::from_millis(100));
    let seen = drain(sock);
    let (mut new_pid, mut exited) = (None, None);
    wait_for("the upgrade", Duration::from_secs(20), || {
        if exited.is_none() {
            exited = wait_exit(old_pid, Duration::ZERO);
        }
        if let Some(status) = exited {
            assert_eq!(
                status,
                0,
                "the process died of the signals (128 + signal); {}",
                std::fs::read_to_string(&log).unwrap()
            );
        }
        new_pid = read_pid(&pid_file).filter(|p| *p != old_pid);
        new_pid.is_some()
    });
    let new_pid = new_pid.unwrap();
    cleanup.1.push(new_pid);
    wait_healthy(addr);
    wait_for(
        "the reload and the hand-over",
        Duration::from_secs(10),
        || {
            let seen = seen.lock().unwrap();
            seen.iter().any(|m| m.starts_with("RELOADING=1"))
                && seen
                    .iter()
                    .any(|m| m.starts_with(&format!("MAINPID={new_pid}\n")))
        },
    );
    wait_for(
        "the old process to drain and exit",
        Duration::from_secs(20),
        || {
            if exited.is_none() {
                exited = wait_exit(old_pid, Duration::ZERO);
            }
            exited.is_some()
        },
    );
    assert_eq!(exited, Some(0));
    kill(new_pid, libc::SIGTERM);
    assert_eq!(wait_exit(new_pid, Duration::from_secs(20)), Some(0));
    let _ = std::fs::remove_file(&notify);

    // SIGTERM: a drain and a clean exit.
    let sock = full_notify_socket(&notify);
    let pid = serve(Path::new(BIN), &config, &log, Some(&notify));
    cleanup.1.push(pid);
    wait_for("the pid file", Duration::from_secs(20), || {
        read_pid(&pid_file) == Some(pid)
    });
    std::thread::sleep(Duration::from_millis(300));
    kill(pid, libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(100));
    let seen = drain(sock);
    assert_eq!(
        wait_exit(pid, Duration::from_secs(20)),
        Some(0),
        "SIGTERM before READY=1: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .any(|m| m.starts_with("STOPPING=1")),
        "{seen:?}"
    );
}

/// `path` made an executable shell script with `body`.
fn script(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    let staged = path.with_extension("staged");
    std::fs::write(&staged, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

fn count(log: &Path, what: &str) -> usize {
    std::fs::read_to_string(log).unwrap().matches(what).count()
}

/// A new binary that writes its pid file and dies before it is ready: the old process, which
/// goes on serving, names itself in the pid file again (`sluice reload`/`upgrade` find it).
#[test]
fn a_failed_upgrade_leaves_the_pid_file_naming_the_old_process() {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER only changes this process's reaping.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("sluice");
    std::fs::copy(BIN, &bin).unwrap();
    let http = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], http));
    let (config, pid_file) = plain_config(dir.path(), http);
    let log = dir.path().join("sluice.log");
    let old_pid = serve(&bin, &config, &log, None);
    let _cleanup = Cleanup(vec![], vec![old_pid]);
    wait_healthy(addr);
    script(&bin, &format!("echo $$ > '{}'\nexit 1", pid_file.display()));
    kill(old_pid, libc::SIGUSR2);
    wait_for("the failure", Duration::from_secs(20), || {
        count(&log, "upgrade failed, this process goes on serving") == 1
    });
    let deadline = Instant::now() + Duration::from_secs(3);
    while read_pid(&pid_file) != Some(old_pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        read_pid(&pid_file),
        Some(old_pid),
        "the pid file names a dead process"
    );
    wait_healthy(addr);
    kill(old_pid, libc::SIGTERM);
    assert_eq!(wait_exit(old_pid, Duration::from_secs(20)), Some(0));
    assert!(!pid_file.exists(), "removed at exit");
}

/// A SIGUSR2 that comes while an upgrade runs (two package installs in a row) is passed on:
/// the new process upgrades again, to the binary installed last.
#[test]
fn a_second_sigusr2_during_an_upgrade_is_passed_on_to_the_new_process() {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER only changes this process's reaping.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("sluice");
    let next = dir.path().join("sluice-next");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::copy(BIN, &next).unwrap();
    let http = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], http));
    let (config, pid_file) = plain_config(dir.path(), http);
    let log = dir.path().join("sluice.log");
    let old_pid = serve(&bin, &config, &log, None);
    let mut cleanup = Cleanup(vec![pid_file.clone()], vec![old_pid]);
    wait_healthy(addr);
    // A new binary slow to start: the second SIGUSR2 comes while the first upgrade runs.
    script(&bin, &format!("sleep 2\nexec '{}' \"$@\"", next.display()));
    kill(old_pid, libc::SIGUSR2);
    // The second once the first is taken (two before that would be one).
    wait_for(
        "the first upgrade to start",
        Duration::from_secs(10),
        || count(&log, "SIGUSR2: starting the new binary") == 1,
    );
    kill(old_pid, libc::SIGUSR2);
    let serving = "the new process is serving; draining and exiting";
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(&log, serving) < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let pids: Vec<i32> = text
        .lines()
        .filter(|l| l.contains(serving))
        .filter_map(|l| {
            l.split("new_pid=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    cleanup.1.extend(&pids);
    assert_eq!(pids.len(), 2, "two upgrades: {text}");
    assert_eq!(count(&log, "passing it on to the new process"), 1, "{text}");
    let (first, last) = (pids[0], pids[1]);
    wait_healthy(addr);
    assert_eq!(read_pid(&pid_file), Some(last));
    for pid in [old_pid, first] {
        assert_eq!(
            wait_exit(pid, Duration::from_secs(20)),
            Some(0),
            "pid {pid} drains and exits"
        );
    }
    kill(last, libc::SIGTERM);
    assert_eq!(wait_exit(last, Duration::from_secs(20)), Some(0));
}
