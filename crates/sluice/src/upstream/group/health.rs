//! Active health checks: one background task per server that connects (TCP) or sends a GET (HTTP)
//! every interval and flips the server's healthy flag after `fall` failures or `rise` successes in a
//! row. The checker only flips flags; readers never wait on it.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
    let timeout = Duration::from_secs(config.timeout_secs);
    let (mut ok_run, mut fail_run) = (0u32, 0u32);
    loop {
        let result = match tokio::time::timeout(timeout, check(&server, &config)).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {} s", config.timeout_secs)),
        };
        match result {
            Ok(()) => {
                fail_run = 0;
                ok_run = ok_run.saturating_add(1);
                if !server.is_healthy() && ok_run >= config.rise {
                    tracing::info!(%group, server = server.addr(), "health check: server up");
                    server.set_healthy(true);
                }
            }
            Err(why) => {
                ok_run = 0;
                fail_run = fail_run.saturating_add(1);
                if server.is_healthy() && fail_run >= config.fall {
                    tracing::warn!(%group, server = server.addr(), %why, "health check: server down");
                    server.set_healthy(false);
                }
            }
        }
        tokio::time::sleep(interval).await;
    }
}

async fn check(server: &Server, config: &HealthCheckConfig) -> Result<(), String> {
    // Through the shared resolver and Happy Eyeballs, as requests dial: each address may use
    // half the check's budget, so a silent first address leaves the next its turn.
    let attempt = (Duration::from_secs(config.timeout_secs) / 2).max(happy::STAGGER);
    let mut stream = happy::connect_name(server.addr(), attempt)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    if config.send_proxy {
        stream
            .write_all(&sluice_http::proxy_protocol::encode_v2_local())
            .await
            .map_err(|e| format!("send: {e}"))?;
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
        .map_err(|e| format!("send: {e}"))?;
    // The status line is all we need; read until its end or 1 KiB.
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    while !buf.windows(2).any(|w| w == b"\r\n") && buf.len() < 1024 {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let status = parse_status(&buf).ok_or_else(|| "no HTTP status line".to_string())?;
    let good = match config.expect_status {
        Some(want) => status == want,
        None => (200..400).contains(&status),
    };
    if good {
        Ok(())
    } else {
        Err(format!("status {status}"))
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
        super::check(&server, &check).await.unwrap();
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
