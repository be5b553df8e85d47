//! The writer of a fill: one detached task per slice miss that fetches from the origin, judges the
//! answer, and feeds the fill, the memory tier and the disk queue. A client going away does not stop
//! it; an origin that ignores `Range` is read on into the following slices (bounded once nobody
//! reads).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::header::{HeaderMap, CONTENT_LENGTH, CONTENT_RANGE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use sluice_http::cache_control::parse_cache_control;
use sluice_http::freshness::{
    storability, variant_key, vary_names, AgeClock, FreshnessPolicy, NotStorable,
};
use sluice_http::range::{parse_content_range, slice_range};

use super::budget::Reservation;
use super::fill::{Fill, FillEnd};
use super::memory::{Slice, SliceBuf};
use super::object::{self, ObjectId, ObjectMeta, SliceKey};
use super::{Inner, Origin, OriginError};
use crate::body::Body;

/// What a fill fetches, and for which object.
pub(crate) struct FillJob {
    pub request: Request<()>,
    pub origin: Arc<dyn Origin>,
    pub kind: JobKind,
}

pub(crate) enum JobKind {
    /// The object is not known yet: the answer decides whether and how it is stored.
    Cold {
        primary: String,
        req_headers: HeaderMap,
        policy: FreshnessPolicy,
    },
    /// A slice of a known object version: the answer must match it, and be storable as an
    /// answer to the request that asked for it (`serve::shared_slice_request`), which carries
    /// the fields of the client that happened to need the slice.
    Warm {
        meta: Arc<ObjectMeta>,
        policy: FreshnessPolicy,
    },
}

/// Cold writers (first fetches of misses) that may wait for a fill place
/// (`max_inflight_slices`), per place; past that, with every place taken, a new miss is passed
/// to the origin instead of queued (`Inner::join_or_start_locked`). Four rounds of fills: a
/// burst of real misses still queues, and a flood of misses whose clients leave at once cannot
/// make every later miss wait behind it.
pub(crate) const WAITING_PER_PERMIT: usize = 4;

/// A cold writer's place among those waiting for a fill place (`Inner::waiting`), given back
/// once it holds one, or when it ends (a task dropped before it ever ran included). Warm writers
/// (read-ahead, refetches of stored slices: about two per streaming client) hold none: counted,
/// a few hundred streams behind a slow origin passed every new miss, uncoalesced, so N viewers
/// of a new live segment made N origin requests.
pub(crate) struct Waiting(Option<Arc<Inner>>);

impl Waiting {
    /// A place for a writer of `job`: counted only when it is cold.
    pub(crate) fn new(inner: Arc<Inner>, job: &FillJob) -> Waiting {
        if !matches!(job.kind, JobKind::Cold { .. }) {
            return Waiting(None);
        }
        inner
            .waiting
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Waiting(Some(inner))
    }

    fn done(&mut self) {
        if let Some(inner) = self.0.take() {
            inner
                .waiting
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.done();
    }
}

/// Why a fill was ended before its fetch: every client that wanted it went away while it waited.
const ABANDONED: &str = "abandoned before the origin was asked";

pub(crate) async fn run(
    inner: Arc<Inner>,
    fill: Arc<Fill>,
    key: SliceKey,
    job: FillJob,
    mut waiting: Waiting,
) {
    // Whatever ends this task (the runtime shutting down included), the fill ends with it, so no
    // reader waits on a writer that is gone.
    let guard = Unregister {
        inner: inner.clone(),
        fill: fill.clone(),
        key,
        alias: std::sync::Mutex::new(None),
    };
    let end = match inner.permits.clone().acquire_owned().await {
        Ok(_permit) => {
            waiting.done();
            // The slice's bytes are taken from the budget before the first one arrives: its
            // exact length when the object is known (a short object's slice is short; holding
            // a whole slice for it would keep the memory tier that much smaller), else a slice.
            let bytes = inner.budget.reserve(reserve_for(&inner, &job, key)).await;
            if fill.forsaken_by_all() {
                // Its clients left while it waited (a flood of cache-busting requests, each
                // reset at once): asking the origin now would cost a slice for nobody, and the
                // place for the misses queued behind it. A client that comes for it later
                // starts a fill of its own.
                inner.metrics.fills_given_up.inc();
                FillEnd::Failed(ABANDONED.into())
            } else {
                fetch(&inner, &fill, key, job, bytes, &guard.alias).await
            }
        }
        Err(_) => FillEnd::Failed("cache closed".into()),
    };
    inner.release(key, &fill);
    fill.finish(end);
    drop(guard);
}

/// Bytes a fill of `key` reserves: the slice's own length when the object's length is known.
fn reserve_for(inner: &Inner, job: &FillJob, key: SliceKey) -> u64 {
    let slice = inner.slice_bytes;
    match &job.kind {
        JobKind::Warm { meta, .. } => meta.length.map_or(slice, |len| {
            len.saturating_sub(key.index.saturating_mul(slice))
                .clamp(1, slice)
        }),
        JobKind::Cold { .. } => slice,
    }
}

struct Unregister {
    inner: Arc<Inner>,
    fill: Arc<Fill>,
    key: SliceKey,
    /// The object's real slice key, once the fill is registered under it too.
    alias: std::sync::Mutex<Option<SliceKey>>,
}

impl Drop for Unregister {
    fn drop(&mut self) {
        self.inner.release(self.key, &self.fill);
        if let Some(real) = *self.alias.lock().expect("alias") {
            self.inner.release(real, &self.fill);
        }
        self.fill.finish(FillEnd::Failed("writer ended".into()));
    }
}

async fn fetch(
    inner: &Arc<Inner>,
    fill: &Arc<Fill>,
    key: SliceKey,
    job: FillJob,
    bytes: Reservation,
    alias: &std::sync::Mutex<Option<SliceKey>>,
) -> FillEnd {
    let started = Instant::now();
    let request_time = SystemTime::now();
    let head_deadline = Duration::from_secs(inner.config.origin_header_timeout_secs);
    // What a slice of a known object was asked with, to judge the answer by.
    let asked = match job.kind {
        JobKind::Warm { .. } => job.request.headers().clone(),
        JobKind::Cold { .. } => HeaderMap::new(),
    };
    let resp = match tokio::time::timeout(head_deadline, job.origin.fetch(job.request)).await {
        Ok(Ok(r)) => r,
        // This side's shortage, not the origin's: no origin error.
        Ok(Err(OriginError::Local(e))) => {
            tracing::debug!(error = %e, "cache fill: out of local resources");
            return FillEnd::Local;
        }
        Ok(Err(e)) => {
            inner.metrics.origin_errors.inc();
            return FillEnd::Failed(e.to_string());
        }
        Err(_) => {
            inner.metrics.origin_errors.inc();
            return FillEnd::Failed("origin sent no response head in time".into());
        }
    };
    inner
        .metrics
        .origin_latency
        .observe(started.elapsed().as_secs_f64());
    let response_time = SystemTime::now();
    let (parts, body) = resp.into_parts();
    let slice = inner.slice_bytes;
    let want = slice_range(key.index, slice, None);

    // A 206 must be exactly the slice asked for; a 200 is the whole object from byte 0.
    if parts.status == StatusCode::RANGE_NOT_SATISFIABLE {
        if let JobKind::Cold { .. } = job.kind {
            // The slice lies past the end (or the object is empty): nothing to store; every
            // waiter asks the origin with its own request, which gets the right answer for it.
            return FillEnd::Pass { reason: "range" };
        }
    }
    let (ranged, total) = match parts.status {
        StatusCode::PARTIAL_CONTENT => {
            let cr = parts
                .headers
                .get(CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(parse_content_range);
            match cr {
                Some(sluice_http::range::ContentRange {
                    range: Some(r),
                    complete_length: Some(len),
                }) if r.start == want.start && r.end == want.end.min(len - 1) => (true, Some(len)),
                _ if matches!(job.kind, JobKind::Cold { .. }) => {
                    // A valid answer all the same (RFC 9110 §14.2: fewer bytes than asked, or
                    // `bytes 0-1048575/*` for a file still growing), but not a slice of an
                    // object of known length: nothing to store. The URL is remembered as
                    // uncacheable (hit-for-pass), and every waiter asks the origin with its own
                    // request, which gets the right answer for it (a 502 after three writers
                    // before).
                    return cold_range_pass(inner, fill, key, &job.kind);
                }
                _ => return FillEnd::Failed("origin sent a Content-Range other than asked".into()),
            }
        }
        _ => (false, content_length(&parts.headers)),
    };
    if total.is_some_and(|t| t > object::MAX_LENGTH) {
        // More than a petabyte announced: broken or hostile, and no store holds it. Nothing is
        // stored; each waiting request asks the origin itself.
        return FillEnd::Pass { reason: "length" };
    }

    let meta = match job.kind {
        JobKind::Warm { meta, policy } => {
            let usable = matches!(parts.status, StatusCode::OK | StatusCode::PARTIAL_CONTENT);
            let changed = usable && !meta.same_version(&parts.headers, total);
            // A 404 to credentials may be the origin hiding what they do not open (as the
            // revalidation reads it): gone only when asked without. A `Cookie` counts: with
            // cookie requests cached (the default) the client's is forwarded, and an origin
            // answering 404 for a session's hidden resource dropped the object for everyone.
            let credentials = asked.contains_key(http::header::AUTHORIZATION)
                || asked.contains_key(http::header::COOKIE);
            if changed || (!credentials && gone(&meta, parts.status, want.start)) {
                // Another version (or the object is gone): never mix it with stored slices.
                inner
                    .index
                    .remove_object(&meta.primary, meta.id, meta.generation);
                inner.drop_objects(std::slice::from_ref(&meta));
                inner.metrics.version_mismatch.inc();
                return if usable {
                    FillEnd::Mismatch
                } else {
                    FillEnd::Failed(format!("origin answered {}", parts.status))
                };
            }
            if !usable {
                // A refusal (401, 403, 429, 431: of any field the client that needed the slice
                // sent, its `User-Agent` or credentials among them) or an origin error says
                // nothing of the object, which stays: dropped, any client could drop any large
                // object for everyone by asking for a slice not stored with such a field. The
                // fill fails; each reader elects a writer with its own request.
                return FillEnd::Failed(format!("origin answered {}", parts.status));
            }
            let verdict = storability(
                &Method::GET,
                &asked,
                StatusCode::OK,
                &parts.headers,
                response_time,
                &policy,
            );
            if let Err(reason) = verdict {
                // An answer to this client's fields (`private`, its credentials' answer the
                // origin did not mark shared, its `no-store`): neither stored nor followed by
                // anyone else. Out of the in-flight map first, so nobody joins it; the reader
                // that asked takes the answer (`Fill::take_pass`), any other asks on its own.
                inner.metrics.uncacheable.inc();
                let label = not_storable_label(reason);
                inner.release(key, fill);
                fill.finish_pass(label, Response::from_parts(parts, crate::body::boxed(body)));
                return FillEnd::Pass { reason: label };
            }
            meta
        }
        JobKind::Cold {
            primary,
            req_headers,
            policy,
        } => {
            let store_status = if ranged { StatusCode::OK } else { parts.status };
            let verdict = storability(
                &Method::GET,
                &req_headers,
                store_status,
                &parts.headers,
                response_time,
                &policy,
            );
            // A head too big to keep (`object::MAX_HEAD_BYTES`, charged to `memory_bytes`
            // while indexed) is passed like any other answer not stored.
            let headers = object::stored_headers(&parts.headers);
            let tags = object::tags(&parts.headers);
            let fits = object::head_bytes(&headers, &tags) <= inner.index.head_limit();
            // A whole answer announcing more than one object may keep (`object_bound`) is
            // passed at its head: its client reads the origin's body itself, at its own pace
            // (TCP back-pressure), where a fill would read it as fast as the origin sends,
            // past the bound, for followers that fall behind and fetch it again.
            let too_large = !ranged && total.is_some_and(|t| t > inner.config.object_bound());
            let fresh = match verdict {
                Ok(f) if fits && !too_large => f,
                verdict => {
                    let reason = verdict.err();
                    let label = match reason {
                        Some(r) => not_storable_label(r),
                        None if !fits => "head-too-large",
                        None => "too-large",
                    };
                    // Remember the URL as uncacheable unless the reason lies in this request, or
                    // the answer is an error: a 5xx or a 404 says how the origin is doing now
                    // (a live segment not yet published, a hiccup), not what the URL is, and a
                    // memo would keep the answer that follows out of the cache.
                    let request_reason = reason == Some(NotStorable::Authorization)
                        || (reason == Some(NotStorable::NoStore)
                            && parse_cache_control(&req_headers).no_store);
                    let error = parts.status.is_client_error() || parts.status.is_server_error();
                    if !request_reason && !error {
                        let until = tokio::time::Instant::now().into_std()
                            + std::time::Duration::from_secs(inner.config.hit_for_pass_secs);
                        let dropped = inner.index.mark_pass(&primary, until);
                        inner.drop_objects(&dropped);
                    }
                    inner.metrics.uncacheable.inc();
                    let mut parts = parts;
                    let whole =
                        ranged && want.start == 0 && total.is_some_and(|t| t - 1 <= want.end);
                    if whole {
                        // The slice asked for is the whole object: it answers any GET as a 200.
                        parts.status = StatusCode::OK;
                        parts.headers.remove(CONTENT_RANGE);
                    }
                    // Out of the in-flight map before the waiters learn the answer: a reader on
                    // another worker thread may be answered, and its client ask again, before
                    // this task gets further, and that request must not join a fill that sends
                    // it away.
                    inner.release(key, fill);
                    if ranged && !whole {
                        // A partial answer to a Range the client may not have sent: unusable.
                        fill.finish(FillEnd::Pass { reason: label });
                    } else {
                        fill.finish_pass(
                            label,
                            Response::from_parts(parts, crate::body::boxed(body)),
                        );
                    }
                    return FillEnd::Pass { reason: label };
                }
            };
            let vary = vary_names(&parts.headers).unwrap_or_default();
            let variant = variant_key(&vary, &req_headers);
            let meta = Arc::new(ObjectMeta {
                id: ObjectId::new(&primary, &variant),
                primary,
                variant,
                generation: inner.next_generation(),
                status: store_status,
                headers,
                length: total,
                freshness: fresh,
                clock: AgeClock::new(&parts.headers, request_time, response_time),
                tags,
                vary,
                soft_purged: false,
                range_capable: ranged,
                wire: Default::default(),
            });
            // Registered under the object's own slice key before the object is in the index:
            // a request that finds it there and reads this slice must join this fill, not
            // start a second fetch of the slice.
            let real = SliceKey {
                object: meta.id,
                generation: meta.generation,
                index: key.index,
            };
            if real != key {
                let mut map = inner.inflight.lock().expect("inflight");
                map.entry(real).or_insert_with(|| fill.clone());
                *alias.lock().expect("alias") = Some(real);
            }
            let dropped = inner.index.insert(meta.clone());
            // Refused by the index (not admitted, or a long variant under a short key): its
            // removal is queued above, so no record of it goes to the disk writer after it
            // (one would wait there, outside the index's bound, behind a write that hangs).
            let refused = dropped.iter().any(|d| Arc::ptr_eq(d, &meta));
            inner.drop_objects(&dropped);
            if let Some(disk) = inner.disk.as_ref().filter(|_| !refused) {
                disk.write_meta(meta.clone());
            }
            inner.metrics.stored.inc();
            meta
        }
    };
    fill.set_head(meta.clone());
    let real = SliceKey {
        object: meta.id,
        generation: meta.generation,
        index: key.index,
    };
    if ranged {
        let len = want.end.min(total.unwrap_or(1) - 1) - want.start + 1;
        let end = fill_ranged(inner, fill, real, len, total, body, bytes).await;
        inner.release(real, fill);
        end
    } else {
        let mut w = WholeBody {
            inner,
            meta,
            own: fill.clone(),
            own_index: key.index,
            bytes: Some(bytes),
            cold: key,
            bound: inner.config.object_bound(),
            storing: true,
        };
        w.run(body).await
    }
}

/// Ends a cold fill whose 206 cannot be stored as the slice asked for (`fetch`) as a pass
/// (reason `range`), the URL marked to pass for `hit_for_pass_secs`.
fn cold_range_pass(inner: &Arc<Inner>, fill: &Arc<Fill>, key: SliceKey, kind: &JobKind) -> FillEnd {
    if let JobKind::Cold {
        primary,
        req_headers,
        ..
    } = kind
    {
        // Not remembered for an answer to credentials (as `storability`'s request reasons in
        // `fetch`): it says how the origin answers them, not what the URL is, and one client's
        // request would keep the URL out of the cache for everyone.
        if req_headers.contains_key(http::header::AUTHORIZATION) {
            return cold_range_end(inner, fill, key);
        }
        let until = tokio::time::Instant::now().into_std()
            + Duration::from_secs(inner.config.hit_for_pass_secs);
        let dropped = inner.index.mark_pass(primary, until);
        inner.drop_objects(&dropped);
    }
    cold_range_end(inner, fill, key)
}

/// The end of `cold_range_pass`, memo or not.
fn cold_range_end(inner: &Arc<Inner>, fill: &Arc<Fill>, key: SliceKey) -> FillEnd {
    inner.metrics.uncacheable.inc();
    // Out of the in-flight map before the waiters learn the answer (see the uncacheable
    // answers in `fetch`); the partial answer is for a `Range` the client may not have sent.
    inner.release(key, fill);
    fill.finish(FillEnd::Pass { reason: "range" });
    FillEnd::Pass { reason: "range" }
}

async fn fill_ranged(
    inner: &Arc<Inner>,
    fill: &Arc<Fill>,
    key: SliceKey,
    len: u64,
    total: Option<u64>,
    mut body: Body,
    bytes: Reservation,
) -> FillEnd {
    let mut got = 0u64;
    let mut buf = SliceBuf::new(len, inner.config.sendfile);
    let started = Instant::now();
    while let Some(frame) = next_frame(inner, &mut body).await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => return FillEnd::Failed(format!("origin body: {e}")),
        };
        if let Ok(data) = frame.into_data() {
            got += data.len() as u64;
            if got > len {
                return FillEnd::Failed("origin sent more than the slice".into());
            }
            inner.metrics.bytes_origin.inc_by(data.len() as u64);
            fill.push(buf.push(&data));
        }
        if got < len && forsaken(inner, started, fill.readers()) {
            return FillEnd::Failed(FORSAKEN.into());
        }
    }
    if got != len {
        return FillEnd::Failed("origin body ended early".into());
    }
    inner
        .store_slice(
            key,
            Slice::new(fill.chunks()).received_in(&buf),
            bytes,
            Some(fill),
        )
        .await;
    FillEnd::Complete {
        last: total.is_some_and(|t| (key.index + 1) * inner.slice_bytes >= t),
    }
}

/// Reads a whole-object answer (200, or any stored status), cutting it into slices.
struct WholeBody<'a> {
    inner: &'a Arc<Inner>,
    meta: Arc<ObjectMeta>,
    own: Arc<Fill>,
    own_index: u64,
    /// The budget's bytes for the slice being read; each complete slice takes its reservation
    /// to the store, and the next one waits for a new one.
    bytes: Option<Reservation>,
    /// The key the job's own fill was registered under (its cold key on a miss).
    cold: SliceKey,
    /// The most bytes of one object the tiers keep (`CacheConfig::object_bound`).
    bound: u64,
    /// Whether complete slices are still stored as the object's: false once the answer has
    /// passed `bound` (then they are relayed to the readers following, and kept in the memory
    /// tier only, evictable like any slice, for readers behind the origin).
    storing: bool,
}

impl WholeBody<'_> {
    async fn run(&mut self, mut body: Body) -> FillEnd {
        let slice = self.inner.slice_bytes;
        let mut index = 0u64;
        let mut recv = self.slice_buf(0);
        let mut buf: Vec<Bytes> = Vec::new();
        let mut buf_len = 0u64;
        let mut current = self.target(0);
        // Registered as soon as a slice fills up, so readers finishing it find the next one here
        // instead of asking the origin again.
        let mut next: Option<Arc<Fill>> = None;
        let mut own_end: Option<FillEnd> = None;
        let mut slice_started = Instant::now();
        loop {
            let frame = match next_frame(self.inner, &mut body).await {
                None => break,
                Some(Ok(f)) => f,
                Some(Err(e)) => {
                    let end = FillEnd::Failed(format!("origin body: {e}"));
                    self.close(index, &current, end.clone());
                    self.close(index + 1, &next, end.clone());
                    return own_end.unwrap_or(end);
                }
            };
            let Ok(mut data) = frame.into_data() else {
                continue;
            };
            self.inner.metrics.bytes_origin.inc_by(data.len() as u64);
            while !data.is_empty() {
                if buf_len == slice {
                    // The slice is full and more follows: it was not the last one.
                    let end = FillEnd::Complete { last: false };
                    let following = current.as_ref().map_or(0, |f| f.readers())
                        + next.as_ref().map_or(0, |f| f.readers());
                    let whole = Slice::new(std::mem::take(&mut buf)).received_in(&recv);
                    self.complete(index, whole, &current, end.clone()).await;
                    // Room for the next slice before reading it: a slow disk slows the origin
                    // read rather than growing memory.
                    self.bytes = Some(self.inner.budget.reserve(slice).await);
                    recv = self.slice_buf(index + 1);
                    if index == self.own_index {
                        own_end = Some(end);
                    }
                    buf_len = 0;
                    index += 1;
                    slice_started = Instant::now();
                    current = next.take();
                    // Before the slice asked for, its own readers wait through these slices.
                    let following = if index <= self.own_index {
                        following + self.own.readers()
                    } else {
                        following
                    };
                    if following == 0 && self.over_budget(index) {
                        let end = FillEnd::Failed("abandoned".into());
                        self.close(index, &current, end.clone());
                        return own_end.unwrap_or(end);
                    }
                }
                let take = ((slice - buf_len) as usize).min(data.len());
                let part = recv.push(&data.split_to(take));
                buf_len += take as u64;
                if let Some(f) = &current {
                    f.push(part.clone());
                }
                buf.push(part);
                if buf_len == slice && next.is_none() {
                    next = self.target(index + 1);
                }
            }
            // Readers of the job's own slice wait through the slices before it too.
            let following = if index <= self.own_index {
                self.own.readers()
            } else {
                0
            } + current.as_ref().map_or(0, |f| f.readers())
                + next.as_ref().map_or(0, |f| f.readers());
            if forsaken(self.inner, slice_started, following) {
                let end = FillEnd::Failed(FORSAKEN.into());
                self.close(index, &current, end.clone());
                self.close(index + 1, &next, end.clone());
                return own_end.unwrap_or(end);
            }
        }
        let length = index * slice + buf_len;
        if self.meta.length.is_some_and(|l| l != length) {
            // Not the object announced: the slices this answer already stored go with the
            // version, never to be put together with another answer's.
            self.inner
                .index
                .remove_object(&self.meta.primary, self.meta.id, self.meta.generation);
            self.inner.drop_objects(std::slice::from_ref(&self.meta));
            let end = FillEnd::Failed("origin body ended early".into());
            self.close(index, &current, end.clone());
            self.close(index + 1, &next, end.clone());
            return own_end.unwrap_or(end);
        }
        if self.meta.length.is_none() && self.storing {
            let mut m = (*self.meta).clone();
            m.length = Some(length);
            let m = Arc::new(m);
            if self.inner.index.update(m.clone()) {
                if let Some(disk) = &self.inner.disk {
                    disk.write_meta(m.clone());
                }
            }
            self.meta = m;
        }
        let end = FillEnd::Complete { last: true };
        let whole = Slice::new(buf).received_in(&recv);
        self.complete(index, whole, &current, end.clone()).await;
        // A slice registered past the end holds nothing: its readers learn the object ended.
        self.close(index + 1, &next, end.clone());
        if index < self.own_index {
            return FillEnd::Complete { last: true };
        }
        own_end.unwrap_or(end)
    }

    /// The buffer slice `index` is received into: a whole slice, or what is left of an object
    /// whose length is known (a short object does not take a slice-sized file).
    fn slice_buf(&self, index: u64) -> SliceBuf {
        let slice = self.inner.slice_bytes;
        let len = self
            .meta
            .length
            .map_or(slice, |l| l.saturating_sub(index * slice).clamp(1, slice));
        SliceBuf::new(len, self.inner.config.sendfile)
    }

    fn key(&self, index: u64) -> SliceKey {
        SliceKey {
            object: self.meta.id,
            generation: self.meta.generation,
            index,
        }
    }

    /// The fill fed while slice `index` passes: the job's own, a new one registered for a later
    /// slice nobody is fetching yet, or none.
    fn target(&self, index: u64) -> Option<Arc<Fill>> {
        if index == self.own_index {
            return Some(self.own.clone());
        }
        if index < self.own_index {
            return None;
        }
        let key = self.key(index);
        let mut map = self.inner.inflight.lock().expect("inflight");
        if map.contains_key(&key) || self.inner.memory.get(&key).is_some() {
            return None;
        }
        let fill = Fill::new();
        fill.set_head(self.meta.clone());
        map.insert(key, fill.clone());
        Some(fill)
    }

    async fn complete(
        &mut self,
        index: u64,
        slice: Slice,
        current: &Option<Arc<Fill>>,
        end: FillEnd,
    ) {
        let stored = index
            .saturating_mul(self.inner.slice_bytes)
            .saturating_add(slice.len);
        if self.storing && stored > self.bound {
            self.stop_storing();
        }
        if !self.storing {
            self.relay(index, slice, current, end);
            return;
        }
        let bytes = match self.bytes.take() {
            Some(b) => b,
            None => self.inner.budget.reserve(self.inner.slice_bytes).await,
        };
        self.inner
            .store_slice(self.key(index), slice, bytes, current.as_deref())
            .await;
        self.close(index, current, end);
    }

    /// The answer has passed the object bound (`max_object_bytes`; a chunked live stream never
    /// ends, a `Content-Length` one past it is passed at its head): stored on, it would churn
    /// the disk tier, and a later joiner replaying from slice 0 would break once that was
    /// evicted. The object leaves the index and the disk tier, its URL is marked to pass for
    /// `hit_for_pass_secs` so later requests go to the origin on their own, and its cold key
    /// leaves the in-flight map (no new request joins this fill). Its slices stay in the memory
    /// tier, as those `relay` adds: the readers already following go on through them at their
    /// own pace (a window of a few slices was gone under any reader slower than the origin,
    /// who then fetched the answer again, or got a truncated one), and they age out of it
    /// under a generation nothing asks for again.
    fn stop_storing(&mut self) {
        self.storing = false;
        let inner = self.inner;
        inner.metrics.uncacheable.inc();
        inner
            .index
            .remove_object(&self.meta.primary, self.meta.id, self.meta.generation);
        // Not `drop_objects`: it takes the memory copies of the slices on disk too.
        if let Some(disk) = &inner.disk {
            disk.remove_object(self.meta.id, self.meta.generation);
        }
        let until = tokio::time::Instant::now().into_std()
            + Duration::from_secs(inner.config.hit_for_pass_secs);
        let dropped = inner.index.mark_pass(&self.meta.primary, until);
        inner.drop_objects(&dropped);
        inner.release(self.cold, &self.own);
    }

    /// A complete slice past the object bound: to the memory tier only, for the readers
    /// following (who move on to it from the fill they read); never to disk, never indexed.
    fn relay(&mut self, index: u64, slice: Slice, current: &Option<Arc<Fill>>, end: FillEnd) {
        let slice = slice.compacted();
        if let (Some(f), Some(whole)) = (current, slice.chunks.first()) {
            f.share(whole);
        }
        self.inner.memory.insert(self.key(index), slice);
        // As without a disk tier: the slice is in the memory tier, its transit bytes are free.
        self.bytes = None;
        self.inner.budget.sample();
        self.close(index, current, end);
    }

    fn close(&self, index: u64, current: &Option<Arc<Fill>>, end: FillEnd) {
        if let Some(f) = current {
            // The job's own fill is registered under its cold key; releasing by the real key is
            // then a no-op and `run` releases it.
            self.inner.release(self.key(index), f);
            f.finish(end);
        }
    }

    /// Reading on with nobody following is worth it only within the detached budget: counted
    /// from the slice asked for once past it, and from the object's start before it (a client
    /// that asked for the end of a long object and left would otherwise have every slice before
    /// it read for nobody).
    fn over_budget(&self, index: u64) -> bool {
        let detached = if index > self.own_index {
            index - self.own_index
        } else {
            index
        };
        detached.saturating_mul(self.inner.slice_bytes) > self.inner.config.detached_fill_bytes.0
    }
}

/// Why a fill nobody follows was given up (`forsaken`).
const FORSAKEN: &str = "origin too slow for a slice nobody reads";

/// Whether a slice begun at `started` has taken longer than `origin_slice_timeout_secs` with no
/// client following it: reading on would hold a fill place and budget for nobody, and an origin
/// trickling bytes inside the idle wait would hold them for good. Checked as bytes arrive, so a
/// forsaken fill ends within that time plus the idle wait (`sluice_cache_fills_given_up_total`).
fn forsaken(inner: &Inner, started: Instant, following: usize) -> bool {
    let late = following == 0
        && started.elapsed() > Duration::from_secs(inner.config.origin_slice_timeout_secs);
    if late {
        inner.metrics.fills_given_up.inc();
    }
    late
}

/// The next body frame, or an error once the origin has been silent for the idle deadline.
pub(crate) async fn next_frame(
    inner: &Inner,
    body: &mut Body,
) -> Option<Result<http_body::Frame<Bytes>, crate::body::BoxError>> {
    let idle = Duration::from_secs(inner.config.origin_idle_timeout_secs);
    match tokio::time::timeout(idle, body.frame()).await {
        Ok(f) => f,
        Err(_) => Some(Err("origin body stalled".into())),
    }
}

/// Whether an answer of `status` for the slice starting at `start` says the stored object is no
/// more: 404 and 410, and 416 for a slice inside the object's known length (it shrank).
fn gone(meta: &ObjectMeta, status: StatusCode, start: u64) -> bool {
    match status {
        StatusCode::NOT_FOUND | StatusCode::GONE => true,
        StatusCode::RANGE_NOT_SATISFIABLE => meta.length.is_some_and(|l| start < l),
        _ => false,
    }
}

fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

pub(crate) fn not_storable_label(r: NotStorable) -> &'static str {
    match r {
        NotStorable::Method => "method",
        NotStorable::Status => "status",
        NotStorable::NoStore => "no-store",
        NotStorable::Private => "private",
        NotStorable::Authorization => "authorization",
        NotStorable::VaryStar => "vary-star",
        NotStorable::SetCookie => "set-cookie",
        NotStorable::NoLifetime => "no-lifetime",
        NotStorable::Cookie => "cookie",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::task::{Context, Poll, Wake, Waker};

    use crate::cache::{Cache, CacheConfig, OriginFuture};

    /// Answers every request with a `no-store` 200.
    struct NoStore;

    impl Origin for NoStore {
        fn fetch(&self, _req: Request<()>) -> OriginFuture {
            Box::pin(async {
                let mut r = Response::new(crate::body::boxed(http_body_util::Full::new(
                    Bytes::from_static(b"not for the cache"),
                )));
                r.headers_mut()
                    .insert(http::header::CACHE_CONTROL, "no-store".parse().unwrap());
                Ok(r)
            })
        }
    }

    /// Answers any request with a whole 200 that announces `announced` bytes and ends cleanly
    /// after `sent` (an origin, or a front of one, that gets its framing wrong).
    struct Short {
        announced: u64,
        sent: usize,
    }

    impl Origin for Short {
        fn fetch(&self, _req: Request<()>) -> OriginFuture {
            let (announced, sent) = (self.announced, self.sent);
            Box::pin(async move {
                let mut r = Response::new(crate::body::boxed(http_body_util::Full::new(
                    Bytes::from(vec![7u8; sent]),
                )));
                let h = r.headers_mut();
                h.insert(CONTENT_LENGTH, announced.into());
                h.insert(http::header::ETAG, "\"a\"".parse().unwrap());
                h.insert(http::header::CACHE_CONTROL, "max-age=60".parse().unwrap());
                Ok(r)
            })
        }
    }

    /// Finding: a whole answer that ended short of its announced length failed its fill but
    /// left the slices it had completed stored under the object's version. They go with it.
    #[tokio::test]
    async fn a_whole_answer_shorter_than_announced_leaves_no_slice_behind() {
        let slice = 64u64 << 10;
        let config = CacheConfig {
            slice_bytes: crate::cache::ByteSize(slice),
            ..CacheConfig::default()
        };
        let mut registry = prometheus_client::registry::Registry::default();
        let cache = Cache::new(&config, None, &mut registry).unwrap();
        let origin = Arc::new(Short {
            announced: 3 * slice,
            sent: (2 * slice + slice / 2) as usize,
        });
        let (parts, ()) = Request::get("/short").body(()).unwrap().into_parts();
        let key = crate::cache::CacheKey::new("t", &parts.uri);
        let resp = cache
            .serve(&parts, &key, origin, &config.policy().freshness())
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.into_body().collect().await.is_err(), "a short body");
        // The writer drops the version as it ends; give it a moment on this runtime.
        for _ in 0..100 {
            if cache.objects() == 0 && cache.inner.memory.weight() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(cache.objects(), 0);
        assert_eq!(
            cache.inner.memory.weight(),
            0,
            "slices of the short answer kept"
        );
    }

    /// A waiting reader's waker that notes, when woken, whether its key is still in flight.
    struct SeesMap {
        inner: Arc<Inner>,
        key: SliceKey,
        in_flight_at_wake: Mutex<Option<bool>>,
    }

    impl Wake for SeesMap {
        fn wake(self: Arc<Self>) {
            let held = self.inner.inflight.lock().unwrap().contains_key(&self.key);
            *self.in_flight_at_wake.lock().unwrap() = Some(held);
        }
    }

    #[tokio::test]
    async fn a_slice_stored_since_its_reader_looked_is_followed_not_fetched_again() {
        use crate::cache::fill::Event;
        use crate::cache::memory::Slice;
        let mut registry = prometheus_client::registry::Registry::default();
        let cache = Cache::new(&CacheConfig::default(), None, &mut registry).unwrap();
        let inner = cache.inner.clone();
        let key = SliceKey {
            object: ObjectId::new("scope|/a", ""),
            generation: 7,
            index: 0,
        };
        // A reader found neither the slice nor its fill; the writer then stored the slice and
        // left the in-flight map before the reader asked to join.
        inner
            .memory
            .insert(key, Slice::new(vec![Bytes::from_static(b"stored bytes")]));
        let (fill, created) = inner.join_or_start(key, || panic!("a second fetch of the slice"));
        assert!(!created);
        let mut reader = fill.reader();
        match reader.next().await {
            Event::Chunk(c) => assert_eq!(&c[..], b"stored bytes"),
            Event::End(e) => panic!("no bytes: {e:?}"),
        }
        assert!(matches!(
            reader.next().await,
            Event::End(FillEnd::Complete { last: true })
        ));
        assert!(!inner.inflight.lock().unwrap().contains_key(&key));
    }

    /// A URL marked to pass (hit-for-pass) after a miss looked it up, before the miss elects a
    /// writer: no fill starts; the miss is told to look again, and then passes.
    #[tokio::test]
    async fn a_miss_for_a_url_marked_to_pass_since_starts_no_fill() {
        let mut registry = prometheus_client::registry::Registry::default();
        let cache = Cache::new(&CacheConfig::default(), None, &mut registry).unwrap();
        let inner = cache.inner.clone();
        let key = SliceKey {
            object: ObjectId::new("scope|/p", ""),
            generation: 0,
            index: 0,
        };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        assert!(inner.index.mark_pass("scope|/p", until).is_empty());
        let joined = inner.join_or_start_miss(key, "scope|/p", &HeaderMap::new(), || {
            panic!("a fill for a URL marked to pass")
        });
        assert!(joined.is_none());
        assert!(inner.inflight.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_uncacheable_answer_leaves_the_inflight_map_before_its_waiters_are_told() {
        let mut registry = prometheus_client::registry::Registry::default();
        let cache = Cache::new(&CacheConfig::default(), None, &mut registry).unwrap();
        let inner = cache.inner.clone();
        let key = SliceKey {
            object: ObjectId::new("scope|/private", ""),
            generation: 0,
            index: 0,
        };
        let (fill, created) = inner.join_or_start(key, || FillJob {
            request: Request::get("/private").body(()).unwrap(),
            origin: Arc::new(NoStore),
            kind: JobKind::Cold {
                primary: "scope|/private".into(),
                req_headers: HeaderMap::new(),
                policy: CacheConfig::default().policy().freshness(),
            },
        });
        assert!(created);
        let sees = Arc::new(SeesMap {
            inner: inner.clone(),
            key,
            in_flight_at_wake: Mutex::new(None),
        });
        let waker = Waker::from(sees.clone());
        let mut cx = Context::from_waker(&waker);
        let mut reader = fill.reader();
        assert!(reader.poll_head(&mut cx).is_pending());
        // The writer runs on this runtime; wait (bounded) for it to wake the reader.
        for _ in 0..500 {
            if sees.in_flight_at_wake.lock().unwrap().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A request that arrives as soon as this reader is answered finds no fill to join.
        assert_eq!(*sees.in_flight_at_wake.lock().unwrap(), Some(false));
        assert!(matches!(
            reader.poll_head(&mut cx),
            Poll::Ready(Err(FillEnd::Pass { reason: "no-store" }))
        ));
        let resp = fill.take_pass().expect("the answer is left for the reader");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"not for the cache");
    }
}
