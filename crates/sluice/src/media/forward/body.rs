//! Request bodies under deadlines: the client's body under an idle deadline and read ahead a
//! little (small bodies whole, within a total deadline), for `/proxy/forward` and the JSON
//! endpoints alike, and `/proxy/forward`'s bodies both ways streamed under a byte cap.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::time::{Instant, Sleep};

use crate::body::BoxError;

/// A body went past its cap.
#[derive(Debug, thiserror::Error)]
#[error("body larger than {0} bytes")]
pub struct TooLarge(pub u64);

/// The client sent no body byte for the idle deadline.
#[derive(Debug, thiserror::Error)]
#[error("no request body bytes for {0} s")]
pub struct Stalled(pub u64);

/// The body held whole did not arrive within the total deadline, though it never stalled.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive whole within {0} s")]
pub struct Late(pub u64);

/// What the relay learns of the client's body as it is read: whether it stalled, and whether its
/// last read was waiting for the client (rather than for the upstream to take what came).
#[derive(Debug, Default)]
pub struct Watch {
    stalled: AtomicBool,
    waiting: AtomicBool,
}

impl Watch {
    /// The idle deadline ended the body.
    pub fn stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }

    /// The body was last left waiting for the client's bytes: an upstream that timed out then
    /// was waiting for the client, not the other way round.
    pub fn waiting(&self) -> bool {
        self.waiting.load(Ordering::Relaxed)
    }
}

pin_project_lite::pin_project! {
    /// The client's request body, ended with [`Stalled`] once it has waited `timeout` for a
    /// frame: the connection's idle timeout does not run while a request is in flight, so
    /// without it a client that declares a length and goes silent holds the task, the connection
    /// and its `/proxy/*` place for ever.
    pub struct Idle<B> {
        #[pin]
        inner: B,
        timeout: Duration,
        // Armed at the first wait only, and moved on at the first wait after a frame.
        sleep: Option<Pin<Box<Sleep>>>,
        moved: bool,
        watch: Arc<Watch>,
    }
}

impl<B> Idle<B> {
    pub fn new(inner: B, timeout: Duration, watch: Arc<Watch>) -> Self {
        Idle {
            inner,
            timeout,
            sleep: None,
            moved: false,
            watch,
        }
    }
}

impl<B> Body for Idle<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if this.watch.stalled() {
            return Poll::Ready(None);
        }
        match this.inner.poll_frame(cx) {
            Poll::Pending => {
                this.watch.waiting.store(true, Ordering::Relaxed);
                let timeout = *this.timeout;
                if std::mem::take(this.moved) {
                    if let Some(sleep) = this.sleep.as_mut() {
                        sleep.as_mut().reset(Instant::now() + timeout);
                    }
                }
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.watch.stalled.store(true, Ordering::Relaxed);
                        Poll::Ready(Some(Err(Box::new(Stalled(timeout.as_secs())))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
            Poll::Ready(next) => {
                this.watch.waiting.store(false, Ordering::Relaxed);
                *this.moved = true;
                Poll::Ready(next.map(|r| r.map_err(Into::into)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What reading ahead found.
pub enum Held<B> {
    /// The whole body, no longer than the read-ahead window.
    Whole(Bytes),
    /// The first bytes, and the rest still to come.
    Partial(Bytes, B),
}

/// Reads `body` until it ends or more than `window` bytes have come, refusing more than `max`,
/// and ending with [`Late`] when that takes longer than `total`: an idle deadline alone restarts
/// at every frame, so a client declaring 65,000 bytes and sending one a minute held the task, the
/// connection and its place for some 44 days.
pub async fn read_ahead<B>(
    mut body: B,
    window: usize,
    max: u64,
    total: Duration,
) -> Result<Held<B>, BoxError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut head = BytesMut::new();
    let read = async {
        while head.len() <= window {
            match body.frame().await {
                None => return Ok(true),
                Some(frame) => {
                    if let Ok(data) = frame.map_err(Into::into)?.into_data() {
                        if head.len() as u64 + data.len() as u64 > max {
                            return Err::<_, BoxError>(Box::new(TooLarge(max)));
                        }
                        head.extend_from_slice(&data);
                    }
                }
            }
        }
        Ok(false)
    };
    match tokio::time::timeout(total, read).await {
        Err(_) => Err(Box::new(Late(total.as_secs()))),
        Ok(Err(e)) => Err(e),
        Ok(Ok(true)) => Ok(Held::Whole(head.freeze())),
        Ok(Ok(false)) => Ok(Held::Partial(head.freeze(), body)),
    }
}

pin_project_lite::pin_project! {
    /// `inner` after an optional first chunk, ending in [`TooLarge`] (and raising `over`) once more
    /// than `max` bytes have passed.
    pub struct Capped<B> {
        head: Option<Bytes>,
        #[pin]
        inner: B,
        seen: u64,
        max: u64,
        over: Arc<AtomicBool>,
    }
}

impl<B> Capped<B> {
    pub fn new(head: Option<Bytes>, inner: B, max: u64, over: Arc<AtomicBool>) -> Self {
        let seen = head.as_ref().map_or(0, |h| h.len() as u64);
        Capped {
            head: head.filter(|h| !h.is_empty()),
            inner,
            seen,
            max,
            over,
        }
    }
}

impl<B> Body for Capped<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if let Some(head) = this.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    *this.seen += data.len() as u64;
                    if *this.seen > *this.max {
                        this.over.store(true, Ordering::Relaxed);
                        return Poll::Ready(Some(Err(Box::new(TooLarge(*this.max)))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let head = self.head.as_ref().map_or(0, |h| h.len() as u64);
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + head);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + head);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt as _;
    use http_body_util::{Full, StreamBody};

    /// A total deadline no test here reaches.
    const LONG: Duration = Duration::from_secs(3600);

    fn chunks(parts: &[&'static [u8]]) -> impl Body<Data = Bytes, Error = BoxError> + Unpin {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    /// A body that sends `first`, then nothing for ever.
    fn silent_after(first: &'static [u8]) -> impl Body<Data = Bytes, Error = BoxError> + Unpin {
        let frames = futures_util::stream::iter([Ok(Frame::data(Bytes::from_static(first)))])
            .chain(futures_util::stream::pending());
        StreamBody::new(frames)
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_body_ends_at_the_idle_deadline() {
        let watch = Arc::new(Watch::default());
        let idle = Idle::new(silent_after(b"abc"), Duration::from_secs(5), watch.clone());
        let started = Instant::now();
        let err = match read_ahead(idle, 1024, 1 << 20, LONG).await {
            Err(e) => e,
            Ok(_) => panic!("a silent body cannot end"),
        };
        assert!(err.is::<Stalled>(), "{err}");
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert!(watch.stalled() && watch.waiting());
        // Frames coming slower than the whole deadline but faster than the idle one go through,
        // and a body that ends is no longer waiting.
        let trickle = futures_util::stream::iter(0..4u8).then(|i| async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            Ok::<_, BoxError>(Frame::data(Bytes::from(vec![i])))
        });
        let watch = Arc::new(Watch::default());
        let idle = Idle::new(
            StreamBody::new(Box::pin(trickle)),
            Duration::from_secs(5),
            watch.clone(),
        );
        let all = idle.collect().await.unwrap().to_bytes();
        assert_eq!(&all[..], &[0, 1, 2, 3]);
        assert!(!watch.stalled() && !watch.waiting());
    }

    /// One byte every 4 s never trips a 5 s idle deadline: only the total one ends the read-ahead,
    /// at exactly its time and as [`Late`], not a stall.
    #[tokio::test(start_paused = true)]
    async fn a_trickling_body_ends_at_the_total_deadline() {
        let trickle = futures_util::stream::iter(0..u8::MAX).then(|i| async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            Ok::<_, BoxError>(Frame::data(Bytes::from(vec![i])))
        });
        let watch = Arc::new(Watch::default());
        let idle = Idle::new(
            StreamBody::new(Box::pin(trickle)),
            Duration::from_secs(5),
            watch.clone(),
        );
        let started = Instant::now();
        let err = match read_ahead(idle, 65_000, 1 << 20, Duration::from_secs(30)).await {
            Err(e) => e,
            Ok(_) => panic!("a trickle of 255 bytes in 1,020 s cannot end within 30 s"),
        };
        assert!(err.is::<Late>(), "{err}");
        assert_eq!(
            err.to_string(),
            "the request body did not arrive whole within 30 s"
        );
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        assert!(!watch.stalled());
        // A body that ends within the deadline is whole, however slowly it came.
        let slow = futures_util::stream::iter(0..3u8).then(|i| async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            Ok::<_, BoxError>(Frame::data(Bytes::from(vec![i])))
        });
        match read_ahead(
            StreamBody::new(Box::pin(slow)),
            1024,
            100,
            Duration::from_secs(13),
        )
        .await
        .unwrap()
        {
            Held::Whole(b) => assert_eq!(&b[..], &[0, 1, 2]),
            Held::Partial(..) => panic!("whole"),
        }
    }

    #[tokio::test]
    async fn small_bodies_are_whole_large_ones_stream_under_the_cap() {
        match read_ahead(chunks(&[b"ab", b"cd"]), 8, 100, LONG)
            .await
            .unwrap()
        {
            Held::Whole(b) => assert_eq!(&b[..], b"abcd"),
            Held::Partial(..) => panic!("whole"),
        }
        let held = read_ahead(chunks(&[b"abcdef", b"ghij", b"klmn"]), 8, 100, LONG)
            .await
            .unwrap();
        let Held::Partial(head, rest) = held else {
            panic!("partial")
        };
        assert_eq!(&head[..], b"abcdefghij");
        let over = Arc::new(AtomicBool::new(false));
        let all = Capped::new(Some(head.clone()), rest, 100, over.clone())
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(&all[..], b"abcdefghijklmn");
        assert!(!over.load(Ordering::Relaxed));
        // Past the cap: an error and the flag.
        let capped = Capped::new(None, chunks(&[b"abcdef", b"ghij"]), 8, over.clone());
        assert!(capped.collect().await.is_err());
        assert!(over.load(Ordering::Relaxed));
        // The read-ahead itself refuses more than the cap.
        assert!(read_ahead(chunks(&[b"abcdef", b"ghij"]), 100, 8, LONG)
            .await
            .is_err());
        // A known length stays known.
        let full = Capped::new(
            Some(Bytes::from_static(b"xy")),
            Full::new(Bytes::from_static(b"abc")),
            100,
            over,
        );
        assert_eq!(full.size_hint().exact(), Some(5));
    }
}
