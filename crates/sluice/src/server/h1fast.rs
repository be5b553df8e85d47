//! The HTTP/1.1 fast path's connection loop: plain connections, and TLS ones once the handshake
//! chose HTTP/1.1, read request heads themselves, serve the unmistakably simple ones (GET or HEAD,
//! no body, one valid Host, routed to a fast-path reverse route) without hyper, and hand the
//! connection to hyper — the bytes already read replayed first — at the first request that is
//! anything else. See `docs/decisions/h1-fast-path.md`.

mod bufs;
mod stream;
#[cfg(feature = "tls")]
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Method;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::activity::Watched;
use super::clock::{Alarm, Clock};
use super::handler::{FastRequest, Handler};
use super::{Conn, SendWatch};
use crate::runtime::recent::recent;
pub(super) use stream::FastStream;

/// The fields read per head here; a head with more goes to hyper (which applies
/// `server.max_headers`).
const FIELDS: usize = 100;
/// First read buffer (one from the thread's stock); it grows up to `server.max_header_bytes` for a
/// long head.
const FIRST_READ: usize = bufs::SIZE;

/// How a busy stretch of the fast path left a connection.
pub(super) enum End {
    /// Nothing more to read: wait, idle, for the next request.
    Idle,
    /// Closed (by either side, a timeout, or shutdown): nothing more to do.
    Closed,
    /// A request the fast path does not serve: hyper takes the connection, these bytes first.
    HandOff(Vec<u8>),
}

/// A request head the fast path will serve, with what it needs from the head.
struct Simple<'a> {
    len: usize,
    request: FastRequest<'a>,
    /// The client's `Host` value.
    host: &'a str,
    /// The normalised path it is routed by (the target's own when already normal).
    path: std::borrow::Cow<'a, str>,
}

/// Reads and classifies heads; `Err(())`: hand over to hyper.
fn classify(buf: &[u8], max_fields: usize) -> Result<Option<Simple<'_>>, ()> {
    // The start of the HTTP/2 preface waits for the rest, so the connection is handed on with
    // all of it and goes to sluice's own HTTP/2 server, not hyper's (the parser would refuse
    // `HTTP/2.0` as soon as it saw it).
    if buf.first() == Some(&b'P')
        && buf.len() < super::H2_PREFACE.len()
        && super::H2_PREFACE.starts_with(buf)
    {
        return Ok(None);
    }
    // Left uninitialised: the parser writes only the fields it finds (100 empty fields written
    // per request were a measurable share of a small request's instructions).
    let mut fields = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; FIELDS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut fields) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(()),
    };
    if req.version != Some(1) || req.headers.len() > max_fields {
        return Err(());
    }
    let method = match req.method {
        Some("GET") => Method::GET,
        Some("HEAD") => Method::HEAD,
        _ => return Err(()),
    };
    let target = req.path.ok_or(())?;
    // Origin form only (and a target `http` accepts as hyper would, checked below); one with a
    // fragment goes to hyper, which routes it without the fragment (a client sends none).
    if !target.starts_with('/') || target.contains('#') {
        return Err(());
    }
    let raw_path = match target.bytes().position(|b| b == b'?') {
        Some(at) => &target[..at],
        None => target,
    };
    if sluice_media::token::split_path_token(raw_path).is_some() {
        // A tokened path only ever reaches a built-in.
        return Err(());
    }
    let path = sluice_http::path::normalize_path(raw_path).map_err(|_| ())?;
    // A `..` only an upstream would see: hyper's path refuses it (400).
    sluice_http::path::check_hidden_dot_segments(&path).map_err(|_| ())?;
    let mut host = None;
    let mut close = false;
    // Room for the forwarding fields added on the way up, without a rehash.
    let mut headers = super::field_maps::take(req.headers.len() + 6);
    // The values are views of one copy of the head, not one allocation each.
    let raw = bytes::Bytes::copy_from_slice(&buf[..len]);
    // The target parsed once, as a view of the same copy (it goes upstream as it is when the
    // route keeps the path).
    let at = target.as_ptr() as usize - buf.as_ptr() as usize;
    let path_and_query =
        http::uri::PathAndQuery::from_maybe_shared(raw.slice(at..at + target.len()))
            .map_err(|_| ())?;
    for f in req.headers.iter() {
        let name = sluice_http::wire::field_name(f.name.as_bytes()).map_err(|_| ())?;
        // SAFETY: `raw` copies the head's bytes from `buf`, and `f.value` is httparse's output
        // for `buf`.
        let value =
            unsafe { sluice_http::wire::shared_value(&raw, buf, f.value) }.map_err(|_| ())?;
        match name.as_str() {
            "host" => {
                if host.is_some() {
                    return Err(());
                }
                // An invalid host is hyper's path's to refuse (400).
                let text = sluice_http::wire::text(f.value).ok_or(())?;
                sluice_http::host::parse_host_text(text).map_err(|_| ())?;
                host = Some(text);
            }
            "content-length" if f.value == b"0" => {}
            "content-length" | "transfer-encoding" | "upgrade" | "expect" => return Err(()),
            "connection" => {
                close |= f
                    .value
                    .split(|&b| b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
            }
            _ => {}
        }
        headers.append(name, value);
    }
    let host = host.ok_or(())?;
    // A body-less head only: a second Content-Length (even `0`) is hyper's to judge.
    if headers.get_all(http::header::CONTENT_LENGTH).iter().count() > 1 {
        return Err(());
    }
    Ok(Some(Simple {
        len,
        request: FastRequest {
            method,
            target,
            path_and_query,
            headers,
            close,
            secure: false,
            alt_svc: None,
        },
        host,
        path,
    }))
}

/// [`classify`] when `parse`; `None` (the head is still incomplete) when not. Parses are counted
/// in tests.
fn classify_if(
    parse: bool,
    buf: &[u8],
    max_fields: usize,
) -> Option<Result<Option<Simple<'_>>, ()>> {
    if !parse {
        return None;
    }
    #[cfg(test)]
    tests::PARSES.with(|n| n.set(n.get() + 1));
    Some(classify(buf, max_fields))
}

/// What a fast-path connection keeps while it waits for a request: the socket, when it
/// went idle, whether a request was served, and its place on the runtime's clock. Everything a
/// request needs (the head buffer, the request being served) lives in a box allocated when the
/// request's first bytes arrive and dropped once the connection is idle again, so tens of
/// thousands of idle keep-alive clients cost their socket and a small task each, as under nginx.
pub(super) struct Idle<S = Watched<TcpStream>> {
    stream: S,
    /// When the connection went idle (accepted, or its last response ended); once `draining`,
    /// when shutdown was seen while idle: the drain clock.
    since: Instant,
    /// A request has been served: the keep-alive idle timeout applies, not the header read
    /// timeout.
    begun: bool,
    /// Shutdown was seen while idle (at `since`).
    draining: bool,
    alarm: Alarm,
}

impl<S: FastStream> Idle<S> {
    pub(super) fn new(stream: S, clock: Arc<Clock>) -> Idle<S> {
        Idle {
            stream,
            since: recent(),
            begun: false,
            draining: false,
            alarm: Alarm::new(clock),
        }
    }

    pub(super) fn into_stream(self) -> S {
        self.stream
    }

    /// Waits until a request's bytes arrive (`true`) or the connection is to close (`false`):
    /// the keep-alive idle timeout (the header read timeout before the first request), or
    /// `DRAIN_IDLE` after shutdown, so a request sent in that moment is still answered (with
    /// `Connection: close`) rather than met by a closed connection.
    pub(super) fn poll_wait<H: Handler>(
        &mut self,
        conn: &Conn<H>,
        cx: &mut Context<'_>,
    ) -> Poll<bool> {
        match self.stream.tcp().get_ref().poll_read_ready(cx) {
            Poll::Ready(ready) => return Poll::Ready(ready.is_ok()),
            Poll::Pending => {}
        }
        let now = recent();
        let t = conn.timeouts;
        let deadline = if *conn.stop.borrow() {
            if !self.draining {
                self.draining = true;
                self.since = now;
            }
            self.since + super::DRAIN_IDLE
        } else if self.begun {
            self.since + t.idle
        } else {
            self.since + t.header_read.min(t.idle)
        };
        if now >= deadline {
            return Poll::Ready(false);
        }
        // The clock also wakes every waiting connection on shutdown.
        self.alarm.wake_by_at(deadline, now, cx.waker());
        Poll::Pending
    }
}

impl<H: Handler> Conn<H> {
    /// Reads and serves requests while they keep coming, until the socket has nothing more
    /// (`End::Idle`: the connection waits, idle, again), it closes, or hyper takes over.
    pub(super) async fn serve_busy<S: FastStream>(
        self: Arc<Self>,
        mut idle: Idle<S>,
        peer: SocketAddr,
    ) -> (Idle<S>, End) {
        let end = self.serve_requests(&mut idle, peer).await;
        (idle, end)
    }

    /// The requests of one busy stretch, read into a head buffer from the thread's stock that
    /// goes back to it when the connection is idle again (or closed).
    async fn serve_requests<S: FastStream>(&self, idle: &mut Idle<S>, peer: SocketAddr) -> End {
        let mut buf = bufs::take();
        let end = self.serve_from(idle, peer, &mut buf).await;
        if !matches!(end, End::HandOff(_)) {
            bufs::give(buf);
        }
        end
    }

    async fn serve_from<S: FastStream>(
        &self,
        idle: &mut Idle<S>,
        peer: SocketAddr,
        buf: &mut Vec<u8>,
    ) -> End {
        let t = self.timeouts;
        let (max_bytes, max_fields) = self.head_limits;
        let mut watch = SendWatch::of(idle.stream.tcp());
        // When the current head must be whole: the header read timeout from its first byte, but
        // for a connection's first head from the accept, with the limit the wait for its first
        // byte had (`Idle::poll_wait`), so a head may not take twice the limit.
        let head_deadline = |idle: &Idle<S>| {
            if idle.begun {
                recent() + t.header_read
            } else {
                idle.since + t.header_read.min(t.idle)
            }
        };
        let mut head_by = head_deadline(idle);
        // Whether the head must be parsed again: not after a read that brought no LF while under
        // the limit (a head is only ever complete at an LF), nor after a wait, so a head sent a
        // byte at a time is parsed once per line, not once per read (which was quadratic).
        let mut parse = !buf.is_empty();
        loop {
            let step = match classify_if(parse, buf, max_fields) {
                None => Step::Read,
                Some(Err(())) => Step::HandOff,
                // A whole head over the limit (one read may bring more than the limit): the
                // screen under hyper answers it 431.
                Some(Ok(Some(simple))) if simple.len > max_bytes => Step::HandOff,
                Some(Ok(Some(simple))) => {
                    // Bytes past this head: a pipelined request the client sent already.
                    let pipelined = buf.len() > simple.len;
                    self.serve_one(simple, pipelined, idle, &mut watch, peer)
                        .await
                }
                Some(Ok(None)) if buf.len() > max_bytes => Step::HandOff,
                Some(Ok(None)) => Step::Read,
            };
            match step {
                // The HTTP/2 preface opens a connection (RFC 9113 §3.4): after HTTP/1.1 requests
                // it is a client's error, not a switch to HTTP/2.
                Step::HandOff if idle.begun && buf.starts_with(super::H2_PREFACE) => {
                    return End::Closed
                }
                Step::HandOff => return End::HandOff(std::mem::take(buf)),
                Step::Closed => return End::Closed,
                Step::Next(len) => {
                    buf.drain(..len);
                    // What follows (a pipelined request) has not been parsed yet.
                    parse = !buf.is_empty();
                    idle.begun = true;
                    idle.since = recent();
                    head_by = idle.since + t.header_read;
                    continue;
                }
                Step::Read => {}
            }
            if buf.capacity() - buf.len() < 1024 {
                buf.reserve(FIRST_READ);
            }
            let was_empty = buf.is_empty();
            let start = buf.len();
            let read = std::future::poll_fn(|cx| Poll::Ready(idle.stream.read_now(cx, buf)));
            let read = read.await;
            // One look for an LF in the new bytes only (it stops at the first: the request
            // line's end when a whole head came in one read), or past the limit, which the
            // parse turns into a hand-off (the screen under hyper answers 431, or hyper the
            // parse error).
            parse = buf.len() > max_bytes || buf[start..].contains(&b'\n');
            match read {
                Ok(0) if was_empty => return End::Closed,
                // The end of the stream inside a head: hyper answers a truncated head.
                Ok(0) => return End::HandOff(std::mem::take(buf)),
                // A head begins: its clock starts.
                Ok(_) if was_empty => head_by = head_deadline(idle),
                Ok(_) => {}
                // Nothing more: the connection is idle (the box this runs in is dropped, the
                // buffer goes back to the thread's stock).
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && was_empty => {
                    return End::Idle
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    // Inside a head: the header read timeout (a slowloris head is closed, as
                    // under hyper), and a drain, which does not wait for a head not yet
                    // whole (else one slow client would hold the shutdown for its grace).
                    if *self.stop.borrow() {
                        return End::Closed;
                    }
                    let mut stop = self.stop.clone();
                    let stream = idle.stream.tcp().get_ref();
                    tokio::select! {
                        ready = stream.readable() => if ready.is_err() { return End::Closed },
                        _ = idle.alarm.until(head_by) => return End::Closed,
                        _ = stop.wait_for(|stopping| *stopping) => return End::Closed,
                    }
                }
                Err(_) => return End::Closed,
            }
        }
    }

    /// Serves one classified request; `HandOff` when its route is not one the fast path serves.
    /// `pipelined`: the head buffer holds bytes past this request's head.
    async fn serve_one<S: FastStream>(
        &self,
        simple: Simple<'_>,
        pipelined: bool,
        idle: &mut Idle<S>,
        watch: &mut SendWatch,
        peer: SocketAddr,
    ) -> Step {
        let t = self.timeouts;
        let Some(route) = self
            .handler
            .fast_route(self.listener, simple.host, &simple.path)
        else {
            return Step::HandOff;
        };
        crate::runtime::busy_poll::stamp();
        let protocol = &self.handler.http_metrics().protocol;
        protocol.http1.inc();
        protocol.fast_path(S::SECURE).inc();
        let stream = &mut idle.stream;
        let guard = stream.activity().begin();
        // For a look at the client while its answer is under way: the proxying holds the stream.
        let fd = std::os::fd::AsRawFd::as_raw_fd(stream.tcp().get_ref());
        let mut request = simple.request;
        request.close |= *self.stop.borrow();
        if S::SECURE {
            request.secure = true;
            request.alt_svc = self.alt_svc.clone();
        }
        let close = request.close;
        let handler = self.handler.clone();
        // Made in its box: built on the stack, the whole proxying future (several KB) was copied
        // into this one's state and this one into the loop's, at every request.
        let mut serve = super::boxed_in_place(|| {
            handler.serve_fast(
                route,
                request,
                &simple.path,
                simple.host,
                peer,
                stream,
                guard,
            )
        });
        // The send timeout is looked at once a tick while the response is under way, on the
        // runtime's clock (a fast response never arms it); so is the client, which may have
        // left (hyper's path sees that by reading while it answers, and cancels the origin
        // request: here the request is dropped, and its upstream connection closed, too).
        let tick = Duration::from_secs(1).min(t.idle).min(t.send);
        let mut check_at = recent() + tick;
        let served = loop {
            tokio::select! {
                served = serve.as_mut() => break served,
                _ = idle.alarm.until(check_at) => {
                    check_at = recent() + tick;
                    if watch.stalled(t.send) {
                        handler.http_metrics().send_timeouts.inc();
                        tracing::debug!(%peer, "client stopped reading: send timeout, closing");
                        return Step::Closed;
                    }
                    // A pipelined request behind this one is the client's (hyper's path, too,
                    // waits when it holds one): it may have shut its side after sending it.
                    if !pipelined && client_left(fd, S::SECURE) {
                        tracing::debug!(%peer, "client left: request cancelled, closing");
                        return Step::Closed;
                    }
                }
            }
        };
        if !served.reusable || close {
            return Step::Closed;
        }
        Step::Next(simple.len)
    }
}

/// Whether the client on socket `fd` has left while its answer is under way: the end of its
/// stream or an error waits unread (peeked, never taken). Bytes waiting are a request pipelined
/// behind this one, and the client is still there; but over TLS (`secure`) they may be its
/// `close_notify` alert, so there the client has left when it also shut its side (`POLLRDHUP`)
/// and no more than [`CLOSE_NOTIFY_MAX`] bytes wait: no request can follow a `close_notify`,
/// and a record that holds a request (pipelined, still in the kernel, its FIN behind it) is
/// longer. One system call (two over TLS when a few bytes wait), made only once a tick while an
/// answer is slow, never per request.
fn client_left(fd: std::os::fd::RawFd, secure: bool) -> bool {
    let mut bytes = [0u8; CLOSE_NOTIFY_MAX + 8];
    // SAFETY: `fd` is the client's socket, open while its request is served (the proxying holds
    // the stream); a few bytes are peeked into `bytes`, without blocking.
    let n = unsafe {
        libc::recv(
            fd,
            bytes.as_mut_ptr().cast(),
            bytes.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        0 => true,
        n if n < 0 => !matches!(
            std::io::Error::last_os_error().kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
        ),
        _ if !secure => false,
        n if n as usize > CLOSE_NOTIFY_MAX => false,
        _ => {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLRDHUP,
                revents: 0,
            };
            // SAFETY: one valid `pollfd`, not waited on (timeout 0).
            let ready = unsafe { libc::poll(&mut p, 1, 0) };
            ready > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
        }
    }
}

/// The most bytes a TLS client's `close_notify` takes on the wire: one record of 23 (TLS 1.2
/// with ChaCha20-Poly1305), 24 (TLS 1.3) or 31 bytes (TLS 1.2 with AES-GCM's explicit nonce);
/// sluice's TLS offers no CBC suites. The shortest record holding a request (`GET /
/// HTTP/1.0` and the blank line, bare LFs, sealed) takes 37 (TLS 1.2, ChaCha20) or 38 (TLS
/// 1.3), so nothing longer is taken for one.
const CLOSE_NOTIFY_MAX: usize = 31;

/// What the loop does next.
enum Step {
    HandOff,
    Closed,
    /// The request took this many bytes of the buffer; the next may follow.
    Next(usize),
    /// The head is not complete yet.
    Read,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cell::Cell;
    use std::pin::Pin;

    use crate::server::activity::{Activity, ActivityGuard};
    use crate::server::handler::{FastClient, ListenerId, Served};

    thread_local! {
        /// The heads the connection loop parsed on this thread.
        pub(super) static PARSES: Cell<usize> = const { Cell::new(0) };
    }

    /// A client whose bytes come from a script: one byte per read, every other read finding
    /// nothing (`WouldBlock`), as a head sent a byte at a time arrives. The loop waits on the real
    /// socket underneath, which is kept readable (its peer wrote a byte nobody reads).
    struct OneByte {
        tcp: Watched<TcpStream>,
        script: Vec<u8>,
        at: usize,
        blocked: bool,
    }

    impl tokio::io::AsyncWrite for OneByte {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            Pin::new(&mut self.tcp).poll_write(cx, data)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.tcp).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.tcp).poll_shutdown(cx)
        }
    }

    impl FastClient for OneByte {
        fn socket(&self) -> Option<&TcpStream> {
            None
        }
        fn wrote(&self) {}
        fn write_blocked(&self) {}
    }

    impl FastStream for OneByte {
        const SECURE: bool = false;

        fn tcp(&self) -> &Watched<TcpStream> {
            &self.tcp
        }

        fn read_now(&mut self, _: &mut Context<'_>, buf: &mut Vec<u8>) -> std::io::Result<usize> {
            // Alternately a byte and nothing.
            self.blocked = !self.blocked;
            if self.blocked {
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            let Some(&b) = self.script.get(self.at) else {
                return Ok(0);
            };
            self.at += 1;
            buf.push(b);
            Ok(1)
        }
    }

    /// A handler with no fast route: a complete head is handed to hyper.
    struct NoRoutes;

    impl Handler for NoRoutes {
        async fn handle(
            &self,
            _: http::Request<crate::body::Incoming>,
            _: SocketAddr,
            _: bool,
            _: ActivityGuard,
        ) -> http::Response<crate::body::Body> {
            unreachable!()
        }
        fn connection_accepted(&self) {}
        fn http_metrics(&self) -> &crate::metrics::HttpMetrics {
            unreachable!()
        }
        fn accept_metrics(&self) -> &crate::server::listener::AcceptMetrics {
            unreachable!()
        }
        fn splices_streams(&self) -> bool {
            false
        }
        type FastRoute = ();
        fn has_fast_routes(&self) -> bool {
            true
        }
        fn fast_route(&self, _: ListenerId, _: &str, _: &str) -> Option<()> {
            None
        }
        async fn serve_fast<W: FastClient + Send + Sync>(
            &self,
            _: (),
            _: FastRequest<'_>,
            _: &str,
            _: &str,
            _: SocketAddr,
            _: &mut W,
            _: ActivityGuard,
        ) -> Served {
            unreachable!()
        }
    }

    /// Runs the connection loop over `script` sent a byte at a time (`max_bytes` the head
    /// limit): how it ended, and how many times it parsed the head.
    async fn one_byte_at_a_time(script: Vec<u8>, max_bytes: usize) -> (End, usize) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, peer) = listener.accept().await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut client, b"x")
            .await
            .unwrap();
        let (_stop_tx, stop) = tokio::sync::watch::channel(false);
        let config = crate::server::ServerConfig::default();
        let conn = Arc::new(Conn {
            builder: Arc::new(crate::server::http_builder(&config)),
            handler: Arc::new(NoRoutes),
            tls: Default::default(),
            stop: stop.clone(),
            timeouts: crate::server::Timeouts {
                idle: Duration::from_secs(30),
                send: Duration::from_secs(30),
                tls_handshake: Duration::from_secs(30),
                header_read: Duration::from_secs(30),
            },
            head_limits: (max_bytes, 100),
            listener: ListenerId::default(),
            splice: false,
            fast_path: true,
            alt_svc: None,
            h2_own: None,
            clock: Clock::start(stop),
        });
        let stream = OneByte {
            tcp: Watched::new(server, Activity::new()),
            script,
            at: 0,
            // The first read finds a byte (one finding none would leave the connection idle).
            blocked: true,
        };
        let idle = Idle::new(stream, conn.clock.clone());
        PARSES.with(|n| n.set(0));
        let (_, end) = conn.serve_busy(idle, peer).await;
        (end, PARSES.with(Cell::get))
    }

    /// A head sent a byte at a time is parsed once per line (and once past the limit), not once
    /// per read: parsing the whole buffer again after every byte was quadratic (a 64 KiB head
    /// cost a worker most of a second). It still reaches hyper whole.
    #[tokio::test]
    async fn a_head_sent_a_byte_at_a_time_is_parsed_once_per_line() {
        let mut head = b"GET / HTTP/1.1\r\nHost: x\r\n".to_vec();
        for i in 0..10 {
            head.extend_from_slice(format!("X-{i}: {}\r\n", "v".repeat(300)).as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        let lines = head.iter().filter(|&&b| b == b'\n').count();
        let (end, parses) = one_byte_at_a_time(head.clone(), 64 * 1024).await;
        assert!(matches!(&end, End::HandOff(bytes) if *bytes == head));
        assert!(
            parses <= lines,
            "{parses} parses of a {}-byte head",
            head.len()
        );
        // A line that never ends is handed on (the screen under hyper answers 431) once past
        // the limit, parsed once there.
        let mut long = b"GET /".to_vec();
        long.resize(5000, b'a');
        let (end, parses) = one_byte_at_a_time(long, 4096).await;
        assert!(matches!(&end, End::HandOff(bytes) if bytes.len() == 4097));
        assert_eq!(parses, 1);
        // A bad method is handed on (hyper answers 400) at its line's end at the latest.
        let (end, parses) = one_byte_at_a_time(b"G(T / HTTP/1.1\r\nHost".to_vec(), 4096).await;
        assert!(matches!(&end, End::HandOff(bytes) if bytes.len() == 16));
        assert_eq!(parses, 1);
    }

    proptest! {
        /// Whatever the bytes, the classifier answers (serve, wait or hand off) and never panics;
        /// a head it serves is complete and within the buffer.
        #[test]
        fn any_bytes_are_classified(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            if let Ok(Some(s)) = classify(&bytes, 100) {
                prop_assert!(s.len <= bytes.len());
                prop_assert!(s.request.method == Method::GET || s.request.method == Method::HEAD);
            }
        }

        /// A simple head with arbitrary field names and values either qualifies or is handed
        /// off; when served, its fields come through in order.
        #[test]
        fn simple_heads_keep_their_fields(
            fields in proptest::collection::vec(("[a-zA-Z-]{1,12}", "[ -~]{0,20}"), 0..8)
        ) {
            let mut head = String::from("GET /p HTTP/1.1\r\nHost: h\r\n");
            for (k, v) in &fields {
                head.push_str(&format!("X-{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            if let Ok(Some(s)) = classify(head.as_bytes(), 100) {
                prop_assert_eq!(s.len, head.len());
                prop_assert_eq!(s.request.headers.len(), fields.len() + 1);
            }
        }
    }

    fn simple(raw: &str) -> bool {
        matches!(classify(raw.as_bytes(), 100), Ok(Some(_)))
    }

    fn hands_off(raw: &str) -> bool {
        classify(raw.as_bytes(), 100).is_err()
    }

    #[test]
    fn what_qualifies() {
        assert!(simple("GET /a?b HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(simple(
            "HEAD / HTTP/1.1\r\nHost: x:80\r\nContent-Length: 0\r\n\r\n"
        ));
        assert!(matches!(
            classify(b"GET / HTTP/1.1\r\nHost: x\r\n", 100),
            Ok(None)
        ));
        for bad in [
            "POST / HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET / HTTP/1.0\r\nHost: x\r\n\r\n",
            "GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: \r\n\r\n",
            "GET / HTTP/1.1\r\nHost: evil.com/.x\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a..x\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a|b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
            "GET /_token_abc/x HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "GET / HTTP/1.1\r\nHost x\r\n\r\n",
            "GET /a#/../b HTTP/1.1\r\nHost: x\r\n\r\n",
        ] {
            assert!(hands_off(bad), "{bad:?}");
        }
        // A preface's start waits for the rest.
        for n in 1..24 {
            let part = &crate::server::H2_PREFACE[..n];
            assert!(matches!(classify(part, 100), Ok(None)), "{n}");
        }
        let c = classify(
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Close\r\n\r\n",
            100,
        );
        assert!(matches!(c, Ok(Some(s)) if s.request.close));
        // More fields than `server.max_headers`: hyper refuses it.
        assert!(classify(b"GET / HTTP/1.1\r\nHost: x\r\nA: 1\r\nB: 2\r\n\r\n", 2).is_err());
    }
}
