//! The binary as an operator meets it: the password from a file (never in argv), a misspelled
//! `RUST_LOG`, plain logs on a pipe, and a `/metrics` whose Content-Type matches its body.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// The sluice binary on a free loopback port, its stderr lines collected by a thread.
struct Binary {
    child: Child,
    port: u16,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Binary {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Binary {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.args(["serve", "--listen", &listen])
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("SLUICE_AUTH_API_PASSWORD")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let b = Binary { child, port, lines };
        b.wait_for("listening");
        b
    }

    fn wait_for(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self
                .lines
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains(needle))
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("no {needle:?} in {:?}", self.lines.lock().unwrap());
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn stderr(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn password_file_keeps_the_secret_out_of_argv_and_bad_rust_log_keeps_info() {
    let origin = Origin::start().await;
    let secret = "file-secret-7f3a";
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(file, "{secret}").unwrap();
    let b = Binary::start(
        &[
            "--allow-private-upstreams",
            "--api-password-file",
            file.path().to_str().unwrap(),
        ],
        &[("RUST_LOG", "warning")],
    );
    // The password works, the trailing newline is not part of it, and argv does not show it.
    let d = enc(&origin.url("/small"));
    assert_eq!(
        get(&b.url(&format!("/proxy/stream?d={d}"))).await.status,
        403
    );
    let r = get(&b.url(&format!("/proxy/stream?d={d}&api_password={secret}"))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), "hello");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", b.child.id())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains(secret));
    // `warning` is not a level: a warning says so, and info lines (the listener) still appear,
    // without colour codes because stderr is a pipe.
    let log = b.stderr();
    assert!(log.contains("\"warning\" is not a level"), "{log}");
    assert!(log.contains("listening"), "{log}");
    assert!(!log.contains('\u{1b}'), "{log}");
    assert!(!log.contains(secret), "{log}");
}

#[tokio::test]
async fn password_from_the_environment() {
    let b = Binary::start(&[], &[("SLUICE_AUTH_API_PASSWORD", "env-secret")]);
    let d = enc("http://127.0.0.1:1/x");
    assert_eq!(
        get(&b.url(&format!("/proxy/stream?d={d}"))).await.status,
        403
    );
    let r = get(&b.url(&format!("/proxy/stream?d={d}&api_password=wrong"))).await;
    assert_eq!(r.status, 403);
}

#[tokio::test]
async fn empty_password_file_is_refused() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--listen", "127.0.0.1:0", "--api-password-file"])
        .arg(file.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is empty"));
}

#[tokio::test]
async fn metrics_content_type_matches_the_body() {
    let s = Sluice::start(test_config()).await;
    // Spend a little CPU (bounded: 150 ms of wall time) so the CPU counter has something to show.
    let spin = Instant::now();
    let mut x = 0u64;
    while spin.elapsed() < Duration::from_millis(150) {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
    }
    // A plain scraper gets Prometheus text 0.0.4: no `# EOF`, counters typed by their sample name.
    let r = get(&s.url("/metrics")).await;
    assert_eq!(
        r.headers["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(!text.contains("# EOF"), "{text}");
    assert!(
        text.contains("# TYPE sluice_requests_total counter"),
        "{text}"
    );
    // Prometheus asks for OpenMetrics first and gets it.
    let r = request(
        "GET",
        &s.url("/metrics"),
        &[(
            "accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )],
    )
    .await;
    assert_eq!(
        r.headers["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(text.contains("# TYPE sluice_requests counter"), "{text}");
    // The standard process families, with believable values.
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} in {text}"))
            .parse()
            .unwrap()
    };
    assert!(value("process_resident_memory_bytes") > 1e6);
    assert!(value("process_open_fds") >= 3.0);
    assert!(value("process_cpu_seconds_total") > 0.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let start = value("process_start_time_seconds");
    assert!(
        start <= now + 1.0 && start > now - 3600.0,
        "{start} vs {now}"
    );
}

#[tokio::test]
async fn playlist_credentials_never_reach_a_client() {
    let mut config = test_config();
    // A provider URL with credentials in both places providers put them; nothing listens there.
    config.iptv.playlist =
        Some("http://acct:sekret1@127.0.0.1:1/get.php?username=acct&password=sekret2".into());
    let s = Sluice::start(config).await;
    let r = get(&s.url("/playlist.m3u")).await;
    assert_eq!(r.status, 502);
    assert_eq!(r.body.unwrap(), "playlist unavailable\n");
}
