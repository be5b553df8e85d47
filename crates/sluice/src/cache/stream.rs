//! The body of a cached response: the planned byte ranges, slice after slice, each from the memory
//! tier, the disk tier, or a fill (joined or started), sent through a small channel so the client's
//! pace is the only buffer. A client going away stops this task, never a fill.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http_body::Frame;
use sluice_http::range::{slice_range, slices_covering, ByteRange, Multipart};
use tokio::sync::mpsc;

use super::fill::{Event, FillEnd, FillReader};
use super::object::{ObjectMeta, SliceKey};
use super::serve::slice_request;
use super::writer::{FillJob, JobKind};
use super::{Inner, Origin};
use crate::body::{Body, BoxError};

/// What the body is made of.
pub(crate) struct Plan {
    parts: Vec<(Option<Bytes>, ByteRange)>,
    tail: Option<Bytes>,
    /// The length is not known yet: slices until the one marked last.
    until_end: bool,
}

impl Plan {
    pub fn whole(len: u64) -> Plan {
        let parts = if len == 0 {
            Vec::new()
        } else {
            vec![(
                None,
                ByteRange {
                    start: 0,
                    end: len - 1,
                },
            )]
        };
        Plan {
            parts,
            tail: None,
            until_end: false,
        }
    }

    pub fn ranges(ranges: Vec<ByteRange>, multipart: Option<Multipart>) -> Plan {
        match multipart {
            None => Plan {
                parts: ranges.into_iter().map(|r| (None, r)).collect(),
                tail: None,
                until_end: false,
            },
            Some(mp) => Plan {
                parts: ranges
                    .into_iter()
                    .map(|r| (Some(Bytes::from(mp.part_head(r))), r))
                    .collect(),
                tail: Some(Bytes::from(mp.tail())),
                until_end: false,
            },
        }
    }

    pub fn until_end() -> Plan {
        Plan {
            parts: Vec::new(),
            tail: None,
            until_end: true,
        }
    }
}

type Item = Result<Bytes, BoxError>;

/// The body straight from the memory tier when every slice it needs is there: no task, no
/// channel, the stored chunks handed to the connection as they are (the hit fast path).
pub(crate) fn from_memory(inner: &Inner, meta: &ObjectMeta, plan: &Plan) -> Option<Body> {
    if plan.until_end {
        return None;
    }
    let slice = inner.slice_bytes;
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut sent = 0u64;
    for (head, range) in &plan.parts {
        if let Some(h) = head {
            chunks.push(h.clone());
        }
        for i in slices_covering(*range, slice) {
            let key = SliceKey {
                object: meta.id,
                generation: meta.generation,
                index: i,
            };
            let s = inner.memory.get(&key)?;
            let sr = slice_range(i, slice, meta.length);
            let from = range.start.max(sr.start) - sr.start;
            let to = range.end.min(sr.end) - sr.start;
            for c in s.range(from, to) {
                sent += c.len() as u64;
                chunks.push(c);
            }
        }
    }
    if let Some(t) = &plan.tail {
        chunks.push(t.clone());
    }
    inner.metrics.bytes_memory.inc_by(sent);
    let frames = futures_util::stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok::<_, BoxError>(Frame::data(c))),
    );
    Some(crate::body::boxed(http_body_util::StreamBody::new(frames)))
}

/// Starts the producer and returns the body it feeds.
pub(crate) fn spawn(
    inner: Arc<Inner>,
    meta: Arc<ObjectMeta>,
    origin: Arc<dyn Origin>,
    parts: Parts,
    plan: Plan,
    first: Option<(u64, FillReader)>,
) -> Body {
    let (tx, rx) = mpsc::channel::<Item>(4);
    let mut p = Producer {
        inner,
        meta,
        origin,
        parts,
        tx,
        first,
    };
    tokio::spawn(async move {
        if let Err(StreamError::Failed(msg)) = p.run(plan).await {
            let _ = p.tx.send(Err(msg.into())).await;
        }
    });
    crate::body::boxed(ChannelBody { rx })
}

enum StreamError {
    /// The client went away.
    Gone,
    /// The bytes cannot be completed (origin failure after retries, or a version change).
    Failed(String),
}

struct Producer {
    inner: Arc<Inner>,
    meta: Arc<ObjectMeta>,
    origin: Arc<dyn Origin>,
    parts: Parts,
    tx: mpsc::Sender<Item>,
    first: Option<(u64, FillReader)>,
}

impl Producer {
    async fn run(&mut self, plan: Plan) -> Result<(), StreamError> {
        let slice = self.inner.slice_bytes;
        for (head, range) in plan.parts {
            if let Some(h) = head {
                self.send(h).await?;
            }
            let covering = slices_covering(range, slice);
            let last = *covering.end();
            for i in covering {
                if i < last {
                    self.prefetch(i + 1);
                }
                let sr = slice_range(i, slice, self.meta.length);
                let from = range.start.max(sr.start) - sr.start;
                let to = range.end.min(sr.end) - sr.start;
                self.copy_slice(i, from, to).await?;
            }
        }
        if plan.until_end {
            let mut i = 0;
            loop {
                let (len, last) = self.copy_slice(i, 0, u64::MAX).await?;
                if last || len < slice {
                    break;
                }
                i += 1;
            }
        }
        if let Some(t) = plan.tail {
            self.send(t).await?;
        }
        Ok(())
    }

    /// Starts the fill of the next slice while this one streams, so a long read costs one origin
    /// round trip, not one per slice. Only for origins that honour `Range` (a whole-object answer
    /// already feeds the following slices).
    fn prefetch(&self, i: u64) {
        if !self.meta.range_capable {
            return;
        }
        let key = SliceKey {
            object: self.meta.id,
            generation: self.meta.generation,
            index: i,
        };
        if self.inner.memory.get(&key).is_some()
            || self.inner.disk.as_ref().is_some_and(|d| d.contains(&key))
            || self
                .inner
                .inflight
                .lock()
                .expect("inflight")
                .contains_key(&key)
        {
            return;
        }
        self.inner.join_or_start(key, || FillJob {
            request: slice_request(&self.parts, i, self.inner.slice_bytes),
            origin: self.origin.clone(),
            kind: JobKind::Warm {
                meta: self.meta.clone(),
            },
        });
    }

    async fn send(&self, b: Bytes) -> Result<(), StreamError> {
        if b.is_empty() {
            return Ok(());
        }
        self.tx.send(Ok(b)).await.map_err(|_| StreamError::Gone)
    }

    /// Sends bytes `from..=to` of slice `i`; returns the slice's length and whether it is the
    /// object's last.
    async fn copy_slice(
        &mut self,
        i: u64,
        mut from: u64,
        to: u64,
    ) -> Result<(u64, bool), StreamError> {
        let key = SliceKey {
            object: self.meta.id,
            generation: self.meta.generation,
            index: i,
        };
        if let Some((idx, reader)) = self.first.take() {
            if idx == i {
                match self.follow(reader, from, to).await {
                    Ok(done) => return Ok(done),
                    Err(Follow::Retry(sent)) => from += sent,
                    Err(Follow::Gone) => return Err(StreamError::Gone),
                    Err(Follow::Fatal(m)) => return Err(StreamError::Failed(m)),
                }
            }
        }
        for _ in 0..3 {
            if let Some(s) = self.inner.memory.get(&key) {
                return self.send_stored(i, &s, from, to, true).await;
            }
            if let Some(disk) = &self.inner.disk {
                if let Some(s) = disk.read(key).await {
                    self.inner.memory.insert(key, s.clone());
                    return self.send_stored(i, &s, from, to, false).await;
                }
            }
            let (fill, _) = self.inner.join_or_start(key, || FillJob {
                request: slice_request(&self.parts, i, self.inner.slice_bytes),
                origin: self.origin.clone(),
                kind: JobKind::Warm {
                    meta: self.meta.clone(),
                },
            });
            match self.follow(fill.reader(), from, to).await {
                Ok(done) => return Ok(done),
                Err(Follow::Retry(sent)) => from += sent,
                Err(Follow::Gone) => return Err(StreamError::Gone),
                Err(Follow::Fatal(m)) => return Err(StreamError::Failed(m)),
            }
        }
        Err(StreamError::Failed("origin failed".into()))
    }

    async fn send_stored(
        &self,
        i: u64,
        s: &super::memory::Slice,
        from: u64,
        to: u64,
        memory: bool,
    ) -> Result<(u64, bool), StreamError> {
        for c in s.range(from, to) {
            let n = c.len() as u64;
            self.send(c).await?;
            if memory {
                self.inner.metrics.bytes_memory.inc_by(n);
            } else {
                self.inner.metrics.bytes_disk.inc_by(n);
            }
        }
        let slice = self.inner.slice_bytes;
        let length = self.meta.length.or_else(|| {
            self.inner
                .index
                .get(&self.meta.primary, self.meta.id)
                .and_then(|m| m.length)
        });
        let last = s.len < slice || length.is_some_and(|l| (i + 1) * slice >= l);
        Ok((s.len, last))
    }

    /// Streams a fill's chunks that fall within `from..=to`.
    async fn follow(
        &self,
        mut reader: FillReader,
        from: u64,
        to: u64,
    ) -> Result<(u64, bool), Follow> {
        let mut at = 0u64;
        loop {
            match reader.next().await {
                Event::Chunk(c) => {
                    let (start, end) = (at, at + c.len() as u64);
                    at = end;
                    if end <= from || start > to {
                        continue;
                    }
                    let lo = from.saturating_sub(start) as usize;
                    let hi = ((to.saturating_add(1)).min(end) - start) as usize;
                    if self.tx.send(Ok(c.slice(lo..hi))).await.is_err() {
                        return Err(Follow::Gone);
                    }
                }
                Event::End(FillEnd::Complete { last }) => return Ok((at, last)),
                Event::End(FillEnd::Failed(_)) => {
                    return Err(Follow::Retry(
                        at.min(to.saturating_add(1)).saturating_sub(from),
                    ))
                }
                Event::End(FillEnd::Mismatch) => {
                    return Err(Follow::Fatal("the object changed at the origin".into()))
                }
                Event::End(FillEnd::Pass { .. }) => {
                    return Err(Follow::Fatal("the object is no longer cacheable".into()))
                }
            }
        }
    }
}

enum Follow {
    /// The writer failed after this many of the requested bytes were sent.
    Retry(u64),
    Gone,
    Fatal(String),
}

/// A body fed by the producer task.
struct ChannelBody {
    rx: mpsc::Receiver<Item>,
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(b))) => Poll::Ready(Some(Ok(Frame::data(b)))),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
