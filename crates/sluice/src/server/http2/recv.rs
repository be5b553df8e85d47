//! A request body as the connection receives it: DATA frames queued for the handler, and the
//! bytes the handler has read counted so the connection can give their window back.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Frame, SizeHint};

use crate::body::BoxError;

/// DATA payloads up to this size (every payload under the frame size this server announces,
/// HTTP/2's default 16 KiB) are copied into the body's own buffer, queued in chunks of at least
/// this size. A payload queued as it came would be a view of the codec's read buffer and keep
/// that whole buffer alive, so a client sending tiny or padded frames, or frames the server
/// reads and drops in between, could make the window's worth of body cost many times its size.
/// With the copy, what a stream holds is its unread bytes.
const CHUNK: usize = 16 * 1024;

/// What the connection and the body's reader share.
#[derive(Default)]
pub(super) struct Shared {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Payloads in order, then `tail`: short ones copied together.
    data: VecDeque<Bytes>,
    tail: BytesMut,
    trailers: Option<HeaderMap>,
    ended: bool,
    /// The client reset the stream, or the connection ended, before the body did.
    failed: Option<h2::Reason>,
    reader: Option<Waker>,
    /// Bytes read (or dropped unread) since the connection last took the count.
    consumed: usize,
    /// The reader is gone: what arrives from now on is released at once.
    dropped: bool,
    /// Bytes still to come by the request's `content-length`.
    remaining: Option<u64>,
    /// The client waits for a `100 Continue` before it sends the body: owed once the body is
    /// first read, and sent by the connection.
    expects_continue: bool,
    continue_owed: bool,
}

impl Shared {
    pub fn new(length: Option<u64>, expects_continue: bool) -> Arc<Shared> {
        let shared = Shared::default();
        {
            let mut s = shared.lock();
            s.remaining = length;
            s.expects_continue = expects_continue;
        }
        Arc::new(shared)
    }

    /// Whether a `100 Continue` is owed now (once per stream).
    pub fn take_continue(&self) -> bool {
        std::mem::take(&mut self.lock().continue_owed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A DATA frame's payload; `false` if the reader is gone (the caller gives its window back).
    pub fn push(&self, data: Bytes) -> bool {
        let mut s = self.lock();
        if s.dropped {
            return false;
        }
        if data.len() <= CHUNK {
            s.tail.extend_from_slice(&data);
            if s.tail.len() >= CHUNK {
                let full = s.tail.split().freeze();
                s.data.push_back(full);
            }
        } else {
            if !s.tail.is_empty() {
                let short = s.tail.split().freeze();
                s.data.push_back(short);
            }
            s.data.push_back(data);
        }
        if let Some(w) = s.reader.take() {
            drop(s);
            w.wake();
        }
        true
    }

    /// The body ended (END_STREAM), with trailers if it had any.
    pub fn end(&self, trailers: Option<HeaderMap>) {
        let mut s = self.lock();
        s.ended = true;
        s.trailers = trailers;
        if let Some(w) = s.reader.take() {
            drop(s);
            w.wake();
        }
    }

    /// The stream was reset or the connection closed before the body ended.
    pub fn fail(&self, reason: h2::Reason) {
        let mut s = self.lock();
        if s.ended {
            return;
        }
        s.failed = Some(reason);
        if let Some(w) = s.reader.take() {
            drop(s);
            w.wake();
        }
    }

    /// Bytes read since the last call, and whether the reader is gone.
    pub fn take_consumed(&self) -> (usize, bool) {
        let mut s = self.lock();
        (std::mem::take(&mut s.consumed), s.dropped)
    }
}

/// The handler's side: an `http_body::Body` that wakes the connection (through the stream's
/// waker) as it reads, so the window is given back.
pub(super) struct RecvBody {
    shared: Arc<Shared>,
    conn: Waker,
}

impl RecvBody {
    pub fn new(shared: Arc<Shared>, conn: Waker) -> RecvBody {
        RecvBody { shared, conn }
    }
}

impl http_body::Body for RecvBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let mut s = this.shared.lock();
        let next = match s.data.pop_front() {
            Some(data) => Some(data),
            None if !s.tail.is_empty() => Some(s.tail.split().freeze()),
            None => None,
        };
        if let Some(data) = next {
            s.consumed += data.len();
            if let Some(r) = s.remaining.as_mut() {
                *r = r.saturating_sub(data.len() as u64);
            }
            drop(s);
            this.conn.wake_by_ref();
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(trailers) = s.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        if s.ended {
            return Poll::Ready(None);
        }
        if let Some(reason) = s.failed {
            return Poll::Ready(Some(Err(format!("HTTP/2 stream ended: {reason}").into())));
        }
        if std::mem::take(&mut s.expects_continue) {
            // The handler wants the body: the client is told to send it.
            s.continue_owed = true;
            this.conn.wake_by_ref();
        }
        if !s.reader.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            s.reader = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        let s = self.shared.lock();
        s.ended && s.data.is_empty() && s.tail.is_empty() && s.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.shared.lock().remaining {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl Drop for RecvBody {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        s.dropped = true;
        let unread: usize = s.data.drain(..).map(|d| d.len()).sum::<usize>() + s.tail.len();
        s.tail = BytesMut::new();
        s.consumed += unread;
        drop(s);
        self.conn.wake_by_ref();
    }
}

/// The body of a request that ended with its head.
pub(super) struct NoBody;

impl http_body::Body for NoBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        true
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn frames_read_in_order_with_trailers_and_counted() {
        let shared = Shared::new(Some(5), false);
        let mut body = RecvBody::new(shared.clone(), futures_util::task::noop_waker());
        assert_eq!(http_body::Body::size_hint(&body).exact(), Some(5));
        assert!(shared.push(Bytes::from_static(b"ab")));
        assert!(shared.push(Bytes::from_static(b"cde")));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        shared.end(Some(trailers));
        // Short payloads come out copied together.
        let a = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&a[..], b"abcde");
        assert_eq!(shared.take_consumed(), (5, false));
        assert_eq!(http_body::Body::size_hint(&body).exact(), Some(0));
        let t = body
            .frame()
            .await
            .unwrap()
            .unwrap()
            .into_trailers()
            .unwrap();
        assert_eq!(t["grpc-status"], "0");
        assert!(body.frame().await.is_none());
        assert!(http_body::Body::is_end_stream(&body));
    }

    #[tokio::test]
    async fn payloads_are_copied_into_chunks_in_order() {
        let shared = Shared::new(None, false);
        let mut body = RecvBody::new(shared.clone(), futures_util::task::noop_waker());
        let mut sent = Vec::new();
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        // 20,000 one-byte payloads (read once on the way), then one larger than a frame of
        // this server's (kept as it came), then two short ones.
        for i in 0..20_000u32 {
            let b = Bytes::copy_from_slice(&[(i % 251) as u8]);
            sent.extend_from_slice(&b);
            assert!(shared.push(b));
            if i == 99 {
                let data = body.frame().await.unwrap().unwrap().into_data().unwrap();
                sizes.push(data.len());
                got.extend_from_slice(&data);
            }
        }
        let long = Bytes::from(vec![9u8; 20_000]);
        sent.extend_from_slice(&long);
        assert!(shared.push(long.clone()));
        for tail in [&b"xy"[..], b"z"] {
            sent.extend_from_slice(tail);
            assert!(shared.push(Bytes::copy_from_slice(tail)));
        }
        shared.end(None);
        // Queued: one chunk of 16 KiB, the rest of the short ones, the long one; then the
        // last two copied together.
        assert_eq!(shared.lock().data.len(), 3);
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            if data.len() == long.len() {
                assert_eq!(
                    data.as_ptr(),
                    long.as_ptr(),
                    "the long payload is not copied"
                );
            }
            sizes.push(data.len());
            got.extend_from_slice(&data);
        }
        assert_eq!(got, sent);
        assert_eq!(sizes, [100, CHUNK, 20_000 - 100 - CHUNK, 20_000, 3]);
        assert_eq!(shared.take_consumed(), (sent.len(), false));
        assert!(http_body::Body::is_end_stream(&body));
    }

    #[tokio::test]
    async fn a_dropped_reader_releases_the_queue_and_the_copies() {
        let shared = Shared::new(None, false);
        let body = RecvBody::new(shared.clone(), futures_util::task::noop_waker());
        assert!(shared.push(Bytes::from(vec![1u8; 20_000])));
        assert!(shared.push(Bytes::from_static(b"abc")));
        drop(body);
        assert_eq!(shared.take_consumed(), (20_003, true));
        assert!(shared.lock().data.is_empty() && shared.lock().tail.is_empty());
    }

    #[tokio::test]
    async fn a_reset_is_an_error_and_a_dropped_reader_releases_everything() {
        let shared = Shared::new(None, false);
        let mut body = RecvBody::new(shared.clone(), futures_util::task::noop_waker());
        shared.push(Bytes::from_static(b"xyz"));
        shared.fail(h2::Reason::CANCEL);
        assert!(body.frame().await.unwrap().is_ok());
        assert!(body.frame().await.unwrap().is_err());
        let shared = Shared::new(None, false);
        let body = RecvBody::new(shared.clone(), futures_util::task::noop_waker());
        shared.push(Bytes::from_static(b"1234"));
        drop(body);
        assert_eq!(shared.take_consumed(), (4, true));
        assert!(!shared.push(Bytes::from_static(b"56")));
        assert_eq!(shared.take_consumed(), (0, true));
    }
}
