//! The body of a cached response: the planned byte ranges, slice after slice, each from the memory
//! tier, the disk tier, or a fill (joined or started). A single range is read by the connection's
//! own task (`Inline`): no task or channel per client, and a client joining a fill gets its head
//! and the first bytes in one write. Whatever needs a disk read (or several ranges, or an object of
//! unknown length) goes through a producer task and a small channel, so the client's pace is the
//! only buffer. A client going away stops its body, never a fill. `Inline` takes turns with the
//! other connections (`turn.rs`): every client following a fill gets its head and first bytes out
//! before any writes bulk.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Response, StatusCode};
use http_body::Frame;
use sluice_http::cache_control::parse_cache_control;
use sluice_http::freshness::{FreshnessPolicy, RequestDirectives};
use sluice_http::range::{slice_range, slices_covering, ByteRange, Multipart};
use tokio::sync::mpsc;

use super::fill::{Event, FillEnd, FillReader};
use super::object::{ObjectMeta, SliceKey};
use super::serve::{clone_parts, shared_slice_request, FILL_ATTEMPTS};
use super::shm::{FileBody, Piece};
use super::turn::{Turn, FIRST_BYTES};
use super::writer::{self, FillJob, JobKind};
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

    /// The one range of a plan without part heads, when that is what it is.
    pub fn single(&self) -> Option<ByteRange> {
        match (&self.parts[..], &self.tail, self.until_end) {
            ([(None, r)], None, false) => Some(*r),
            _ => None,
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

/// The most slices a body from [`from_memory`] may cover. That body holds a view of every slice
/// it will send from the start (and its `FileBody` the slices' shared-memory files), for as long
/// as its client takes to read it: the tier may evict them meanwhile, and then they are held
/// outside `memory_bytes`, uncounted. A slow reader of a 500-slice object held 500 slices after
/// the tier had let them go, and N such readers N times that, whatever the budget. Past this
/// bound a hit goes by the streaming path ([`inline`], [`spawn`]), which holds the slice it
/// sends and at most the next one. Eight keeps every hit of the suite's cached cells on the fast
/// path: 7 MB is seven slices of 1 MiB, and a range of it that starts mid-slice eight. Bigger
/// slices take fewer ([`memory_path_slices`]).
pub(crate) const MEMORY_PATH_SLICES: u64 = 8;

/// What a fast-path body may hold at most, in bytes, past the two slices the streaming path
/// holds anyway: 8 slices of 1 MiB, but 2 of 64 MiB (not 512 MiB).
const MEMORY_PATH_BYTES: u64 = 8 << 20;

/// The most slices a fast-path body covers at `slice` bytes a slice: [`MEMORY_PATH_SLICES`], and
/// no more than [`MEMORY_PATH_BYTES`] hold unless that is under the streaming path's two.
pub(crate) fn memory_path_slices(slice: u64) -> u64 {
    MEMORY_PATH_SLICES.min((MEMORY_PATH_BYTES / slice.max(1)).max(2))
}

/// The body straight from the memory tier when every slice it needs is there and they are at
/// most [`memory_path_slices`]: no task, no channel, the stored chunks handed to the connection
/// as they are (the hit fast path). Beside it, with `cache.sendfile`, the same bytes as pieces for
/// `sendfile` when some of the slices are file-backed (`shm.rs`).
pub(crate) fn from_memory(
    inner: &Inner,
    meta: &ObjectMeta,
    plan: &Plan,
) -> Option<(Body, Option<FileBody>)> {
    if plan.until_end {
        return None;
    }
    let slice = inner.slice_bytes;
    let bound = memory_path_slices(slice);
    let mut covered = 0u64;
    for (_, range) in &plan.parts {
        let slices = slices_covering(*range, slice);
        covered = covered.saturating_add(slices.end() - slices.start() + 1);
        if covered > bound {
            return None;
        }
    }
    let mut chunks: Vec<Bytes> = Vec::new();
    // Only built when slices can be file-backed at all.
    let mut pieces: Option<Vec<Piece>> = inner.config.sendfile.then(Vec::new);
    let mut piece = |p: Piece| {
        if let Some(v) = pieces.as_mut() {
            v.push(p);
        }
    };
    let mut sent = 0u64;
    for (head, range) in &plan.parts {
        if let Some(h) = head {
            chunks.push(h.clone());
            piece(Piece::Bytes(h.clone()));
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
            let mut len = 0;
            for c in s.range(from, to) {
                len += c.len() as u64;
                if s.file.is_none() {
                    piece(Piece::Bytes(c.clone()));
                }
                chunks.push(c);
            }
            if let Some(b) = &s.file {
                piece(Piece::File {
                    file: b.file().clone(),
                    offset: from,
                    len,
                });
            }
            sent += len;
        }
    }
    if let Some(t) = &plan.tail {
        chunks.push(t.clone());
        piece(Piece::Bytes(t.clone()));
    }
    inner.metrics.bytes_memory.inc_by(sent);
    let frames = futures_util::stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok::<_, BoxError>(Frame::data(c))),
    );
    let body = crate::body::boxed(http_body_util::StreamBody::new(frames));
    let files = pieces
        .map(|pieces| FileBody { pieces })
        .filter(FileBody::has_files);
    Some((body, files))
}

/// How far into a slice (1 / `AHEAD_AT` of it) a body reading on starts the next one.
const AHEAD_AT: u64 = 2;

/// Starts the fill of slice `i` while the one before it streams, so a long read costs one origin
/// round trip, not one per slice. Only for origins that honour `Range` (a whole-object answer
/// already feeds the following slices).
fn prefetch(
    inner: &Arc<Inner>,
    meta: &Arc<ObjectMeta>,
    origin: &Arc<dyn Origin>,
    parts: &Parts,
    policy: &FreshnessPolicy,
    i: u64,
) {
    if !meta.range_capable || meta.length.is_some_and(|l| i * inner.slice_bytes >= l) {
        return;
    }
    let key = SliceKey {
        object: meta.id,
        generation: meta.generation,
        index: i,
    };
    if inner.memory.get(&key).is_some()
        || inner.disk.as_ref().is_some_and(|d| d.contains(&key))
        || inner.inflight.lock().expect("inflight").contains_key(&key)
    {
        return;
    }
    inner.join_or_start(key, || warm_job(inner, meta, origin, parts, policy, i));
}

/// The fill job for slice `i` of the stored object `meta`, which a reader of it found missing:
/// asked for the shared object (`serve::shared_slice_request`), the answer judged as one to
/// what was sent (`writer.rs`).
fn warm_job(
    inner: &Inner,
    meta: &Arc<ObjectMeta>,
    origin: &Arc<dyn Origin>,
    parts: &Parts,
    policy: &FreshnessPolicy,
    i: u64,
) -> FillJob {
    FillJob {
        request: shared_slice_request(parts, &meta.vary, policy, i, inner.slice_bytes),
        origin: origin.clone(),
        kind: JobKind::Warm {
            meta: meta.clone(),
            policy: policy.clone(),
        },
    }
}

/// Where the body of an answer a reader took for itself alone (`Fill::take_pass`) starts in the
/// object: a 206 is the slice asked for (the writer checked its `Content-Range`), anything else
/// the whole object.
fn own_start(resp: &Response<Body>, index: u64, slice: u64) -> u64 {
    if resp.status() == StatusCode::PARTIAL_CONTENT {
        index * slice
    } else {
        0
    }
}

/// Whether the origin may answer this request's slices for it alone (`writer.rs` judges a
/// slice's answer by the fields it was asked with): it carries `Authorization`, or a
/// `Cache-Control: no-store` the policy honours. A slice fetched ahead for such a request, by
/// nobody in particular, is an answer nobody takes: the reader asks again with its own fill.
fn answers_may_pass(parts: &Parts, policy: &FreshnessPolicy) -> bool {
    parts.headers.contains_key(http::header::AUTHORIZATION)
        || (policy.request_directives == RequestDirectives::Honor
            && parse_cache_control(&parts.headers).no_store)
}

/// The chunks a producer queues ahead of its client. A stored slice is one chunk (the whole
/// slice, `Slice::compacted`), so this many could be as many whole slices: before it takes a
/// stored slice, a producer waits until its client holds at most one chunk unread
/// ([`Producer::room_for_a_slice`]).
const QUEUED: usize = 4;

/// Starts the producer and returns the body it feeds.
pub(crate) fn spawn(
    inner: Arc<Inner>,
    meta: Arc<ObjectMeta>,
    origin: Arc<dyn Origin>,
    parts: Parts,
    policy: FreshnessPolicy,
    plan: Plan,
    first: Option<(u64, FillReader)>,
) -> Body {
    let (tx, rx) = mpsc::channel::<Item>(QUEUED);
    let wary = answers_may_pass(&parts, &policy);
    let mut p = Producer {
        inner,
        meta,
        origin,
        parts,
        policy,
        tx,
        first,
        passed: false,
        wary,
        shared: false,
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
    policy: FreshnessPolicy,
    tx: mpsc::Sender<Item>,
    first: Option<(u64, FillReader)>,
    /// The origin answered this body's own request with what may not be stored: no read-ahead
    /// (a slice fetched ahead would be answered the same, for nobody, and fetched again).
    passed: bool,
    /// The request's answers may pass ([`answers_may_pass`]): no read-ahead until `shared`.
    wary: bool,
    /// A fill this body started was stored: its request's answers are shared ones.
    shared: bool,
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
                if i < last && !self.passed && (!self.wary || self.shared) {
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

    fn prefetch(&self, i: u64) {
        prefetch(
            &self.inner,
            &self.meta,
            &self.origin,
            &self.parts,
            &self.policy,
            i,
        );
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
                match self.follow(reader, i, from, to, false).await {
                    Ok(done) => return Ok(done),
                    Err(Follow::Retry(sent)) => from += sent,
                    Err(Follow::Gone) => return Err(StreamError::Gone),
                    Err(Follow::Fatal(m)) => return Err(StreamError::Failed(m)),
                }
            }
        }
        for _ in 0..3 {
            self.room_for_a_slice().await?;
            if let Some(s) = self.inner.memory.get(&key) {
                return self.send_stored(i, &s, from, to, true).await;
            }
            if let Some(disk) = &self.inner.disk {
                if let Some(s) = disk.read(key).await {
                    self.inner.memory.insert(key, s.clone());
                    return self.send_stored(i, &s, from, to, false).await;
                }
            }
            let (fill, created) = self.inner.join_or_start(key, || {
                warm_job(
                    &self.inner,
                    &self.meta,
                    &self.origin,
                    &self.parts,
                    &self.policy,
                    i,
                )
            });
            match self.follow(fill.reader(), i, from, to, created).await {
                Ok(done) => return Ok(done),
                Err(Follow::Retry(sent)) => from += sent,
                Err(Follow::Gone) => return Err(StreamError::Gone),
                Err(Follow::Fatal(m)) => return Err(StreamError::Failed(m)),
            }
        }
        Err(StreamError::Failed("origin failed".into()))
    }

    /// Waits until the client has taken all but one of the chunks queued for it. A stored
    /// slice (from the memory tier, or read from disk) is then held by this body only while
    /// the one before it is sent: without the wait the queue held four whole slices and the
    /// producer a fifth, outside `memory_bytes` once the tier had evicted them, for as long as
    /// the client did not read.
    async fn room_for_a_slice(&self) -> Result<(), StreamError> {
        match self.tx.reserve_many(QUEUED - 1).await {
            Ok(_permits) => Ok(()),
            Err(_) => Err(StreamError::Gone),
        }
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

    /// Streams a fill's chunks of slice `i` that fall within `from..=to`; `mine` when this
    /// body started the fill.
    async fn follow(
        &mut self,
        mut reader: FillReader,
        i: u64,
        from: u64,
        to: u64,
        mine: bool,
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
                Event::End(FillEnd::Complete { last }) => {
                    self.shared |= mine;
                    return Ok((at, last));
                }
                Event::End(FillEnd::Failed(_) | FillEnd::Local) => {
                    return Err(Follow::Retry(
                        at.min(to.saturating_add(1)).saturating_sub(from),
                    ))
                }
                Event::End(FillEnd::Mismatch) => {
                    return Err(Follow::Fatal("the object changed at the origin".into()))
                }
                Event::End(FillEnd::Pass { .. }) => {
                    // An answer for the fields this body's request carried, not for the
                    // object (`writer.rs`): taken by the body that asked, and by no other,
                    // which asks with its own request.
                    return match mine.then(|| reader.fill().take_pass()).flatten() {
                        Some(resp) => {
                            self.passed = true;
                            self.own(resp, i, from, to).await
                        }
                        None => Err(Follow::Retry(0)),
                    };
                }
            }
        }
    }

    /// Sends the bytes of slice `i` within `from..=to` from an answer this body took for itself
    /// alone: never stored, never shared.
    async fn own(
        &self,
        resp: Response<Body>,
        i: u64,
        from: u64,
        to: u64,
    ) -> Result<(u64, bool), Follow> {
        let slice = self.inner.slice_bytes;
        let start = i * slice;
        let mut at = own_start(&resp, i, slice);
        let mut body = resp.into_body();
        let mut sent = 0u64;
        // A whole answer goes on past the slice: the rest is not read.
        while at < start + slice {
            let frame = match writer::next_frame(&self.inner, &mut body).await {
                None => break,
                Some(Ok(f)) => f,
                Some(Err(_)) => return Err(Follow::Retry(sent)),
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let (a, b) = (at, at + data.len() as u64);
            at = b;
            self.inner.metrics.bytes_origin.inc_by(data.len() as u64);
            let lo = (start + from).max(a);
            let hi = start
                .saturating_add(to)
                .saturating_add(1)
                .min(start + slice)
                .min(b);
            if lo < hi {
                let part = data.slice((lo - a) as usize..(hi - a) as usize);
                if self.tx.send(Ok(part)).await.is_err() {
                    return Err(Follow::Gone);
                }
                sent += hi - lo;
            }
        }
        // An answer that ended short of the bytes wanted (a chunked 206 cut early, a 200 shorter
        // than the stored length) is not the slice's end: taken as one, the plan went on with
        // slice `i + 1` right after it, bytes at the wrong offsets under a 206 head. Asked
        // again from what was sent. Without a known length, the end of the answer is the
        // object's.
        if let Some(length) = self.meta.length {
            let wanted = start
                .saturating_add(to)
                .saturating_add(1)
                .min(start + slice)
                .min(length);
            if at < wanted {
                return Err(Follow::Retry(sent));
            }
        }
        let len = at.saturating_sub(start).min(slice);
        let last = len < slice || self.meta.length.is_some_and(|l| (i + 1) * slice >= l);
        Ok((len, last))
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

/// Starts the body of one range (`first`: the reader of the fill this request joined or started
/// for the slice holding the range's first byte).
pub(crate) fn inline(
    inner: Arc<Inner>,
    meta: Arc<ObjectMeta>,
    origin: Arc<dyn Origin>,
    parts: Parts,
    policy: FreshnessPolicy,
    range: ByteRange,
    first: Option<(u64, FillReader)>,
) -> Body {
    let slice = inner.slice_bytes;
    let index = range.start / slice;
    let mut body = Inline {
        inner,
        meta,
        origin,
        parts,
        policy,
        next: range.start,
        end: range.end,
        index: None,
        attempts: 0,
        source: Source::Pick,
        turn: Turn::new(),
        carry: None,
        ahead: None,
        own: false,
    };
    if let Some((i, reader)) = first {
        if i == index {
            body.enter(index);
            body.source = Source::Follow {
                reader,
                at: 0,
                mine: false,
            };
        }
    }
    crate::body::boxed(body)
}

/// A single range read by the connection's task (see the module head).
struct Inline {
    inner: Arc<Inner>,
    meta: Arc<ObjectMeta>,
    origin: Arc<dyn Origin>,
    parts: Parts,
    policy: FreshnessPolicy,
    /// The next byte to send and the last one (absolute offsets).
    next: u64,
    end: u64,
    /// The slice being sent.
    index: Option<u64>,
    /// Writers of that slice that failed under this body.
    attempts: usize,
    source: Source,
    /// Its share of the connection's turns (`turn.rs`).
    turn: Turn,
    /// The rest of a frame cut at `FIRST_BYTES`, sent next.
    carry: Option<Bytes>,
    /// The read-ahead still to start: slice `.1` once `next` reaches `.0`.
    ahead: Option<(u64, u64)>,
    /// The origin answered this body's own request with what may not be stored: no read-ahead
    /// (a slice fetched ahead would be answered the same, for nobody).
    own: bool,
}

enum Source {
    /// Find the slice holding `next`.
    Pick,
    /// A stored slice's chunks still to send.
    Stored(std::vec::IntoIter<Bytes>),
    /// A fill of the slice; `at` is the slice offset of the next chunk it gives; `mine` when
    /// this body started it.
    Follow {
        reader: FillReader,
        at: u64,
        mine: bool,
    },
    /// An answer taken for this body alone (`Fill::take_pass`); `at` is the object offset of
    /// the next byte it gives.
    Own {
        body: Body,
        at: u64,
    },
    /// A producer task sends the rest (a slice on disk).
    Channel(Body),
    Done,
}

impl Inline {
    fn slice_key(&self, index: u64) -> SliceKey {
        SliceKey {
            object: self.meta.id,
            generation: self.meta.generation,
            index,
        }
    }

    /// Starts sending slice `index`: its successor is fetched meanwhile when the range goes on,
    /// from the middle of this one (`AHEAD_AT`) rather than from its start, so a burst of
    /// clients on a cold object asks the origin for one slice at first, not two, while a long
    /// read still finds the next slice under way when it gets there.
    fn enter(&mut self, index: u64) {
        if self.index == Some(index) {
            return;
        }
        self.index = Some(index);
        self.attempts = 0;
        let slice = self.inner.slice_bytes;
        self.ahead = (self.end >= (index + 1) * slice)
            .then(|| (index * slice + slice / AHEAD_AT, index + 1));
        self.read_ahead();
    }

    /// Starts the read-ahead once the body has reached its mark.
    fn read_ahead(&mut self) {
        if self.own {
            return;
        }
        if let Some((at, i)) = self.ahead {
            if self.next >= at {
                self.ahead = None;
                prefetch(
                    &self.inner,
                    &self.meta,
                    &self.origin,
                    &self.parts,
                    &self.policy,
                    i,
                );
            }
        }
    }

    /// Offsets `from..=to` inside slice `index` that the range still needs.
    fn wanted(&self, index: u64) -> (u64, u64) {
        let start = index * self.inner.slice_bytes;
        let last = start + self.inner.slice_bytes - 1;
        (self.next - start, self.end.min(last) - start)
    }

    /// Chooses where the slice holding `next` comes from.
    fn pick(&mut self) -> Result<(), BoxError> {
        let index = self.next / self.inner.slice_bytes;
        self.enter(index);
        let key = self.slice_key(index);
        let (from, to) = self.wanted(index);
        if let Some(s) = self.inner.memory.get(&key) {
            if s.len <= to {
                return Err("a stored slice is shorter than the object".into());
            }
            self.source = Source::Stored(s.range(from, to).into_iter());
            return Ok(());
        }
        if self.inner.disk.as_ref().is_some_and(|d| d.contains(&key)) {
            // A disk read is awaited: the rest of the range goes through a producer task.
            let rest = ByteRange {
                start: self.next,
                end: self.end,
            };
            self.source = Source::Channel(spawn(
                self.inner.clone(),
                self.meta.clone(),
                self.origin.clone(),
                clone_parts(&self.parts),
                self.policy.clone(),
                Plan::ranges(vec![rest], None),
                None,
            ));
            return Ok(());
        }
        if self.attempts >= FILL_ATTEMPTS {
            return Err("origin failed".into());
        }
        let (fill, created) = self.inner.join_or_start(key, || {
            warm_job(
                &self.inner,
                &self.meta,
                &self.origin,
                &self.parts,
                &self.policy,
                index,
            )
        });
        self.source = Source::Follow {
            reader: fill.reader(),
            at: 0,
            mine: created,
        };
        Ok(())
    }

    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        loop {
            if self.next > self.end && !matches!(self.source, Source::Channel(_)) {
                self.source = Source::Done;
            }
            let index = self.index.unwrap_or(self.next / self.inner.slice_bytes);
            let (from, to) = match self.source {
                Source::Follow { .. } => self.wanted(index),
                _ => (0, 0),
            };
            match &mut self.source {
                Source::Done => return Poll::Ready(None),
                Source::Channel(body) => {
                    return match http_body::Body::poll_frame(Pin::new(body), cx) {
                        Poll::Ready(Some(Ok(f))) => match f.into_data() {
                            Ok(b) => Poll::Ready(Some(Ok(b))),
                            Err(_) => continue,
                        },
                        Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                        Poll::Ready(None) => Poll::Ready(None),
                        Poll::Pending => Poll::Pending,
                    }
                }
                Source::Pick => {
                    if let Err(e) = self.pick() {
                        self.source = Source::Done;
                        return Poll::Ready(Some(Err(e)));
                    }
                }
                Source::Own { body, at } => {
                    match ready!(http_body::Body::poll_frame(Pin::new(body), cx)) {
                        Some(Ok(frame)) => {
                            let Ok(data) = frame.into_data() else {
                                continue;
                            };
                            let (start, end) = (*at, *at + data.len() as u64);
                            *at = end;
                            self.inner.metrics.bytes_origin.inc_by(data.len() as u64);
                            if end <= self.next {
                                continue;
                            }
                            if start > self.end {
                                self.source = Source::Done;
                                continue;
                            }
                            let lo = (self.next - start) as usize;
                            let hi = ((self.end + 1).min(end) - start) as usize;
                            self.next += (hi - lo) as u64;
                            return Poll::Ready(Some(Ok(data.slice(lo..hi))));
                        }
                        Some(Err(e)) => {
                            self.source = Source::Done;
                            return Poll::Ready(Some(Err(e)));
                        }
                        // Short of the range: the slice reached is picked again (a whole answer
                        // may have carried this body past the slice it asked for).
                        None => self.source = Source::Pick,
                    }
                }
                Source::Stored(chunks) => match chunks.next() {
                    Some(c) => {
                        self.next += c.len() as u64;
                        self.inner.metrics.bytes_memory.inc_by(c.len() as u64);
                        return Poll::Ready(Some(Ok(c)));
                    }
                    None => self.source = Source::Pick,
                },
                Source::Follow { reader, at, mine } => {
                    match ready!(reader.poll_next(cx)) {
                        Event::Chunk(c) => {
                            let (start, end) = (*at, *at + c.len() as u64);
                            *at = end;
                            if end <= from || start > to {
                                continue;
                            }
                            let lo = (from - start) as usize;
                            let hi = ((to + 1).min(end) - start) as usize;
                            self.next += (hi - lo) as u64;
                            return Poll::Ready(Some(Ok(c.slice(lo..hi))));
                        }
                        Event::End(FillEnd::Complete { .. }) => {
                            if self.next <= index * self.inner.slice_bytes + to {
                                // The slice ended before the bytes this range needs from it.
                                self.source = Source::Done;
                                return Poll::Ready(Some(Err(
                                    "the origin's slice is shorter than the object".into(),
                                )));
                            }
                            self.source = Source::Pick;
                        }
                        Event::End(FillEnd::Failed(_) | FillEnd::Local) => {
                            // Elect a new writer; it carries on from the byte reached.
                            self.attempts += 1;
                            self.source = Source::Pick;
                        }
                        Event::End(FillEnd::Mismatch) => {
                            self.source = Source::Done;
                            return Poll::Ready(Some(Err(
                                "the object changed at the origin".into()
                            )));
                        }
                        Event::End(FillEnd::Pass { .. }) => {
                            // An answer for the fields this body's request carried, not for the
                            // object (`writer.rs`): taken by the body that asked, and by no
                            // other, which asks with its own request.
                            self.attempts += 1;
                            let own = mine.then(|| reader.fill().take_pass()).flatten();
                            self.source = match own {
                                Some(resp) => {
                                    self.own = true;
                                    self.ahead = None;
                                    let slice = self.inner.slice_bytes;
                                    Source::Own {
                                        at: own_start(&resp, index, slice),
                                        body: resp.into_body(),
                                    }
                                }
                                None => Source::Pick,
                            };
                        }
                    }
                }
            }
        }
    }
}

impl http_body::Body for Inline {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.turn.hold(cx) {
            return Poll::Pending;
        }
        let mut polled = match self.carry.take() {
            Some(rest) => Poll::Ready(Some(Ok(rest))),
            None => self.poll_data(cx),
        };
        self.read_ahead();
        match &mut polled {
            Poll::Ready(Some(Ok(b))) => {
                if self.turn.first() && b.len() > FIRST_BYTES {
                    self.carry = Some(b.split_off(FIRST_BYTES));
                }
                self.turn.sent(b.len());
            }
            Poll::Pending => self.turn.waiting(),
            Poll::Ready(_) => {}
        }
        polled.map(|o| o.map(|r| r.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.carry.is_none()
            && (matches!(self.source, Source::Done)
                || (self.next > self.end && !matches!(self.source, Source::Channel(_))))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use http::{Request, Response, StatusCode};
    use http_body_util::BodyExt;

    use super::*;
    use crate::cache::index::Lookup;
    use crate::cache::{Cache, CacheConfig, CacheKey, OriginFuture};

    const MIB: u64 = 1024 * 1024;
    const OBJECT: u64 = 2 * MIB;

    /// The byte at `offset` of the test object.
    fn byte_at(offset: u64) -> u8 {
        (offset % 251) as u8
    }

    fn bytes(from: u64, len: u64) -> Bytes {
        (from..from + len).map(byte_at).collect::<Vec<u8>>().into()
    }

    /// An origin that answers each slice request with a 206 whose body the test feeds frame by
    /// frame; it notes the first offset of every request.
    #[derive(Default)]
    struct Fed {
        asked: Mutex<Vec<u64>>,
        feeds: Mutex<Vec<(u64, mpsc::UnboundedSender<Bytes>)>>,
    }

    impl Fed {
        fn asked(&self) -> Vec<u64> {
            self.asked.lock().unwrap().clone()
        }

        /// Sends `len` bytes of the answer to the request that started at `start`.
        fn feed(&self, start: u64, at: u64, len: u64) {
            let feeds = self.feeds.lock().unwrap();
            let (_, tx) = feeds.iter().find(|(s, _)| *s == start).expect("asked");
            tx.send(bytes(at, len)).unwrap();
        }

        /// Ends the answer to the request that started at `start`.
        fn end(&self, start: u64) {
            self.feeds.lock().unwrap().retain(|(s, _)| *s != start);
        }
    }

    struct FedOrigin(Arc<Fed>);

    impl Origin for FedOrigin {
        fn fetch(&self, req: Request<()>) -> OriginFuture {
            let range = req.headers()[http::header::RANGE].to_str().unwrap();
            let (a, b) = range["bytes=".len()..].split_once('-').unwrap();
            let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
            let b = b.min(OBJECT - 1);
            let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
            self.0.asked.lock().unwrap().push(a);
            self.0.feeds.lock().unwrap().push((a, tx));
            let frames = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv()
                    .await
                    .map(|b| (Ok::<_, BoxError>(Frame::data(b)), rx))
            });
            let resp = Response::builder()
                .status(StatusCode::PARTIAL_CONTENT)
                .header("content-range", format!("bytes {a}-{b}/{OBJECT}"))
                .header("content-length", (b - a + 1).to_string())
                .header("cache-control", "max-age=60")
                .header("etag", "\"v1\"")
                .body(crate::body::boxed(http_body_util::StreamBody::new(frames)))
                .unwrap();
            Box::pin(async move { Ok(resp) })
        }
    }

    fn cache() -> (Cache, Arc<Fed>, Arc<dyn Origin>) {
        let cfg = CacheConfig {
            memory_bytes: crate::cache::config::ByteSize(64 * MIB),
            slice_bytes: crate::cache::config::ByteSize(MIB),
            ..CacheConfig::default()
        };
        let mut registry = prometheus_client::registry::Registry::default();
        let cache = Cache::new(&cfg, None, &mut registry).unwrap();
        let fed = Arc::new(Fed::default());
        (cache, fed.clone(), Arc::new(FedOrigin(fed)))
    }

    async fn get(cache: &Cache, origin: &Arc<dyn Origin>) -> Body {
        let (parts, ()) = Request::get("/object").body(()).unwrap().into_parts();
        let key = CacheKey::new("test", &parts.uri);
        let policy = CacheConfig::default().policy().freshness();
        let resp = cache.serve(&parts, &key, origin.clone(), &policy).await;
        assert_eq!(resp.status(), StatusCode::OK);
        resp.into_body()
    }

    /// The next data frame, bounded in time.
    async fn frame(body: &mut Body) -> Bytes {
        let f = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("a frame in time")
            .expect("not the end")
            .expect("no error");
        f.into_data().expect("data")
    }

    /// Lets the spawned fills run.
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    /// Until the origin has been asked for slice `start`, bounded.
    async fn asked_for(fed: &Fed, start: u64) {
        for _ in 0..250 {
            if fed.asked().contains(&start) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the origin was never asked for {start}: {:?}", fed.asked());
    }

    /// An origin that answers each slice request at once, in one frame.
    struct Ready;

    impl Origin for Ready {
        fn fetch(&self, req: Request<()>) -> OriginFuture {
            let range = req.headers()[http::header::RANGE].to_str().unwrap();
            let (a, b) = range["bytes=".len()..].split_once('-').unwrap();
            let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
            let b = b.min(OBJECT - 1);
            let resp = Response::builder()
                .status(StatusCode::PARTIAL_CONTENT)
                .header("content-range", format!("bytes {a}-{b}/{OBJECT}"))
                .header("content-length", (b - a + 1).to_string())
                .header("cache-control", "max-age=60")
                .header("etag", "\"v1\"")
                .body(crate::body::boxed(http_body_util::Full::new(bytes(
                    a,
                    b - a + 1,
                ))))
                .unwrap();
            Box::pin(async move { Ok(resp) })
        }
    }

    /// The bytes of one stored slice, counting itself among the `live` ones until its last view
    /// is gone.
    struct Tracked {
        bytes: Vec<u8>,
        live: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl AsRef<[u8]> for Tracked {
        fn as_ref(&self) -> &[u8] {
            &self.bytes
        }
    }

    impl Drop for Tracked {
        fn drop(&mut self) {
            self.live.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// A cache of 64 KiB slices holding the test object (32 slices) whole in its memory tier,
    /// every slice stored as [`Tracked`] bytes counted in the returned `live`.
    async fn stored_in_memory() -> (
        Cache,
        Arc<dyn Origin>,
        Arc<ObjectMeta>,
        Arc<std::sync::atomic::AtomicUsize>,
    ) {
        let cfg = CacheConfig {
            memory_bytes: crate::cache::config::ByteSize(64 * MIB),
            slice_bytes: crate::cache::config::ByteSize(64 * 1024),
            ..CacheConfig::default()
        };
        let mut registry = prometheus_client::registry::Registry::default();
        let cache = Cache::new(&cfg, None, &mut registry).unwrap();
        let origin: Arc<dyn Origin> = Arc::new(Ready);
        let mut body = get(&cache, &origin).await;
        let mut got = Vec::new();
        while got.len() < OBJECT as usize {
            got.extend_from_slice(&frame(&mut body).await);
        }
        drop(body);
        settle().await;
        let inner = &cache.inner;
        let key = CacheKey::new("test", &"/object".parse().unwrap());
        let Lookup::Hit(meta) =
            inner
                .index
                .lookup(&key.0, &http::HeaderMap::new(), std::time::Instant::now())
        else {
            panic!("the object is stored");
        };
        let slice = inner.slice_bytes;
        let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for i in 0..OBJECT / slice {
            let key = SliceKey {
                object: meta.id,
                generation: meta.generation,
                index: i,
            };
            assert!(inner.memory.get(&key).is_some(), "slice {i} is in memory");
            live.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let tracked = Bytes::from_owner(Tracked {
                bytes: bytes(i * slice, slice).to_vec(),
                live: live.clone(),
            });
            inner
                .memory
                .insert(key, crate::cache::memory::Slice::new(vec![tracked]));
        }
        (cache, origin, meta, live)
    }

    /// Whether a fresh hit for `range` (none: the whole object) is answered by the memory fast
    /// path.
    fn fast(cache: &Cache, range: Option<&str>) -> bool {
        let mut req = Request::get("/object");
        if let Some(r) = range {
            req = req.header(http::header::RANGE, r);
        }
        let (parts, ()) = req.body(()).unwrap().into_parts();
        let key = CacheKey::new("test", &parts.uri);
        let policy = CacheConfig::default().policy().freshness();
        cache
            .serve_fresh(&parts, &key, &policy, &[], false)
            .is_some()
    }

    #[tokio::test]
    async fn a_slow_reader_of_a_long_hit_holds_a_bounded_number_of_slices() {
        let (cache, origin, meta, live) = stored_in_memory().await;
        let slices = OBJECT / cache.inner.slice_bytes;
        assert_eq!(
            live.load(std::sync::atomic::Ordering::SeqCst),
            slices as usize
        );
        // A whole read from memory is every byte, in order.
        let mut whole = get(&cache, &origin).await;
        let mut got = Vec::new();
        while let Some(f) = whole.frame().await {
            got.extend_from_slice(&f.unwrap().into_data().unwrap());
        }
        assert!(got == bytes(0, OBJECT), "the object's bytes, in order");
        // A client that takes one frame, then reads no more; the tier then lets every slice go.
        let mut slow = get(&cache, &origin).await;
        let first = frame(&mut slow).await;
        settle().await;
        for i in 0..slices {
            cache.inner.memory.remove(&SliceKey {
                object: meta.id,
                generation: meta.generation,
                index: i,
            });
        }
        let held = live.load(std::sync::atomic::Ordering::SeqCst) as u64;
        assert!(
            held <= 2,
            "a slow reader holds {held} of {slices} evicted slices (bound 2: the streaming path's)"
        );
        // It reads on: the evicted slices come from the origin again, every byte in order.
        let mut got = first.to_vec();
        while let Some(f) = slow.frame().await {
            got.extend_from_slice(&f.unwrap().into_data().unwrap());
        }
        assert!(got == bytes(0, OBJECT), "the object's bytes, in order");
    }

    #[tokio::test]
    async fn a_slow_reader_of_several_ranges_holds_one_slice_and_the_next() {
        let (cache, origin, meta, live) = stored_in_memory().await;
        let slice = cache.inner.slice_bytes;
        let slices = OBJECT / slice;
        // Two ranges of whole slices, apart: a multipart body, fed by a producer task.
        let range = format!("bytes=0-{},{}-{}", 16 * slice - 1, 17 * slice, OBJECT - 1);
        let (parts, ()) = Request::get("/object")
            .header(http::header::RANGE, &range)
            .body(())
            .unwrap()
            .into_parts();
        let key = CacheKey::new("test", &parts.uri);
        let policy = CacheConfig::default().policy().freshness();
        let resp = cache.serve(&parts, &key, origin.clone(), &policy).await;
        assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
        let mut slow = resp.into_body();
        let head = frame(&mut slow).await;
        assert!(head.len() < 256, "the first part's head comes first");
        settle().await;
        for i in 0..slices {
            cache.inner.memory.remove(&SliceKey {
                object: meta.id,
                generation: meta.generation,
                index: i,
            });
        }
        let held = live.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            held <= 2,
            "a slow reader holds {held} of {slices} evicted slices (one and the next)"
        );
        // It reads on: every byte of both ranges, in order, between the part heads.
        let mut got = head.to_vec();
        while let Some(f) = slow.frame().await {
            got.extend_from_slice(&f.unwrap().into_data().unwrap());
        }
        let first = bytes(0, 16 * slice);
        let second = bytes(17 * slice, OBJECT - 17 * slice);
        let after = head.len() + first.len();
        assert!(got[head.len()..after] == first[..], "the first range");
        let blank = got[after..]
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("the second part's head");
        let at = after + blank + 4;
        assert!(got[at..at + second.len()] == second[..], "the second range");
    }

    #[tokio::test]
    async fn hits_of_a_few_slices_keep_the_fast_path() {
        let (cache, _origin, _meta, _live) = stored_in_memory().await;
        let slice = cache.inner.slice_bytes;
        let n = memory_path_slices(slice);
        assert_eq!(
            n, MEMORY_PATH_SLICES,
            "64 KiB slices take the count's bound"
        );
        assert_eq!(memory_path_slices(1 << 20), 8);
        assert_eq!(memory_path_slices(4 << 20), 2);
        assert_eq!(memory_path_slices(64 << 20), 2);
        assert!(fast(&cache, Some(&format!("bytes=0-{}", n * slice - 1))));
        assert!(fast(
            &cache,
            Some(&format!("bytes=100-{}", (n - 1) * slice))
        ));
        assert!(fast(&cache, Some("bytes=0-0,1000-2000")));
        // One slice more, in one range or in several: the streaming path.
        assert!(!fast(&cache, Some(&format!("bytes=0-{}", n * slice))));
        assert!(!fast(&cache, Some(&format!("bytes=100-{}", n * slice))));
        assert!(!fast(
            &cache,
            Some(&format!(
                "bytes=0-{},{}-{}",
                slice,
                4 * slice,
                11 * slice - 1
            ))
        ));
        assert!(!fast(&cache, None), "the whole object is 32 slices");
    }

    #[tokio::test]
    async fn a_client_joining_a_fill_with_bytes_waiting_gets_a_short_first_frame() {
        let (cache, fed, origin) = cache();
        let mut first = get(&cache, &origin).await;
        asked_for(&fed, 0).await;
        // One large origin frame: 512 KiB already in the fill when the second client joins.
        fed.feed(0, 0, 512 * 1024);
        let mut got = 0u64;
        while got < 512 * 1024 {
            got += frame(&mut first).await.len() as u64;
        }
        let mut second = get(&cache, &origin).await;
        let head = frame(&mut second).await;
        assert_eq!(
            head.len(),
            FIRST_BYTES,
            "the first frame is cut, the rest comes after a yield"
        );
        assert_eq!(head, bytes(0, FIRST_BYTES as u64));
        let rest = frame(&mut second).await;
        assert_eq!(
            rest,
            bytes(FIRST_BYTES as u64, 512 * 1024 - FIRST_BYTES as u64)
        );
    }

    #[tokio::test]
    async fn the_next_slice_is_fetched_from_the_middle_of_this_one() {
        let (cache, fed, origin) = cache();
        let mut body = get(&cache, &origin).await;
        asked_for(&fed, 0).await;
        // A client still in the first half of slice 0: the origin is asked for nothing more.
        fed.feed(0, 0, 256 * 1024);
        let mut got = Vec::new();
        while got.len() < 256 * 1024 {
            got.extend_from_slice(&frame(&mut body).await);
        }
        settle().await;
        assert_eq!(
            fed.asked(),
            vec![0],
            "no read-ahead before half of the slice"
        );
        // Past the middle: the next slice is asked for while this one streams.
        fed.feed(0, 256 * 1024, 512 * 1024);
        while got.len() < 768 * 1024 {
            got.extend_from_slice(&frame(&mut body).await);
        }
        let next = tokio::spawn(async move {
            let mut body = body;
            let mut rest = Vec::new();
            while let Some(f) = body.frame().await {
                rest.extend_from_slice(&f.unwrap().into_data().unwrap());
            }
            rest
        });
        asked_for(&fed, MIB).await;
        assert_eq!(fed.asked(), vec![0, MIB]);
        fed.feed(0, 768 * 1024, 256 * 1024);
        fed.end(0);
        fed.feed(MIB, MIB, MIB);
        fed.end(MIB);
        let rest = tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("the body ends")
            .unwrap();
        got.extend_from_slice(&rest);
        assert_eq!(got.len() as u64, OBJECT);
        assert!(got == bytes(0, OBJECT), "the object's bytes, in order");
    }
}
