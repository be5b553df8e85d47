//! The upstream response body: frames pass straight through, with an idle-read deadline (reset by
//! every frame) and a byte counter; a body collected whole also has a total deadline.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::atomic::Counter;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

/// Why an upstream body ended early.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamBodyError {
    #[error("upstream {host} sent nothing for {secs} s")]
    Idle { host: String, secs: u64 },
    #[error("upstream {host} did not finish the body within {secs} s")]
    Deadline { host: String, secs: u64 },
    #[error("upstream {host} body failed: {source}")]
    Read { host: String, source: hyper::Error },
}

pin_project_lite::pin_project! {
    /// An upstream body with an idle-read deadline.
    pub struct UpstreamBody {
        #[pin]
        inner: Incoming,
        #[pin]
        idle: Sleep,
        timeout: Duration,
        // The total deadline of `collect_limited`; a streamed body has none.
        whole: Duration,
        host: String,
        bytes: Counter,
    }
}

impl UpstreamBody {
    pub(crate) fn new(inner: Incoming, timeout: Duration, host: String, bytes: Counter) -> Self {
        UpstreamBody {
            inner,
            idle: tokio::time::sleep(timeout),
            timeout,
            whole: Duration::MAX,
            host,
            bytes,
        }
    }

    /// The total deadline [`UpstreamBody::collect_limited`] keeps (none until set).
    pub(crate) fn whole_deadline(mut self, whole: Duration) -> Self {
        self.whole = whole;
        self
    }

    /// Collects the whole body, refusing more than `limit` bytes (manifests, keys, init segments)
    /// or taking longer than `upstream.whole_body_timeout_secs`: the idle deadline alone lets a
    /// byte every minute hold the request, and what was collected so far, for good.
    pub async fn collect_limited(self, limit: usize) -> Result<Bytes, CollectError> {
        let grow = |_| Ok::<(), std::convert::Infallible>(());
        match self.collect_limited_with(limit, grow).await {
            Ok(collected) => collected,
            Err(never) => match never {},
        }
    }

    /// [`UpstreamBody::collect_limited`], telling `grow` each capacity the buffer is about to take
    /// (at most `limit`; the last one is what the returned bytes hold) before it is allocated, so
    /// a caller can charge the buffer, spare room included. An `Err` from `grow` stops the collect
    /// and is the outer `Err`.
    pub async fn collect_limited_with<E>(
        self,
        limit: usize,
        mut grow: impl FnMut(usize) -> Result<(), E>,
    ) -> Result<Result<Bytes, CollectError>, E> {
        use http_body_util::BodyExt;
        let (whole, host) = (self.whole, self.host.clone());
        let collect = async {
            let mut body = std::pin::pin!(self);
            let mut out = Vec::new();
            while let Some(frame) = body.frame().await {
                let data = match frame {
                    Ok(frame) => match frame.into_data() {
                        Ok(data) => data,
                        Err(_) => continue,
                    },
                    Err(e) => return Ok(Err(e.into())),
                };
                let need = out.len() + data.len();
                if need > limit {
                    return Ok(Err(CollectError::TooLarge { limit }));
                }
                if need > out.capacity() {
                    // Doubling keeps the copies few; exact, so the capacity told is the one held.
                    let cap = need.max(out.capacity().saturating_mul(2)).min(limit);
                    grow(cap)?;
                    out.reserve_exact(cap - out.len());
                }
                out.extend_from_slice(&data);
            }
            // A `Vec` with spare room becomes `Bytes` without a copy, keeping its whole buffer.
            Ok(Ok(Bytes::from(out)))
        };
        match tokio::time::timeout(whole, collect).await {
            Ok(collected) => collected,
            Err(_) => {
                let secs = whole.as_secs();
                Ok(Err(UpstreamBodyError::Deadline { host, secs }.into()))
            }
        }
    }
}

/// Why a body could not be collected.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error(transparent)]
    Body(#[from] UpstreamBodyError),
    #[error("upstream body larger than {limit} bytes")]
    TooLarge { limit: usize },
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = UpstreamBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamBodyError>>> {
        let mut this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.bytes.inc_by(data.len() as u64);
                }
                this.idle.as_mut().reset(Instant::now() + *this.timeout);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(source))) => Poll::Ready(Some(Err(UpstreamBodyError::Read {
                host: this.host.clone(),
                source,
            }))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match std::future::Future::poll(this.idle, cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(UpstreamBodyError::Idle {
                    host: this.host.clone(),
                    secs: this.timeout.as_secs(),
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
