//! Plain HTTP/1.1 upstream connections driven by the request that uses them: an idle stack per
//! server (newest on top), the connection polled inside the attempt and then by the response body,
//! and pushed back when the response ends. No task per connection, so a response reaches the
//! client without a hand-off between tasks (see `docs/decisions/owned-h1-upstream.md`).

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use super::client::ConnectFailure;
use super::dial::EagerStream;
use crate::body::Body;

type Io = TokioIo<EagerStream>;

/// Why an attempt on an owned connection failed.
#[derive(Debug, thiserror::Error)]
pub enum H1Error {
    #[error(transparent)]
    Connect(#[from] ConnectFailure),
    #[error("{0}")]
    Http(#[from] hyper::Error),
}

/// One upstream connection: the half requests are handed to and the half that does the I/O.
struct Live {
    send: SendRequest<Body>,
    conn: Connection<Io, Body>,
}

impl Live {
    /// Polls the connection with a waker that wakes nobody: the connection registers no task of
    /// a finished request, and a connection the server closed (or broke) shows as ready.
    /// `true` when it can take another request.
    ///
    /// Polled outside the task's cooperative budget: a busy task (an HTTP/2 connection's, which
    /// polls all its streams) may have spent it, and the socket's read would then answer
    /// `Pending` whatever waits in it, passing stray bytes (another request's answer) as quiet.
    fn usable_when_idle(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        let conn = &mut self.conn;
        let polled = {
            let look = tokio::task::unconstrained(poll_fn(|cx| Pin::new(&mut *conn).poll(cx)));
            let mut look = std::pin::pin!(look);
            look.as_mut().poll(&mut cx)
        };
        match polled {
            Poll::Ready(_) => false,
            Poll::Pending => self.send.is_ready(),
        }
    }
}

struct Idle {
    /// Boxed, like everywhere it travels: a connection is a large value, and moving it in and out
    /// of the stack and the response body would copy it each time.
    live: Box<Live>,
    since: Instant,
}

/// One route's owned HTTP/1.1 connections (for one per-core runtime, or the whole process under
/// work-stealing), an idle stack per server of the route's group.
pub struct H1Pool {
    servers: Vec<Mutex<VecDeque<Idle>>>,
    max_idle: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
    builder: http1::Builder,
    /// A task closing expired idle connections is running.
    reaping: AtomicBool,
}

impl H1Pool {
    pub fn new(
        servers: usize,
        max_idle: usize,
        idle_timeout: Duration,
        connect_timeout: Duration,
    ) -> Arc<H1Pool> {
        Arc::new(H1Pool {
            servers: (0..servers).map(|_| Mutex::new(VecDeque::new())).collect(),
            max_idle,
            idle_timeout,
            connect_timeout,
            builder: http1::Builder::new(),
            reaping: AtomicBool::new(false),
        })
    }

    /// Sends `req` (origin-form target, `Host` set) to server `index` at `addr` and returns the
    /// response head; the body drives the connection on. A pooled connection that turns out closed
    /// before the request was written is replaced by another (the request was not sent).
    pub async fn send(
        self: &Arc<Self>,
        index: usize,
        addr: &str,
        mut req: Request<Body>,
    ) -> Result<Response<UpstreamBody>, H1Error> {
        loop {
            let (live, reused) = match self.checkout(index) {
                Some(live) => (live, true),
                // Boxed: connecting is the rare path, and inline its state would make every
                // request's future (copied as it is built) as large as the resolver's and dialer's.
                None => (Box::pin(self.connect(addr)).await?, false),
            };
            let mut live = Some(live);
            let sent = match live.as_mut() {
                Some(l) => l.send.try_send_request(req),
                None => unreachable!(),
            };
            let mut sent = std::pin::pin!(sent);
            // The connection writes the request and reads the head here, in this task: poll it
            // first so a head already read resolves the answer in the same pass.
            let result = poll_fn(|cx| {
                if let Some(l) = live.as_mut() {
                    if Pin::new(&mut l.conn).poll(cx).is_ready() {
                        // Closed or failed: dropping it hands a request it never took back.
                        live = None;
                    }
                }
                sent.as_mut().poll(cx)
            })
            .await;
            match result {
                Ok(resp) => {
                    let driver = live.map(|live| Driver {
                        live,
                        pool: self.clone(),
                        index,
                    });
                    return Ok(resp.map(|incoming| UpstreamBody {
                        incoming,
                        driver,
                        ended: false,
                        failed: None,
                    }));
                }
                Err(mut e) => match e.take_message() {
                    Some(back) if reused => req = back,
                    _ => return Err(H1Error::Http(e.into_error())),
                },
            }
        }
    }

    /// The newest idle connection to server `index` that can still take a request.
    fn checkout(&self, index: usize) -> Option<Box<Live>> {
        let slot = self.servers.get(index)?;
        loop {
            let idle = slot.lock().ok()?.pop_back()?;
            if idle.since.elapsed() >= self.idle_timeout {
                // The newest is expired, so is every older one.
                let expired = std::mem::take(&mut *slot.lock().ok()?);
                drop(expired);
                return None;
            }
            let mut live = idle.live;
            if live.usable_when_idle() {
                return Some(live);
            }
        }
    }

    /// Puts a connection whose response ended back on its server's stack.
    fn checkin(self: &Arc<Self>, index: usize, mut live: Box<Live>) {
        if self.max_idle == 0 || !live.usable_when_idle() {
            return;
        }
        let Some(Ok(mut stack)) = self.servers.get(index).map(Mutex::lock) else {
            return;
        };
        if stack.len() >= self.max_idle {
            // The oldest goes: the newest are the warmest and the last to be closed by a server.
            stack.pop_front();
        }
        stack.push_back(Idle {
            live,
            since: Instant::now(),
        });
        drop(stack);
        self.ensure_reaper();
    }

    /// Starts the task that closes connections idle past `pool_idle_secs`, unless one runs; it
    /// holds the pool weakly and ends when every stack is empty or the pool is gone.
    fn ensure_reaper(self: &Arc<Self>) {
        if self.reaping.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            self.reaping.store(false, Ordering::Release);
            return;
        };
        let pool: Weak<H1Pool> = Arc::downgrade(self);
        let period = (self.idle_timeout / 2).max(Duration::from_millis(100));
        handle.spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let Some(pool) = pool.upgrade() else { return };
                if pool.reap() == 0 {
                    pool.reaping.store(false, Ordering::Release);
                    // A connection pushed between the sweep and the flag is swept by the next
                    // push's reaper, or expires at checkout.
                    return;
                }
            }
        });
    }

    /// Closes expired idle connections; how many are left.
    fn reap(&self) -> usize {
        let mut left = 0;
        for slot in &self.servers {
            let Ok(mut stack) = slot.lock() else { continue };
            while stack
                .front()
                .is_some_and(|i| i.since.elapsed() >= self.idle_timeout)
            {
                stack.pop_front();
            }
            left += stack.len();
        }
        left
    }

    async fn connect(&self, addr: &str) -> Result<Box<Live>, H1Error> {
        let secs = self.connect_timeout.as_secs();
        let tcp = match tokio::time::timeout(self.connect_timeout, super::dial::dial(addr)).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(ConnectFailure::Timeout {
                    addr: addr.to_string(),
                    secs,
                }
                .into())
            }
        };
        // An HTTP/1 handshake does no I/O: it only sets the connection up. The request is written
        // in the attempt's first poll when the TCP handshake is already done (`dial`).
        let (send, conn) = self
            .builder
            .handshake(TokioIo::new(EagerStream::new(tcp)))
            .await?;
        Ok(Box::new(Live { send, conn }))
    }

    /// Idle connections to server `index` (tests).
    #[cfg(test)]
    fn idle(&self, index: usize) -> usize {
        self.servers[index].lock().map(|s| s.len()).unwrap_or(0)
    }
}

/// The connection a response body drives, and where it goes back to.
struct Driver {
    live: Box<Live>,
    pool: Arc<H1Pool>,
    index: usize,
}

/// An upstream response body: from the legacy client (its connection task drives it) or from an
/// owned connection this body drives itself.
pub struct UpstreamBody {
    incoming: Incoming,
    driver: Option<Driver>,
    ended: bool,
    /// A failure held back for one poll (see `poll_frame`).
    failed: Option<hyper::Error>,
}

impl From<Incoming> for UpstreamBody {
    fn from(incoming: Incoming) -> Self {
        UpstreamBody {
            incoming,
            driver: None,
            ended: false,
            failed: None,
        }
    }
}

impl UpstreamBody {
    fn release(&mut self) {
        if let Some(d) = self.driver.take() {
            d.pool.checkin(d.index, d.live);
        }
    }
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(e) = this.failed.take() {
            return Poll::Ready(Some(Err(e)));
        }
        // Buffered bytes first; polling asks the connection for more (hyper reads a body only
        // when it is wanted).
        let mut polled = Pin::new(&mut this.incoming).poll_frame(cx);
        if polled.is_pending() {
            let Some(d) = this.driver.as_mut() else {
                return Poll::Pending;
            };
            if Pin::new(&mut d.live.conn).poll(cx).is_ready() {
                this.driver = None;
            }
            polled = Pin::new(&mut this.incoming).poll_frame(cx);
        }
        match &polled {
            Poll::Ready(None) => {
                this.ended = true;
                this.release();
            }
            Poll::Ready(Some(Err(_))) => {
                this.driver = None;
                if let Poll::Ready(Some(Err(e))) = polled {
                    // Read in the same pass as the head, a cut would reach the client's writer
                    // before it sent anything, and it would drop the head too. One `Pending`
                    // first lets it write what arrived; the cut comes on the next poll.
                    this.failed = Some(e);
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // A body never polled to its end (HEAD, 204, 304, or a writer that stops at the length)
        // still leaves a reusable connection when the message is complete; otherwise the
        // connection closes here, as HTTP/1 cannot abandon a response half read.
        if self.driver.is_some() && self.is_end_stream() {
            self.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// An origin answering every request on a connection with `body`; counts accepted connections.
    async fn origin(body: &'static str, close_after: Option<usize>) -> (String, Arc<AtomicCount>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicCount::default());
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                count.0.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut served = 0;
                    loop {
                        let mut chunk = [0u8; 1024];
                        let n = match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            let answer = format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            if s.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                            served += 1;
                            if close_after == Some(served) {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    #[derive(Default)]
    struct AtomicCount(std::sync::atomic::AtomicUsize);

    impl AtomicCount {
        fn get(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    fn get(addr: &str) -> Request<Body> {
        Request::builder()
            .uri("/x")
            .header("host", addr)
            .body(crate::body::empty())
            .unwrap()
    }

    async fn read_all(resp: Response<UpstreamBody>) -> Bytes {
        use http_body_util::BodyExt;
        resp.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn reuses_one_connection_for_sequential_requests() {
        let (addr, accepted) = origin("hello", None).await;
        let pool = H1Pool::new(1, 8, Duration::from_secs(30), Duration::from_secs(2));
        for _ in 0..5 {
            let resp = pool.send(0, &addr, get(&addr)).await.unwrap();
            assert_eq!(read_all(resp).await, Bytes::from_static(b"hello"));
            assert_eq!(pool.idle(0), 1);
        }
        assert_eq!(accepted.get(), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_at_its_end_returns_the_connection() {
        let (addr, accepted) = origin("", None).await;
        let pool = H1Pool::new(1, 8, Duration::from_secs(30), Duration::from_secs(2));
        for _ in 0..3 {
            let resp = pool.send(0, &addr, get(&addr)).await.unwrap();
            assert!(resp.body().is_end_stream());
            drop(resp);
        }
        assert_eq!(accepted.get(), 1);
        assert_eq!(pool.idle(0), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_half_read_closes_the_connection() {
        let (addr, accepted) = origin("0123456789", None).await;
        let pool = H1Pool::new(1, 8, Duration::from_secs(30), Duration::from_secs(2));
        let resp = pool.send(0, &addr, get(&addr)).await.unwrap();
        drop(resp);
        assert_eq!(pool.idle(0), 0);
        let resp = pool.send(0, &addr, get(&addr)).await.unwrap();
        assert_eq!(read_all(resp).await, Bytes::from_static(b"0123456789"));
        assert_eq!(accepted.get(), 2);
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_is_replaced() {
        let (addr, accepted) = origin("ok", Some(1)).await;
        let pool = H1Pool::new(1, 8, Duration::from_secs(30), Duration::from_secs(2));
        for _ in 0..3 {
            let resp = pool.send(0, &addr, get(&addr)).await.unwrap();
            assert_eq!(read_all(resp).await, Bytes::from_static(b"ok"));
            // Let the server's close arrive before the next checkout.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.get(), 3);
    }

    #[tokio::test]
    async fn idle_connections_are_bounded_and_expire() {
        let (addr, _) = origin("x", None).await;
        let pool = H1Pool::new(1, 2, Duration::from_millis(200), Duration::from_secs(2));
        let a = pool.send(0, &addr, get(&addr)).await.unwrap();
        let b = pool.send(0, &addr, get(&addr)).await.unwrap();
        let c = pool.send(0, &addr, get(&addr)).await.unwrap();
        for r in [a, b, c] {
            read_all(r).await;
        }
        assert_eq!(pool.idle(0), 2);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(pool.idle(0), 0);
        assert!(!pool.reaping.load(Ordering::Acquire));
    }

    #[tokio::test]
    async fn refused_connect_is_a_connect_failure() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let pool = H1Pool::new(1, 8, Duration::from_secs(30), Duration::from_secs(2));
        let err = pool.send(0, &addr, get(&addr)).await.err().unwrap();
        assert!(matches!(
            err,
            H1Error::Connect(ConnectFailure::Refused { .. })
        ));
    }

    /// An origin that reads one request per connection and answers it with `answer`, as is.
    async fn raw_origin(answer: &'static [u8]) -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(answer).await;
            }
        });
        addr
    }

    /// Bytes a server sends on an idle pooled connection (a body after a HEAD's head, a second
    /// answer) make it unusable, even for a task that has spent its cooperative budget.
    #[tokio::test]
    async fn stray_bytes_are_seen_even_out_of_budget() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await;
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nEVIL")
                        .await;
                    tokio::time::sleep(Duration::from_secs(5)).await;
                });
            }
        });
        let pool = H1Pool::new(1, 8, Duration::from_secs(30), Duration::from_secs(2));
        let resp = pool.send(0, &addr, get(&addr)).await.unwrap();
        assert_eq!(read_all(resp).await, Bytes::from_static(b"ok"));
        assert_eq!(pool.idle(0), 1);
        // The runtime sees the stray bytes arrive.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        for _ in 0..1000 {
            tx.send(()).unwrap();
        }
        let reused = poll_fn(|cx| {
            // Until the budget is spent: then a ready channel answers `Pending`.
            while let Poll::Ready(Some(())) = rx.poll_recv(cx) {}
            Poll::Ready(pool.checkout(0).is_some())
        })
        .await;
        assert!(!reused, "a connection with stray bytes was taken for reuse");
    }

    #[tokio::test]
    async fn garbage_answer_is_an_error() {
        let addr = raw_origin(b"SSH-2.0-OpenSSH_9.0\r\n\xff\xfe garbage\r\n\r\n").await;
        let pool = H1Pool::new(1, 8, Duration::from_secs(30), Duration::from_secs(2));
        let err = pool.send(0, &addr, get(&addr)).await.err().unwrap();
        assert!(matches!(err, H1Error::Http(_)), "{err}");
    }

    #[tokio::test]
    async fn a_cut_body_yields_what_arrived_then_the_error() {
        let addr = raw_origin(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789").await;
        let pool = H1Pool::new(1, 8, Duration::from_secs(30), Duration::from_secs(2));
        let resp = pool.send(0, &addr, get(&addr)).await.unwrap();
        assert_eq!(resp.status(), http::StatusCode::OK);
        let mut body = resp.into_body();
        let mut got = Vec::new();
        let err = loop {
            match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                Some(Ok(frame)) => got.extend_from_slice(frame.data_ref().unwrap()),
                Some(Err(e)) => break e,
                None => panic!("a cut body ended as if complete"),
            }
        };
        assert_eq!(got, b"0123456789");
        assert_eq!(err.to_string(), "error reading a body from connection");
        assert_eq!(pool.idle(0), 0);
    }
}
