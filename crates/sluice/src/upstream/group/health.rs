//! Active health checks: one background task per server that connects (TCP) or sends a GET (HTTP)
//! every interval and flips the server's healthy flag after `fall` failures or `rise` successes in a
//! row. The checker only flips flags; readers never wait on it.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::{Groups, Server};
use crate::upstream::happy;

/// `health_check = { ... }` in an `[[upstreams]]` group.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckConfig {
    /// `tcp`: a connect succeeds. `http`: `GET path` answers with `expect_status`.
    #[serde(default)]
    pub kind: CheckKind,
    /// Path of the HTTP check.
    #[serde(default = "default_path")]
    pub path: String,
    /// Seconds between checks of one server.
    #[serde(default = "default_interval")]
    pub interval_secs: u64,
    /// Seconds one check may take (connect, send, read the status line).
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
    /// Successes in a row that bring a down server back.
    #[serde(default = "default_rise")]
    pub rise: u32,
    /// Failures in a row that take an up server out.
    #[serde(default = "default_fall")]
    pub fall: u32,
    /// Status the HTTP check expects; absent = any 2xx or 3xx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_status: Option<u16>,
    /// Each check opens with a PROXY protocol v2 header of the LOCAL kind (no client: the proxy
    /// speaking for itself), as HAProxy's `check-send-proxy` does, for servers that require the
    /// header (a `[[tcp]]` listener's `send_proxy` in front of nginx's `proxy_protocol`): without
    /// it such a server refuses the check and is taken out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub send_proxy: bool,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CheckKind {
    #[default]
    Tcp,
    Http,
}

fn default_path() -> String {
    "/".into()
}
fn default_interval() -> u64 {
    5
}
fn default_timeout() -> u64 {
    2
}
fn default_rise() -> u32 {
    2
}
fn default_fall() -> u32 {
    3
}

impl HealthCheckConfig {
    /// Whether `other` probes servers the same way (what is sent and what counts as up), so a
    /// verdict of one holds for the other; its pace (interval, timeout, rise, fall) may differ.
    pub fn probes_like(&self, other: &HealthCheckConfig) -> bool {
        self.kind == other.kind
            && self.send_proxy == other.send_proxy
            && (self.kind == CheckKind::Tcp
                || (self.path == other.path && self.expect_status == other.expect_status))
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.interval_secs == 0 || self.timeout_secs == 0 {
            return Err("interval_secs and timeout_secs must be at least 1".into());
        }
        if self.rise == 0 || self.fall == 0 {
            return Err("rise and fall must be at least 1".into());
        }
        if !self.path.starts_with('/') || self.path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(format!(
                "path {:?} must start with / and hold no spaces",
                self.path
            ));
        }
        if let Some(s) = self.expect_status {
            if !(100..=599).contains(&s) {
                return Err(format!("expect_status {s} is not an HTTP status"));
            }
        }
        Ok(())
    }
}

/// The running checkers; dropping this stops them (a reload starts a new set).
#[derive(Debug, Default)]
pub struct HealthChecks {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for HealthChecks {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts one checker per server of every group that has `health_check`.
pub fn spawn(groups: &Groups) -> HealthChecks {
    let mut tasks = Vec::new();
    for group in groups.iter() {
        let Some(config) = group.health_check() else {
            continue;
        };
        for server in group.servers() {
            tasks.push(tokio::spawn(run(
                Arc::clone(server),
                config.clone(),
                group.name().to_string(),
            )));
        }
    }
    HealthChecks { tasks }
}

async fn run(server: Arc<Server>, config: HealthCheckConfig, group: String) {
    let interval = Duration::from_secs(config.interval_secs);
    let mut runs = Runs::default();
    loop {
        let result = probe(&server, &config, dial).await;
        runs.record(&server, &config, &group, result);
        tokio::time::sleep(interval).await;
    }
}

/// Whether `e` says this process is out of its own resources (descriptors, socket buffers,
/// memory): nothing about the peer it was talking to, so never counted against it.
pub fn is_local_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Whether a failure to reach a server is this side's, not the server's: local exhaustion
/// ([`is_local_exhaustion`]) or no local address/port to connect from (`EADDRNOTAVAIL`). Such a
/// failure is booked on no server; only exhaustion is no verdict for the active check
/// (`Runs::record`), and only exhaustion stops the attempts (another server may be reached
/// without a local port toward this one).
pub fn is_local_failure(e: &io::Error) -> bool {
    is_local_exhaustion(e) || e.raw_os_error() == Some(libc::EADDRNOTAVAIL)
}

/// A checker's runs of successes and failures for one server.
#[derive(Debug, Default)]
struct Runs {
    ok: u32,
    fail: u32,
    /// Since when every check has failed with `EADDRNOTAVAIL` (none: the last one did not).
    no_address_since: Option<tokio::time::Instant>,
}

/// How long checks failing with `EADDRNOTAVAIL` are no verdict: ports toward one destination
/// run out while connections to it sit in TIME_WAIT (60 s on Linux), which a client can bring
/// about (connections held through `[[tcp]]`, or ~470 opened and closed a second); past twice
/// that, the address is taken to be one this host cannot reach from, and the checks count.
const NO_ADDRESS_GRACE: Duration = Duration::from_secs(120);

impl Runs {
    /// Counts one check's `result` and flips the server after `rise` or `fall` in a row. A check
    /// that failed for this side's exhaustion ([`is_local_exhaustion`]: a full descriptor table,
    /// say, which any client can bring about) is no verdict: neither run moves, so it can neither
    /// take a healthy server out nor bring a down one back. `EADDRNOTAVAIL` is no verdict for
    /// [`NO_ADDRESS_GRACE`] (ports toward one destination, used up meanwhile by clients), then a
    /// failure: a check that never gave a verdict would keep a server this host cannot reach
    /// from up for ever.
    fn record(
        &mut self,
        server: &Server,
        config: &HealthCheckConfig,
        group: &str,
        result: io::Result<()>,
    ) {
        let no_address = matches!(&result, Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL));
        if !no_address {
            self.no_address_since = None;
        }
        match result {
            Err(e)
                if no_address
                    && self
                        .no_address_since
                        .get_or_insert_with(tokio::time::Instant::now)
                        .elapsed()
                        < NO_ADDRESS_GRACE =>
            {
                tracing::warn!(%group, server = server.addr(), error = %e,
                    "health check: no local address toward the server, no verdict yet");
            }
            Ok(()) => {
                self.fail = 0;
                self.ok = self.ok.saturating_add(1);
                if !server.is_healthy() && self.ok >= config.rise {
                    tracing::info!(%group, server = server.addr(), "health check: server up");
                    server.set_healthy(true);
                }
            }
            Err(e) if is_local_exhaustion(&e) => {
                tracing::warn!(%group, server = server.addr(), error = %e,
                    "health check: out of local resources, no verdict");
            }
            Err(why) => {
                self.ok = 0;
                self.fail = self.fail.saturating_add(1);
                if server.is_healthy() && self.fail >= config.fall {
                    tracing::warn!(%group, server = server.addr(), %why, "health check: server down");
                    server.set_healthy(false);
                }
            }
        }
    }
}

/// How a check dials its server: through the shared resolver and Happy Eyeballs, as requests do.
async fn dial(addr: String, attempt: Duration) -> io::Result<TcpStream> {
    happy::connect_name(&addr, attempt).await
}

/// One check within the check's timeout; `connect` dials the server (its address and the budget
/// of one of its addresses): [`dial`] but in tests.
async fn probe<F, Fut>(server: &Server, config: &HealthCheckConfig, connect: F) -> io::Result<()>
where
    F: FnOnce(String, Duration) -> Fut,
    Fut: std::future::Future<Output = io::Result<TcpStream>>,
{
    let timeout = Duration::from_secs(config.timeout_secs);
    match tokio::time::timeout(timeout, check(server, config, connect)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer within {} s", config.timeout_secs),
        )),
    }
}

/// A failure of the check's own making (no I/O error underneath), with its words.
fn failed(text: String) -> io::Error {
    io::Error::other(text)
}

/// Adds what was being done to an I/O error's words, keeping its kind and, when it has one, its
/// OS code (which [`is_local_failure`] reads).
fn doing(what: &'static str) -> impl FnOnce(io::Error) -> io::Error {
    move |e| match e.raw_os_error() {
        Some(_) => e,
        None => io::Error::new(e.kind(), format!("{what}: {e}")),
    }
}

async fn check<F, Fut>(server: &Server, config: &HealthCheckConfig, connect: F) -> io::Result<()>
where
    F: FnOnce(String, Duration) -> Fut,
    Fut: std::future::Future<Output = io::Result<TcpStream>>,
{
    // Through the shared resolver and Happy Eyeballs, as requests dial: each address may use
    // half the check's budget, so a silent first address leaves the next its turn.
    let attempt = (Duration::from_secs(config.timeout_secs) / 2).max(happy::STAGGER);
    let mut stream = connect(server.addr().to_string(), attempt)
        .await
        .map_err(doing("connect"))?;
    if config.send_proxy {
        stream
            .write_all(&sluice_http::proxy_protocol::encode_v2_local())
            .await
            .map_err(doing("send"))?;
    }
    if config.kind == CheckKind::Tcp {
        return Ok(());
    }
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: sluice-health-check\r\nConnection: close\r\n\r\n",
        config.path,
        server.addr()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(doing("send"))?;
    // The status line is all we need; read until its end or 1 KiB.
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    while !buf.windows(2).any(|w| w == b"\r\n") && buf.len() < 1024 {
        let n = stream.read(&mut chunk).await.map_err(doing("read"))?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let status = parse_status(&buf).ok_or_else(|| failed("no HTTP status line".to_string()))?;
    let good = match config.expect_status {
        Some(want) => status == want,
        None => (200..400).contains(&status),
    };
    if good {
        Ok(())
    } else {
        Err(failed(format!("status {status}")))
    }
}

/// The code of an `HTTP/1.x NNN ...` status line.
fn parse_status(buf: &[u8]) -> Option<u16> {
    let rest = buf
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| buf.strip_prefix(b"HTTP/1.0 "))?;
    let code = rest.get(..3)?;
    if !code.iter().all(u8::is_ascii_digit) || !matches!(rest.get(3), Some(b' ' | b'\r')) {
        return None;
    }
    std::str::from_utf8(code).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::parse_status;

    /// Finding: a check dialled its server with `getaddrinfo` and one address after the other,
    /// outside the resolver and Happy Eyeballs. It dials as requests do: `localhost` is `::1`
    /// and `127.0.0.1` (RFC 6761), so a server on `::1` alone is checked up.
    #[tokio::test]
    async fn a_check_dials_through_the_resolver() {
        let Ok(v6) = tokio::net::TcpListener::bind("[::1]:0").await else {
            eprintln!("no IPv6 loopback here; skipped");
            return;
        };
        let port = v6.local_addr().unwrap().port();
        let config: super::super::GroupConfig = toml::from_str(&format!(
            "name = \"app\"\nservers = [\"localhost:{port}\"]\n\
             [health_check]\nkind = \"tcp\"\ntimeout_secs = 2\n"
        ))
        .unwrap();
        let group = super::super::Group::new(&config).unwrap();
        let check = config.health_check.clone().unwrap();
        let server = group.servers()[0].clone();
        super::check(&server, &check, super::dial).await.unwrap();
    }

    fn os(code: i32) -> std::io::Error {
        std::io::Error::from_raw_os_error(code)
    }

    #[test]
    fn local_failures_are_told_from_the_servers() {
        use super::{is_local_exhaustion, is_local_failure};
        for code in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            assert!(is_local_exhaustion(&os(code)), "{code}");
            assert!(is_local_failure(&os(code)), "{code}");
        }
        assert!(!is_local_exhaustion(&os(libc::EADDRNOTAVAIL)));
        assert!(is_local_failure(&os(libc::EADDRNOTAVAIL)));
        for code in [
            libc::ECONNREFUSED,
            libc::ETIMEDOUT,
            libc::ECONNRESET,
            libc::EHOSTUNREACH,
        ] {
            assert!(!is_local_failure(&os(code)), "{code}");
        }
        assert!(!is_local_failure(&std::io::Error::other("status 500")));
    }

    /// Finding: a check's connect error became a string and counted toward `fall`, EMFILE
    /// included, so a client that filled the descriptor table (with `[[tcp]]` connections, say)
    /// had every checked server marked down. A check failed on this side is now no verdict: it
    /// moves neither run. Tested through the checker's dial seam (exhausting the real
    /// descriptor table would disturb the other tests of this binary).
    #[tokio::test]
    async fn a_check_out_of_descriptors_is_no_verdict() {
        let config: super::super::GroupConfig = toml::from_str(
            "name = \"app\"\nservers = [\"127.0.0.1:9\"]\n\
             [health_check]\nkind = \"tcp\"\ntimeout_secs = 2\nrise = 2\nfall = 2\n",
        )
        .unwrap();
        let group = super::super::Group::new(&config).unwrap();
        let check = config.health_check.clone().unwrap();
        let server = group.servers()[0].clone();
        let mut runs = super::Runs::default();
        // Each check's dial fails with `code`.
        let step = |code: i32| {
            let (server, check) = (server.clone(), check.clone());
            async move {
                let dial = |_: String, _| async move { Err(os(code)) };
                super::probe(&server, &check, dial).await
            }
        };
        for code in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            for _ in 0..5 {
                let result = step(code).await;
                assert_eq!(result.as_ref().unwrap_err().raw_os_error(), Some(code));
                runs.record(&server, &check, "app", result);
                assert!(server.is_healthy(), "{code}");
            }
        }
        // Nor does one break a run: refused, EMFILE, refused is two failures in a row.
        runs.record(&server, &check, "app", step(libc::ECONNREFUSED).await);
        runs.record(&server, &check, "app", step(libc::EMFILE).await);
        assert!(server.is_healthy());
        runs.record(&server, &check, "app", step(libc::ECONNREFUSED).await);
        assert!(!server.is_healthy());
        // ... and a down server needs `rise` real successes, EMFILE between them or not.
        runs.record(&server, &check, "app", Ok(()));
        runs.record(&server, &check, "app", step(libc::EMFILE).await);
        assert!(!server.is_healthy());
        runs.record(&server, &check, "app", Ok(()));
        assert!(server.is_healthy());
    }

    /// Finding (review of the above): `EADDRNOTAVAIL` was no verdict too, so a server no check
    /// could ever reach from this host stayed up for ever and kept its share of requests; then
    /// (review of db0590f7) a failure at once, so clients using up the ports toward a server
    /// (TIME_WAIT) got it taken out. No verdict for `NO_ADDRESS_GRACE`, then `fall` take it out.
    #[tokio::test(start_paused = true)]
    async fn a_check_with_no_local_address_is_a_failure() {
        let config: super::super::GroupConfig = toml::from_str(
            "name = \"app\"\nservers = [\"127.0.0.1:9\"]\n\
             [health_check]\nkind = \"tcp\"\ntimeout_secs = 2\nrise = 2\nfall = 2\n",
        )
        .unwrap();
        let group = super::super::Group::new(&config).unwrap();
        let check = config.health_check.clone().unwrap();
        let server = group.servers()[0].clone();
        let mut runs = super::Runs::default();
        let dial = |_: String, _| async move { Err(os(libc::EADDRNOTAVAIL)) };
        runs.record(
            &server,
            &check,
            "app",
            super::probe(&server, &check, dial).await,
        );
        assert!(server.is_healthy());
        // Within the grace (ports used up by clients pass): no verdict, however many.
        for _ in 0..10 {
            runs.record(
                &server,
                &check,
                "app",
                super::probe(&server, &check, dial).await,
            );
            tokio::time::advance(std::time::Duration::from_secs(10)).await;
        }
        assert!(server.is_healthy(), "ports used up for 100 s took it out");
        tokio::time::advance(super::NO_ADDRESS_GRACE).await;
        for _ in 0..2 {
            runs.record(
                &server,
                &check,
                "app",
                super::probe(&server, &check, dial).await,
            );
        }
        assert!(
            !server.is_healthy(),
            "two EADDRNOTAVAIL checks past the grace with fall = 2"
        );
    }

    #[test]
    fn status_lines() {
        assert_eq!(parse_status(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(parse_status(b"HTTP/1.0 503\r\n"), Some(503));
        assert_eq!(parse_status(b"HTTP/1.1 20 OK\r\n"), None);
        assert_eq!(parse_status(b"SSH-2.0\r\n"), None);
        assert_eq!(parse_status(b""), None);
    }
}
