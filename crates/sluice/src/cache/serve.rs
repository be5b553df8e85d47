//! The phases of one cached request: lookup, decide (fresh, stale-while-revalidate, revalidate,
//! miss, pass), then the response head; the body comes from `stream`.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use sluice_http::cache_control::parse_cache_control;
use sluice_http::cache_status::{CacheStatus, Forward};
use sluice_http::conditional::{if_range_allows, not_modified};
use sluice_http::freshness::{
    decide_use, request_may_fill, storability, variant_key, vary_names, AgeClock, FreshnessPolicy,
    NotStorable, RequestDirectives, Use,
};
use sluice_http::range::{resolve_range, slice_range, Multipart, RangeOutcome, RangeSpec};

use super::fill::FillEnd;
use super::index::Lookup;
use super::object::{merge_not_modified, validates, ObjectId, ObjectMeta, SliceKey};
use super::stream::{self, Plan};
use super::writer::{not_storable_label, FillJob, JobKind};
use super::{CacheKey, Inner, Origin};
use crate::body::{self, Body};

/// The name this cache uses in `Cache-Status`.
pub(crate) const CACHE_NAME: &str = "sluice";
static CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// Request headers the cache sets itself on origin requests, or that only concern one hop.
const NOT_FORWARDED: [HeaderName; 12] = [
    // Origin requests carry no body.
    header::CONTENT_LENGTH,
    header::RANGE,
    header::IF_RANGE,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::CONNECTION,
    header::TE,
    header::UPGRADE,
    header::TRANSFER_ENCODING,
    header::PROXY_AUTHORIZATION,
];

/// How many times a reader elects a new writer after the one it followed failed.
pub(crate) const FILL_ATTEMPTS: usize = 3;

/// The origin request for the cache's own purposes: the client's end-to-end headers, none of its
/// range or conditional ones.
pub(crate) fn origin_request(parts: &Parts) -> Request<()> {
    let mut req = Request::new(());
    *req.method_mut() = Method::GET;
    *req.uri_mut() = parts.uri.clone();
    let headers = req.headers_mut();
    for (name, value) in &parts.headers {
        if !NOT_FORWARDED.contains(name) && name != "keep-alive" {
            headers.append(name.clone(), value.clone());
        }
    }
    req
}

/// An origin request for slice `index`.
pub(crate) fn slice_request(parts: &Parts, index: u64, slice_bytes: u64) -> Request<()> {
    let mut req = origin_request(parts);
    let r = slice_range(index, slice_bytes, None);
    req.headers_mut().insert(
        header::RANGE,
        HeaderValue::from_str(&format!("bytes={}-{}", r.start, r.end)).expect("ascii"),
    );
    req
}

/// An origin request for slice `index` of a stored object (the revalidation's, a missing
/// slice's), made for the shared object rather than for the client that happened to need it:
/// without that client's `Cookie`, unless a request with one may fill the cache
/// (`request_may_fill`: the route caches cookie requests) or the object varies on it (then the
/// cookie is in the variant's key, and every reader of the object sent the same). Its
/// `Authorization` stays, and the answer is judged as one to it (`storability`): an object a
/// request with credentials could store is one the origin marked shared, and an origin that
/// checks each reuse (`must-revalidate`) would refuse the request without them.
pub(crate) fn shared_slice_request(
    parts: &Parts,
    vary: &[HeaderName],
    policy: &FreshnessPolicy,
    index: u64,
    slice_bytes: u64,
) -> Request<()> {
    let mut req = slice_request(parts, index, slice_bytes);
    if !policy.store_cookie_requests && !vary.contains(&header::COOKIE) {
        req.headers_mut().remove(header::COOKIE);
    }
    req
}

fn error_response(status: StatusCode, message: &str) -> Response<Body> {
    let mut resp = Response::new(body::full(format!("{{\"error\":\"{message}\"}}")));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn set_status(resp: &mut Response<Body>, status: &CacheStatus) {
    if let Ok(v) = HeaderValue::from_str(&status.render(CACHE_NAME)) {
        resp.headers_mut().insert(CACHE_STATUS.clone(), v);
    }
}

impl Inner {
    pub(super) async fn serve(
        self: &Arc<Self>,
        parts: &Parts,
        key: &CacheKey,
        origin: Arc<dyn Origin>,
        policy: &FreshnessPolicy,
    ) -> Response<Body> {
        if parts.method != Method::GET && parts.method != Method::HEAD {
            return error_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "the cache serves GET and HEAD",
            );
        }
        let req_cc = parse_cache_control(&parts.headers);
        let lookup = self.index.lookup(&key.0, &parts.headers, Instant::now());
        if req_cc.only_if_cached && !matches!(lookup, Lookup::Hit(_)) {
            // RFC 9111 §5.2.1.7.
            return error_response(StatusCode::GATEWAY_TIMEOUT, "not cached");
        }
        match lookup {
            Lookup::Pass => {
                self.metrics.result("bypass");
                self.pass(parts, &origin, Some("hit-for-pass")).await
            }
            Lookup::UriMiss => {
                self.miss(parts, key, origin, policy, Forward::UriMiss, &[])
                    .await
            }
            Lookup::VaryMiss { vary } => {
                self.miss(parts, key, origin, policy, Forward::VaryMiss, &vary)
                    .await
            }
            Lookup::Hit(meta) => {
                let now = SystemTime::now();
                let mut fresh = meta.freshness;
                if meta.soft_purged {
                    // Invalidated (an unsafe method's success, a soft purge): validated before
                    // any reuse, never served stale while revalidating (RFC 9111 §4.4).
                    fresh = fresh.invalidated();
                }
                let age = meta.clock.current_age(now);
                let decided = decide_use(&fresh, age, &req_cc, policy);
                if req_cc.only_if_cached && matches!(decided, Use::Revalidate { .. }) {
                    // RFC 9111 §5.2.1.7: stored, but not usable without the origin, which this
                    // client asked not to be contacted.
                    return error_response(StatusCode::GATEWAY_TIMEOUT, "not cached");
                }
                match decided {
                    Use::Fresh => {
                        self.metrics.result("hit");
                        let status = CacheStatus {
                            hit: true,
                            ttl: Some(meta.ttl(now)),
                            ..Default::default()
                        };
                        self.respond(parts, meta, origin, policy, status, None)
                    }
                    Use::StaleWhileRevalidate => {
                        self.metrics.result("stale");
                        self.spawn_revalidate(meta.clone(), parts, origin.clone(), policy.clone());
                        let status = CacheStatus {
                            hit: true,
                            ttl: Some(meta.ttl(now)),
                            detail: Some("stale-while-revalidate"),
                            ..Default::default()
                        };
                        self.respond(parts, meta, origin, policy, status, None)
                    }
                    Use::Revalidate { stale_if_error } => {
                        self.revalidate_and_respond(
                            parts,
                            key,
                            meta,
                            origin,
                            policy,
                            stale_if_error,
                        )
                        .await
                    }
                }
            }
        }
    }

    /// A stored object that needs the origin's word before this use (stale, invalidated by a
    /// purge or an unsafe method, or asked with `no-cache`). One revalidation per object version
    /// at a time, as a cold miss has one fill: the first request asks the origin, and every
    /// other one that finds the object so meanwhile waits for that answer (as long as a fill
    /// waits for an origin's head, `origin_header_timeout_secs`) and serves the refreshed
    /// object, or joins the miss that fetches the replaced one. Without that, a hot object
    /// purged (or stale with `must-revalidate`) sent the origin one conditional request per
    /// request in flight. An answer that was the first request's alone (a refusal, which may be
    /// of a field it sent; none, because its client left) is no answer for the others: one of
    /// them asks next. A failure is one for all (a copy `stale-if-error` allows is served), and
    /// after [`FILL_ATTEMPTS`] of them the request gets a 502. A request whose own fields shape
    /// the answer (its `Authorization`, its honoured `no-store`: `revalidate`) neither leads
    /// nor joins: it asks alone, as before.
    async fn revalidate_and_respond(
        self: &Arc<Self>,
        parts: &Parts,
        key: &CacheKey,
        meta: Arc<ObjectMeta>,
        origin: Arc<dyn Origin>,
        policy: &FreshnessPolicy,
        stale_if_error: bool,
    ) -> Response<Body> {
        let ask = Ask {
            parts,
            key,
            meta,
            origin,
            policy,
            stale_if_error,
        };
        if asks_alone(parts, policy) {
            let outcome = self.revalidate(&ask.meta, parts, &ask.origin, policy).await;
            return self.answer_revalidated(ask, outcome, false).await;
        }
        let mut failed = false;
        for _ in 0..FILL_ATTEMPTS {
            let mut heard = match self.lead_or_join(&ask.meta, key, &parts.headers) {
                Turn::Moved => {
                    // Refreshed or dropped since this request looked: decided again on what is
                    // stored now.
                    return Box::pin(self.serve(parts, key, ask.origin, policy)).await;
                }
                Turn::Lead(lead) => {
                    let outcome = self.revalidate(&ask.meta, parts, &ask.origin, policy).await;
                    lead.publish(Rechecked::of(&outcome));
                    drop(lead);
                    return self.answer_revalidated(ask, outcome, false).await;
                }
                Turn::Wait(heard) => heard,
            };
            self.metrics.coalesced.inc();
            let wait = Duration::from_secs(self.config.origin_header_timeout_secs);
            let shared = match tokio::time::timeout(wait, heard.wait_for(Option::is_some)).await {
                Ok(Ok(answer)) => answer.clone().unwrap_or(Rechecked::Own),
                // The leader went without a word (it publishes one even when its client leaves).
                Ok(Err(_)) => Rechecked::Own,
                Err(_) if ask.stale_if_error => Rechecked::Failed,
                Err(_) => return error_response(StatusCode::GATEWAY_TIMEOUT, "origin timed out"),
            };
            match shared {
                Rechecked::Fresh(meta) => {
                    return self
                        .answer_revalidated(ask, Revalidated::Fresh(meta), true)
                        .await
                }
                Rechecked::Changed => {
                    return self
                        .answer_revalidated(ask, Revalidated::Changed, true)
                        .await
                }
                Rechecked::Failed if ask.stale_if_error => {
                    return self
                        .answer_revalidated(ask, Revalidated::Failed(None), true)
                        .await
                }
                Rechecked::Failed => failed = true,
                Rechecked::Own => failed = false,
            }
        }
        if failed {
            return self
                .answer_revalidated(ask, Revalidated::Failed(None), true)
                .await;
        }
        // Every answer so far was another request's own: this one asks with its own fields.
        let outcome = self.revalidate(&ask.meta, parts, &ask.origin, policy).await;
        self.answer_revalidated(ask, outcome, false).await
    }

    /// Leads the revalidation of `meta`'s version, or waits for the one under way. `Moved`
    /// when none is under way and the index no longer holds `meta`: a revalidation that ended
    /// since this request looked has refreshed or dropped the object (it updates the index
    /// before it leaves the map), and a second one would ask the origin again for nothing.
    fn lead_or_join(&self, meta: &Arc<ObjectMeta>, key: &CacheKey, req: &HeaderMap) -> Turn<'_> {
        let id = (meta.id, meta.generation);
        let mut map = self.rechecks.lock().expect("rechecks");
        if let Some(under_way) = map.get(&id) {
            return Turn::Wait(under_way.answer.subscribe());
        }
        match self.index.lookup(&key.0, req, Instant::now()) {
            Lookup::Hit(now) if Arc::ptr_eq(&now, meta) => {}
            _ => return Turn::Moved,
        }
        let recheck = Arc::new(Recheck {
            answer: tokio::sync::watch::channel(None).0,
        });
        map.insert(id, recheck.clone());
        Turn::Lead(Leading {
            inner: self,
            id,
            recheck,
        })
    }

    /// The answer to a request that needed a revalidation, from its `outcome` (this request's
    /// own, or the one it waited for: `collapsed`).
    async fn answer_revalidated(
        self: &Arc<Self>,
        ask: Ask<'_>,
        outcome: Revalidated,
        collapsed: bool,
    ) -> Response<Body> {
        let Ask {
            parts,
            key,
            meta,
            origin,
            policy,
            stale_if_error,
        } = ask;
        match outcome {
            Revalidated::Fresh(meta) => {
                self.metrics.result("revalidated");
                // Forwarded, so not a `hit` in RFC 9211 terms, though the bytes are the cache's.
                let status = CacheStatus {
                    fwd: Some(Forward::Stale),
                    fwd_status: Some(304),
                    collapsed,
                    ttl: Some(meta.ttl(SystemTime::now())),
                    ..Default::default()
                };
                self.respond(parts, meta, origin, policy, status, None)
            }
            Revalidated::Changed => {
                self.miss(parts, key, origin, policy, Forward::Stale, &meta.vary)
                    .await
            }
            Revalidated::Pass => {
                self.metrics.result("bypass");
                self.pass(parts, &origin, Some("revalidation-for-client"))
                    .await
            }
            Revalidated::Failed(_) if stale_if_error => {
                self.metrics.result("stale");
                let status = CacheStatus {
                    fwd: Some(Forward::Stale),
                    ttl: Some(meta.ttl(SystemTime::now())),
                    detail: Some("stale-if-error"),
                    ..Default::default()
                };
                self.respond(parts, meta, origin, policy, status, None)
            }
            Revalidated::Failed(Some(mut resp)) | Revalidated::Refused(mut resp) => {
                let code = resp.status().as_u16();
                set_status(
                    &mut resp,
                    &CacheStatus {
                        fwd: Some(Forward::Stale),
                        fwd_status: Some(code),
                        ..Default::default()
                    },
                );
                resp
            }
            Revalidated::Failed(None) => {
                error_response(StatusCode::BAD_GATEWAY, "origin unavailable")
            }
        }
    }

    /// Asks the origin whether `meta` is still current (RFC 9111 §4.3). The request carries the
    /// first slice's `Range`, so a changed object costs at most one slice. It is made for the
    /// shared object, not for the client that happened to find it stale: without the client's
    /// `Cookie` (a 304's fields, which the object takes, would otherwise be that user's for
    /// everyone), unless a request with one may fill the cache (`request_may_fill`: the route
    /// caches cookie requests) or the object varies on it. `Authorization` stays: an object a
    /// request with it could store is one the origin marked shared (`public`, `s-maxage`,
    /// `must-revalidate`), and with `must-revalidate` the origin checks each reuse against the
    /// caller's credentials (RFC 9111 §3.5); without them every revalidation would be a 401
    /// that drops the object. A 304 that changes `Vary` drops the object: the answer is a miss.
    ///
    /// The answer is about the stored object, but the request carries the fields of the client
    /// that happened to ask, and those may shape it: its `no-store` (its answer may not be
    /// stored) and its `Authorization`. When they may have (the client's `no-store` is honoured,
    /// or the request carries credentials), the answer is for that client alone and the stored
    /// object stays as it is for everyone else: a 304 is served merged but not stored, and
    /// anything else (a 200 or 206, a refusal) sends the client's request to the origin as a
    /// pass. Otherwise any client could drop any object by asking with `no-cache, no-store`, or
    /// have its credentials' 304 fields stored for everyone. A 4xx other than 404, 410 and 416 is
    /// the origin refusing the request (its credentials, its rate, any field the client sent):
    /// passed on, the object kept.
    async fn revalidate(
        self: &Arc<Self>,
        meta: &Arc<ObjectMeta>,
        parts: &Parts,
        origin: &Arc<dyn Origin>,
        policy: &FreshnessPolicy,
    ) -> Revalidated {
        let mut req = shared_slice_request(parts, &meta.vary, policy, 0, self.slice_bytes);
        if let Some(etag) = meta.headers.get(header::ETAG) {
            req.headers_mut()
                .insert(header::IF_NONE_MATCH, etag.clone());
        }
        if let Some(lm) = meta.headers.get(header::LAST_MODIFIED) {
            req.headers_mut()
                .insert(header::IF_MODIFIED_SINCE, lm.clone());
        }
        let request_time = SystemTime::now();
        let started = Instant::now();
        // Bounded as a fill's fetch is: requests may be waiting for this answer.
        let head_deadline = Duration::from_secs(self.config.origin_header_timeout_secs);
        let resp = match tokio::time::timeout(head_deadline, origin.fetch(req)).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) | Err(_) => {
                self.metrics.origin_errors.inc();
                return Revalidated::Failed(None);
            }
        };
        self.metrics
            .origin_latency
            .observe(started.elapsed().as_secs_f64());
        let response_time = SystemTime::now();
        let client_no_store = policy.request_directives == RequestDirectives::Honor
            && parse_cache_control(&parts.headers).no_store;
        // The client's credentials, which the request carried: what the origin answers is
        // judged as an answer to them (stored for everyone only when the object is shared,
        // RFC 9111 §3.5), not by the client's `no-store`, which is about this answer alone.
        let mut asked = HeaderMap::new();
        if let Some(auth) = parts.headers.get(header::AUTHORIZATION) {
            asked.insert(header::AUTHORIZATION, auth.clone());
        }
        let credentials = !asked.is_empty();
        let for_them_alone = |status: StatusCode, headers: &HeaderMap| {
            matches!(
                storability(&Method::GET, &asked, status, headers, response_time, policy),
                Err(NotStorable::Authorization)
            )
        };
        match resp.status() {
            StatusCode::NOT_MODIFIED => {
                // The object was stored, and is looked up, under its `Vary` names: a 304 with
                // other names (or `*`) describes another set of variants.
                let vary_changed = resp.headers().contains_key(header::VARY)
                    && vary_names(resp.headers()).as_deref() != Ok(meta.vary.as_slice());
                // A 304 that names another entity tag is not about the stored response, and
                // does not update it (RFC 9111 §4.3.4): its fields would be put on the stored
                // bytes as another version's. The stored one is not what the origin has now.
                if !validates(&meta.headers, resp.headers()) {
                    if client_no_store || credentials {
                        return Revalidated::Pass;
                    }
                    self.forget(meta);
                    return Revalidated::Changed;
                }
                let mut headers = meta.headers.clone();
                merge_not_modified(&mut headers, resp.headers());
                let verdict = storability(
                    &Method::GET,
                    &asked,
                    meta.status,
                    &headers,
                    response_time,
                    policy,
                );
                let theirs = client_no_store || for_them_alone(meta.status, &headers);
                if !theirs && (vary_changed || verdict.is_err()) {
                    self.forget(meta);
                    return Revalidated::Changed;
                }
                let mut m = (**meta).clone();
                m.headers = headers;
                if let Ok(fresh) = verdict {
                    m.freshness = fresh;
                }
                m.clock = AgeClock::new(resp.headers(), request_time, response_time);
                m.soft_purged = false;
                m.tags = super::object::tags(&m.headers);
                let m = Arc::new(m);
                if !theirs && self.index.update(m.clone()) {
                    if let Some(disk) = &self.disk {
                        disk.write_meta(m.clone());
                    }
                }
                Revalidated::Fresh(m)
            }
            s if s.is_server_error() => Revalidated::Failed(Some(resp)),
            StatusCode::UNAUTHORIZED
            | StatusCode::PROXY_AUTHENTICATION_REQUIRED
            | StatusCode::TOO_MANY_REQUESTS => Revalidated::Refused(resp),
            // The client's `no-store` (its answer may not be stored), a refusal of its
            // credentials, or a new representation its credentials would not share: for it
            // alone.
            _ if client_no_store => Revalidated::Pass,
            s if credentials && (s.is_client_error() || for_them_alone(s, resp.headers())) => {
                Revalidated::Pass
            }
            // The object is gone, or empty now (the slice's range cannot be satisfied).
            StatusCode::NOT_FOUND | StatusCode::GONE | StatusCode::RANGE_NOT_SATISFIABLE => {
                self.forget(meta);
                Revalidated::Changed
            }
            // Any other refusal may be of a field the client sent (a header too large for the
            // origin, a `Referer` or `User-Agent` it blocks): passed on, the object kept, or any
            // client could drop any object with such a field and `no-cache`.
            s if s.is_client_error() => Revalidated::Refused(resp),
            _ => {
                // A new representation: the stored one goes; a fresh miss fetches the new one.
                self.forget(meta);
                Revalidated::Changed
            }
        }
    }

    fn forget(&self, meta: &Arc<ObjectMeta>) {
        self.index
            .remove_object(&meta.primary, meta.id, meta.generation);
        self.drop_objects(std::slice::from_ref(meta));
    }

    /// One background revalidation per object at a time, detached from every client.
    fn spawn_revalidate(
        self: &Arc<Self>,
        meta: Arc<ObjectMeta>,
        parts: &Parts,
        origin: Arc<dyn Origin>,
        policy: FreshnessPolicy,
    ) {
        if !self
            .revalidating
            .lock()
            .expect("revalidating")
            .insert(meta.id)
        {
            return;
        }
        let inner = self.clone();
        let mut parts = clone_parts(parts);
        // It serves the shared object, not the client that found it stale: without that
        // client's credentials or directives (a `no-store` or `Authorization` of theirs would
        // make the 304 theirs alone, and the object would never be refreshed). An object that
        // needs credentials on every reuse (`must-revalidate`) is never revalidated in the
        // background.
        parts.headers.remove(header::AUTHORIZATION);
        parts.headers.remove(header::CACHE_CONTROL);
        parts.headers.remove(header::PRAGMA);
        tokio::spawn(async move {
            let _ = inner.revalidate(&meta, &parts, &origin, &policy).await;
            inner
                .revalidating
                .lock()
                .expect("revalidating")
                .remove(&meta.id);
        });
    }

    /// Sends the client's request to the origin as it is (uncacheable URL or answer).
    async fn pass(
        &self,
        parts: &Parts,
        origin: &Arc<dyn Origin>,
        detail: Option<&'static str>,
    ) -> Response<Body> {
        let mut req = origin_request(parts);
        *req.method_mut() = parts.method.clone();
        for name in [
            header::RANGE,
            header::IF_RANGE,
            header::IF_NONE_MATCH,
            header::IF_MODIFIED_SINCE,
            header::IF_MATCH,
            header::IF_UNMODIFIED_SINCE,
        ] {
            for v in parts.headers.get_all(&name) {
                req.headers_mut().append(name.clone(), v.clone());
            }
        }
        match origin.fetch(req).await {
            Ok(mut resp) => {
                let code = resp.status().as_u16();
                set_status(
                    &mut resp,
                    &CacheStatus {
                        fwd: Some(Forward::Bypass),
                        fwd_status: Some(code),
                        detail,
                        ..Default::default()
                    },
                );
                resp
            }
            Err(_) => {
                self.metrics.origin_errors.inc();
                error_response(StatusCode::BAD_GATEWAY, "origin unavailable")
            }
        }
    }

    /// A miss: elect (or join) the writer of the first slice the request needs; its answer
    /// decides the object, and the request streams while it arrives.
    async fn miss(
        self: &Arc<Self>,
        parts: &Parts,
        key: &CacheKey,
        origin: Arc<dyn Origin>,
        policy: &FreshnessPolicy,
        mut why: Forward,
        vary: &[HeaderName],
    ) -> Response<Body> {
        if let Err(reason) = request_may_fill(&parts.headers, policy) {
            // Straight to the origin, alone: no fill another request could join, no memo that
            // would keep the URL's next answer out of the cache.
            self.metrics.result("bypass");
            return self
                .pass(parts, &origin, Some(not_storable_label(reason)))
                .await;
        }
        let first = first_slice(parts, self.slice_bytes);
        let cold_key = |vary: &[HeaderName]| SliceKey {
            object: ObjectId::new(&key.0, &variant_key(vary, &parts.headers)),
            generation: 0,
            index: first,
        };
        let mut cold = cold_key(vary);
        for _ in 0..FILL_ATTEMPTS {
            let joined = self.join_or_start_miss(cold, &key.0, &parts.headers, || FillJob {
                request: slice_request(parts, first, self.slice_bytes),
                origin: origin.clone(),
                kind: JobKind::Cold {
                    primary: key.0.clone(),
                    req_headers: parts.headers.clone(),
                    policy: policy.clone(),
                },
            });
            let Some((fill, created)) = joined else {
                // Stored since this request looked (on a loaded machine the thread can be
                // preempted for milliseconds in between): a hit, not a second fetch. Or marked
                // to pass since: passed on as it is, not fetched as a slice.
                return Box::pin(self.serve(parts, key, origin, policy)).await;
            };
            let mut reader = fill.reader();
            match reader.head().await {
                Ok(meta) if meta.variant != variant_key(&meta.vary, &parts.headers) => {
                    // Joined a fetch for another variant (the URL's Vary was not known yet):
                    // fetch this request's own variant.
                    why = Forward::VaryMiss;
                    cold = cold_key(&meta.vary);
                    continue;
                }
                Ok(meta) => {
                    self.metrics.result("miss");
                    let status = CacheStatus {
                        fwd: Some(why),
                        fwd_status: Some(meta.status.as_u16()),
                        stored: true,
                        collapsed: !created,
                        ttl: Some(meta.ttl(SystemTime::now())),
                        ..Default::default()
                    };
                    return self.respond(
                        parts,
                        meta,
                        origin,
                        policy,
                        status,
                        Some((first, reader)),
                    );
                }
                Err(FillEnd::Pass { reason }) => {
                    self.metrics.result("bypass");
                    // The writer's answer serves the request that started it, and only that
                    // one: a joiner shares the key, not the request (an `Authorization` the
                    // joiner lacks shaped that answer), so it asks the origin itself (never
                    // queueing behind the writer).
                    if parts.method == Method::GET && created {
                        if let Some(mut resp) = fill.take_pass() {
                            let code = resp.status().as_u16();
                            set_status(
                                &mut resp,
                                &CacheStatus {
                                    fwd: Some(why),
                                    fwd_status: Some(code),
                                    detail: Some(reason),
                                    ..Default::default()
                                },
                            );
                            return resp;
                        }
                    }
                    return self.pass(parts, &origin, Some(reason)).await;
                }
                Err(FillEnd::Mismatch)
                | Err(FillEnd::Failed(_))
                | Err(FillEnd::Complete { .. }) => {
                    // Elect a new writer (the failed one has left the in-flight map).
                    continue;
                }
            }
        }
        error_response(StatusCode::BAD_GATEWAY, "origin unavailable")
    }

    /// A fresh hit answered from what this process holds, or `None` (then [`Inner::serve`]
    /// answers): the lookup and freshness decision of `serve`, with a response only when it needs
    /// no origin at all (a 304, a 416, a HEAD, or a body whose every slice is in the memory
    /// tier). `unseen` names request fields `parts` does not carry as the origin would see them:
    /// an object that varies on one of them is left to `serve`.
    pub(super) fn serve_fresh(
        self: &Arc<Self>,
        parts: &Parts,
        key: &CacheKey,
        policy: &FreshnessPolicy,
        unseen: &[HeaderName],
        wire: bool,
    ) -> Option<Response<Body>> {
        if parts.method != Method::GET && parts.method != Method::HEAD {
            return None;
        }
        let Lookup::Hit(meta) = self.index.lookup(&key.0, &parts.headers, Instant::now()) else {
            return None;
        };
        if meta.soft_purged || meta.vary.iter().any(|v| unseen.contains(v)) {
            return None;
        }
        let now = SystemTime::now();
        let age = meta.clock.current_age(now);
        let req_cc = parse_cache_control(&parts.headers);
        if decide_use(&meta.freshness, age, &req_cc, policy) != Use::Fresh {
            return None;
        }
        let status = CacheStatus {
            hit: true,
            ttl: Some(meta.ttl(now)),
            ..Default::default()
        };
        if wire {
            if let Some(resp) = self.whole_from_wire(parts, &meta, age, &status) {
                self.metrics.result("hit");
                return Some(resp);
            }
        }
        let resp = match self.head(parts, &meta, age, &status) {
            Head::Done(resp) => resp,
            Head::Body { code, headers, .. } if parts.method == Method::HEAD => {
                with_head(body::empty(), code, headers)
            }
            Head::Body {
                code,
                headers,
                plan,
            } => {
                let (body, files) = stream::from_memory(self, &meta, &plan)?;
                let mut resp = with_head(body, code, headers);
                if let Some(f) = files {
                    resp.extensions_mut().insert(f);
                }
                resp
            }
        };
        self.metrics.result("hit");
        Some(resp)
    }

    /// A plain GET's whole 200 answer from the memory tier with its head as stored bytes
    /// ([`StoredHead`]) and no header map: `None` when the request asks for a part, is
    /// conditional, or the body is not all in memory (then the head is built as a map).
    fn whole_from_wire(
        &self,
        parts: &Parts,
        meta: &ObjectMeta,
        age: u64,
        status: &CacheStatus,
    ) -> Option<Response<Body>> {
        let length = meta.length?;
        if parts.method != Method::GET
            || meta.status != StatusCode::OK
            || parts.headers.contains_key(header::RANGE)
            || not_modified(&parts.headers, &meta.headers)
        {
            return None;
        }
        let (body, files) = stream::from_memory(self, meta, &Plan::whole(length))?;
        let fields = meta
            .wire
            .get_or_make(|| wire_fields(&meta.headers, length))
            .clone();
        let mut resp = Response::new(body);
        resp.extensions_mut().insert(StoredHead {
            fields,
            age,
            cache_status: status.render(CACHE_NAME),
            has_date: meta.headers.contains_key(header::DATE),
            length,
        });
        if let Some(f) = files {
            resp.extensions_mut().insert(f);
        }
        Some(resp)
    }

    /// The response for a stored (or just stored) object.
    fn respond(
        self: &Arc<Self>,
        parts: &Parts,
        meta: Arc<ObjectMeta>,
        origin: Arc<dyn Origin>,
        policy: &FreshnessPolicy,
        status: CacheStatus,
        first: Option<(u64, super::fill::FillReader)>,
    ) -> Response<Body> {
        let age = meta.clock.current_age(SystemTime::now());
        let (code, headers, plan) = match self.head(parts, &meta, age, &status) {
            Head::Done(resp) => return resp,
            Head::Body {
                code,
                headers,
                plan,
            } => (code, headers, plan),
        };
        let mut files = None;
        let body = if parts.method == Method::HEAD {
            body::empty()
        } else if let Some((b, f)) = first
            .is_none()
            .then(|| stream::from_memory(self, &meta, &plan))
            .flatten()
        {
            files = f;
            b
        } else if let Some(range) = plan.single() {
            let parts = clone_parts(parts);
            stream::inline(
                self.clone(),
                meta,
                origin,
                parts,
                policy.clone(),
                range,
                first,
            )
        } else {
            let parts = clone_parts(parts);
            stream::spawn(
                self.clone(),
                meta,
                origin,
                parts,
                policy.clone(),
                plan,
                first,
            )
        };
        let mut resp = with_head(body, code, headers);
        if let Some(f) = files {
            // For a writer that can send file ranges (the HTTP/1.1 fast path); others ignore it.
            resp.extensions_mut().insert(f);
        }
        resp
    }

    /// The head of the answer to `parts` from `meta` (of age `age`): a whole response when it
    /// has no body from the object (304, 416), else the status, fields and body plan.
    fn head(&self, parts: &Parts, meta: &ObjectMeta, age: u64, status: &CacheStatus) -> Head {
        if meta.status == StatusCode::OK && not_modified(&parts.headers, &meta.headers) {
            let mut resp = Response::new(body::empty());
            *resp.status_mut() = StatusCode::NOT_MODIFIED;
            for name in [
                header::CACHE_CONTROL,
                header::CONTENT_LOCATION,
                header::DATE,
                header::ETAG,
                header::EXPIRES,
                header::LAST_MODIFIED,
                header::VARY,
            ] {
                for v in meta.headers.get_all(&name) {
                    resp.headers_mut().append(name.clone(), v.clone());
                }
            }
            finish_head(resp.headers_mut(), age, status);
            return Head::Done(resp);
        }
        let mut headers = meta.headers.clone();
        let mut code = meta.status;
        let plan = match (meta.status, meta.length) {
            (StatusCode::OK, Some(len)) => {
                headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
                let range = parts
                    .headers
                    .get(header::RANGE)
                    .and_then(|v| v.to_str().ok())
                    .filter(|_| if_range_allows(&parts.headers, &meta.headers));
                match range.map(|r| resolve_range(r, len)) {
                    None | Some(RangeOutcome::Whole) => {
                        headers.insert(header::CONTENT_LENGTH, len.into());
                        Plan::whole(len)
                    }
                    Some(RangeOutcome::Unsatisfiable) => {
                        let mut resp = Response::new(body::empty());
                        *resp.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
                        resp.headers_mut().insert(
                            header::CONTENT_RANGE,
                            HeaderValue::from_str(&format!("bytes */{len}")).expect("ascii"),
                        );
                        finish_head(resp.headers_mut(), age, status);
                        return Head::Done(resp);
                    }
                    Some(RangeOutcome::Partial(ranges)) if ranges.len() == 1 => {
                        code = StatusCode::PARTIAL_CONTENT;
                        let r = ranges[0];
                        headers.insert(
                            header::CONTENT_RANGE,
                            HeaderValue::from_str(&sluice_http::range::content_range(r, len))
                                .expect("ascii"),
                        );
                        headers.insert(header::CONTENT_LENGTH, r.len().into());
                        Plan::ranges(vec![r], None)
                    }
                    Some(RangeOutcome::Partial(ranges)) => {
                        code = StatusCode::PARTIAL_CONTENT;
                        let mp = Multipart {
                            boundary: boundary(),
                            content_type: headers
                                .get(header::CONTENT_TYPE)
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_string),
                            length: len,
                        };
                        headers.insert(
                            header::CONTENT_TYPE,
                            HeaderValue::from_str(&mp.response_type()).expect("ascii"),
                        );
                        headers.insert(header::CONTENT_LENGTH, mp.body_length(&ranges).into());
                        Plan::ranges(ranges, Some(mp))
                    }
                }
            }
            (_, Some(len)) => {
                headers.insert(header::CONTENT_LENGTH, len.into());
                Plan::whole(len)
            }
            (_, None) => Plan::until_end(),
        };
        finish_head(&mut headers, age, status);
        Head::Body {
            code,
            headers,
            plan,
        }
    }
}

/// What a stored object answers a request with, before its body.
enum Head {
    /// No body from the object: 304 or 416.
    Done(Response<Body>),
    Body {
        code: StatusCode,
        headers: HeaderMap,
        plan: Plan,
    },
}

fn with_head(body: Body, code: StatusCode, headers: HeaderMap) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = code;
    *resp.headers_mut() = headers;
    resp
}

/// What a request that needed a revalidation brings to its answer.
struct Ask<'a> {
    parts: &'a Parts,
    key: &'a CacheKey,
    meta: Arc<ObjectMeta>,
    origin: Arc<dyn Origin>,
    policy: &'a FreshnessPolicy,
    stale_if_error: bool,
}

/// Whether a request's own fields shape the revalidation's answer (`Inner::revalidate`): its
/// credentials, or its `no-store` when honoured. Such a request neither waits for another's
/// revalidation nor has others wait for its own.
fn asks_alone(parts: &Parts, policy: &FreshnessPolicy) -> bool {
    parts.headers.contains_key(header::AUTHORIZATION)
        || (policy.request_directives == RequestDirectives::Honor
            && parse_cache_control(&parts.headers).no_store)
}

/// One revalidation made for a client, in the in-flight map (`Inner::rechecks`): its answer,
/// once there is one, for the requests that wait for it.
pub(super) struct Recheck {
    answer: tokio::sync::watch::Sender<Option<Rechecked>>,
}

/// What a revalidation's answer tells the requests that waited for it.
#[derive(Clone)]
pub(super) enum Rechecked {
    /// Not modified: the object, refreshed and stored.
    Fresh(Arc<ObjectMeta>),
    /// The object was dropped (another version, or gone): a miss fetches what there is now.
    Changed,
    /// The origin failed (unreachable, no head in time, 5xx).
    Failed,
    /// An answer for the leading request alone (a refusal, which may be of a field it sent), or
    /// none (its client left).
    Own,
}

impl Rechecked {
    fn of(outcome: &Revalidated) -> Rechecked {
        match outcome {
            Revalidated::Fresh(meta) => Rechecked::Fresh(meta.clone()),
            Revalidated::Changed => Rechecked::Changed,
            Revalidated::Failed(_) => Rechecked::Failed,
            Revalidated::Refused(_) | Revalidated::Pass => Rechecked::Own,
        }
    }
}

/// A request's part in the revalidation of an object version.
enum Turn<'a> {
    Lead(Leading<'a>),
    Wait(tokio::sync::watch::Receiver<Option<Rechecked>>),
    /// The object stored is no longer the one the request found.
    Moved,
}

/// The leading request's hold on a revalidation: the answer it publishes reaches every waiter,
/// and dropped (published or not: a client that leaves cancels its request's future) it leaves
/// the map, having told the waiters [`Rechecked::Own`] if it had told them nothing.
struct Leading<'a> {
    inner: &'a Inner,
    id: (ObjectId, u64),
    recheck: Arc<Recheck>,
}

impl Leading<'_> {
    fn publish(&self, answer: Rechecked) {
        self.recheck.answer.send_replace(Some(answer));
    }
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        self.recheck.answer.send_if_modified(|answer| {
            let unset = answer.is_none();
            if unset {
                *answer = Some(Rechecked::Own);
            }
            unset
        });
        let mut map = self
            .inner
            .rechecks
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if map
            .get(&self.id)
            .is_some_and(|r| Arc::ptr_eq(r, &self.recheck))
        {
            map.remove(&self.id);
        }
    }
}

enum Revalidated {
    Fresh(Arc<ObjectMeta>),
    Changed,
    /// The origin failed; a 5xx answer is kept to pass on when no stale copy may be served.
    Failed(Option<Response<Body>>),
    /// The origin refused the request (a 4xx other than 404, 410 and 416): its answer is passed
    /// on, never a stale copy, and the object stays.
    Refused(Response<Body>),
    /// The answer may have been shaped by the client's own fields (its `no-store`, its
    /// credentials) and is not a 304: the client's request goes to the origin as a pass, and the
    /// object stays.
    Pass,
}

/// The head of a whole 200 answer from a stored object, for a writer of HTTP/1.1 bytes: the
/// object's fields as written once (`ObjectMeta::wire`), and what changes per answer. The same
/// fields as [`Inner::head`] makes as a map for that answer (`Accept-Ranges`, `Content-Length`,
/// `Age`, `Cache-Status`), hop-by-hop fields left out as the proxy leaves them out.
#[derive(Clone, Debug)]
pub struct StoredHead {
    /// `name: value\r\n` lines: the stored fields, `accept-ranges` and `content-length`.
    pub fields: bytes::Bytes,
    pub age: u64,
    /// The `Cache-Status` value.
    pub cache_status: String,
    /// The stored fields have a `Date` (else the writer adds today's).
    pub has_date: bool,
    /// The body's length.
    pub length: u64,
}

/// The stored fields of a whole 200 answer of `length` bytes as `name: value` lines, in the
/// order the map answer has them, without the per-answer `Age` and `Cache-Status`.
fn wire_fields(stored: &HeaderMap, length: u64) -> bytes::Bytes {
    let mut headers = stored.clone();
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    headers.insert(header::CONTENT_LENGTH, length.into());
    sluice_http::hop::strip_hop_by_hop(&mut headers, false);
    let mut out = Vec::with_capacity(64 + headers.len() * 48);
    for (name, value) in &headers {
        if name == header::AGE || name == CACHE_STATUS {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    bytes::Bytes::from(out)
}

fn finish_head(headers: &mut HeaderMap, age: u64, status: &CacheStatus) {
    headers.insert(header::AGE, age.into());
    // The rendered string becomes the value as it is (no second copy).
    let rendered = bytes::Bytes::from(status.render(CACHE_NAME));
    if let Ok(v) = HeaderValue::from_maybe_shared(rendered) {
        headers.insert(CACHE_STATUS.clone(), v);
    }
}

/// The slice holding the first byte a request asks for (0 when it is unknown before the length is).
fn first_slice(parts: &Parts, slice_bytes: u64) -> u64 {
    let spec = parts
        .headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(sluice_http::range::parse_range);
    match spec.as_deref() {
        Some([RangeSpec::From { first, .. }, ..]) => first / slice_bytes,
        _ => 0,
    }
}

fn boundary() -> String {
    let mut b = [0u8; 12];
    let _ = getrandom::getrandom(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub(crate) fn clone_parts(parts: &Parts) -> Parts {
    let mut req = Request::new(());
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = parts.uri.clone();
    *req.headers_mut() = parts.headers.clone();
    req.into_parts().0
}
