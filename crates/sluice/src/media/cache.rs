//! The media front end on the slice cache service: MPDs, `sidx` boxes, init and media segments
//! fetched through [`crate::cache::Cache`] under keys that cover the whole upstream request.
//!
//! Keys ([`request_key`]): `media|<fingerprint>|<url>`, where the fingerprint is a SHA-256 over
//! the method, the URL and every header sluice sends with every value. Two viewers share bytes
//! only when sluice would send the origin byte-identical requests, so one user's cookie or
//! authorization never fetches bytes for another. Requests whose own headers decide what the
//! origin answers (`h_range`, `h_if-*`) bypass the cache: a partial or conditional answer is
//! not the object the key names.
//!
//! A byte range of an object (DASH `SegmentBase`, HLS `EXT-X-BYTERANGE`) is a `Range` on the
//! whole object's key, so the cache fetches only the slices it covers and every range of one file
//! shares them. The cache asks the origin through [`MediaOrigin`], which sends the user's headers
//! plus the cache's own `Range` and conditionals to the full URL, and remembers why an exchange
//! failed so the player gets the same error (403 from the address guard, 504 on a timeout) as
//! without the cache.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::atomic::Counter;
use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sluice_media::dash::proxy::Part;
use url::Url;

use super::MediaConfig;
use crate::body::Body;
use crate::cache::config::PolicyConfig;
use crate::cache::{Cache, CacheKey, FreshnessPolicy, Origin, OriginFuture};
use crate::error::{ProxyError, Side};
use crate::upstream::{Upstream, UpstreamRequest};

/// The URL that answered after redirects, kept with a stored object when it differs from the one
/// asked (relative URLs in an MPD resolve against it). Only the media front end reads it; it
/// never reaches a client.
static FINAL_URL: HeaderName = HeaderName::from_static("sluice-final-url");

/// Request headers that make the origin answer something other than the whole, current object.
const NOT_CACHEABLE_WITH: [HeaderName; 6] = [
    header::RANGE,
    header::IF_RANGE,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
];

/// Whether a fetch with `headers` goes around the cache: the user's own `Range` or conditional
/// (`h_range`, `h_if-*`) makes the origin's answer not the object the key names.
pub fn bypasses(headers: &HeaderMap) -> bool {
    NOT_CACHEABLE_WITH.iter().any(|h| headers.contains_key(h))
}

/// What a fetch is for: picks the default lifetime and labels the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheKind {
    Mpd,
    /// A `SegmentBase` track's `sidx` bytes.
    Sidx,
    Init,
    /// A media segment (by a player request or by prefetch).
    Segment,
}

impl CacheKind {
    fn label(self) -> &'static str {
        match self {
            CacheKind::Mpd => "mpd",
            CacheKind::Sidx => "sidx",
            CacheKind::Init => "init",
            CacheKind::Segment => "segment",
        }
    }

    fn what(self) -> &'static str {
        match self {
            CacheKind::Mpd => "the MPD",
            _ => "a media object",
        }
    }
}

/// Label of per-kind series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

/// How the media front end's fetches went, by kind (the cache's own `sluice_cache_*` families
/// count bytes, tiers and evictions for every user of the cache).
#[derive(Clone, Default)]
pub struct MediaCacheMetrics {
    hits: Family<KindLabels, Counter>,
    misses: Family<KindLabels, Counter>,
    coalesced: Family<KindLabels, Counter>,
    bypassed: Family<KindLabels, Counter>,
}

impl MediaCacheMetrics {
    /// Registers the families under `media_cache_`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = MediaCacheMetrics::default();
        let sub = registry.sub_registry_with_prefix("media_cache");
        sub.register(
            "hits",
            "Media fetches answered by the cache without the origin, by kind",
            m.hits.clone(),
        );
        sub.register(
            "misses",
            "Media fetches that went to the origin through the cache, by kind",
            m.misses.clone(),
        );
        sub.register(
            "coalesced",
            "Media fetches that joined a fetch already in flight, by kind",
            m.coalesced.clone(),
        );
        sub.register(
            "bypassed",
            "Media fetches sent around the cache (caching off, own Range or conditional, or an uncacheable answer), by kind",
            m.bypassed.clone(),
        );
        m
    }

    /// Counts one fetch: `cache_status` is the cache's `Cache-Status`, `None` for a fetch sent
    /// around the cache.
    fn count(&self, kind: CacheKind, cache_status: Option<&str>) {
        let label = KindLabels { kind: kind.label() };
        let family = match cache_status {
            None => &self.bypassed,
            // Answered with the cache's bytes: fresh, stale-while-revalidate, after a 304, or
            // stale-if-error.
            Some(s)
                if s.contains("; hit")
                    || s.contains("fwd-status=304")
                    || s.contains("stale-if-error") =>
            {
                &self.hits
            }
            Some(s) if s.contains("collapsed") => &self.coalesced,
            Some(s) if s.contains("fwd=bypass") || s.contains("detail=") => &self.bypassed,
            // Fetched through the cache (stored), or failed on the way.
            Some(_) => &self.misses,
        };
        family.get_or_create(&label).inc();
    }
}

/// One object's bytes, as fetched or from the cache.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub bytes: Bytes,
    /// The URL that answered, after redirects.
    pub final_url: Url,
    /// Seconds since the origin produced it (`Age`; 0 when fetched just now).
    pub age: u64,
}

/// The media front end's cache: the shared service (or none) and a policy per kind.
pub struct MediaCache {
    cache: Option<Cache>,
    upstream: Upstream,
    mpd: FreshnessPolicy,
    init: FreshnessPolicy,
    segment: FreshnessPolicy,
    metrics: MediaCacheMetrics,
}

impl MediaCache {
    /// `cache`: the process's slice cache, `None` when the media front end does not cache.
    /// `defaults`: the `[cache]` policy keys the media lifetimes are applied over.
    pub fn new(
        cache: Option<Cache>,
        upstream: Upstream,
        config: &MediaConfig,
        defaults: &PolicyConfig,
        metrics: MediaCacheMetrics,
    ) -> Arc<MediaCache> {
        let me = Arc::new(MediaCache {
            cache,
            upstream,
            mpd: media_policy(defaults, config.mpd_ttl_secs),
            init: media_policy(defaults, config.init_ttl_secs),
            segment: media_policy(defaults, config.segment_ttl_secs),
            metrics,
        });
        super::cluster::register(&me);
        me
    }

    fn policy(&self, kind: CacheKind) -> &FreshnessPolicy {
        match kind {
            CacheKind::Mpd => &self.mpd,
            CacheKind::Sidx | CacheKind::Init => &self.init,
            CacheKind::Segment => &self.segment,
        }
    }

    /// Whether `part` fetched with `headers` is cached and fresh, or being fetched (prefetch skips
    /// it then).
    pub fn holds(&self, part: &Part, headers: &HeaderMap) -> bool {
        self.cache
            .as_ref()
            .is_some_and(|c| c.holds(&request_key(&part.url, headers)))
    }

    /// Whether `part` fetched with `headers` is marked to pass: its last answer could not be
    /// stored (`no-store`, `private`...), so a fetch ahead of the player would be thrown away.
    pub fn passes(&self, part: &Part, headers: &HeaderMap) -> bool {
        self.cache
            .as_ref()
            .is_some_and(|c| c.passes(&request_key(&part.url, headers)))
    }

    /// The bytes of `part` (the whole object, or exactly its byte range), at most `limit`, from
    /// the cache or the origin. `max_age`: the most seconds a cached copy may have aged (a live
    /// MPD's refresh period); older copies are revalidated or fetched again. A non-2xx answer is
    /// an error with the upstream's status, so players see the 404 or 403 the origin gave.
    pub async fn fetch(
        &self,
        kind: CacheKind,
        part: &Part,
        headers: &HeaderMap,
        limit: usize,
        max_age: Option<u64>,
    ) -> Result<Fetched, ProxyError> {
        let cache = match &self.cache {
            Some(c) if !bypasses(headers) => c,
            _ => {
                self.metrics.count(kind, None);
                return fetch_direct(&self.upstream, kind, part, headers, limit).await;
            }
        };
        let key = request_key(&part.url, headers);
        // In a cache cluster, the key's owner fills it (one origin fetch for the cluster).
        let peer = match cache.cluster() {
            Some(cluster) => {
                let order = super::cluster::order(kind, part, headers, max_age);
                cluster
                    .fill_via_owner(super::cluster::FILL, &key, order)
                    .await
            }
            None => None,
        };
        let resp = match peer {
            Some(resp) => resp,
            None => {
                self.serve_local(cache, &key, kind, part, headers, max_age)
                    .await?
            }
        };
        let status = resp.headers().get("cache-status");
        self.metrics.count(
            kind,
            Some(status.and_then(|v| v.to_str().ok()).unwrap_or("")),
        );
        let host = part.url.host_str().unwrap_or("").to_owned();
        if !resp.status().is_success() {
            return Err(ProxyError::upstream_status(
                resp.status(),
                &host,
                kind.what(),
            ));
        }
        let final_url = resp
            .headers()
            .get(&FINAL_URL)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| Url::parse(v).ok())
            .unwrap_or_else(|| part.url.clone());
        let age = resp
            .headers()
            .get(header::AGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let partial = resp.status() == StatusCode::PARTIAL_CONTENT;
        let deadline = self.upstream.whole_body_timeout();
        let body = collect_limited(resp.into_body(), limit, deadline)
            .await
            .map_err(|e| match e {
                CollectError::Deadline => body_error(
                    &host,
                    kind,
                    format!(
                        "upstream {host} did not finish the body within {} s",
                        deadline.as_secs()
                    ),
                ),
                e => body_error(&host, kind, e),
            })?;
        Ok(Fetched {
            bytes: exact_range(part.range, partial, body),
            final_url,
            age,
        })
    }
}

impl MediaCache {
    /// `part` through this node's own cache: the answer, or why the origin exchange failed
    /// (the same error as without the cache).
    pub(super) async fn serve_local(
        &self,
        cache: &Cache,
        key: &CacheKey,
        kind: CacheKind,
        part: &Part,
        headers: &HeaderMap,
        max_age: Option<u64>,
    ) -> Result<Response<Body>, ProxyError> {
        let origin = Arc::new(MediaOrigin {
            upstream: self.upstream.clone(),
            url: part.url.clone(),
            headers: headers.clone(),
            error: Arc::default(),
        });
        let mut req = Request::new(());
        *req.method_mut() = Method::GET;
        if let Some((a, b)) = part.range {
            req.headers_mut().insert(header::RANGE, range_value(a, b));
        }
        if let Some(secs) = max_age {
            req.headers_mut().insert(
                header::CACHE_CONTROL,
                HeaderValue::from_str(&format!("max-age={secs}")).expect("digits"),
            );
        }
        let (parts, ()) = req.into_parts();
        let dyn_origin: Arc<dyn Origin> = origin.clone();
        let resp = cache
            .serve(&parts, key, dyn_origin, self.policy(kind))
            .await;
        if !resp.status().is_success() {
            if let Some(e) = origin.take_error() {
                return Err(e);
            }
        }
        Ok(resp)
    }

    /// The process's cache, for a peer's fill (`media::cluster`).
    pub(super) fn cache(&self) -> Option<&Cache> {
        self.cache.as_ref()
    }
}

/// The `[cache]` policy with a media kind's lifetime: an origin's own freshness (`max-age`,
/// `Expires`, `no-cache`...) is honoured; without it the object stays fresh for `ttl_secs`, with
/// `Last-Modified` too (a segment written a second ago must not be stale at once).
fn media_policy(defaults: &PolicyConfig, ttl_secs: u64) -> FreshnessPolicy {
    let mut p = defaults.freshness();
    let ttl = Duration::from_secs(ttl_secs);
    p.default_ttl = ttl;
    p.heuristic_min = ttl;
    p.heuristic_max = ttl;
    // Only sluice's own directives (a live MPD's `max-age`) reach the cache: honour them.
    p.request_directives = sluice_http::freshness::RequestDirectives::Honor;
    // No origin's `Set-Cookie` reaches a media client: refusing a shared answer for it keeps
    // nothing from anyone, and leaves every viewer of a `public` segment behind a load
    // balancer's cookie to the origin (the rule before reverse routes refused them all).
    p.store_shared_set_cookie = true;
    p
}

/// The cache key of whatever sluice fetches from `url` with `headers` (see the module docs).
pub fn request_key(url: &Url, headers: &HeaderMap) -> CacheKey {
    let req = UpstreamRequest {
        method: Method::GET,
        url: url.clone(),
        headers: headers.clone(),
    };
    let fp = request_fingerprint(&req);
    let hex: String = fp.iter().map(|b| format!("{b:02x}")).collect();
    // Reverse-proxy keys start with a route name, which always holds a `/` before the first `|`.
    CacheKey(format!("media|{hex}|{url}"))
}

/// SHA-256 over a length-prefixed encoding of the request (method, URL, every header with every
/// value, names sorted, values in order), so no two different requests give one byte stream. The
/// outgoing route (direct, proxy, TLS checks) is a function of the URL's host and the default
/// User-Agent a constant of the configuration, so both are covered by the URL.
pub fn request_fingerprint(req: &UpstreamRequest) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(req.method.as_str().as_bytes());
    field(req.url.as_str().as_bytes());
    let mut names: Vec<&HeaderName> = req.headers.keys().collect();
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    for name in names {
        for value in req.headers.get_all(name) {
            field(name.as_str().as_bytes());
            field(value.as_bytes());
        }
    }
    h.finalize().into()
}

/// The cache's origin for one media fetch: the full URL with the user's headers, plus the
/// cache's `Range` and conditionals. Remembers why an exchange failed.
struct MediaOrigin {
    upstream: Upstream,
    url: Url,
    headers: HeaderMap,
    /// Why the last exchange failed (read by the request that made this origin).
    error: Arc<Mutex<Option<ProxyError>>>,
}

impl MediaOrigin {
    fn take_error(&self) -> Option<ProxyError> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl Origin for MediaOrigin {
    fn fetch(&self, req: Request<()>) -> OriginFuture {
        let (parts, ()) = req.into_parts();
        let mut headers = self.headers.clone();
        for name in &NOT_CACHEABLE_WITH {
            for v in parts.headers.get_all(name) {
                headers.append(name.clone(), v.clone());
            }
        }
        let request = UpstreamRequest {
            method: parts.method,
            url: self.url.clone(),
            headers,
        };
        let upstream = self.upstream.clone();
        let asked = self.url.clone();
        let slot = self.error.clone();
        Box::pin(async move {
            match upstream.send(request).await {
                Ok(resp) => {
                    let mut out = Response::new(crate::body::boxed(resp.body));
                    *out.status_mut() = resp.status;
                    *out.headers_mut() = resp.headers;
                    if resp.status.as_u16() >= 400 && !explicit_freshness(out.headers()) {
                        // The media lifetimes are for objects; an error (a live segment asked
                        // for a moment early) is kept only as long as the origin itself says.
                        out.headers_mut()
                            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                    }
                    if resp.final_url != asked {
                        if let Ok(v) = HeaderValue::from_str(resp.final_url.as_str()) {
                            out.headers_mut().insert(FINAL_URL.clone(), v);
                        }
                    }
                    Ok(out)
                }
                Err(e) => {
                    *slot.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(ProxyError::from_upstream(&e));
                    Err(crate::cache::origin::origin_error(e))
                }
            }
        })
    }
}

/// Whether the origin gave the answer a lifetime of its own (`max-age`, `s-maxage`, `Expires`,
/// `CDN-Cache-Control`).
fn explicit_freshness(headers: &HeaderMap) -> bool {
    let cc = sluice_http::cache_control::parse_cache_control(headers);
    cc.max_age.is_some()
        || cc.s_maxage.is_some()
        || headers.contains_key(header::EXPIRES)
        || headers.contains_key("cdn-cache-control")
}

/// `bytes=a-b` (digits only, so always a valid value).
fn range_value(a: u64, b: u64) -> HeaderValue {
    HeaderValue::from_str(&format!("bytes={a}-{b}")).expect("digits")
}

/// Exactly `range` of an answer: a 206 is taken as it is; a 200 (an origin that ignores `Range`)
/// is cut to the range.
fn exact_range(range: Option<(u64, u64)>, partial: bool, body: Bytes) -> Bytes {
    match range {
        Some((a, b)) if !partial => {
            let end = (b as usize).saturating_add(1).min(body.len());
            let start = (a as usize).min(end);
            body.slice(start..end)
        }
        _ => body,
    }
}

/// Why a body could not be read whole.
#[derive(Debug, thiserror::Error)]
enum CollectError {
    #[error("{0}")]
    Body(String),
    #[error("upstream body larger than {limit} bytes")]
    TooLarge { limit: usize },
    /// Not whole within `upstream.whole_body_timeout_secs`: the cache's fill has idle deadlines
    /// only, so a byte a minute would hold this request for good.
    #[error("the body did not finish in time")]
    Deadline,
}

async fn collect_limited(
    body: Body,
    limit: usize,
    deadline: Duration,
) -> Result<Bytes, CollectError> {
    let collect = async {
        let mut body = std::pin::pin!(body);
        let mut out = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| CollectError::Body(e.to_string()))?;
            if let Ok(data) = frame.into_data() {
                if out.len() + data.len() > limit {
                    return Err(CollectError::TooLarge { limit });
                }
                out.extend_from_slice(&data);
            }
        }
        Ok(out.freeze())
    };
    tokio::time::timeout(deadline, collect)
        .await
        .map_err(|_| CollectError::Deadline)?
}

fn body_error(host: &str, kind: CacheKind, e: impl std::fmt::Display) -> ProxyError {
    let message = match kind {
        CacheKind::Mpd => format!("MPD: {e}"),
        _ => e.to_string(),
    };
    let mut err = ProxyError::new(
        Side::Upstream,
        StatusCode::BAD_GATEWAY,
        "upstream_body",
        message,
    );
    err.upstream = Some(host.to_string());
    err
}

/// Fetches `part` straight from the origin (no cache, or headers that make the answer the
/// requester's own).
async fn fetch_direct(
    upstream: &Upstream,
    kind: CacheKind,
    part: &Part,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Fetched, ProxyError> {
    let mut headers = headers.clone();
    if let Some((a, b)) = part.range {
        headers.insert(header::RANGE, range_value(a, b));
    }
    let req = UpstreamRequest {
        method: Method::GET,
        url: part.url.clone(),
        headers,
    };
    let host = part.url.host_str().unwrap_or("").to_owned();
    let resp = upstream
        .send(req)
        .await
        .map_err(|e| ProxyError::from_upstream(&e))?;
    if !resp.status.is_success() {
        return Err(ProxyError::upstream_status(resp.status, &host, kind.what()));
    }
    let partial = resp.status == StatusCode::PARTIAL_CONTENT;
    let final_url = resp.final_url.clone();
    let body = resp
        .body
        .collect_limited(limit)
        .await
        .map_err(|e| body_error(&host, kind, e))?;
    Ok(Fetched {
        bytes: exact_range(part.range, partial, body),
        final_url,
        age: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(headers: &[(&'static str, &'static str)]) -> CacheKey {
        let mut h = HeaderMap::new();
        for (n, v) in headers {
            h.append(*n, HeaderValue::from_static(v));
        }
        request_key(&Url::parse("http://o/seg.ts").unwrap(), &h)
    }

    #[test]
    fn key_covers_every_request_header() {
        let plain = with(&[]);
        assert_eq!(plain, with(&[]));
        assert_ne!(
            plain,
            request_key(&Url::parse("http://o/seg2.ts").unwrap(), &HeaderMap::new())
        );
        // Every header and value counts; order of different names does not.
        assert_ne!(plain, with(&[("cookie", "a=1")]));
        assert_ne!(with(&[("cookie", "a=1")]), with(&[("cookie", "a=2")]));
        assert_ne!(with(&[("authorization", "A")]), with(&[("cookie", "A")]));
        assert_ne!(plain, with(&[("host", "other")]));
        assert_eq!(
            with(&[("x-a", "1"), ("x-b", "2")]),
            with(&[("x-b", "2"), ("x-a", "1")])
        );
        assert_ne!(
            with(&[("x-a", "1"), ("x-a", "2")]),
            with(&[("x-a", "2"), ("x-a", "1")])
        );
        // Length prefixes: moving bytes between name and value changes the key.
        assert_ne!(with(&[("x-ab", "c")]), with(&[("x-a", "bc")]));
        let mut head = UpstreamRequest::get(Url::parse("http://o/seg.ts").unwrap());
        let get = request_fingerprint(&head);
        head.method = Method::HEAD;
        assert_ne!(get, request_fingerprint(&head));
        // Readable, and apart from every reverse-proxy key (those hold a `/` before the first `|`).
        assert!(plain.0.starts_with("media|") && plain.0.ends_with("|http://o/seg.ts"));
    }

    #[test]
    fn ranges_are_cut_from_whole_answers_only() {
        let body = Bytes::from_static(b"0123456789");
        assert_eq!(exact_range(Some((2, 4)), false, body.clone()), "234");
        assert_eq!(exact_range(Some((8, 20)), false, body.clone()), "89");
        assert_eq!(
            exact_range(Some((2, 4)), true, Bytes::from_static(b"234")),
            "234"
        );
        assert_eq!(exact_range(None, false, body.clone()), body);
    }

    /// Finding: with reverse routes' rule (every answer with `Set-Cookie` passed), a `public`
    /// segment behind a load balancer's cookie (AWSALB) was never stored, so each viewer
    /// fetched it and prefetch stopped; media clients never get an origin's `Set-Cookie`.
    #[test]
    fn a_shared_segment_with_set_cookie_is_stored_for_media() {
        let p = media_policy(&PolicyConfig::default(), 60);
        let mut h = HeaderMap::new();
        h.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("public, max-age=6"),
        );
        h.insert(header::SET_COOKIE, HeaderValue::from_static("AWSALB=x"));
        let store = |h: &HeaderMap| {
            sluice_http::freshness::storability(
                &Method::GET,
                &HeaderMap::new(),
                StatusCode::OK,
                h,
                std::time::SystemTime::now(),
                &p,
            )
        };
        assert_eq!(store(&h).map(|f| f.lifetime), Ok(6));
        // Not marked shared: refused, as ever.
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("max-age=6"));
        assert_eq!(
            store(&h).map(|f| f.lifetime),
            Err(sluice_http::freshness::NotStorable::SetCookie)
        );
    }

    #[test]
    fn media_lifetimes_apply_without_origin_freshness() {
        let p = media_policy(&PolicyConfig::default(), 60);
        assert_eq!(p.default_ttl, Duration::from_secs(60));
        assert_eq!(p.heuristic_min, p.heuristic_max);
        // A just-written file with Last-Modified is fresh for the media lifetime.
        let now = std::time::SystemTime::now();
        let mut h = HeaderMap::new();
        let date = httpdate::fmt_http_date(now);
        h.insert(header::DATE, HeaderValue::from_str(&date).unwrap());
        h.insert(header::LAST_MODIFIED, HeaderValue::from_str(&date).unwrap());
        let f = sluice_http::freshness::storability(
            &Method::GET,
            &HeaderMap::new(),
            StatusCode::OK,
            &h,
            now,
            &p,
        )
        .unwrap();
        assert_eq!(f.lifetime, 60);
        // The origin's own word wins.
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("max-age=5"));
        let f = sluice_http::freshness::storability(
            &Method::GET,
            &HeaderMap::new(),
            StatusCode::OK,
            &h,
            now,
            &p,
        )
        .unwrap();
        assert_eq!(f.lifetime, 5);
    }
}
