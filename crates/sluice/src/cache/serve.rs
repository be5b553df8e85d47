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
use super::{CacheKey, Inner, Origin, OriginError};
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

/// How many times one request decides again on what is stored (found refreshed or dropped
/// since it looked, or stored since it missed) before it stops looking: a revalidation's
/// [`Turn::Moved`] is then served as a miss, and a miss that finds the object stored once more
/// is passed to the origin. Each round needs another request to have changed the object in
/// between, but nothing else bounded the recursion.
const REDECIDE_LIMIT: u8 = 3;

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

/// The answer to a request the origin could not be asked for because this process is out of its
/// own resources (`OriginError::Local`): what the reverse path answers (503 `local_resources`,
/// booked on this side), body and error mark alike.
fn local_resources() -> Response<Body> {
    crate::error::ProxyError::new(
        crate::error::Side::Internal,
        StatusCode::SERVICE_UNAVAILABLE,
        "local_resources",
        "the proxy is out of resources for now",
    )
    .into_response()
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
        self.serve_at(parts, key, origin, policy, 0).await
    }

    /// [`Inner::serve`], deciding for the `depth`th time ([`REDECIDE_LIMIT`]).
    async fn serve_at(
        self: &Arc<Self>,
        parts: &Parts,
        key: &CacheKey,
        origin: Arc<dyn Origin>,
        policy: &FreshnessPolicy,
        depth: u8,
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
                self.miss(parts, key, origin, policy, Forward::UriMiss, &[], depth)
                    .await
            }
            Lookup::VaryMiss { vary } => {
                self.miss(parts, key, origin, policy, Forward::VaryMiss, &vary, depth)
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
                        let ask = Ask {
                            parts,
                            key,
                            meta,
                            origin,
                            policy,
                            stale_if_error,
                            depth,
                        };
                        self.revalidate_and_respond(ask).await
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
    /// them asks next. A failure is one for all, and final: each waiter gets the copy
    /// `stale-if-error` allows it, else the origin's own status (a 5xx, with its
    /// `Retry-After`), else a 502 (a 504 when the origin sent no head in time), without asking
    /// the origin again (a stalling origin held each waiter up to [`FILL_ATTEMPTS`] header
    /// timeouts, and a 503 became a 502). A request whose own fields shape the answer (its
    /// `Authorization`, its honoured `no-store`: `revalidate`) neither leads nor joins: it asks
    /// alone, as before.
    async fn revalidate_and_respond(self: &Arc<Self>, ask: Ask<'_>) -> Response<Body> {
        let (parts, key, policy) = (ask.parts, ask.key, ask.policy);
        if asks_alone(parts, policy) {
            let outcome = self.revalidate(&ask.meta, parts, &ask.origin, policy).await;
            return self.answer_revalidated(ask, outcome, false).await;
        }
        for _ in 0..FILL_ATTEMPTS {
            let mut heard = match self.lead_or_join(&ask.meta, key, &parts.headers) {
                Turn::Moved if ask.depth < REDECIDE_LIMIT => {
                    // Refreshed or dropped since this request looked: decided again on what is
                    // stored now.
                    let depth = ask.depth + 1;
                    return Box::pin(self.serve_at(parts, key, ask.origin, policy, depth)).await;
                }
                Turn::Moved => {
                    // Moved under this request every time it looked: a miss (which joins or
                    // starts the one fill, or passes when the object is stored again).
                    let vary = ask.meta.vary.clone();
                    return Box::pin(self.miss(
                        parts,
                        key,
                        ask.origin,
                        policy,
                        Forward::Stale,
                        &vary,
                        ask.depth,
                    ))
                    .await;
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
                // No answer in the time a fill waits for an origin's head: the origin's is late.
                Err(_) => Rechecked::Failed(Failure::TimedOut),
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
                Rechecked::Failed(failure) => {
                    // The origin's answer for the object, not for the leader's request: asked
                    // again by each waiter, a stalling origin held it for one more header
                    // timeout per try.
                    return self
                        .answer_revalidated(ask, Revalidated::Failed(failure, None), true)
                        .await;
                }
                Rechecked::Own => {}
            }
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
        let mut map = self.rechecks.lock().unwrap_or_else(|e| e.into_inner());
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
            depth,
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
                self.miss(
                    parts,
                    key,
                    origin,
                    policy,
                    Forward::Stale,
                    &meta.vary,
                    depth,
                )
                .await
            }
            Revalidated::Pass => {
                self.metrics.result("bypass");
                self.pass(parts, &origin, Some("revalidation-for-client"))
                    .await
            }
            Revalidated::Failed(..) if stale_if_error => {
                self.metrics.result("stale");
                let status = CacheStatus {
                    fwd: Some(Forward::Stale),
                    ttl: Some(meta.ttl(SystemTime::now())),
                    detail: Some("stale-if-error"),
                    ..Default::default()
                };
                self.respond(parts, meta, origin, policy, status, None)
            }
            Revalidated::Failed(_, Some(mut resp)) | Revalidated::Refused(mut resp) => {
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
            Revalidated::Failed(failure, None) => {
                let mut resp = failure.response();
                if let Failure::Answered { status, .. } = failure {
                    set_status(
                        &mut resp,
                        &CacheStatus {
                            fwd: Some(Forward::Stale),
                            fwd_status: Some(status.as_u16()),
                            collapsed,
                            ..Default::default()
                        },
                    );
                }
                resp
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
            Ok(Err(OriginError::Timeout)) | Err(_) => {
                self.metrics.origin_errors.inc();
                return Revalidated::Failed(Failure::TimedOut, None);
            }
            Ok(Err(OriginError::Unreachable(_))) => {
                self.metrics.origin_errors.inc();
                return Revalidated::Failed(Failure::Unreachable, None);
            }
            Ok(Err(OriginError::Local(_))) => return Revalidated::Failed(Failure::Local, None),
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
            status if status.is_server_error() => {
                let retry_after = resp.headers().get(header::RETRY_AFTER).cloned();
                Revalidated::Failed(
                    Failure::Answered {
                        status,
                        retry_after,
                    },
                    Some(resp),
                )
            }
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
            .unwrap_or_else(|e| e.into_inner())
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
                .unwrap_or_else(|e| e.into_inner())
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
            Err(OriginError::Local(_)) => local_resources(),
            Err(_) => {
                self.metrics.origin_errors.inc();
                error_response(StatusCode::BAD_GATEWAY, "origin unavailable")
            }
        }
    }

    /// A miss: elect (or join) the writer of the first slice the request needs; its answer
    /// decides the object, and the request streams while it arrives. `depth`: how many times
    /// the request has decided again ([`REDECIDE_LIMIT`]).
    #[allow(clippy::too_many_arguments)]
    async fn miss(
        self: &Arc<Self>,
        parts: &Parts,
        key: &CacheKey,
        origin: Arc<dyn Origin>,
        policy: &FreshnessPolicy,
        mut why: Forward,
        vary: &[HeaderName],
        depth: u8,
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
                // to pass since: passed on as it is, not fetched as a slice. Past the limit
                // (the object changed under this request each time it looked), passed.
                if depth >= REDECIDE_LIMIT {
                    self.metrics.result("bypass");
                    return self.pass(parts, &origin, Some("redecided")).await;
                }
                return Box::pin(self.serve_at(parts, key, origin, policy, depth + 1)).await;
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
                // This side's shortage: final for every request that followed the fill (another
                // writer would fail the same way), as the reverse path tries no other server.
                Err(FillEnd::Local) => return local_resources(),
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
    /// How many times this request has decided again ([`REDECIDE_LIMIT`]).
    depth: u8,
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
    /// The origin failed (unreachable, no head in time, 5xx): final for every waiter.
    Failed(Failure),
    /// An answer for the leading request alone (a refusal, which may be of a field it sent), or
    /// none (its client left).
    Own,
}

impl Rechecked {
    fn of(outcome: &Revalidated) -> Rechecked {
        match outcome {
            Revalidated::Fresh(meta) => Rechecked::Fresh(meta.clone()),
            Revalidated::Changed => Rechecked::Changed,
            // Every 5xx is final for the waiters: an app that answers 500 while its database is
            // overloaded would otherwise have each waiter ask in turn, then the rest at once
            // (the herd this coalescing removes). Requests whose own fields shape the answer
            // (credentials, an honoured `no-store`) never wait for another's revalidation.
            Revalidated::Failed(failure, _) => Rechecked::Failed(failure.clone()),
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

/// How the origin failed a revalidation: what the requests that waited for it answer with when
/// no stale copy may be served (the origin's body went to the request that asked).
#[derive(Clone)]
pub(super) enum Failure {
    /// Unreachable, or the exchange broke: 502.
    Unreachable,
    /// No response head within `origin_header_timeout_secs`: 504.
    TimedOut,
    /// This process was out of its own resources to ask: 503 `local_resources`.
    Local,
    /// A server error: its status, and its `Retry-After` (when to ask again).
    Answered {
        status: StatusCode,
        retry_after: Option<HeaderValue>,
    },
}

impl Failure {
    fn response(&self) -> Response<Body> {
        match self {
            Failure::Unreachable => error_response(StatusCode::BAD_GATEWAY, "origin unavailable"),
            Failure::TimedOut => error_response(StatusCode::GATEWAY_TIMEOUT, "origin timed out"),
            Failure::Local => local_resources(),
            Failure::Answered {
                status,
                retry_after,
            } => {
                let mut resp = error_response(*status, "origin unavailable");
                if let Some(v) = retry_after {
                    resp.headers_mut().insert(header::RETRY_AFTER, v.clone());
                }
                resp
            }
        }
    }
}

enum Revalidated {
    Fresh(Arc<ObjectMeta>),
    Changed,
    /// The origin failed; a 5xx answer is kept to pass on (to the request that asked) when no
    /// stale copy may be served.
    Failed(Failure, Option<Response<Body>>),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;

    use crate::cache::{Cache, CacheConfig, OriginFuture};

    /// A 10-byte object, stale at once (`max-age=0`), that the origin always validates (304 to
    /// its tag). Counts the requests, and the conditional ones.
    #[derive(Default)]
    struct Validating {
        asked: AtomicUsize,
        conditional: AtomicUsize,
    }

    impl Origin for Validating {
        fn fetch(&self, req: Request<()>) -> OriginFuture {
            self.asked.fetch_add(1, Ordering::SeqCst);
            let conditional = req.headers().get(header::IF_NONE_MATCH).is_some();
            if conditional {
                self.conditional.fetch_add(1, Ordering::SeqCst);
            }
            Box::pin(async move {
                let mut r = Response::new(if conditional {
                    body::empty()
                } else {
                    body::full(bytes::Bytes::from_static(b"0123456789"))
                });
                if conditional {
                    *r.status_mut() = StatusCode::NOT_MODIFIED;
                } else {
                    r.headers_mut().insert(header::CONTENT_LENGTH, 10.into());
                }
                let h = r.headers_mut();
                h.insert(header::ETAG, HeaderValue::from_static("\"a\""));
                h.insert(header::CACHE_CONTROL, HeaderValue::from_static("max-age=0"));
                Ok(r)
            })
        }
    }

    async fn stored(path: &str) -> (Cache, Arc<Validating>, Parts, CacheKey, FreshnessPolicy) {
        let config = CacheConfig::default();
        let mut registry = prometheus_client::registry::Registry::default();
        let cache = Cache::new(&config, None, &mut registry).unwrap();
        let origin = Arc::new(Validating::default());
        let (parts, ()) = Request::get(path).body(()).unwrap().into_parts();
        let key = CacheKey::new("t", &parts.uri);
        let policy = config.policy().freshness();
        let resp = cache.serve(&parts, &key, origin.clone(), &policy).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.into_body().collect().await.unwrap().to_bytes(),
            "0123456789"
        );
        assert_eq!(cache.objects(), 1);
        (cache, origin, parts, key, policy)
    }

    fn cache_status(resp: &Response<Body>) -> String {
        resp.headers()[&CACHE_STATUS].to_str().unwrap().to_string()
    }

    /// Finding (review of a9211f4b): the in-flight revalidations' lock was taken with
    /// `expect`, so once a panic anywhere poisoned it every later revalidation panicked too
    /// (the leader's `Drop` already took the poisoned lock's value).
    #[tokio::test]
    async fn a_poisoned_recheck_lock_does_not_fail_every_revalidation() {
        let (cache, origin, parts, key, policy) = stored("/poisoned").await;
        let inner = cache.inner.clone();
        let poisoner = std::thread::spawn(move || {
            let _held = inner.rechecks.lock().unwrap();
            panic!("poisons the lock");
        });
        assert!(poisoner.join().is_err());
        assert!(cache.inner.rechecks.is_poisoned());
        let resp = cache.serve(&parts, &key, origin.clone(), &policy).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(
            cache_status(&resp).contains("fwd-status=304"),
            "{}",
            cache_status(&resp)
        );
        assert_eq!(origin.conditional.load(Ordering::SeqCst), 1);
    }

    /// Finding (review of a9211f4b): a revalidation that found its object moved (refreshed or
    /// dropped since the request looked) decided again on what was stored, with nothing to
    /// bound how often. Past [`REDECIDE_LIMIT`] it is served as a miss, which passes when the
    /// object is stored (as it is here): one plain origin request, no further decision.
    #[tokio::test]
    async fn a_request_whose_object_keeps_moving_stops_deciding_again() {
        let (cache, origin, parts, key, policy) = stored("/moving").await;
        let Lookup::Hit(now) = cache
            .inner
            .index
            .lookup(&key.0, &parts.headers, Instant::now())
        else {
            panic!("stored");
        };
        // A copy of the stored record: never the one the index holds, so always `Moved`.
        let seen = Arc::new((*now).clone());
        let ask = |depth| Ask {
            parts: &parts,
            key: &key,
            meta: seen.clone(),
            origin: origin.clone(),
            policy: &policy,
            stale_if_error: false,
            depth,
        };
        // Below the limit: decided again, on the stored object (one conditional request).
        let resp = cache.inner.revalidate_and_respond(ask(0)).await;
        assert!(
            cache_status(&resp).contains("fwd-status=304"),
            "{}",
            cache_status(&resp)
        );
        assert_eq!(origin.conditional.load(Ordering::SeqCst), 1);
        // At the limit: a miss, which finds the object stored and passes.
        let asked = origin.asked.load(Ordering::SeqCst);
        let resp = cache
            .inner
            .revalidate_and_respond(ask(REDECIDE_LIMIT))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(
            cache_status(&resp).contains("detail=redecided"),
            "{}",
            cache_status(&resp)
        );
        assert_eq!(origin.asked.load(Ordering::SeqCst), asked + 1);
        assert_eq!(origin.conditional.load(Ordering::SeqCst), 1);
    }
}
