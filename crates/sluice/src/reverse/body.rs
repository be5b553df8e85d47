//! Body wrappers of the reverse proxy: the request body lent to one attempt at a time (taken back
//! when the attempt never read it, so a connect failure can move on to another server), with the
//! route's size limit and idle deadline; and the response body with its idle deadline and the
//! bookkeeping that ends with it.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::body::Incoming;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::h1pool::UpstreamBody;

/// Why a body stopped early.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("request body larger than {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("no body bytes for {secs} s")]
    Idle { secs: u64 },
    #[error("body read failed: {0}")]
    Read(#[from] hyper::Error),
    #[error("request body read failed: {0}")]
    Client(crate::body::ReadError),
}

/// How the client failed to send its request body: none of these is the server's doing, so none
/// counts against it (passive health) and no other server is tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientFault {
    /// The client closed the connection (or reset it) before the body ended.
    Aborted,
    /// The body's framing was broken (a bad chunk, a chunk size that overflows).
    Malformed,
    /// No body byte for the route's idle timeout, or the body still coming from the client when
    /// the header timeout ran out.
    Slow,
    /// Over the route's `max_body_bytes`.
    TooLarge,
}

impl ClientFault {
    fn code(self) -> u8 {
        match self {
            ClientFault::Aborted => 1,
            ClientFault::Malformed => 2,
            ClientFault::Slow => 3,
            ClientFault::TooLarge => 4,
        }
    }

    fn of_code(code: u8) -> Option<ClientFault> {
        match code {
            1 => Some(ClientFault::Aborted),
            2 => Some(ClientFault::Malformed),
            3 => Some(ClientFault::Slow),
            4 => Some(ClientFault::TooLarge),
            _ => None,
        }
    }

    /// What a read error of the client's body means.
    fn of_read(e: &crate::body::ReadError) -> ClientFault {
        let e = match e {
            crate::body::ReadError::Hyper(e) => e,
            // An HTTP/3 body that broke its own `Content-Length` is reported as invalid data;
            // anything else (a stream reset, a connection lost) is the client going away.
            crate::body::ReadError::Adapted(e) => {
                return match e.downcast_ref::<std::io::Error>() {
                    Some(io) if io.kind() == std::io::ErrorKind::InvalidData => {
                        ClientFault::Malformed
                    }
                    _ => ClientFault::Aborted,
                };
            }
        };
        if e.is_incomplete_message() || e.is_closed() || e.is_canceled() {
            return ClientFault::Aborted;
        }
        if e.is_parse() || e.is_user() {
            return ClientFault::Malformed;
        }
        // hyper reports a bad chunk as an I/O error of kind InvalidData, a reset as another kind.
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            if let Some(io) = s.downcast_ref::<std::io::Error>() {
                return match io.kind() {
                    std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput => {
                        ClientFault::Malformed
                    }
                    _ => ClientFault::Aborted,
                };
            }
            source = s.source();
        }
        ClientFault::Aborted
    }
}

/// The downstream request body, shared between attempts.
pub struct BodySlot {
    shared: Arc<Shared>,
    size_hint: SizeHint,
    end_stream: bool,
    /// No body at all (a cache fill's GET): every attempt may send "nothing".
    bodiless: bool,
}

struct Shared {
    incoming: Mutex<Option<Incoming>>,
    too_large: AtomicBool,
    /// The client's failure, if any ([`ClientFault::code`]; 0: none).
    fault: AtomicU8,
    /// The body was lent and its last poll waited for the client (not for the server to take it).
    awaiting_client: AtomicBool,
    /// When (`Shared::ms`) the current wait for the client's bytes began; 0: not waiting.
    wait_began: AtomicU64,
    /// What `wait_began` counts from.
    born: Instant,
    /// When the body ended (all of it was read from the client and passed on): the server's
    /// header timeout runs from here at the latest ([`BodySlot::ended_at`]).
    ended_at: OnceLock<Instant>,
    sent: AtomicU64,
    limit: u64,
    idle: Duration,
}

impl BodySlot {
    /// `limit` 0 means no limit.
    pub fn new(incoming: Incoming, limit: u64, idle: Duration) -> Self {
        BodySlot {
            size_hint: incoming.size_hint(),
            // A `content-length: 0` body over HTTP/2 whose END_STREAM has not come (or never
            // will) has nothing to send: ended, as a spent one is (`LentBody::is_end_stream`).
            end_stream: incoming.is_end_stream() || incoming.size_hint().exact() == Some(0),
            shared: Arc::new(Shared {
                incoming: Mutex::new(Some(incoming)),
                too_large: AtomicBool::new(false),
                fault: AtomicU8::new(0),
                awaiting_client: AtomicBool::new(false),
                wait_began: AtomicU64::new(0),
                born: crate::runtime::recent::recent(),
                ended_at: OnceLock::new(),
                sent: AtomicU64::new(0),
                limit,
                idle,
            }),
            bodiless: false,
        }
    }

    /// A slot for a request without a body, replayable on every attempt.
    pub fn empty(idle: Duration) -> Self {
        BodySlot {
            size_hint: SizeHint::with_exact(0),
            end_stream: true,
            shared: Arc::new(Shared {
                incoming: Mutex::new(None),
                too_large: AtomicBool::new(false),
                fault: AtomicU8::new(0),
                awaiting_client: AtomicBool::new(false),
                wait_began: AtomicU64::new(0),
                born: crate::runtime::recent::recent(),
                // Nothing to wait for: the header timeout runs from the attempt's start.
                ended_at: OnceLock::new(),
                sent: AtomicU64::new(0),
                limit: 0,
                idle,
            }),
            bodiless: true,
        }
    }

    /// Whether the request has no body at all.
    pub fn is_empty(&self) -> bool {
        self.end_stream
    }

    /// The body for one attempt; `None` once an earlier attempt started reading it.
    pub fn lend(&self) -> Option<LentBody> {
        if !self.bodiless && self.shared.incoming.lock().ok()?.is_none() {
            return None;
        }
        Some(LentBody {
            idle: IdleClock::new(self.shared.idle),
            shared: self.shared.clone(),
            inner: None,
            size_hint: self.size_hint,
            end_stream: self.end_stream,
        })
    }

    /// Whether the body can still be sent (no attempt has read from it).
    pub fn untouched(&self) -> bool {
        self.bodiless
            || self
                .shared
                .incoming
                .lock()
                .map(|g| g.is_some())
                .unwrap_or(false)
    }

    /// Whether the size limit cut the body.
    pub fn too_large(&self) -> bool {
        self.shared.too_large.load(Ordering::Relaxed)
    }

    /// Whether a failed attempt was the client's doing: its body failed (aborted, malformed,
    /// idle, too large), or, when the attempt ran out of time (`timed_out`), the body was still
    /// waiting for the client's bytes rather than for the server to take them.
    pub fn client_fault(&self, timed_out: bool) -> Option<ClientFault> {
        let s = &self.shared;
        if let Some(f) = ClientFault::of_code(s.fault.load(Ordering::Relaxed)) {
            return Some(f);
        }
        (timed_out && self.awaiting_client()).then_some(ClientFault::Slow)
    }

    /// Whether the body has not ended and its last poll was waiting for the client's bytes (not
    /// for the server to take them): when the header timeout runs out then, the client is late.
    fn awaiting_client(&self) -> bool {
        let s = &self.shared;
        !self.bodiless && s.ended_at.get().is_none() && s.awaiting_client.load(Ordering::Relaxed)
    }

    /// Whether the body is stalled on its client: not ended, waiting for the client's bytes now,
    /// and either this wait has lasted [`STALLED_AFTER`] or, that long after the request began,
    /// the body has come slower than [`TRICKLE_BYTES_PER_SEC`] on average. A server that gives
    /// up on the request then (closes, resets) may be giving up on a client too slow for its own
    /// timeout: not a failure to book on it. Merely waiting now is not enough: a client slower
    /// than the upstream link leaves nearly every upload waiting on it, and a server that resets
    /// an upload coming at a real link's pace (a crashed worker, a full disk) must be booked,
    /// however long the upload has run.
    pub fn stalled(&self) -> bool {
        if !self.awaiting_client() {
            return false;
        }
        let s = &self.shared;
        let now = s.ms();
        let began = s.wait_began.load(Ordering::Relaxed);
        let current = if began == 0 {
            0
        } else {
            now.saturating_sub(began)
        };
        let after = STALLED_AFTER.as_millis() as u64;
        if current >= after {
            return true;
        }
        // A trickle (a byte every few hundred milliseconds) never waits long at a time, yet a
        // server's whole-request upload timeout gives up on it.
        now >= after
            && s.sent.load(Ordering::Relaxed).saturating_mul(1000) / now < TRICKLE_BYTES_PER_SEC
    }

    /// When the whole body had been passed on to the server; `None` while it has not (or when
    /// there is no body to pass on).
    pub fn ended_at(&self) -> Option<Instant> {
        self.shared.ended_at.get().copied()
    }
}

/// How long one wait for the client's body bytes must last before a server's error is laid to
/// the client ([`BodySlot::stalled`]): far above the gaps of a client streaming at a real link's
/// pace, below any server's upload timeout (seconds at least).
pub const STALLED_AFTER: Duration = Duration::from_millis(500);

/// The average body rate below which a client waited on now is taken as trickling
/// ([`BodySlot::stalled`]): 4 KiB/s, a thirty-second of a slow mobile uplink, far above a
/// byte every few hundred milliseconds.
pub const TRICKLE_BYTES_PER_SEC: u64 = 4096;

impl Shared {
    /// Milliseconds since `born`, plus one (0 is "not waiting").
    fn ms(&self) -> u64 {
        crate::runtime::recent::since(self.born).as_millis() as u64 + 1
    }

    /// A poll found no byte from the client: a wait begins, unless one is on.
    fn wait(&self) {
        self.awaiting_client.store(true, Ordering::Relaxed);
        if self.wait_began.load(Ordering::Relaxed) == 0 {
            self.wait_began.store(self.ms(), Ordering::Relaxed);
        }
    }

    /// The client's bytes came: the wait on, if any, is over.
    fn came(&self) {
        self.awaiting_client.store(false, Ordering::Relaxed);
        self.wait_began.store(0, Ordering::Relaxed);
    }

    /// Records the client's failure (the first one stands).
    fn fault(&self, fault: ClientFault) {
        let _ = self
            .fault
            .compare_exchange(0, fault.code(), Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The body ended: the first end stands.
    fn ended(&self) {
        self.came();
        let _ = self.ended_at.set(crate::runtime::recent::recent());
    }
}

/// The body as one attempt sends it.
pub struct LentBody {
    shared: Arc<Shared>,
    inner: Option<Incoming>,
    idle: IdleClock,
    size_hint: SizeHint,
    end_stream: bool,
}

impl Body for LentBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if this.inner.is_none() {
            // First read: from now on the body belongs to this attempt.
            let taken = this.shared.incoming.lock().ok().and_then(|mut g| g.take());
            match taken {
                Some(b) => this.inner = Some(b),
                None => return Poll::Ready(None),
            }
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(&mut *inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let sent = this
                        .shared
                        .sent
                        .fetch_add(data.len() as u64, Ordering::Relaxed)
                        + data.len() as u64;
                    if this.shared.limit > 0 && sent > this.shared.limit {
                        this.shared.too_large.store(true, Ordering::Relaxed);
                        this.shared.fault(ClientFault::TooLarge);
                        return Poll::Ready(Some(Err(BodyError::TooLarge {
                            limit: this.shared.limit,
                        })));
                    }
                }
                this.idle.moved();
                this.shared.came();
                // A body of known length ends with its last frame: the sender (hyper) looks at
                // `is_end_stream` and never polls for the end, so it is marked here. An HTTP/2
                // (or HTTP/3) body is at its end only with END_STREAM, which may come later or
                // never be polled for: its `content-length` counted down to nothing ends it too.
                if inner.is_end_stream() || inner.size_hint().exact() == Some(0) {
                    this.shared.ended();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.shared.fault(ClientFault::of_read(&e));
                Poll::Ready(Some(Err(BodyError::Client(e))))
            }
            Poll::Ready(None) => {
                this.shared.ended();
                Poll::Ready(None)
            }
            Poll::Pending => {
                this.shared.wait();
                match this.idle.poll_expired(cx) {
                    Poll::Ready(()) => {
                        this.shared.fault(ClientFault::Slow);
                        Poll::Ready(Some(Err(BodyError::Idle {
                            secs: this.shared.idle.as_secs(),
                        })))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            // Its `content-length` spent is its end too: an HTTP/2 upstream then sends
            // END_STREAM with the last byte instead of waiting for the client's (which may
            // never come, while the header timeout, run from the body's end, books the server).
            Some(b) => b.is_end_stream() || b.size_hint().exact() == Some(0),
            None => self.end_stream,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(b) => b.size_hint(),
            None => self.size_hint,
        }
    }
}

/// A body's idle deadline, armed only when the body has to wait: a body whose frames are ready
/// whenever it is polled (every small response, every request without a body) never reads the
/// clock, allocates a timer or puts one on the timer wheel. The deadline runs from the first wait
/// after the last frame, which is later than the frame itself by no more than the time the frame
/// took to be taken.
pub(super) struct IdleClock {
    timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    /// A frame went through since the deadline was set: move it at the next wait.
    moved: bool,
}

impl IdleClock {
    pub(super) fn new(timeout: Duration) -> Self {
        IdleClock {
            timeout,
            sleep: None,
            moved: false,
        }
    }

    /// A frame went through.
    pub(super) fn moved(&mut self) {
        self.moved = true;
    }

    /// The body has to wait: ready once it has waited `timeout` with no frame.
    pub(super) fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let timeout = self.timeout;
        if std::mem::take(&mut self.moved) {
            if let Some(sleep) = self.sleep.as_mut() {
                sleep.as_mut().reset(Instant::now() + timeout);
            }
        }
        self.sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)))
            .as_mut()
            .poll(cx)
    }
}

use std::future::Future;

/// Runs when the response body ends or is dropped (metrics, access log, in-flight release).
pub trait OnDone: Send + 'static {
    fn done(self: Box<Self>, bytes: u64, complete: bool);
}

pin_project_lite::pin_project! {
    /// The upstream response body on its way to the client.
    pub struct ResponseBody {
        #[pin]
        inner: UpstreamBody,
        idle: IdleClock,
        bytes: u64,
        done: Option<Box<dyn OnDone>>,
    }

    impl PinnedDrop for ResponseBody {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(done) = this.done.take() {
                done.done(*this.bytes, false);
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// A body sluice answers with itself (a cached response) on its way to the client: counted,
    /// with the bookkeeping that ends with it.
    pub struct Counted {
        #[pin]
        inner: crate::body::Body,
        bytes: u64,
        done: Option<Box<dyn OnDone>>,
    }

    impl PinnedDrop for Counted {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(done) = this.done.take() {
                done.done(*this.bytes, false);
            }
        }
    }
}

impl Counted {
    pub fn new(inner: crate::body::Body, done: Box<dyn OnDone>) -> Self {
        Counted {
            inner,
            bytes: 0,
            done: Some(done),
        }
    }
}

impl Body for Counted {
    type Data = Bytes;
    type Error = crate::body::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    *this.bytes += data.len() as u64;
                }
            }
            Poll::Ready(None) => {
                if let Some(done) = this.done.take() {
                    done.done(*this.bytes, true);
                }
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl ResponseBody {
    pub fn new(inner: UpstreamBody, timeout: Duration, done: Box<dyn OnDone>) -> Self {
        ResponseBody {
            inner,
            idle: IdleClock::new(timeout),
            bytes: 0,
            done: Some(done),
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    *this.bytes += data.len() as u64;
                }
                this.idle.moved();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(BodyError::Read(e)))),
            Poll::Ready(None) => {
                if let Some(done) = this.done.take() {
                    done.done(*this.bytes, true);
                }
                Poll::Ready(None)
            }
            Poll::Pending => match this.idle.poll_expired(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(BodyError::Idle {
                    secs: this.idle.timeout.as_secs(),
                }))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    /// Polls the clock once, as a body does when it has to wait.
    async fn waits(clock: &mut IdleClock) -> bool {
        poll_fn(|cx| Poll::Ready(clock.poll_expired(cx).is_ready())).await
    }

    #[tokio::test(start_paused = true)]
    async fn idle_clock_runs_from_the_first_wait_after_the_last_frame() {
        let mut clock = IdleClock::new(Duration::from_secs(10));
        // Frames that never wait arm nothing.
        clock.moved();
        assert!(clock.sleep.is_none());
        assert!(!waits(&mut clock).await);
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(!waits(&mut clock).await);
        // A frame after 6 s of waiting moves the deadline to 10 s after the next wait.
        clock.moved();
        assert!(!waits(&mut clock).await);
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(
            !waits(&mut clock).await,
            "the frame did not move the deadline"
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(
            waits(&mut clock).await,
            "idle past the timeout without expiring"
        );
    }
}
