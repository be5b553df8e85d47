//! Response bodies the client has stopped pulling while its socket is writable (an HTTP/2 client
//! that never opens its flow-control window): released after the send timeout, even though the
//! connection never polls them again.
//!
//! A blocked socket is the connection watchdog's business (see `activity`); this covers the case
//! a socket-level check cannot see. Releasing drops the inner body, and with it the upstream
//! fetch and everything buffered for it; the stream itself stays bounded by the HTTP/2 stream
//! and send-buffer limits, and ends with an error whenever it is polled again. sluice's own
//! HTTP/2 server goes further at the same timeout: it resets such a stream and drops the chunk it
//! had already taken from the body (`http2::Connection::reset_parked`); hyper's keeps that chunk
//! until the connection ends.

use std::pin::Pin;
use std::sync::atomic::Ordering;

use crate::atomic::AtomicU64;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::Instant;

use crate::body::{Body, BoxError};
use crate::runtime::recent::{self, recent};

/// The bodies of one connection's responses in flight.
#[derive(Debug)]
pub struct Watchlist {
    start: Instant,
    bodies: Mutex<Vec<Weak<Shared>>>,
}

struct Shared {
    inner: Mutex<Option<Body>>,
    /// 0 while the connection is pulling (or the body is finished); otherwise 1 + milliseconds
    /// since `Watchlist::start` at which the body last had a frame taken (or was handed over)
    /// and has not been asked for the next one since.
    waiting_ms: AtomicU64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("waiting_ms", &self.waiting_ms)
            .finish_non_exhaustive()
    }
}

impl Watchlist {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            start: recent(),
            bodies: Mutex::new(Vec::new()),
        })
    }

    /// Wraps a response body so the watchdog can see whether it is being pulled.
    pub fn guard(&self, inner: Body) -> Outgoing {
        if inner.is_end_stream() {
            return Outgoing::Plain(inner);
        }
        let shared = Arc::new(Shared {
            inner: Mutex::new(Some(inner)),
            waiting_ms: AtomicU64::new(mark(self.start)),
        });
        let mut bodies = self.bodies.lock().unwrap_or_else(|e| e.into_inner());
        bodies.retain(|w| w.strong_count() > 0);
        bodies.push(Arc::downgrade(&shared));
        drop(bodies);
        Outgoing::Guarded(Guarded {
            shared,
            start: self.start,
        })
    }

    /// Releases every body not pulled for `limit`; returns how many.
    pub fn release_stalled(&self, limit: Duration) -> usize {
        let now = mark(self.start);
        let limit = limit.as_millis() as u64;
        let mut released = 0;
        let mut bodies = self.bodies.lock().unwrap_or_else(|e| e.into_inner());
        bodies.retain(|weak| {
            let Some(shared) = weak.upgrade() else {
                return false;
            };
            let since = shared.waiting_ms.load(Ordering::Relaxed);
            if since == 0 || now.saturating_sub(since) < limit {
                return true;
            }
            let inner = shared
                .inner
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            released += usize::from(inner.is_some());
            false
        });
        released
    }
}

/// 1 + milliseconds from `start` to now (0 stands for "being pulled").
fn mark(start: Instant) -> u64 {
    recent::since(start).as_millis() as u64 + 1
}

/// A response body as a connection hands it to hyper: as the handler made it, or behind the
/// watch. Not boxed again: hyper takes the body type as it is, so the watch costs the shared
/// state only, not a second box and a second dynamic call per frame. (`http_body_util::Either`
/// would do the same, but its error bound, `Into<BoxError>` on each side, makes the compiler
/// fail to prove the connection future `Send`: "implementation of `From` is not general
/// enough".)
pub enum Outgoing {
    Plain(Body),
    Guarded(Guarded),
}

/// A response body that reports when it is pulled.
pub struct Guarded {
    shared: Arc<Shared>,
    /// The watch list's `start`, which the marks count from.
    start: Instant,
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let shared = &self.shared;
        shared.waiting_ms.store(0, Ordering::Relaxed);
        let mut inner = shared.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(body) = inner.as_mut() else {
            return Poll::Ready(Some(Err(
                "client stopped reading: response released after the send timeout".into(),
            )));
        };
        let res = Pin::new(&mut *body).poll_frame(cx);
        if matches!(res, Poll::Ready(Some(Ok(_)))) && !body.is_end_stream() {
            shared.waiting_ms.store(mark(self.start), Ordering::Relaxed);
        }
        res
    }

    fn is_end_stream(&self) -> bool {
        let inner = self.shared.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.as_ref().is_some_and(HttpBody::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.shared.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.as_ref().map(HttpBody::size_hint).unwrap_or_default()
    }
}

impl HttpBody for Outgoing {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // Both kinds are `Unpin` (a box, an `Arc`).
        match self.get_mut() {
            Outgoing::Plain(body) => Pin::new(body).poll_frame(cx),
            Outgoing::Guarded(guarded) => Pin::new(guarded).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Outgoing::Plain(body) => body.is_end_stream(),
            Outgoing::Guarded(guarded) => guarded.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Outgoing::Plain(body) => body.size_hint(),
            Outgoing::Guarded(guarded) => guarded.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test(start_paused = true)]
    async fn a_body_not_pulled_is_released_and_then_fails() {
        let list = Watchlist::new();
        let chunks = futures_util::stream::iter(
            (0..3).map(|_| Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"abc")))),
        );
        let mut body = list.guard(crate::body::boxed(http_body_util::StreamBody::new(chunks)));
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"abc");
        tokio::time::advance(Duration::from_millis(900)).await;
        assert_eq!(list.release_stalled(Duration::from_secs(1)), 0);
        // Pulled again: the clock restarts.
        body.frame().await.unwrap().unwrap();
        tokio::time::advance(Duration::from_millis(900)).await;
        assert_eq!(list.release_stalled(Duration::from_secs(1)), 0);
        tokio::time::advance(Duration::from_millis(200)).await;
        assert_eq!(list.release_stalled(Duration::from_secs(1)), 1);
        assert!(body.frame().await.unwrap().is_err());
        assert_eq!(list.release_stalled(Duration::from_secs(1)), 0);
    }

    #[test]
    fn finished_bodies_are_not_watched() {
        let list = Watchlist::new();
        let _ = list.guard(crate::body::empty());
        assert!(list.bodies.lock().unwrap().is_empty());
    }
}
