//! Routes with `cache = true`: GET/HEAD through the slice cache with an origin that makes the
//! route's own attempts, `PURGE` to the cache, and invalidation after unsafe methods.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::atomic::Counter;
use http::{Method, Request, Response, StatusCode, Uri, Version};
use sluice_http::{forwarded, hop};
use tokio::time::Instant;

use super::access_log::Entry;
use super::body::{BodySlot, Counted, OnDone, ResponseBody};
use super::budget::RetryBudget;
use super::fast::{FastClient, FastRequest, Served};
use super::fast_write::{write_response, Meters};
use super::forward::{
    attempts, hash_key, rewrite_path, upstream_host, Downstream, FetchError, UpstreamHead,
};
use super::{Reverse, Route};
use crate::body::{self, Body};
use crate::cache::cluster::hop::CLAIM_HEADER;
use crate::cache::cluster::{relay::Local, RelayRequest};
use crate::cache::purge::invalidation_keys;
use crate::cache::{Cache, CacheKey, FreshnessPolicy, Origin, OriginError, OriginFuture};
use crate::error::{ErrorMark, ProxyError};
use crate::upstream::group::InFlight;

/// What the cache keys of a request on a caching route are made of.
pub(super) struct CacheTarget {
    /// The route's name and the host the client asked for (lower case), each prefixed by its
    /// length, so no host (or route) can reach into the other field: `a|b` + `c` and `a` + `b|c`
    /// are different keys.
    scope: String,
    host: String,
    /// The path and query sent upstream (after the route's rewrite).
    target: Uri,
}

impl CacheTarget {
    /// `None` when the route does not cache or the rewritten target is not a URI.
    pub(super) fn of(
        reverse: &Reverse,
        route: &Route,
        uri: &Uri,
        path: &str,
        down: &Downstream,
    ) -> Option<CacheTarget> {
        reverse.cache.as_ref()?;
        route.cache_policy.as_ref()?;
        let mut pq = rewrite_path(&route.config, path);
        let target = if uri.scheme().is_none() && uri.authority().is_none() && pq == uri.path() {
            // Origin form, not rewritten: the client's target as it is (no second parse).
            uri.clone()
        } else {
            if let Some(q) = uri.query() {
                pq.push('?');
                pq.push_str(q);
            }
            pq.parse().ok()?
        };
        let host = down.host.as_deref().unwrap_or("").to_ascii_lowercase();
        Some(CacheTarget {
            scope: scope(&route.name, &host),
            host,
            target,
        })
    }
}

impl CacheTarget {
    /// The key of this target for a request whose forwarding fields tell the origin `claimed`
    /// ([`forwarded::claimed_scope`]): `scope|target`, with ` claimed` after it when there is
    /// one. A trusted peer's `X-Forwarded-Proto: http` and `https` made two answers (a
    /// `force_ssl` redirect for one) that shared a key. Without one, the key is as it was: the
    /// disk tier's records are found by it. After the target (which holds no space), not in the
    /// scope: a tag or prefix purge sent to the route and host reaches every such variant.
    fn key(&self, claimed: Option<&str>) -> CacheKey {
        let key = CacheKey::new(&self.scope, &self.target);
        match claimed {
            Some(c) => with_claimed(key, c),
            None => key,
        }
    }
}

/// The claim part of a request's key: on a vouched relay, the relaying node's ([`CLAIM_HEADER`];
/// none when it names none, as a node sends a relay whose key has no claim, and as a node of an
/// older version sends every relay, whose keys had none); else `own`, made from the fields the
/// origin gets. A client's header (no vouched marker) counts for nothing.
fn relayed_or_own_claim(
    vouched: bool,
    relayed: Option<&http::HeaderValue>,
    own: impl FnOnce() -> Option<String>,
) -> Option<String> {
    if !vouched {
        return own();
    }
    match relayed.map(|v| v.to_str()) {
        Some(Ok(c)) if c != "none" => Some(c.to_string()),
        _ => None,
    }
}

/// `key` for a request whose forwarding fields claim `claimed`.
fn with_claimed(key: CacheKey, claimed: &str) -> CacheKey {
    let mut text = key.0;
    text.reserve(1 + claimed.len());
    text.push(' ');
    text.push_str(claimed);
    CacheKey(text)
}

/// The part of a cache key before the target: the route's name and the host, each prefixed by
/// its length.
fn scope(route: &str, host: &str) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(route.len() + host.len() + 8);
    let _ = write!(s, "{}:{route}{}:{host}", route.len(), host.len());
    s
}

/// Whether `method` goes through the cache (or to its purge) rather than straight upstream.
pub(super) fn cache_method(method: &Method) -> bool {
    method == Method::GET || method == Method::HEAD || method.as_str() == "PURGE"
}

/// Whether a successful `method` invalidates what the cache holds for its target (RFC 9111 §4.4).
pub(super) fn invalidates(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

impl Reverse {
    /// Serves a GET, HEAD or PURGE on a caching route; `start` and `entry` are for the metrics and
    /// the access log, recorded (with the bytes sent) when the body ends.
    pub(super) async fn serve_cached(
        &self,
        route: &Arc<Route>,
        parts: http::request::Parts,
        path: &str,
        down: &Downstream,
        t: CacheTarget,
        (start, entry): (Instant, Option<Entry>),
    ) -> Response<Body> {
        let resp = self
            .cached_response(route, parts, path, down, t, false)
            .await;
        route.meters.ttfb().observe(start.elapsed().as_secs_f64());
        let record = Box::new(self.record(route, start, resp.status().as_u16(), entry));
        resp.map(|b| body::boxed(Counted::new(b, record)))
    }

    /// What a request on a caching route is finished with: metrics and the access log line.
    fn record(
        &self,
        route: &Arc<Route>,
        start: Instant,
        status: u16,
        entry: Option<Entry>,
    ) -> Record {
        Record {
            access_log: self.access_log.clone(),
            route: route.clone(),
            start,
            status,
            entry,
        }
    }

    /// The answer to a GET, HEAD or PURGE on a caching route, with this hop's `Via` and the
    /// route's response edits on what the cache serves.
    async fn cached_response(
        &self,
        route: &Arc<Route>,
        mut parts: http::request::Parts,
        path: &str,
        down: &Downstream,
        t: CacheTarget,
        wire: bool,
    ) -> Response<Body> {
        let (Some(cache), Some(policy)) = (self.cache.as_ref(), route.cache_policy.as_ref()) else {
            // `CacheTarget::of` only exists for caching routes.
            return ProxyError::downstream(StatusCode::NOT_FOUND, "no_cache", "not cached")
                .into_response();
        };
        // In a cache cluster, a request a peer relayed (a valid hop marker) is served here; a
        // client's marker is removed and counts for nothing.
        let cluster = cache.cluster().cloned();
        if cluster.is_none() && parts.method.as_str() != "PURGE" {
            // Only a node's relay may name a claim; without a cluster nothing vouches for one.
            parts.headers.remove(CLAIM_HEADER);
            let key = t.key(self.claimed(&parts.headers, down).as_deref());
            let mut resp = self
                .cached_alone(route, cache, policy, parts, down, (t, &key), wire)
                .await;
            self.response_fields(route, resp.headers_mut(), Version::HTTP_11);
            return resp;
        }
        let relay = cluster.as_ref().map(|c| {
            // The host the cache key and the route were chosen by: an absolute-form target's
            // authority over a `Host` field that differs (RFC 9112 §3.2.2). Taken from `Host`
            // first, the owner was asked for (and routed to) another host's object, which was
            // then stored here under this one's key.
            let authority = down.host.as_deref().unwrap_or_default().to_string();
            let target = parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_string();
            let hop = c.take_hop(
                &mut parts.headers,
                parts.method.as_str(),
                &authority,
                &target,
            );
            (hop, authority, target)
        });
        let vouched = matches!(relay, Some((Some(true), ..)));
        let relay = relay.map(|(hop, authority, target)| (hop.is_some(), authority, target));
        // A request a peer relayed carries that node's forwarding fields (the client's address,
        // scheme and host as it saw them, made by its rules for trusting a client's own), which
        // its marker vouches for: they are extended here as a trusted proxy's, so the origin sees
        // the client, not the node, and never a client's own unchecked `X-Forwarded-For`. A relay
        // from a node before this (its marker vouches for the request line only) carries the
        // client's own fields, which are treated as any client's.
        let relayed_down;
        let down = match vouched {
            true => {
                relayed_down = Downstream {
                    trusted: true,
                    client_ip: parts
                        .headers
                        .get("x-real-ip")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(down.client_ip),
                    ..down.clone()
                };
                &relayed_down
            }
            _ => down,
        };
        // Made from the fields the origin gets (a vouched relay's as a trusted proxy's), or, on
        // a vouched relay that names it, as the node that took the request from the client made
        // it: keyed by the relaying node's fields, its own `X-Forwarded-Proto` made another key
        // here than the one it chose this owner by (and a purge by that key went to).
        let relayed_claim = parts.headers.remove(CLAIM_HEADER);
        let claimed = relayed_or_own_claim(vouched, relayed_claim.as_ref(), || {
            self.claimed(&parts.headers, down)
        });
        // A URL purge names the plain key: it reaches every claimed variant of it
        // (`index::Primaries::Key`), whatever forwarding fields the `PURGE` came with.
        let key = if parts.method.as_str() == "PURGE" {
            t.key(None)
        } else {
            t.key(claimed.as_deref())
        };
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let balance = hash_key(route, target, &parts.headers, down);
        // The purge authorisation below reads the client's own headers: the head gets a copy.
        let head = match self.upstream_head(
            route,
            super::forward::ClientHead::of(&parts),
            parts.headers.clone(),
            path,
            down,
            false,
        ) {
            Ok(head) => head,
            Err(e) => return e.into_response(),
        };
        let mut resp = if parts.method.as_str() == "PURGE" {
            // The purge authorisation reads the client's own headers.
            parts.uri = t.target.clone();
            cache.purge_everywhere(&parts, &key, down.client_ip).await
        } else {
            // The cache sees the request as the upstream would (forwarding headers added, route
            // header edits applied), so its origin requests need no further rewriting.
            let mut cparts = Request::new(()).into_parts().0;
            cparts.method = parts.method.clone();
            cparts.uri = t.target.clone();
            cparts.version = parts.version;
            cparts.headers = head.headers;
            let origin: Arc<dyn Origin> = Arc::new(RouteOrigin {
                budget: self.budget.clone(),
                route: route.clone(),
                host: head.host.and_then(|h| h.value()),
                balance,
            });
            match (cluster, relay) {
                (Some(c), Some((false, authority, target)))
                    if route.config.cache_peer_copy
                        && matches!(c.owner(&key), crate::cache::cluster::Owner::Peer(_)) =>
                {
                    // A local copy, filled from the owner and kept for a short while.
                    let req = RelayRequest {
                        method: parts.method.clone(),
                        authority,
                        target,
                        headers: self.relay_headers(&parts, down, claimed.as_deref()),
                        body_idle: route.idle_timeout,
                    };
                    let origin = c.owner_origin(&key, req, origin);
                    let mut resp = cache
                        .serve(&cparts, &key, origin, &c.copy_policy(policy))
                        .await;
                    c.name_node(resp.headers_mut());
                    resp
                }
                (Some(c), Some((false, authority, target))) => {
                    let local = local_fill(cache, cparts, &key, origin, policy);
                    let req = RelayRequest {
                        method: parts.method.clone(),
                        authority,
                        target,
                        headers: self.relay_headers(&parts, down, claimed.as_deref()),
                        body_idle: route.idle_timeout,
                    };
                    match c.through_owner(&key, req, local.clone()).await {
                        Some(resp) => resp,
                        None => {
                            let mut resp = local(parts.headers.clone()).await;
                            c.name_node(resp.headers_mut());
                            resp
                        }
                    }
                }
                (c, _) => {
                    let mut resp = cache.serve(&cparts, &key, origin, policy).await;
                    if let Some(c) = c {
                        c.name_node(resp.headers_mut());
                    }
                    resp
                }
            }
        };
        if parts.method.as_str() != "PURGE" {
            // As a relayed response gets them: this hop's `Via` (the stored head is an HTTP/1.1
            // origin's as the cache keeps it), the route's removals and additions.
            self.response_fields(route, resp.headers_mut(), Version::HTTP_11);
        }
        resp
    }

    /// What a request's forwarding fields, as they go upstream, tell the origin of the scheme
    /// and host beyond this hop's own: part of its cache key ([`CacheTarget::key`]).
    fn claimed(&self, headers: &http::HeaderMap, down: &Downstream) -> Option<String> {
        if !down.trusted {
            // A client's own are replaced by this hop's: nothing to read.
            return None;
        }
        let hop = forwarded::Hop {
            peer: down.peer.ip(),
            trusted: true,
            client: None,
            proto: if down.secure { "https" } else { "http" },
            host: down.host.as_deref(),
            host_value: None,
            forwarded: self.settings.forwarded,
            via: None,
        };
        forwarded::claimed_scope(headers, &hop)
    }

    /// The fields a miss is relayed to its owner with: the client's, with this node's forwarding
    /// fields made as for an origin (the owner extends them; it took the client's own as the
    /// node's, trusted or replaced as if the node were the client).
    fn relay_headers(
        &self,
        parts: &http::request::Parts,
        down: &Downstream,
        claimed: Option<&str>,
    ) -> http::HeaderMap {
        let mut headers = parts.headers.clone();
        self.relay_forwarding(&mut headers, down, parts.version);
        // The claim this node keyed the request by, for the owner to key it so (`CLAIM_HEADER`);
        // none when there is none, so the marker is signed as before and a node of the previous
        // version still takes the relay (it would refuse a marker over a field it does not know).
        if let Some(v) = claimed.and_then(|c| http::HeaderValue::from_str(c).ok()) {
            headers.insert(CLAIM_HEADER, v);
        }
        headers
    }

    /// A GET or HEAD on a cache of its own (no cluster). A fresh hit whose body is in memory is
    /// answered from the client's fields as the upstream would get them, before anything only an
    /// origin request needs is made: this hop's forwarding fields (unless the object varies on
    /// one), the origin. Anything else goes on to [`Cache::serve`] with those fields added.
    /// `wire`: a whole hit may come with its head as stored bytes (see [`Cache::serve_fresh`]).
    #[allow(clippy::too_many_arguments)]
    async fn cached_alone(
        &self,
        route: &Arc<Route>,
        cache: &Cache,
        policy: &FreshnessPolicy,
        mut parts: http::request::Parts,
        down: &Downstream,
        (t, key): (CacheTarget, &CacheKey),
        wire: bool,
    ) -> Response<Body> {
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let balance = hash_key(route, target, &parts.headers, down);
        let has_authority = parts.uri.authority().is_some();
        let headers = std::mem::take(&mut parts.headers);
        let (headers, client_host) =
            self.upstream_fields(route, headers, down, parts.version, false);
        let mut cparts = Request::new(()).into_parts().0;
        cparts.method = parts.method;
        cparts.uri = t.target;
        cparts.version = parts.version;
        cparts.headers = headers;
        if let Some(resp) = cache.serve_fresh(&cparts, key, policy, &forwarded::FIELDS, wire) {
            return resp;
        }
        self.add_forwarding(route, &mut cparts.headers, down, parts.version);
        let origin: Arc<dyn Origin> = Arc::new(RouteOrigin {
            budget: self.budget.clone(),
            route: route.clone(),
            host: upstream_host(route, down, has_authority, client_host),
            balance,
        });
        cache.serve(&cparts, key, origin, policy).await
    }

    /// Serves a GET or HEAD on a caching route from the HTTP/1.1 fast path (`server::h1fast`)
    /// exactly as [`Reverse::handle`] does through hyper, and writes the answer itself: a
    /// memory-tier hit of file-backed slices goes out with `sendfile` (`fast_write`).
    pub(super) async fn serve_cached_fast<W: FastClient>(
        &self,
        route: &Arc<Route>,
        req: FastRequest<'_>,
        path: &str,
        down: &Downstream,
        client: &mut W,
        (on_head, sent_meter): (impl FnOnce(u16, Option<ErrorMark>), &Counter),
    ) -> Served {
        let start = Instant::now();
        self.budget.record_request();
        let (close, head_only) = (req.close, req.method == Method::HEAD);
        let alt_svc = req.alt_svc.clone();
        let entry = self.log_entry(
            route,
            down,
            &req.method,
            req.target,
            Version::HTTP_11,
            &req.headers,
        );
        let mut parts = Request::new(()).into_parts().0;
        parts.method = req.method;
        parts.version = Version::HTTP_11;
        parts.headers = req.headers;
        // The fast path only takes origin-form targets `http` accepts.
        parts.uri = req.target.parse().unwrap_or_default();
        // A hit's head may be written from the stored bytes when nothing on the way edits it:
        // no `Via`, no route response edits, no `Alt-Svc` to offer.
        let wire = !head_only
            && alt_svc.is_none()
            && !self.settings.via
            && route.resp_remove.is_empty()
            && route.resp_add.is_empty();
        let mut resp = match CacheTarget::of(self, route, &parts.uri, path, down) {
            Some(t) => {
                self.cached_response(route, parts, path, down, t, wire)
                    .await
            }
            // As `upstream_head` answers on hyper's path.
            None => ProxyError::new(
                crate::error::Side::Upstream,
                StatusCode::BAD_GATEWAY,
                "bad_rewrite",
                "the rewritten request target is invalid",
            )
            .into_response(),
        };
        route.meters.ttfb().observe(start.elapsed().as_secs_f64());
        super::fast::offer_alt_svc(resp.headers_mut(), alt_svc);
        let status = resp.status().as_u16();
        let record = Box::new(self.record(route, start, status, entry));
        on_head(status, resp.extensions().get::<ErrorMark>().copied());
        let meter = self
            .cache
            .as_ref()
            .map(|c| c.sendfile_meter())
            .unwrap_or_default();
        let bytes = AtomicU64::new(0);
        let meters = Meters {
            sent: sent_meter,
            sendfile: &meter,
            body: &bytes,
        };
        let complete = write_response(client, resp, head_only, close, meters).await;
        record.done(bytes.into_inner(), complete);
        Served {
            status,
            reusable: complete && !close,
        }
    }

    /// Drops what the cache holds for the target (and same-host `Location` / `Content-Location`)
    /// after an unsafe method got a success or redirect.
    pub(super) fn invalidate_after(
        &self,
        t: &CacheTarget,
        status: StatusCode,
        headers: &http::HeaderMap,
    ) {
        if let Some(cache) = &self.cache {
            // Plain keys: each reaches every claimed variant of it (`index::Primaries::Key`),
            // whatever forwarding fields the objects were stored with.
            cache.invalidate(&invalidation_keys(
                &t.scope, &t.host, &t.target, status, headers,
            ));
        }
    }
}

/// This node's own answer to a request of a cluster (its cache and the route's origin), with
/// the client's `Range` and conditionals of `client` over the upstream view `cparts`: a miss this
/// node owns, one whose owners all failed, and the rest of a body an owner stopped sending.
fn local_fill(
    cache: &Cache,
    cparts: http::request::Parts,
    key: &CacheKey,
    origin: Arc<dyn Origin>,
    policy: &FreshnessPolicy,
) -> Local {
    let (cache, key, policy) = (cache.clone(), key.clone(), policy.clone());
    let cparts = Arc::new(cparts);
    Arc::new(move |client: http::HeaderMap| {
        let (cache, key, policy, origin) =
            (cache.clone(), key.clone(), policy.clone(), origin.clone());
        let mut parts = Request::new(()).into_parts().0;
        parts.method = cparts.method.clone();
        parts.uri = cparts.uri.clone();
        parts.version = cparts.version;
        parts.headers = cparts.headers.clone();
        for name in [
            http::header::RANGE,
            http::header::IF_RANGE,
            http::header::IF_NONE_MATCH,
            http::header::IF_MODIFIED_SINCE,
            http::header::IF_MATCH,
            http::header::IF_UNMODIFIED_SINCE,
        ] {
            parts.headers.remove(&name);
            for v in client.get_all(&name) {
                parts.headers.append(name.clone(), v.clone());
            }
        }
        Box::pin(async move { cache.serve(&parts, &key, origin, &policy).await })
    })
}

/// The cache's origin for one request: the route's attempts across its upstream group
/// (balancing, retries, retry budget, timeouts) with a bodiless request. Owns everything it uses,
/// since a fill may outlive the request and a reload.
struct RouteOrigin {
    budget: Arc<RetryBudget>,
    route: Arc<Route>,
    host: Option<http::HeaderValue>,
    balance: Option<Vec<u8>>,
}

impl Origin for RouteOrigin {
    fn fetch(&self, req: Request<()>) -> OriginFuture {
        let (mut parts, ()) = req.into_parts();
        // The cache's origin requests carry no body: a client's framing fields must not go on with
        // them (a `Content-Length` left on a bodiless GET would have the origin take the next
        // request on the pooled connection as its body).
        parts.headers.remove(http::header::CONTENT_LENGTH);
        parts.headers.remove(http::header::TRANSFER_ENCODING);
        parts.headers.remove(http::header::EXPECT);
        let mut head = UpstreamHead {
            method: parts.method,
            path_and_query: parts
                .uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
            headers: parts.headers,
            upgrade: false,
            host: self.host.clone().map(super::forward::ClientHost::Field),
            forwarding: None,
        };
        let (budget, route) = (self.budget.clone(), self.route.clone());
        let balance = self.balance.clone();
        Box::pin(async move {
            let slot = BodySlot::empty(route.idle_timeout);
            let fetched = attempts(&budget, &route, &mut head, &slot, balance.as_deref())
                .await
                .map_err(|e| match e {
                    FetchError::HeaderTimeout { .. } | FetchError::ConnectTimeout { .. } => {
                        OriginError::Timeout
                    }
                    // Out of this side's resources: not the origin's failure.
                    e @ FetchError::Local { .. } => OriginError::Local(e.to_string()),
                    other => OriginError::Unreachable(other.to_string()),
                })?;
            let (p, incoming) = fetched.response.into_parts();
            let mut headers = p.headers;
            hop::strip_hop_by_hop(&mut headers, false);
            let mut out = Response::new(body::boxed(ResponseBody::new(
                incoming,
                route.idle_timeout,
                Box::new(Hold(fetched.in_flight)),
            )));
            *out.status_mut() = p.status;
            *out.headers_mut() = headers;
            Ok(out)
        })
    }
}

/// The end of a request on a caching route: metrics, and the access log line with the bytes
/// the client got.
struct Record {
    access_log: Option<super::access_log::AccessLog>,
    route: Arc<Route>,
    start: Instant,
    status: u16,
    entry: Option<Entry>,
}

impl OnDone for Record {
    fn done(self: Box<Self>, bytes: u64, _complete: bool) {
        let duration = self.start.elapsed();
        self.route.meters.requests(self.status).inc();
        self.route.meters.total().observe(duration.as_secs_f64());
        if let (Some(log), Some(mut entry)) = (&self.access_log, self.entry) {
            entry.status = self.status;
            entry.bytes = bytes;
            entry.duration = duration;
            log.record(&entry);
        }
    }
}

/// Keeps the server's in-flight mark (least-connections balancing) until the fill's body ends.
struct Hold(#[allow(dead_code)] InFlight);

impl OnDone for Hold {
    fn done(self: Box<Self>, _bytes: u64, _complete: bool) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_fields_cannot_run_into_each_other() {
        let key = |route: &str, host: &str, target: &str| {
            CacheKey::new(&scope(route, host), &target.parse().unwrap()).0
        };
        assert_eq!(key("*/", "a.test", "/x"), "2:*/6:a.test|/x");
        // `|` or digits and `:` in one field never make the key of other fields.
        assert_ne!(
            key("r", "shop.test|/y", "/z"),
            key("r", "shop.test", "/y|/z")
        );
        assert_ne!(key("r|a", "b", "/"), key("r", "a|b", "/"));
        assert_ne!(key("r", "1:a", "/"), key("r1:", "a", "/"));
    }

    /// What a trusted peer's forwarding fields claim (another scheme or host) follows the
    /// target; without a claim the key is as stored objects have it, and either way it stays in
    /// its route and host's scope, which tag purges go by.
    #[test]
    fn a_claimed_scheme_or_host_makes_another_key_in_the_same_scope() {
        let t = CacheTarget {
            scope: scope("r", "a.test"),
            host: "a.test".into(),
            target: "/x?y=1".parse().unwrap(),
        };
        assert_eq!(t.key(None).0, "1:r6:a.test|/x?y=1");
        let https = forwarded::claimed_text("https", Some("a.test"));
        let http = forwarded::claimed_text("http", Some("A.test"));
        let keys = [t.key(None), t.key(Some(&https)), t.key(Some(&http))];
        assert_eq!(keys[1].0, "1:r6:a.test|/x?y=1 5:https6:a.test");
        assert!(keys[0] != keys[1] && keys[1] != keys[2] && keys[2] != keys[0]);
        for k in &keys {
            assert_eq!(crate::cache::purge::key_scope(&k.0), "1:r6:a.test|");
        }
    }

    /// Finding: the owner of a relayed miss keyed it by the relaying node's forwarding fields
    /// taken as a trusted proxy's: a client on TLS to an untrusted node (plain key there, the
    /// owner chosen by it) came with that node's own `X-Forwarded-Proto: https`, a claim on the
    /// owner (plain http): a second copy, which a purge by the plain key missed. The owner keys
    /// it as the relaying node did; a client's header counts for nothing.
    #[test]
    fn a_vouched_relay_is_keyed_by_the_relaying_nodes_claim() {
        let own = || Some(forwarded::claimed_text("https", Some("a.test")));
        let none = http::HeaderValue::from_static("none");
        let https = forwarded::claimed_text("https", Some("a.test"));
        let named = http::HeaderValue::from_str(&https).unwrap();
        assert_eq!(relayed_or_own_claim(true, Some(&none), own), None);
        assert_eq!(
            relayed_or_own_claim(true, Some(&named), || None),
            Some(https)
        );
        // A relay naming none (no claim, or a node of the previous version): no claim, not
        // the owner's own (its trusted-proxy view of the relaying node's fields).
        assert_eq!(relayed_or_own_claim(true, None, own), None);
        // A client's (no vouched marker): ignored.
        assert_eq!(relayed_or_own_claim(false, Some(&none), own), own());
        assert_eq!(relayed_or_own_claim(false, Some(&named), || None), None);
        let t = CacheTarget {
            scope: scope("r", "a.test"),
            host: "a.test".into(),
            target: "/x".parse().unwrap(),
        };
        assert_eq!(
            t.key(relayed_or_own_claim(true, Some(&none), own).as_deref()),
            t.key(None)
        );
    }
}
