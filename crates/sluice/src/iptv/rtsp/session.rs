//! The RTSP client of one session: connect (through the upstream address guard), OPTIONS,
//! DESCRIBE, SETUP, PLAY, following redirects and answering Basic or Digest challenges; then
//! the data phase, where RTP arrives interleaved on the control connection or on a UDP port
//! pair, keep-alives go out, and TEARDOWN ends it. Every step has a deadline and every message
//! a size bound (`sluice_media::rtsp::Limits`).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use sluice_media::rtsp::{self, auth, headers, sdp, Item, Limits, Message};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::{timeout, Instant};

use super::request::Target;
use super::{Context, TransportMode};
use crate::atomic::Counter;
use crate::upstream::ConnectError;

/// Why a session could not start or ended.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{0}")]
    Connect(#[from] ConnectError),
    #[error("connection to {0} failed: {1}")]
    Tcp(String, std::io::Error),
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    #[error("no answer to {0} within {1} ms")]
    Timeout(&'static str, u128),
    #[error("{method} answered {status} {reason}")]
    Status {
        method: &'static str,
        status: u16,
        reason: String,
    },
    #[error("{0}")]
    Protocol(#[from] rtsp::RtspError),
    #[error("{0}")]
    Sdp(#[from] sdp::SdpError),
    #[error("{0}")]
    Header(#[from] headers::HeaderError),
    #[error("{0}")]
    Auth(#[from] auth::AuthError),
    #[error("the server asks for credentials and the URL has none")]
    NeedCredentials,
    #[error("the server refused the credentials")]
    BadCredentials,
    #[error("SETUP answer has no Session header")]
    NoSession,
    #[error("the server sends RTP over {0}, not the transport asked for")]
    TransportMismatch(&'static str),
    #[error("more than {0} redirects")]
    Redirects(usize),
    #[error("redirect to {0:?}, which is not an rtsp:// URL (or holds spaces or controls)")]
    BadRedirect(String),
    #[error("the server closed the connection")]
    Closed,
    #[error("the server ended the session ({0})")]
    Ended(u16),
}

/// Where RTP arrives.
enum Media {
    Interleaved {
        channel: u8,
    },
    Udp {
        rtp: UdpSocket,
        /// Held so the server's RTCP finds an open port (no ICMP errors back).
        _rtcp: UdpSocket,
        /// Only datagrams from this address are taken.
        server: IpAddr,
    },
}

/// Answers to challenges: the chosen scheme and a request counter for Digest.
struct Credentials {
    user: String,
    password: String,
    challenge: Option<auth::Challenge>,
    nc: u32,
    cnonce: String,
}

/// A playing (or starting) RTSP session.
pub struct Session {
    conn: TcpStream,
    buf: BytesMut,
    /// How far the parses of the item at the start of `buf` got.
    progress: Progress,
    /// Replies to the server's own requests, written before the next read or request; bytes
    /// leave it only once written (see `flush_outbox`).
    outbox: BytesMut,
    /// When the write of what `outbox` holds must be done by, kept across cut-short calls.
    outbox_deadline: Option<Instant>,
    limits: Limits,
    cseq: u32,
    user_agent: String,
    step: Duration,
    credentials: Option<Credentials>,
    session_id: Option<String>,
    /// A write was cut short (its future dropped: the setup was abandoned mid-request), so
    /// the connection carries part of a request and cannot carry another.
    cut: bool,
    /// Keep-alive period: configured, or half of what the server announced.
    pub keepalive: Duration,
    keepalive_method: &'static str,
    play_url: String,
    media: Media,
    /// UDP datagrams taken by the last `receive`.
    udp: UdpBatch,
    /// Where each UDP datagram is received: one byte more than the largest taken
    /// (`set_max_datagram`), so that a larger one shows by its length instead of being cut.
    udp_scratch: Vec<u8>,
}

/// The outcome of the setup on one server.
enum Setup {
    Playing,
    Redirect(String),
}

/// Largest RTP datagram taken over UDP until `set_max_datagram` says otherwise.
const DEFAULT_MAX_DATAGRAM: usize = 2048;
/// Datagrams taken per UDP wakeup.
const UDP_BATCH: usize = 32;

impl Session {
    /// Connects, follows redirects, authenticates, and starts playing `target`; the session
    /// is left in `slot` (playing on success). It is there whenever the setup ends early too
    /// (an error, or this future dropped), so that a session the server set up can be torn
    /// down (`teardown`) instead of kept on the server until it notices the closed connection.
    /// `reached` is set once a connection to a server (the first, or a redirect's) is made:
    /// a setup that fails before spent nothing of a server's.
    pub async fn open(
        target: &Target,
        ctx: &Context,
        slot: &mut Option<Session>,
        reached: &mut bool,
    ) -> Result<(), SessionError> {
        let cfg = &ctx.config;
        let mut url = target.url.clone();
        let (mut host, mut port) = (target.host.clone(), target.port);
        let mut credentials = target.credentials.clone();
        for _ in 0..=cfg.max_redirects {
            // A redirect comes before SETUP: the session it replaces has nothing to tear down.
            *slot = None;
            let s = slot.insert(Session::connect(&host, port, ctx).await?);
            *reached = true;
            s.credentials = credentials.clone().map(|(user, password)| Credentials {
                user,
                password,
                challenge: None,
                nc: 0,
                cnonce: cnonce(),
            });
            match s.start(&url, target).await? {
                Setup::Playing => return Ok(()),
                Setup::Redirect(location) => {
                    let (h, p, clean) = redirect_target(&location)?;
                    tracing::info!(from = %redact(&url), to = %redact(&clean), "RTSP redirect");
                    // Credentials are for the host they were given with, never a redirect's.
                    if h != target.host || p != target.port {
                        credentials = None;
                    }
                    (host, port, url) = (h, p, clean);
                }
            }
        }
        Err(SessionError::Redirects(cfg.max_redirects))
    }

    async fn connect(host: &str, port: u16, ctx: &Context) -> Result<Session, SessionError> {
        let cfg = &ctx.config;
        let step = Duration::from_millis(cfg.timeout_ms);
        let addrs = timeout(step, ctx.upstream.resolve_checked(host, port))
            .await
            .map_err(|_| SessionError::Timeout("DNS", step.as_millis()))??;
        let mut last = None;
        for addr in addrs.iter().take(4) {
            match timeout(step, TcpStream::connect(addr)).await {
                Ok(Ok(conn)) => {
                    conn.set_nodelay(true)?;
                    return Ok(Session::on(conn, cfg));
                }
                Ok(Err(e)) => last = Some(e),
                Err(_) => {
                    last = Some(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer within {} ms", step.as_millis()),
                    ))
                }
            }
        }
        let e = last.unwrap_or_else(|| std::io::Error::other("no address"));
        Err(SessionError::Tcp(format!("{host}:{port}"), e))
    }

    /// A session not yet started on the connection `conn`.
    fn on(conn: TcpStream, cfg: &super::RtspConfig) -> Session {
        Session {
            conn,
            buf: BytesMut::with_capacity(64 * 1024),
            progress: Progress::default(),
            outbox: BytesMut::new(),
            outbox_deadline: None,
            limits: Limits::default(),
            cseq: 0,
            user_agent: cfg.user_agent.clone(),
            step: Duration::from_millis(cfg.timeout_ms),
            credentials: None,
            session_id: None,
            cut: false,
            keepalive: Duration::from_secs(cfg.keepalive_secs),
            keepalive_method: "OPTIONS",
            play_url: String::new(),
            media: Media::Interleaved { channel: 0 },
            udp: UdpBatch {
                max: DEFAULT_MAX_DATAGRAM,
                ..UdpBatch::default()
            },
            udp_scratch: vec![0; DEFAULT_MAX_DATAGRAM + 1],
        }
    }

    /// OPTIONS (to learn the keep-alive method), DESCRIBE, SETUP, PLAY.
    async fn start(&mut self, url: &str, target: &Target) -> Result<Setup, SessionError> {
        let options = self.request("OPTIONS", url, &[]).await?;
        if let Some(location) = redirect(&options) {
            return Ok(Setup::Redirect(location));
        }
        let public = options.header("Public").unwrap_or_default().to_string();
        let describe = self
            .request("DESCRIBE", url, &[("Accept", "application/sdp")])
            .await?;
        if let Some(location) = redirect(&describe) {
            return Ok(Setup::Redirect(location));
        }
        check("DESCRIBE", &describe)?;
        let base = describe
            .header("Content-Base")
            .or(describe.header("Content-Location"))
            .unwrap_or(url)
            .to_string();
        let media = sdp::ts_media(&String::from_utf8_lossy(&describe.body))?;
        let control = sdp::control_url(&base, media.control.as_deref());
        let transport = match target.transport {
            TransportMode::Tcp => "RTP/AVP/TCP;unicast;interleaved=0-1".to_string(),
            TransportMode::Udp => {
                let (rtp, rtcp) = udp_pair(self.conn.local_addr()?.ip())?;
                let port = rtp.local_addr()?.port();
                let server = self.conn.peer_addr()?.ip();
                self.media = Media::Udp {
                    rtp,
                    _rtcp: rtcp,
                    server,
                };
                format!("RTP/AVP;unicast;client_port={port}-{}", port + 1)
            }
        };
        let setup = self
            .request("SETUP", &control, &[("Transport", &transport)])
            .await?;
        check("SETUP", &setup)?;
        let (id, server_timeout) =
            headers::session(setup.header("Session").ok_or(SessionError::NoSession)?)?;
        self.session_id = Some(id);
        // From here on the session exists on the server: a TEARDOWN names this URL.
        self.play_url = base;
        let answer = headers::transport(setup.header("Transport").unwrap_or("RTP/AVP/TCP"))?;
        match (&mut self.media, answer.tcp) {
            (Media::Interleaved { channel }, true) => {
                *channel = answer.interleaved.map_or(0, |(rtp, _)| rtp)
            }
            (Media::Udp { server, .. }, false) => {
                if let Some(ip) = answer.source.as_deref().and_then(|s| s.parse().ok()) {
                    *server = ip;
                }
            }
            (Media::Interleaved { .. }, false) => {
                return Err(SessionError::TransportMismatch("UDP"))
            }
            (Media::Udp { .. }, true) => return Err(SessionError::TransportMismatch("TCP")),
        }
        let announced = Duration::from_secs(server_timeout.unwrap_or(60).clamp(2, 3600));
        if self.keepalive.is_zero() {
            self.keepalive = announced / 2;
        }
        if headers::lists_method(&public, "GET_PARAMETER") {
            self.keepalive_method = "GET_PARAMETER";
        }
        let play = self
            .request("PLAY", &self.play_url.clone(), &[("Range", &target.range)])
            .await?;
        check("PLAY", &play)?;
        Ok(Setup::Playing)
    }

    /// Sends a request and waits for its answer, answering one 401 with the credentials.
    async fn request(
        &mut self,
        method: &'static str,
        url: &str,
        extra: &[(&str, &str)],
    ) -> Result<Message, SessionError> {
        for attempt in 0..2 {
            let cseq = self.send(method, url, extra).await?;
            let resp = self.answer(method, cseq).await?;
            if resp.status != 401 {
                return Ok(resp);
            }
            let Some(creds) = self.credentials.as_mut() else {
                return Err(SessionError::NeedCredentials);
            };
            if attempt > 0 || creds.challenge.is_some() && !stale(&resp) {
                return Err(SessionError::BadCredentials);
            }
            creds.challenge = Some(auth::choose(resp.headers_named("WWW-Authenticate"))?);
            creds.nc = 0;
        }
        Err(SessionError::BadCredentials)
    }

    /// Writes a request; returns its CSeq.
    async fn send(
        &mut self,
        method: &'static str,
        url: &str,
        extra: &[(&str, &str)],
    ) -> Result<u32, SessionError> {
        self.cseq += 1;
        let mut head = format!(
            "{method} {url} RTSP/1.0\r\nCSeq: {}\r\nUser-Agent: {}\r\n",
            self.cseq, self.user_agent
        );
        if let Some(id) = &self.session_id {
            head.push_str(&format!("Session: {id}\r\n"));
        }
        if let Some(creds) = self.credentials.as_mut() {
            if let Some(challenge) = &creds.challenge {
                creds.nc += 1;
                let input = auth::DigestInput {
                    method,
                    uri: url,
                    nc: creds.nc,
                    cnonce: &creds.cnonce,
                };
                let value = auth::authorization(challenge, &creds.user, &creds.password, input);
                head.push_str(&format!("Authorization: {value}\r\n"));
            }
        }
        for (k, v) in extra {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        self.write(head.as_bytes(), method).await?;
        Ok(self.cseq)
    }

    async fn write(&mut self, bytes: &[u8], what: &'static str) -> Result<(), SessionError> {
        // A reply a cut-short `receive` left half-written goes out whole first: a request
        // written into the middle of it would garble both.
        self.flush_outbox().await?;
        // Cleared only when the whole request is out: a write timed out or dropped halfway
        // leaves the flag set.
        self.cut = true;
        timeout(self.step, self.conn.write_all(bytes))
            .await
            .map_err(|_| SessionError::Timeout(what, self.step.as_millis()))??;
        self.cut = false;
        Ok(())
    }

    /// Reads until the answer with `cseq` arrives; frames and other messages on the way are
    /// dropped (none are expected before PLAY).
    async fn answer(&mut self, method: &'static str, cseq: u32) -> Result<Message, SessionError> {
        let deadline = Instant::now() + self.step;
        loop {
            while let Some((item, used)) = next_in(&self.buf, &mut self.progress, self.limits)? {
                self.buf.advance(used);
                if let Item::Message(m) = item {
                    if m.is_request() {
                        self.reply(&m);
                    } else if m.cseq() == Some(cseq) {
                        return Ok(m);
                    }
                }
            }
            self.flush_outbox().await?;
            let read = tokio::time::timeout_at(deadline, self.conn.read_buf(&mut self.buf))
                .await
                .map_err(|_| SessionError::Timeout(method, self.step.as_millis()))??;
            if read == 0 {
                return Err(SessionError::Closed);
            }
        }
    }

    /// Queues the answer to a request from the server: OPTIONS and GET_PARAMETER (the
    /// server's own keep-alive) succeed, anything else is not implemented.
    fn reply(&mut self, m: &Message) {
        let cseq = m.cseq().unwrap_or(0);
        let status = match m.text.as_str() {
            "OPTIONS" | "GET_PARAMETER" => "200 OK",
            _ => "501 Not Implemented",
        };
        self.outbox
            .extend_from_slice(format!("RTSP/1.0 {status}\r\nCSeq: {cseq}\r\n\r\n").as_bytes());
    }

    /// Writes the queued replies. Cancel-safe: `write_buf` takes from the outbox only what
    /// the socket took, so a call dropped mid-write (the pump's `select!` drops `receive` at
    /// every tick) leaves the rest, and the next call goes on from the first unsent byte.
    /// Taking the whole outbox before writing, as this did, lost what a dropped call had not
    /// written and left half a reply on the wire for the next request to run into. The
    /// deadline outlives dropped calls: a server that never reads is given up on after one
    /// step, not waited on afresh at every tick.
    async fn flush_outbox(&mut self) -> Result<(), SessionError> {
        if self.outbox.is_empty() {
            return Ok(());
        }
        let step = self.step;
        let deadline = *self
            .outbox_deadline
            .get_or_insert_with(|| Instant::now() + step);
        while !self.outbox.is_empty() {
            let wrote = tokio::time::timeout_at(deadline, self.conn.write_buf(&mut self.outbox))
                .await
                .map_err(|_| SessionError::Timeout("a reply", step.as_millis()))??;
            if wrote == 0 {
                return Err(SessionError::Io(std::io::ErrorKind::WriteZero.into()));
            }
        }
        self.outbox_deadline = None;
        Ok(())
    }

    /// Takes UDP datagrams of up to `max` bytes whole (`iptv.max_datagram_bytes`, as the
    /// multicast receiver does). One larger is received as `max + 1` bytes, which shows it,
    /// and dropped there, counted on `malformed` (the hub's, where `Pump::take_datagram` counts
    /// an interleaved frame over the bound): before, every datagram was received into 2,048
    /// bytes, so with `max_datagram_bytes` above that a larger one was cut there and relayed as
    /// if whole, a broken packet in the stream.
    pub fn set_max_datagram(&mut self, max: usize, malformed: Counter) {
        self.udp_scratch = vec![0; max.saturating_add(1)];
        (self.udp.max, self.udp.malformed) = (max, malformed);
    }

    /// Waits for more data (cancel-safe: nothing is lost if the future is dropped, neither
    /// data read nor replies queued). Then call `drain`.
    pub async fn receive(&mut self) -> Result<(), SessionError> {
        self.flush_outbox().await?;
        match &self.media {
            Media::Interleaved { .. } => {
                if self.conn.read_buf(&mut self.buf).await? == 0 {
                    return Err(SessionError::Closed);
                }
            }
            Media::Udp { rtp, server, .. } => {
                let server = *server;
                let scratch = &mut self.udp_scratch;
                tokio::select! {
                    read = self.conn.read_buf(&mut self.buf) => {
                        if read? == 0 {
                            return Err(SessionError::Closed);
                        }
                    }
                    got = rtp.recv_from(scratch) => {
                        let (n, from) = got?;
                        self.udp.keep(&scratch[..n], from, server);
                        for _ in 1..UDP_BATCH {
                            match rtp.try_recv_from(scratch) {
                                Ok((n, from)) => self.udp.keep(&scratch[..n], from, server),
                                Err(_) => break,
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Hands every complete RTP packet received so far to `sink`; handles control messages.
    pub fn drain(&mut self, sink: &mut impl FnMut(&[u8])) -> Result<(), SessionError> {
        let mut at = 0;
        for len in self.udp.lens.drain(..) {
            sink(&self.udp.data[at..at + len]);
            at += len;
        }
        self.udp.data.clear();
        let rtp_channel = match self.media {
            Media::Interleaved { channel } => Some(channel),
            Media::Udp { .. } => None,
        };
        let mut used_total = 0;
        let result = loop {
            let rest = &self.buf[used_total..];
            match next_in(rest, &mut self.progress, self.limits) {
                Ok(Some((Item::Frame { channel, payload }, used))) => {
                    if Some(channel) == rtp_channel {
                        sink(&rest[payload]);
                    }
                    used_total += used;
                }
                Ok(Some((Item::Message(m), used))) => {
                    used_total += used;
                    if m.is_request() {
                        self.reply(&m);
                    } else if matches!(m.status, 454 | 457) || m.status >= 500 {
                        // The answer to a keep-alive: the session is gone on the server.
                        break Err(SessionError::Ended(m.status));
                    } else if m.status >= 300 {
                        tracing::debug!(
                            status = m.status,
                            "RTSP keep-alive answered with an error"
                        );
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e.into()),
            }
        };
        self.buf.advance(used_total);
        result
    }

    /// Sends a keep-alive request; its answer is read by `drain`.
    pub async fn keep_alive(&mut self) -> Result<(), SessionError> {
        let url = self.play_url.clone();
        self.send(self.keepalive_method, &url, &[])
            .await
            .map(|_| ())
    }

    /// The server's address (`None` once the connection is gone).
    pub fn server(&self) -> Option<SocketAddr> {
        self.conn.peer_addr().ok()
    }

    /// Whether the server set a session up (answered SETUP): only then is there something
    /// for `teardown` to end.
    pub fn is_set_up(&self) -> bool {
        self.session_id.is_some()
    }

    /// Ends the session on the server (best effort, bounded by one step) if the server set
    /// one up (answered SETUP), however far the setup got: servers that count sessions per
    /// subscriber (common on IPTV head-ends) refuse the next SETUP while an abandoned one is
    /// still open on their side.
    pub async fn teardown(mut self) {
        if self.session_id.is_none() {
            return;
        }
        let url = self.play_url.clone();
        let step = self.step;
        let done = timeout(step, async {
            if self.cut || !self.outbox.is_empty() {
                // Half a request is on the wire, or replies the server stopped reading are
                // left (their write timed out, maybe halfway: the deadline is past, so this
                // connection takes nothing more): the TEARDOWN goes on a new connection to
                // the same server (the address already passed the guard). RTSP sessions are
                // not tied to their connection.
                self.conn = TcpStream::connect(self.conn.peer_addr()?).await?;
                self.conn.set_nodelay(true)?;
                (self.buf, self.progress, self.cut) = (BytesMut::new(), Progress::default(), false);
                // The rest of a reply belongs to the old connection's stream.
                self.outbox.clear();
                self.outbox_deadline = None;
            }
            let cseq = self.send("TEARDOWN", &url, &[]).await?;
            self.answer("TEARDOWN", cseq).await
        })
        .await;
        if let Ok(Err(e)) = done {
            tracing::debug!(error = %e, "RTSP TEARDOWN failed");
        }
    }
}

/// UDP datagrams taken by one `receive`, back to back, and their lengths.
#[derive(Default)]
struct UdpBatch {
    data: Vec<u8>,
    lens: Vec<usize>,
    /// The largest datagram kept (`Session::set_max_datagram`).
    max: usize,
    /// Where the server's datagrams over `max` are counted (the hub's `malformed`).
    malformed: Counter,
}

impl UdpBatch {
    /// Keeps `d`, received from `from`, if it is the server's and at most `max` bytes. One
    /// larger is counted and dropped here, never copied: copied for the pump to drop, as it
    /// was, `data` grew to a whole batch of them (32 x 64 KiB at `max_datagram_bytes = 65535`)
    /// and kept that capacity for the session's life.
    fn keep(&mut self, d: &[u8], from: SocketAddr, server: IpAddr) {
        // Anyone can send to an open UDP port: only the server's packets become the stream.
        if from.ip() != server || d.is_empty() {
            return;
        }
        if d.len() > self.max {
            self.malformed.inc();
            return;
        }
        self.data.extend_from_slice(d);
        self.lens.push(d.len());
    }
}

/// A 3xx answer's `Location`.
fn redirect(m: &Message) -> Option<String> {
    (300..400)
        .contains(&m.status)
        .then(|| m.header("Location").map(str::to_string))
        .flatten()
}

/// A 401 whose Digest challenge is marked stale only wants the new nonce.
fn stale(m: &Message) -> bool {
    m.headers_named("WWW-Authenticate")
        .any(|v| v.to_ascii_lowercase().contains("stale=true"))
}

fn check(method: &'static str, m: &Message) -> Result<(), SessionError> {
    if (200..300).contains(&m.status) {
        return Ok(());
    }
    Err(SessionError::Status {
        method,
        status: m.status,
        reason: m.text.chars().take(64).collect(),
    })
}

/// A redirect's host, port and URL (credentials removed).
fn redirect_target(location: &str) -> Result<(String, u16, String), SessionError> {
    // Masked before it is cut (a cut user info would not be seen as one): it is logged.
    let bad = || {
        SessionError::BadRedirect(
            crate::redact::mask_url(location)
                .chars()
                .take(128)
                .collect(),
        )
    };
    // The path goes into the next server's request line as given: a bare CR (which ends no
    // header line here) or a space there would end that line early and start a header or a
    // request of the redirecting server's choosing.
    if location
        .chars()
        .any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(bad());
    }
    let rest = location.strip_prefix("rtsp://").ok_or_else(bad)?;
    let (authority, path) = match rest.find(['/', '?']) {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let fake = format!("/rtsp/{hostport}{path}");
    let (path_only, query) = match fake.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (fake.as_str(), None),
    };
    // Reuse the request parser's host checks; catch-up parameters are not re-read.
    let config = super::RtspConfig {
        seek_params: Vec::new(),
        ..super::RtspConfig::default()
    };
    let t = super::request::parse(path_only, None, None, &config).map_err(|_| bad())?;
    let url = match query {
        Some(q) => format!("{}?{q}", t.url),
        None => t.url,
    };
    Ok((t.host, t.port, url))
}

/// Two UDP sockets on consecutive ports, the first even (RTP), as RFC 3550 asks.
fn udp_pair(local: IpAddr) -> Result<(UdpSocket, UdpSocket), SessionError> {
    for _ in 0..32 {
        let rtp = std::net::UdpSocket::bind((local, 0))?;
        let port = rtp.local_addr()?.port();
        if port % 2 != 0 || port == u16::MAX {
            continue;
        }
        let Ok(rtcp) = std::net::UdpSocket::bind((local, port + 1)) else {
            continue;
        };
        // Best effort: a bigger buffer absorbs bursts while the runtime is busy.
        let _ = socket2::SockRef::from(&rtp).set_recv_buffer_size(2 * 1024 * 1024);
        rtp.set_nonblocking(true)?;
        rtcp.set_nonblocking(true)?;
        return Ok((UdpSocket::from_std(rtp)?, UdpSocket::from_std(rtcp)?));
    }
    Err(SessionError::Io(std::io::Error::other(
        "no free pair of UDP ports for RTP/RTCP",
    )))
}

fn cnonce() -> String {
    let mut raw = [0u8; 8];
    let _ = getrandom::getrandom(&mut raw);
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

/// A URL for logs: the query (which may carry account parameters) replaced by `?…`.
pub fn redact(url: &str) -> String {
    match url.split_once('?') {
        Some((base, _)) => format!("{base}?…"),
        None => url.to_string(),
    }
}

/// How far the parses of the item at the start of a buffer got, kept between reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Progress {
    /// What the last parse said the buffer must hold before the item can be had.
    need: usize,
    /// How many bytes at the buffer's start the search for the end of the head has been
    /// through (see `next_item_resumed`).
    scanned: usize,
}

/// The item at the start of `buf`, or `None` while `buf` holds fewer bytes than the last
/// parse asked for (`progress`, updated here): a message whose body trickles in a byte at a
/// time is parsed when its head is complete and when its body is, not once per read, and a
/// head that trickles in is searched for its end once over, not from its start on every read.
fn next_in(
    buf: &[u8],
    progress: &mut Progress,
    limits: Limits,
) -> Result<Option<(Item, usize)>, rtsp::RtspError> {
    // An empty buffer holds no item either.
    if buf.len() < progress.need.max(1) {
        return Ok(None);
    }
    #[cfg(test)]
    tests::PARSES.with(|p| p.set(p.get() + 1));
    match rtsp::message::next_item_resumed(buf, limits, &mut progress.scanned)? {
        rtsp::Next::Item(item, used) => {
            *progress = Progress::default();
            Ok(Some((item, used)))
        }
        rtsp::Next::NeedMore(n) => {
            progress.need = n;
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Calls of `rtsp::next_item` made by `next_in` on this thread.
        pub(super) static PARSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// A session on a loopback connection whose socket buffers are small, and the server's
    /// end of it.
    async fn session_pair() -> (Session, tokio::net::TcpStream) {
        let (session, server, _) = session_listening().await;
        (session, server)
    }

    /// As `session_pair`, with the server's listener, still listening.
    async fn session_listening() -> (Session, tokio::net::TcpStream, tokio::net::TcpListener) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        client.set_nodelay(true).unwrap();
        // Bounded buffers (the kernel would grow them to megabytes), so that a write of the
        // outbox blocks while the server does not read.
        socket2::SockRef::from(&client)
            .set_send_buffer_size(64 * 1024)
            .unwrap();
        socket2::SockRef::from(&server)
            .set_recv_buffer_size(64 * 1024)
            .unwrap();
        let mut session = Session::on(client, &crate::iptv::rtsp::RtspConfig::default());
        session.play_url = "rtsp://127.0.0.1/live".into();
        (session, server, listener)
    }

    /// Reads from `conn` until `len` bytes came or none came for a second.
    async fn read_up_to(conn: &mut tokio::net::TcpStream, len: usize) -> Vec<u8> {
        let mut got = Vec::new();
        let mut chunk = [0u8; 8192];
        while got.len() < len {
            match timeout(Duration::from_secs(1), conn.read(&mut chunk)).await {
                Ok(Ok(n)) if n > 0 => got.extend_from_slice(&chunk[..n]),
                _ => break,
            }
        }
        got
    }

    /// The pump's `select!` drops `receive` at each tick, mid-write of a queued reply when the
    /// server reads slowly. The replies queued then reach the server whole, each byte once
    /// and in order, from the calls that follow, and a keep-alive written after them comes
    /// after the last reply, not into the middle of one.
    #[tokio::test]
    async fn replies_cut_short_by_a_dropped_receive_go_out_whole() {
        let (mut session, mut server) = session_pair().await;
        // Far more than the socket buffers hold: 40,000 numbered replies (~1 MB).
        let mut queued = Vec::new();
        for cseq in 0..40_000 {
            queued.extend_from_slice(format!("RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\n\r\n").as_bytes());
        }
        session.outbox.extend_from_slice(&queued);
        // Dropped while the write blocks, twice, the server reading a little in between.
        let cut = timeout(Duration::from_millis(100), session.receive()).await;
        assert!(cut.is_err(), "receive finished: {cut:?}");
        let mut chunk = [0u8; 1000];
        let mut got = Vec::new();
        let n = server.read(&mut chunk).await.unwrap();
        got.extend_from_slice(&chunk[..n]);
        let cut = timeout(Duration::from_millis(100), session.receive()).await;
        assert!(cut.is_err(), "receive finished: {cut:?}");
        // The next call goes on while the server reads; then it waits for data (dropped).
        let reader = tokio::spawn(async move {
            let rest = read_up_to(&mut server, usize::MAX).await;
            (server, rest)
        });
        for _ in 0..25 {
            let waited = timeout(Duration::from_millis(200), session.receive()).await;
            assert!(waited.is_err(), "receive answered: {waited:?}");
            if session.outbox.is_empty() {
                break;
            }
        }
        assert!(session.outbox.is_empty(), "every reply written");
        session.keep_alive().await.unwrap();
        let (_server, rest) = reader.await.unwrap();
        got.extend_from_slice(&rest);
        let keepalive = b"OPTIONS rtsp://127.0.0.1/live RTSP/1.0\r\nCSeq: 1\r\n";
        assert!(
            got.len() > queued.len(),
            "{} of {} bytes",
            got.len(),
            queued.len()
        );
        assert!(
            got[..queued.len()] == queued[..],
            "the replies, once each, in order"
        );
        assert!(
            got[queued.len()..].starts_with(keepalive),
            "then the keep-alive"
        );
    }

    /// A server that stops reading while replies to its requests are queued: the write of
    /// the replies times out, half of them maybe on the wire. The TEARDOWN still goes out, on
    /// a new connection (the old one cannot carry it), and is answered there.
    #[tokio::test]
    async fn a_teardown_after_a_reply_timed_out_goes_on_a_new_connection() {
        let (mut session, _server, listener) = session_listening().await;
        session.step = Duration::from_millis(300);
        session.session_id = Some("s1".into());
        for cseq in 0..40_000 {
            session
                .outbox
                .extend_from_slice(format!("RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\n\r\n").as_bytes());
        }
        let failed = timeout(Duration::from_secs(5), session.receive()).await;
        assert!(
            matches!(failed, Ok(Err(SessionError::Timeout(..)))),
            "{failed:?}"
        );
        assert!(!session.cut && !session.outbox.is_empty());
        let server = tokio::spawn(async move {
            let (mut conn, _) = timeout(Duration::from_secs(2), listener.accept())
                .await
                .expect("no new connection for the TEARDOWN")
                .unwrap();
            let mut got = Vec::new();
            let mut chunk = [0u8; 1024];
            while !got.ends_with(b"\r\n\r\n") {
                let n = conn.read(&mut chunk).await.unwrap();
                assert!(n > 0, "closed after {got:?}");
                got.extend_from_slice(&chunk[..n]);
            }
            let text = String::from_utf8(got).unwrap();
            let cseq = text
                .lines()
                .find_map(|l| l.strip_prefix("CSeq: "))
                .unwrap()
                .to_string();
            conn.write_all(format!("RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\n\r\n").as_bytes())
                .await
                .unwrap();
            text
        });
        session.teardown().await;
        let text = server.await.unwrap();
        assert!(
            text.starts_with("TEARDOWN rtsp://127.0.0.1/live RTSP/1.0\r\n")
                && text.contains("Session: s1"),
            "{text:?}"
        );
    }

    /// Attack: a hostile server sends a 16 KiB head one byte per read. The session keeps how
    /// far the search for the head's end got, so each read searches only the new bytes (and
    /// three before them), not the whole head again; the message comes out whole, and the
    /// frame after it starts a search afresh.
    #[test]
    fn a_trickled_head_is_searched_from_where_it_stopped() {
        let mut raw = b"RTSP/1.0 200 OK\r\nCSeq: 8\r\n".to_vec();
        let mut lines = 0;
        while raw.len() < 16 * 1024 - 32 {
            raw.extend_from_slice(b"a:b\r\n");
            lines += 1;
        }
        raw.extend_from_slice(b"\r\n");
        let head = raw.len();
        raw.extend_from_slice(&[b'$', 0, 0, 1, 7]);
        let (mut progress, mut buf, mut items) = (Progress::default(), BytesMut::new(), Vec::new());
        for (at, b) in raw.iter().enumerate() {
            buf.extend_from_slice(std::slice::from_ref(b));
            while let Some((item, used)) = next_in(&buf, &mut progress, Limits::default()).unwrap()
            {
                items.push(item);
                buf.advance(used);
            }
            if at + 1 < head {
                // All of it searched: the next read starts there.
                assert_eq!(progress.scanned, buf.len(), "after {} bytes", at + 1);
            }
        }
        assert_eq!(items.len(), 2);
        let Item::Message(m) = &items[0] else {
            panic!("not the message")
        };
        assert_eq!((m.cseq(), m.headers.len()), (Some(8), 1 + lines));
        assert_eq!(
            items[1],
            Item::Frame {
                channel: 0,
                payload: 4..5
            }
        );
        assert_eq!(progress, Progress::default());
        assert!(buf.is_empty());
    }

    /// Attack: a hostile server sends a 16 KiB head of thousands of headers, then its 64 KiB
    /// body one byte per read. The session parses the message twice (head complete, body
    /// complete), not once per byte; a frame after it is found as usual.
    #[test]
    fn a_trickled_body_is_parsed_twice() {
        let mut raw = b"RTSP/1.0 200 OK\r\nCSeq: 9\r\n".to_vec();
        let mut i = 0;
        while raw.len() < 16 * 1024 - 64 {
            raw.extend_from_slice(format!("a{i}:\r\n").as_bytes());
            i += 1;
        }
        raw.extend_from_slice(b"Content-Length: 65536\r\n\r\n");
        let head = raw.len();
        raw.resize(head + 65536, b'x');
        raw.extend_from_slice(&[b'$', 0, 0, 2, 7, 7]);
        let limits = Limits::default();
        let mut progress = Progress::default();
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&raw[..head]);
        let mut items = Vec::new();
        PARSES.with(|p| p.set(0));
        // The head in one read, then everything else a byte per read.
        for b in &raw[head..] {
            buf.extend_from_slice(std::slice::from_ref(b));
            while let Some((item, used)) = next_in(&buf, &mut progress, limits).unwrap() {
                items.push(item);
                buf.advance(used);
            }
        }
        let parses = PARSES.with(|p| p.get());
        assert_eq!(items.len(), 2);
        let Item::Message(m) = &items[0] else {
            panic!("not the message")
        };
        assert_eq!((m.cseq(), m.body.len()), (Some(9), 65536));
        assert_eq!(
            items[1],
            Item::Frame {
                channel: 0,
                payload: 4..6
            }
        );
        // The message: head and body complete. The frame: its header, then its end.
        assert_eq!(parses, 2 + 3, "parses");
        assert!(buf.is_empty());
    }

    /// The server's UDP datagrams over the bound are counted as malformed where they arrive
    /// and never copied: a batch of them (32, at up to 64 KiB each) was copied whole into
    /// the batch, for the pump to drop, and the batch kept that capacity for the session's
    /// life. Those up to the bound are kept whole; a stranger's are neither kept nor counted.
    #[test]
    fn datagrams_over_the_bound_are_counted_and_never_copied() {
        let malformed = Counter::default();
        let mut batch = UdpBatch {
            max: 2048,
            malformed: malformed.clone(),
            ..UdpBatch::default()
        };
        let server: IpAddr = "192.0.2.1".parse().unwrap();
        let from_server: SocketAddr = "192.0.2.1:5004".parse().unwrap();
        let stranger: SocketAddr = "192.0.2.9:5004".parse().unwrap();
        let over = vec![0x47u8; 2049];
        for _ in 0..UDP_BATCH {
            batch.keep(&over, from_server, server);
        }
        assert!(
            batch.lens.is_empty() && batch.data.capacity() == 0,
            "{} datagrams over the bound kept, {} bytes held",
            batch.lens.len(),
            batch.data.capacity()
        );
        assert_eq!(malformed.get(), UDP_BATCH as u64);
        batch.keep(&over, stranger, server);
        batch.keep(&over[..188], stranger, server);
        assert_eq!(malformed.get(), UDP_BATCH as u64, "a stranger's counted");
        batch.keep(&over[..2048], from_server, server);
        batch.keep(&over[..188], from_server, server);
        assert_eq!(batch.lens, [2048, 188]);
        assert_eq!(batch.data.len(), 2048 + 188);
        assert_eq!(malformed.get(), UDP_BATCH as u64);
    }
}
