//! One keep-alive HTTP/1.1 connection to a loopback target, and one measured, verified GET on it.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use sha2::{Digest, Sha256};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// Where requests go. Only loopback addresses are accepted: the suite never sends load anywhere
/// else.
#[derive(Debug)]
pub struct Target {
    pub(crate) addr: SocketAddr,
    pub(crate) host: String,
    pub(crate) path_and_query: String,
    /// Extra request headers (e.g. `Range`), sent with every request.
    pub(crate) headers: Vec<(http::HeaderName, http::HeaderValue)>,
}

impl Target {
    pub fn parse(url: &str) -> Result<Self> {
        let uri: http::Uri = url.parse().with_context(|| format!("bad url {url}"))?;
        if uri.scheme_str() != Some("http") {
            bail!("only http:// targets are supported: {url}");
        }
        let authority = uri.authority().context("url has no host")?;
        let port = authority.port_u16().unwrap_or(80);
        let addr = (authority.host(), port)
            .to_socket_addrs()?
            .next()
            .context("host did not resolve")?;
        if !addr.ip().is_loopback() {
            bail!("refusing non-loopback target {addr}");
        }
        let path_and_query = uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        Ok(Target {
            addr,
            host: authority.as_str().to_string(),
            path_and_query,
            headers: Vec::new(),
        })
    }

    /// Adds `Name: value` request headers.
    pub fn with_headers(mut self, lines: &[String]) -> Result<Self> {
        for line in lines {
            let (name, value) = line
                .split_once(':')
                .with_context(|| format!("header without ':': {line}"))?;
            self.headers.push((
                http::HeaderName::from_bytes(name.trim().as_bytes())
                    .with_context(|| format!("bad header name in {line}"))?,
                http::HeaderValue::from_str(value.trim())
                    .with_context(|| format!("bad header value in {line}"))?,
            ));
        }
        Ok(self)
    }
}

/// What a correct response looks like.
#[derive(Debug, Clone)]
pub struct Expect {
    pub status: u16,
    pub len: Option<u64>,
    pub sha256: Option<[u8; 32]>,
}

/// Result of one request. `error` is a short label when the request failed.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub error: Option<String>,
    pub bytes: u64,
    pub ttfb: Duration,
    pub total: Duration,
    pub hashed: bool,
    /// When the request began: with `ttfb`, places its first byte on a clock shared by a round.
    pub started: Instant,
}

impl Outcome {
    fn failed(label: impl Into<String>, start: Instant) -> Self {
        Outcome {
            error: Some(label.into()),
            bytes: 0,
            ttfb: Duration::ZERO,
            total: start.elapsed(),
            hashed: false,
            started: start,
        }
    }

    pub fn ok(&self) -> bool {
        self.error.is_none()
    }
}

/// A connection that reconnects when the server closed it.
pub struct Conn {
    target: Arc<Target>,
    sender: Option<SendRequest<Empty<Bytes>>>,
    /// New TCP connections opened after the first one.
    pub reconnects: u64,
    opened: bool,
    /// This connection's number in its pool: `{i}` in the target path is replaced by it, so each
    /// client of a round can ask for its own object.
    index: usize,
}

impl Conn {
    pub fn with_index(target: Arc<Target>, index: usize) -> Self {
        Conn {
            target,
            sender: None,
            reconnects: 0,
            opened: false,
            index,
        }
    }

    /// Makes sure a usable connection is open, so that a timed request does not pay for connect.
    pub async fn ready(&mut self) -> Result<()> {
        if let Some(s) = self.sender.as_mut() {
            if !s.is_closed() && s.ready().await.is_ok() {
                return Ok(());
            }
        }
        self.sender = None;
        let stream = TcpStream::connect(self.target.addr).await?;
        stream.set_nodelay(true)?;
        let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            // The connection ends when the server closes it or the sender is dropped.
            let _ = conn.await;
        });
        sender.ready().await?;
        self.sender = Some(sender);
        if self.opened {
            self.reconnects += 1;
        }
        self.opened = true;
        Ok(())
    }

    /// One GET, read to the end, checked against `expect`, bounded by `timeout`.
    pub async fn get(&mut self, expect: &Expect, hash: bool, timeout: Duration) -> Outcome {
        let start = Instant::now();
        match tokio::time::timeout(timeout, self.get_inner(expect, hash, start)).await {
            Ok(outcome) => {
                if !outcome.ok() {
                    // Never reuse a connection whose last exchange went wrong.
                    self.sender = None;
                }
                outcome
            }
            Err(_) => {
                self.sender = None;
                Outcome::failed("timeout", start)
            }
        }
    }

    async fn get_inner(&mut self, expect: &Expect, hash: bool, start: Instant) -> Outcome {
        if self.ready().await.is_err() {
            return Outcome::failed("connect", start);
        }
        let Some(sender) = self.sender.as_mut() else {
            return Outcome::failed("connect", start);
        };
        let path = &self.target.path_and_query;
        let path = if path.contains("{i}") {
            path.replace("{i}", &self.index.to_string())
        } else {
            path.clone()
        };
        let mut builder = http::Request::get(path.as_str())
            .header(http::header::HOST, self.target.host.as_str())
            .header(http::header::USER_AGENT, "sluice-loadgen");
        for (name, value) in &self.target.headers {
            builder = builder.header(name, value);
        }
        let req = match builder.body(Empty::<Bytes>::new()) {
            Ok(r) => r,
            Err(_) => return Outcome::failed("request", start),
        };
        let resp = match sender.send_request(req).await {
            Ok(r) => r,
            Err(_) => return Outcome::failed("send", start),
        };
        let ttfb = start.elapsed();
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut hasher = hash.then(Sha256::new);
        let mut bytes = 0u64;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => {
                    if let Some(data) = f.data_ref() {
                        bytes += data.len() as u64;
                        if let Some(h) = hasher.as_mut() {
                            h.update(data);
                        }
                    }
                }
                Err(_) => return Outcome::failed("body", start),
            }
        }
        let total = start.elapsed();
        let error = if status != expect.status {
            Some(format!("status_{status}"))
        } else if expect.len.is_some_and(|len| len != bytes) {
            Some("length".to_string())
        } else {
            let digest = hasher.map(|h| h.finalize());
            match (digest, expect.sha256) {
                (Some(got), Some(want)) if got.as_slice() != want => Some("sha256".to_string()),
                _ => None,
            }
        };
        Outcome {
            error,
            bytes,
            ttfb,
            total,
            hashed: hash && expect.sha256.is_some(),
            started: start,
        }
    }
}

/// Parses a 64-digit hex SHA-256.
pub fn parse_sha256(hex: &str) -> Result<[u8; 32]> {
    if hex.len() != 64 {
        bail!("sha256 must be 64 hex digits");
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).context("bad hex in sha256")?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_non_loopback() {
        assert!(Target::parse("http://10.0.0.1:80/x").is_err());
        assert!(Target::parse("https://127.0.0.1/x").is_err());
        let t = Target::parse("http://127.0.0.1:8080/a?b=c").unwrap();
        assert_eq!(t.path_and_query, "/a?b=c");
        assert_eq!(t.host, "127.0.0.1:8080");
    }

    #[test]
    fn sha256_hex() {
        let h = parse_sha256(&"ab".repeat(32)).unwrap();
        assert!(h.iter().all(|b| *b == 0xab));
        assert!(parse_sha256("abc").is_err());
    }
}
