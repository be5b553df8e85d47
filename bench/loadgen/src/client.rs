//! One keep-alive connection to a loopback target (HTTP/1.1, or HTTP/2 over TLS), and one
//! measured, verified GET on it.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::{Digest, Sha256};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use crate::quic::{H3Conn, SharedH3};
use crate::tls::{Handshake, TlsClient};

/// Where requests go. Only loopback addresses are accepted: the suite never sends load anywhere
/// else.
#[derive(Debug)]
pub struct Target {
    pub(crate) addr: SocketAddr,
    pub(crate) host: String,
    pub(crate) path_and_query: String,
    /// Extra request headers (e.g. `Range`), sent with every request.
    pub(crate) headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// `https://`: set by `with_tls`, which such a target needs.
    pub(crate) secure: bool,
    pub(crate) tls: Option<TlsClient>,
    /// HTTP/2 (over TLS, by ALPN), with this many concurrent streams per connection.
    pub(crate) h2_streams: Option<usize>,
    /// HTTP/3 (QUIC to the same port over UDP), with this many concurrent streams per
    /// connection.
    pub(crate) h3_streams: Option<usize>,
}

impl Target {
    pub fn parse(url: &str) -> Result<Self> {
        let uri: http::Uri = url.parse().with_context(|| format!("bad url {url}"))?;
        let secure = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => bail!("only http:// and https:// targets are supported: {url}"),
        };
        let authority = uri.authority().context("url has no host")?;
        let port = authority
            .port_u16()
            .unwrap_or(if secure { 443 } else { 80 });
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
            secure,
            tls: None,
            h2_streams: None,
            h3_streams: None,
        })
    }

    /// TLS for an `https://` target: trust `ca`, handshake as `handshake` says, and speak
    /// HTTP/2 (`h2_streams`) or HTTP/3 (`h3_streams`) with that many concurrent streams per
    /// connection when given.
    pub fn with_tls(
        mut self,
        ca: Option<&std::path::Path>,
        handshake: Handshake,
        h2_streams: Option<usize>,
        h3_streams: Option<usize>,
    ) -> Result<Self> {
        let multiplexed = h2_streams.is_some() || h3_streams.is_some();
        if !self.secure {
            if ca.is_some() || multiplexed || handshake != Handshake::Keep {
                bail!("--ca, --handshake, --h2-streams and --h3-streams need an https:// url");
            }
            return Ok(self);
        }
        if h2_streams.is_some() && h3_streams.is_some() {
            bail!("--h2-streams and --h3-streams are two protocols: give one");
        }
        if h3_streams.is_some() && handshake != Handshake::Keep {
            bail!("--h3-streams keeps its QUIC connections open: --handshake must be keep");
        }
        let ca = ca.context("an https:// url needs --ca (the PEM file of the CA to trust)")?;
        let host = self
            .host
            .rsplit_once(':')
            .map_or(self.host.as_str(), |h| h.0);
        let alpn: &[u8] = match (h2_streams, h3_streams) {
            (Some(_), _) => b"h2",
            (_, Some(_)) => b"h3",
            _ => b"http/1.1",
        };
        self.tls = Some(TlsClient::new(ca, host, handshake, alpn)?);
        self.h2_streams = h2_streams.map(|m| m.max(1));
        self.h3_streams = h3_streams.map(|m| m.max(1));
        Ok(self)
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

/// The request half of an open HTTP/1.1 or HTTP/2 connection.
enum Sender {
    H1(http1::SendRequest<Empty<Bytes>>),
    H2(http2::SendRequest<Empty<Bytes>>),
}

impl Sender {
    fn is_closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }

    async fn ready(&mut self) -> hyper::Result<()> {
        match self {
            Sender::H1(s) => s.ready().await,
            Sender::H2(s) => s.ready().await,
        }
    }

    async fn send(
        &mut self,
        req: http::Request<Empty<Bytes>>,
    ) -> hyper::Result<http::Response<Incoming>> {
        match self {
            Sender::H1(s) => s.send_request(req).await,
            Sender::H2(s) => s.send_request(req).await,
        }
    }
}

/// The HTTP/2 connection that several `Conn`s (its streams) share.
pub type SharedH2 = Arc<Mutex<Option<http2::SendRequest<Empty<Bytes>>>>>;

/// A connection that reconnects when the server closed it.
pub struct Conn {
    target: Arc<Target>,
    sender: Option<Sender>,
    /// New TCP connections opened after the first one.
    pub reconnects: u64,
    /// TLS handshakes by kind.
    pub tls_full: u64,
    pub tls_resumed: u64,
    /// TLS handshakes that settled on TLS 1.2 (the rest were TLS 1.3), so a report can say
    /// which version each server ran.
    pub tls12: u64,
    opened: bool,
    /// This connection's number in its pool: `{i}` in the target path is replaced by it, so each
    /// client of a round can ask for its own object.
    index: usize,
    tls_config: Option<Arc<rustls::ClientConfig>>,
    /// For HTTP/2: the connection this stream shares with others.
    shared_h2: Option<SharedH2>,
    /// For HTTP/3: the connection this stream shares with others, and this stream's copy.
    shared_h3: Option<SharedH3>,
    h3: Option<H3Conn>,
}

/// `c` connections' worth of clients: one `Conn` each, or for HTTP/2 and HTTP/3 `streams`
/// `Conn`s sharing each connection.
pub fn pool(target: &Arc<Target>, c: usize) -> Vec<Conn> {
    let streams = target.h2_streams.or(target.h3_streams).unwrap_or(1);
    let slots: Vec<SharedH2> = (0..c).map(|_| SharedH2::default()).collect();
    let slots3: Vec<SharedH3> = (0..c).map(|_| SharedH3::default()).collect();
    (0..c * streams)
        .map(|i| {
            let mut conn = Conn::with_index(target.clone(), i);
            if target.h2_streams.is_some() {
                conn.shared_h2 = Some(slots[i / streams].clone());
            }
            if target.h3_streams.is_some() {
                conn.shared_h3 = Some(slots3[i / streams].clone());
            }
            conn
        })
        .collect()
}

async fn handshake_h1<I>(io: I) -> Result<Sender>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        // The connection ends when the server closes it or the sender is dropped.
        let _ = conn.await;
    });
    Ok(Sender::H1(sender))
}

impl Conn {
    pub fn with_index(target: Arc<Target>, index: usize) -> Self {
        let tls_config = target.tls.as_ref().map(TlsClient::config_for_connection);
        Conn {
            target,
            sender: None,
            reconnects: 0,
            tls_full: 0,
            tls_resumed: 0,
            tls12: 0,
            opened: false,
            index,
            tls_config,
            shared_h2: None,
            shared_h3: None,
            h3: None,
        }
    }

    /// Makes sure this stream's HTTP/3 connection is open (the first stream of a slot to find
    /// it closed opens the next one for all).
    async fn ready_h3(&mut self, slot: SharedH3) -> Result<()> {
        if self.h3.as_ref().is_some_and(|c| !c.is_closed()) {
            return Ok(());
        }
        let mut open = slot.lock().await;
        if let Some(c) = open.as_ref().filter(|c| !c.is_closed()) {
            self.h3 = Some(c.clone());
            return Ok(());
        }
        let tls = self.target.tls.as_ref().context("HTTP/3 needs TLS")?;
        let c = H3Conn::connect(self.target.addr, tls).await?;
        self.tls_full += 1;
        if self.opened {
            self.reconnects += 1;
        }
        self.opened = true;
        *open = Some(c.clone());
        self.h3 = Some(c);
        Ok(())
    }

    /// Makes sure a usable connection is open, so that a timed request does not pay for connect.
    pub async fn ready(&mut self) -> Result<()> {
        if let Some(slot) = self.shared_h3.clone() {
            return self.ready_h3(slot).await;
        }
        if let Some(s) = self.sender.as_mut() {
            if !s.is_closed() && s.ready().await.is_ok() {
                return Ok(());
            }
        }
        self.sender = None;
        if let Some(slot) = self.shared_h2.clone() {
            let mut open = slot.lock().await;
            if let Some(s) = open.as_ref().filter(|s| !s.is_closed()) {
                let mut s = s.clone();
                s.ready().await?;
                self.sender = Some(Sender::H2(s));
                return Ok(());
            }
            let Sender::H2(s) = self.connect().await? else {
                bail!("no h2 connection");
            };
            *open = Some(s.clone());
            self.sender = Some(Sender::H2(s));
            return Ok(());
        }
        self.sender = Some(self.connect().await?);
        Ok(())
    }

    /// A new TCP (and TLS) connection and its HTTP handshake.
    async fn connect(&mut self) -> Result<Sender> {
        let stream = TcpStream::connect(self.target.addr).await?;
        stream.set_nodelay(true)?;
        let mut sender = match (&self.target.tls, &self.tls_config) {
            (Some(tls), Some(config)) => {
                let connector = tokio_rustls::TlsConnector::from(config.clone());
                let io = connector.connect(tls.server_name.clone(), stream).await?;
                let session = io.get_ref().1;
                match session.handshake_kind() {
                    Some(rustls::HandshakeKind::Resumed) => self.tls_resumed += 1,
                    _ => self.tls_full += 1,
                }
                if session.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_2) {
                    self.tls12 += 1;
                }
                if self.target.h2_streams.is_some() {
                    let (sender, conn) =
                        http2::handshake(TokioExecutor::new(), TokioIo::new(io)).await?;
                    tokio::spawn(async move {
                        let _ = conn.await;
                    });
                    Sender::H2(sender)
                } else {
                    handshake_h1(io).await?
                }
            }
            _ => handshake_h1(stream).await?,
        };
        sender.ready().await?;
        if self.opened {
            self.reconnects += 1;
        }
        self.opened = true;
        Ok(sender)
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
                self.h3 = None;
                Outcome::failed("timeout", start)
            }
        }
    }

    /// One GET over HTTP/3.
    async fn get_h3(&mut self, expect: &Expect, hash: bool, start: Instant) -> Outcome {
        if self.ready().await.is_err() {
            return Outcome::failed("connect", start);
        }
        let uri = format!("https://{}{}", self.target.host, self.path());
        let Some(conn) = self.h3.as_mut() else {
            return Outcome::failed("connect", start);
        };
        match conn.get(&uri, &self.target.headers, hash, start).await {
            Ok(got) => {
                let error = judge(got.status, got.bytes, got.digest, expect);
                if error.is_some() {
                    self.h3 = None;
                }
                Outcome {
                    error,
                    bytes: got.bytes,
                    ttfb: got.ttfb,
                    total: start.elapsed(),
                    hashed: hash && expect.sha256.is_some(),
                    started: start,
                }
            }
            Err(step) => {
                // A GOAWAY or a closed connection: the next request opens a new one.
                self.h3 = None;
                Outcome::failed(step, start)
            }
        }
    }

    /// The target's path, with `{i}` replaced by this connection's number.
    fn path(&self) -> String {
        let path = &self.target.path_and_query;
        if path.contains("{i}") {
            path.replace("{i}", &self.index.to_string())
        } else {
            path.clone()
        }
    }

    async fn get_inner(&mut self, expect: &Expect, hash: bool, start: Instant) -> Outcome {
        if self.shared_h3.is_some() {
            return self.get_h3(expect, hash, start).await;
        }
        if self.ready().await.is_err() {
            return Outcome::failed("connect", start);
        }
        let path = self.path();
        let Some(sender) = self.sender.as_mut() else {
            return Outcome::failed("connect", start);
        };
        let h2 = self.target.h2_streams.is_some();
        let per_request = self
            .target
            .tls
            .as_ref()
            .is_some_and(|t| t.handshake != Handshake::Keep);
        let mut builder = if h2 {
            // HTTP/2 takes the authority from the URI (`:authority`), not from `Host`.
            http::Request::get(format!("https://{}{path}", self.target.host))
        } else {
            http::Request::get(path.as_str()).header(http::header::HOST, self.target.host.as_str())
        };
        builder = builder.header(http::header::USER_AGENT, "sluice-loadgen");
        if per_request && !h2 {
            builder = builder.header(http::header::CONNECTION, "close");
        }
        for (name, value) in &self.target.headers {
            builder = builder.header(name, value);
        }
        let req = match builder.body(Empty::<Bytes>::new()) {
            Ok(r) => r,
            Err(_) => return Outcome::failed("request", start),
        };
        let resp = match sender.send(req).await {
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
        if per_request {
            // The next request opens (and handshakes) a new connection.
            self.sender = None;
        }
        let error = judge(status, bytes, hasher.map(|h| h.finalize().into()), expect);
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

/// What is wrong with a response, if anything: its status, length or digest.
fn judge(status: u16, bytes: u64, digest: Option<[u8; 32]>, expect: &Expect) -> Option<String> {
    if status != expect.status {
        Some(format!("status_{status}"))
    } else if expect.len.is_some_and(|len| len != bytes) {
        Some("length".to_string())
    } else {
        match (digest, expect.sha256) {
            (Some(got), Some(want)) if got != want => Some("sha256".to_string()),
            _ => None,
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
        assert!(Target::parse("ftp://127.0.0.1/x").is_err());
        assert!(Target::parse("https://127.0.0.1/x").unwrap().secure);
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
