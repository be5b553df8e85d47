//! The slice cache service end to end: a small hyper front on 127.0.0.1:0 calling `Cache::serve`
//! in front of a scripted origin that counts requests and bytes, section by section of RFC 9111,
//! plus coalescing, slices of a cold multi-GB object, version changes, the disk tier and purge.

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::registry::Registry;
use sluice::cache::{ByteSize, Cache, CacheConfig, CacheKey, Origin, OriginError, OriginFuture};
use support::{request, sha256};
use tokio::net::TcpListener;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

// === the scripted origin ===

/// One object the origin serves; its bytes are a function of the offset and the version, so any
/// range of a huge object is generated on the fly.
#[derive(Clone)]
struct Obj {
    len: u64,
    version: u8,
    headers: Vec<(&'static str, String)>,
    honor_range: bool,
    status: u16,
    /// Delay before the response head.
    delay: Duration,
    /// Answer 500 instead.
    fail: bool,
    /// Stop sending (without closing) on reaching this offset of the object.
    stall_after: Option<u64>,
    /// Send the body one byte at a time, this long apart (inside any idle wait, never done).
    trickle: Option<Duration>,
    /// The bytes depend on the request's Accept-Encoding (with `Vary: Accept-Encoding`).
    by_encoding: bool,
    /// The next answer whose body reaches this offset of the object ends there, short of its
    /// `Content-Length` (the connection is cut); later answers are whole.
    cut_once_at: Option<(u64, Arc<std::sync::atomic::AtomicBool>)>,
    /// Wait this long before each 64 KiB of the body.
    pace: Option<Duration>,
    /// The `ETag` sent whatever the version (else `"v<version>"`).
    fixed_etag: Option<&'static str>,
    /// No `Content-Length`: the body is sent chunked, its length unknown until it ends.
    chunked: bool,
    /// Answer 403 to a request with this `User-Agent` (a WAF refusing a scanner).
    refuse_agent: Option<&'static str>,
    /// The bytes depend on the request's `Cookie` or `Authorization` (`user_version`), with the
    /// same length, `ETag` and fields for everyone: a page personalised without saying so.
    by_user: bool,
    /// Answer any `If-None-Match` with a 304 naming the current `ETag`.
    any_304: bool,
    /// Answer 404 to a request with a `Cookie` (a resource hidden from other sessions).
    hide_from_cookie: bool,
    /// Send at most this many bytes of a range asked for (a 206 shorter than asked, RFC 9110
    /// §14.2 allows it).
    short_206: Option<u64>,
    /// A 206's complete length is `*` (a file still growing).
    star_length: bool,
    /// Hold conditional requests (`If-None-Match`) until the test lets them go.
    hold_conditionals: Option<Arc<tokio::sync::Semaphore>>,
}

impl Obj {
    fn new(len: u64, cache_control: &str) -> Obj {
        Obj {
            len,
            version: 1,
            headers: vec![("cache-control", cache_control.to_string())],
            honor_range: true,
            status: 200,
            delay: Duration::ZERO,
            fail: false,
            stall_after: None,
            trickle: None,
            by_encoding: false,
            cut_once_at: None,
            pace: None,
            fixed_etag: None,
            chunked: false,
            refuse_agent: None,
            by_user: false,
            any_304: false,
            hide_from_cookie: false,
            short_206: None,
            star_length: false,
            hold_conditionals: None,
        }
    }

    fn header(mut self, k: &'static str, v: &str) -> Obj {
        self.headers.push((k, v.to_string()));
        self
    }

    fn etag(&self) -> String {
        match self.fixed_etag {
            Some(tag) => tag.to_string(),
            None => format!("\"v{}\"", self.version),
        }
    }
}

fn byte_at(i: u64, version: u8) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 11) as u8 ^ (i as u8) ^ version.wrapping_mul(97)
}

fn encoding_version(ae: Option<&str>) -> u8 {
    match ae {
        Some("gzip") => 10,
        Some("br") => 20,
        _ => 30,
    }
}

/// The version of a `by_user` object's bytes for a request with this `Cookie` or `Authorization`.
fn user_version(who: &str) -> u8 {
    100 + (who.bytes().map(u32::from).sum::<u32>() % 100) as u8
}

fn bytes_of(version: u8, start: u64, end_incl: u64) -> Vec<u8> {
    (start..=end_incl).map(|i| byte_at(i, version)).collect()
}

#[derive(Default)]
struct OriginState {
    objects: Mutex<HashMap<String, Obj>>,
    requests: Mutex<Vec<(String, HashMap<String, String>)>>,
    bytes: AtomicU64,
}

impl OriginState {
    fn set(&self, path: &str, obj: Obj) {
        self.objects.lock().unwrap().insert(path.to_string(), obj);
    }

    fn update(&self, path: &str, f: impl FnOnce(&mut Obj)) {
        f(self.objects.lock().unwrap().get_mut(path).unwrap());
    }

    fn count(&self, path: &str) -> usize {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .count()
    }

    fn requests_for(&self, path: &str) -> Vec<HashMap<String, String>> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, h)| h.clone())
            .collect()
    }

    fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::SeqCst)
    }
}

type OriginBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn origin_handle(state: Arc<OriginState>, req: Request<Incoming>) -> Response<OriginBody> {
    let path = req.uri().path().to_string();
    let seen: HashMap<String, String> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    state
        .requests
        .lock()
        .unwrap()
        .push((path.clone(), seen.clone()));
    let obj = state.objects.lock().unwrap().get(&path).cloned();
    let Some(obj) = obj else {
        return Response::builder().status(404).body(empty()).unwrap();
    };
    if obj.refuse_agent.is_some() && seen.get("user-agent").map(String::as_str) == obj.refuse_agent
    {
        return Response::builder().status(403).body(empty()).unwrap();
    }
    if obj.hide_from_cookie && seen.contains_key("cookie") {
        return Response::builder().status(404).body(empty()).unwrap();
    }
    tokio::time::sleep(obj.delay).await;
    if let Some(gate) = obj
        .hold_conditionals
        .as_ref()
        .filter(|_| seen.contains_key("if-none-match"))
    {
        drop(gate.acquire().await);
    }
    if obj.fail {
        return Response::builder().status(500).body(empty()).unwrap();
    }
    let mut b = Response::builder().header("etag", obj.etag());
    for (k, v) in &obj.headers {
        b = b.header(*k, v.as_str());
    }
    if seen.get("if-none-match") == Some(&obj.etag())
        || (obj.any_304 && seen.contains_key("if-none-match"))
    {
        return b.status(304).body(empty()).unwrap();
    }
    let range = seen
        .get("range")
        .filter(|_| obj.honor_range && obj.status == 200)
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
    let (status, start, end) = match range {
        Some((a, _)) if a >= obj.len => {
            return b
                .status(416)
                .header("content-range", format!("bytes */{}", obj.len))
                .body(empty())
                .unwrap()
        }
        Some((a, z)) => {
            let z = z.min(obj.len - 1);
            let z = obj.short_206.map_or(z, |n| z.min(a + n - 1));
            (206, a, z)
        }
        None if obj.len == 0 => (obj.status, 1, 0),
        None => (obj.status, 0, obj.len - 1),
    };
    if status == 206 {
        let complete = if obj.star_length {
            "*".to_string()
        } else {
            obj.len.to_string()
        };
        b = b.header("content-range", format!("bytes {start}-{end}/{complete}"));
    }
    let len = if end >= start { end - start + 1 } else { 0 };
    if !obj.chunked {
        b = b.header("content-length", len.to_string());
    }
    let who = seen.get("cookie").or(seen.get("authorization"));
    let version = if obj.by_encoding {
        encoding_version(seen.get("accept-encoding").map(String::as_str))
    } else if let Some(who) = who.filter(|_| obj.by_user) {
        user_version(who)
    } else {
        obj.version
    };
    let stall_at = obj.stall_after;
    let trickle = obj.trickle;
    let pace = obj.pace;
    let cut = obj.cut_once_at.clone();
    let counter = state.clone();
    // Generated in 64 KiB chunks as the client reads.
    let chunks = futures_util::stream::unfold(start, move |at| {
        let counter = counter.clone();
        let cut = cut.clone();
        async move {
            if len == 0 || at > end {
                return None;
            }
            if stall_at.is_some_and(|s| at >= s) {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            if let Some((c, pending)) = &cut {
                if at >= *c && pending.swap(false, Ordering::SeqCst) {
                    return None;
                }
            }
            let stop = match trickle {
                Some(gap) => {
                    tokio::time::sleep(gap).await;
                    at
                }
                None => (at + 64 * KIB - 1).min(end),
            };
            if let Some(gap) = pace {
                tokio::time::sleep(gap).await;
            }
            counter.bytes.fetch_add(stop - at + 1, Ordering::SeqCst);
            let data = Bytes::from(bytes_of(version, at, stop));
            Some((Ok::<_, Infallible>(Frame::data(data)), stop + 1))
        }
    });
    b.status(status)
        .body(BodyExt::boxed(StreamBody::new(chunks)))
        .unwrap()
}

fn empty() -> OriginBody {
    BodyExt::boxed(Empty::new())
}

async fn serve_loop<F, Fut, B>(listener: TcpListener, handler: F)
where
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<B>> + Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            return;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let handler = handler.clone();
                async move { Ok::<_, Infallible>(handler(req, peer).await) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

async fn start_origin() -> (Arc<OriginState>, SocketAddr) {
    let state = Arc::new(OriginState::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let s = state.clone();
    tokio::spawn(serve_loop(listener, move |req, _| {
        origin_handle(s.clone(), req)
    }));
    (state, addr)
}

// === the front: the cache's entry point behind a real HTTP server ===

struct TestOrigin {
    client: Client<HttpConnector, Empty<Bytes>>,
    addr: SocketAddr,
}

impl Origin for TestOrigin {
    fn fetch(&self, req: Request<()>) -> OriginFuture {
        let (parts, ()) = req.into_parts();
        let uri = format!(
            "http://{}{}",
            self.addr,
            parts
                .uri
                .path_and_query()
                .map(|p| p.as_str())
                .unwrap_or("/")
        );
        let mut out = Request::builder().method(parts.method).uri(uri);
        for (k, v) in &parts.headers {
            if k != "host" {
                out = out.header(k, v);
            }
        }
        let fut = self.client.request(out.body(Empty::new()).unwrap());
        Box::pin(async move {
            let resp = fut
                .await
                .map_err(|e| OriginError::Unreachable(e.to_string()))?;
            Ok(resp.map(sluice::body::boxed))
        })
    }
}

struct Front {
    addr: SocketAddr,
    cache: Cache,
    registry: Arc<Mutex<Registry>>,
}

impl Front {
    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    fn metrics(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry.lock().unwrap())
            .unwrap();
        out
    }
}

fn config(slice: u64) -> CacheConfig {
    CacheConfig {
        memory_bytes: ByteSize(64 * MIB),
        slice_bytes: ByteSize(slice),
        purge_key: "purge-secret".into(),
        ..CacheConfig::default()
    }
}

async fn start_front(cfg: CacheConfig, origin: SocketAddr) -> Front {
    let policy = cfg.policy().freshness();
    start_front_with(cfg, origin, policy).await
}

/// [`start_front`] with a policy of the test's own (a reverse route's, say).
async fn start_front_with(
    cfg: CacheConfig,
    origin: SocketAddr,
    policy: sluice_http::freshness::FreshnessPolicy,
) -> Front {
    let origin: Arc<dyn Origin> = Arc::new(TestOrigin {
        client: Client::builder(TokioExecutor::new()).build_http(),
        addr: origin,
    });
    start_front_on(cfg, origin, policy).await
}

/// [`start_front_with`] in front of an origin of the test's own.
async fn start_front_on(
    cfg: CacheConfig,
    origin: Arc<dyn Origin>,
    policy: sluice_http::freshness::FreshnessPolicy,
) -> Front {
    let mut registry = Registry::with_prefix("sluice");
    let cache = Cache::new(&cfg, None, &mut registry).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let c = cache.clone();
    tokio::spawn(serve_loop(
        listener,
        move |req: Request<Incoming>, peer: SocketAddr| {
            let (cache, origin, policy) = (c.clone(), origin.clone(), policy.clone());
            async move {
                let (parts, _) = req.into_parts();
                let key = CacheKey::new("test", &parts.uri);
                if parts.method == "PURGE" {
                    return cache.purge(&parts, &key, peer.ip());
                }
                cache.serve(&parts, &key, origin, &policy).await
            }
        },
    ));
    Front {
        addr,
        cache,
        registry: Arc::new(Mutex::new(registry)),
    }
}

fn status_of(r: &support::Reply) -> String {
    r.headers
        .get("cache-status")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

fn body(r: &support::Reply) -> Bytes {
    r.body.clone().expect("whole body")
}

// === RFC 9111 §3: what is stored ===

#[tokio::test]
async fn miss_then_hit_with_cache_status_and_age() {
    let (origin, oaddr) = start_origin().await;
    origin.set(
        "/a",
        Obj::new(100 * KIB, "max-age=60").header("content-type", "video/mp4"),
    );
    let front = start_front(config(64 * KIB), oaddr).await;

    let first = request("GET", &front.url("/a"), &[]).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        status_of(&first),
        "sluice; fwd=uri-miss; fwd-status=200; stored; ttl=60"
    );
    assert_eq!(
        sha256(&body(&first)),
        sha256(&bytes_of(1, 0, 100 * KIB - 1))
    );
    assert_eq!(first.headers["content-length"], "102400");
    assert_eq!(first.headers["content-type"], "video/mp4");
    assert_eq!(first.headers["accept-ranges"], "bytes");

    let second = request("GET", &front.url("/a"), &[]).await;
    assert!(
        status_of(&second).starts_with("sluice; hit; ttl="),
        "{}",
        status_of(&second)
    );
    assert_eq!(body(&second), body(&first));
    assert_eq!(second.headers["age"], "0");
    // Two slices, one origin request each; nothing more for the hit.
    assert_eq!(origin.count("/a"), 2);
    assert_eq!(origin.bytes(), 100 * KIB);
    let m = front.metrics();
    assert!(
        m.contains("sluice_cache_requests_total{result=\"hit\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("sluice_cache_origin_received_bytes_total 102400"),
        "{m}"
    );
}

#[tokio::test]
async fn no_store_private_and_set_cookie_are_passed_with_hit_for_pass() {
    let (origin, oaddr) = start_origin().await;
    origin.set("/ns", Obj::new(10, "no-store"));
    origin.set("/pv", Obj::new(10, "private, max-age=60"));
    origin.set(
        "/ck",
        Obj::new(10, "max-age=60").header("set-cookie", "s=1"),
    );
    let front = start_front(config(64 * KIB), oaddr).await;
    for (path, reason) in [
        ("/ns", "no-store"),
        ("/pv", "private"),
        ("/ck", "set-cookie"),
    ] {
        let a = request("GET", &front.url(path), &[]).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(body(&a), Bytes::from(bytes_of(1, 0, 9)));
        assert!(
            status_of(&a).contains(&format!("detail={reason}")),
            "{}",
            status_of(&a)
        );
        // The memo sends the next one straight to the origin, with the client's own headers.
        let b = request("GET", &front.url(path), &[("range", "bytes=2-3")]).await;
        assert_eq!(b.status, StatusCode::PARTIAL_CONTENT);
        assert_eq!(body(&b), Bytes::from(bytes_of(1, 2, 3)));
        assert_eq!(
            status_of(&b),
            "sluice; fwd=bypass; fwd-status=206; detail=hit-for-pass"
        );
        assert_eq!(origin.count(path), 2);
    }
    assert_eq!(front.cache.objects(), 0);
}

/// Finding: a `public` answer with `Set-Cookie` was stored without the cookie, and the miss
/// that fetched it was answered from the stored fields: the client lost its cookie. Such an
/// answer is now passed on as the origin sent it and not stored (nginx's and Varnish's default),
/// so each client gets the cookie the origin set for it and no other.
#[tokio::test]
async fn a_public_answer_with_set_cookie_keeps_its_cookie_and_is_not_stored() {
    let (origin, oaddr) = start_origin().await;
    origin.set(
        "/pub-ck",
        Obj::new(10, "public, max-age=60").header("set-cookie", "session=first"),
    );
    let front = start_front(config(64 * KIB), oaddr).await;
    let a = request("GET", &front.url("/pub-ck"), &[]).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(body(&a), Bytes::from(bytes_of(1, 0, 9)));
    assert_eq!(
        a.headers.get("set-cookie").map(|v| v.to_str().unwrap()),
        Some("session=first"),
        "{}",
        status_of(&a)
    );
    assert!(
        status_of(&a).contains("detail=set-cookie"),
        "{}",
        status_of(&a)
    );
    assert_eq!(front.cache.objects(), 0);
    // The origin now sets another client's cookie: the next client gets that one, from the
    // origin (the URL's memo), never the first one's.
    origin.update("/pub-ck", |o| {
        o.headers.retain(|(k, _)| *k != "set-cookie");
        o.headers.push(("set-cookie", "session=second".into()));
    });
    let b = request("GET", &front.url("/pub-ck"), &[]).await;
    assert_eq!(
        b.headers.get("set-cookie").map(|v| v.to_str().unwrap()),
        Some("session=second")
    );
    assert_eq!(origin.count("/pub-ck"), 2);
    assert_eq!(front.cache.objects(), 0);
}

#[tokio::test]
async fn an_uncacheable_error_leaves_no_memo_behind() {
    let (origin, oaddr) = start_origin().await;
    let front = start_front(config(64 * KIB), oaddr).await;
    // Not there yet (a live segment asked for early): a 404 with no freshness is not stored...
    let a = request("GET", &front.url("/late"), &[]).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    // ...and leaves no hit-for-pass memo: once it exists, it is fetched and stored at once.
    origin.set("/late", Obj::new(10, "max-age=60"));
    let b = request("GET", &front.url("/late"), &[]).await;
    assert_eq!(b.status, StatusCode::OK);
    assert_eq!(
        status_of(&b),
        "sluice; fwd=uri-miss; fwd-status=200; stored; ttl=60"
    );
    // The same after an origin failure.
    let mut failing = Obj::new(10, "max-age=60");
    failing.fail = true;
    origin.set("/flaky", failing);
    let c = request("GET", &front.url("/flaky"), &[]).await;
    assert_eq!(c.status, StatusCode::INTERNAL_SERVER_ERROR);
    origin.set("/flaky", Obj::new(10, "max-age=60"));
    let d = request("GET", &front.url("/flaky"), &[]).await;
    assert!(status_of(&d).contains("; stored"), "{}", status_of(&d));
    let e = request("GET", &front.url("/flaky"), &[]).await;
    assert!(
        status_of(&e).starts_with("sluice; hit"),
        "{}",
        status_of(&e)
    );
    assert_eq!(origin.count("/late") + origin.count("/flaky"), 4);
}

#[tokio::test]
async fn authorization_needs_public_and_cdn_cache_control_wins() {
    let (origin, oaddr) = start_origin().await;
    origin.set("/auth", Obj::new(10, "max-age=60"));
    origin.set("/auth-public", Obj::new(10, "public, max-age=60"));
    origin.set(
        "/cdn",
        Obj::new(10, "no-store").header("cdn-cache-control", "max-age=120"),
    );
    let front = start_front(config(64 * KIB), oaddr).await;
    let auth = [("authorization", "Bearer x")];
    for _ in 0..2 {
        request("GET", &front.url("/auth"), &auth).await;
        request("GET", &front.url("/auth-public"), &auth).await;
        request("GET", &front.url("/cdn"), &[]).await;
    }
    assert_eq!(
        origin.count("/auth"),
        2,
        "Authorization without public: never stored"
    );
    assert_eq!(origin.count("/auth-public"), 1);
    assert_eq!(
        origin.count("/cdn"),
        1,
        "CDN-Cache-Control overrides no-store"
    );
    let hit = request("GET", &front.url("/cdn"), &[]).await;
    assert!(
        status_of(&hit).contains("hit; ttl=12"),
        "{}",
        status_of(&hit)
    );
}

// === §4.1: Vary ===

#[tokio::test]
async fn concurrent_cold_requests_for_different_variants_get_their_own() {
    let (origin, oaddr) = start_origin().await;
    let mut obj = Obj::new(1000, "max-age=60").header("vary", "Accept-Encoding");
    obj.by_encoding = true;
    obj.delay = Duration::from_millis(100);
    origin.set("/enc", obj);
    let front = start_front(config(64 * KIB), oaddr).await;
    let encodings = ["gzip", "br", "gzip", "br", "gzip", "br"];
    let replies = futures_util::future::join_all(encodings.iter().map(|ae| {
        let url = front.url("/enc");
        async move { request("GET", &url, &[("accept-encoding", ae)]).await }
    }))
    .await;
    for (ae, r) in encodings.iter().zip(&replies) {
        assert_eq!(
            body(r),
            Bytes::from(bytes_of(encoding_version(Some(ae)), 0, 999)),
            "{ae}"
        );
    }
    assert_eq!(origin.count("/enc"), 2, "one fetch per variant");
}

#[tokio::test]
async fn vary_keeps_variants_apart_and_vary_star_is_never_stored() {
    let (origin, oaddr) = start_origin().await;
    origin.set(
        "/v",
        Obj::new(10, "max-age=60").header("vary", "Accept-Encoding"),
    );
    origin.set("/star", Obj::new(10, "max-age=60").header("vary", "*"));
    let front = start_front(config(64 * KIB), oaddr).await;
    let gz = [("accept-encoding", "gzip")];
    let br = [("accept-encoding", "br")];
    let a = request("GET", &front.url("/v"), &gz).await;
    assert!(status_of(&a).contains("fwd=uri-miss"));
    let b = request("GET", &front.url("/v"), &br).await;
    assert!(status_of(&b).contains("fwd=vary-miss"), "{}", status_of(&b));
    let a2 = request("GET", &front.url("/v"), &gz).await;
    let b2 = request("GET", &front.url("/v"), &br).await;
    assert!(status_of(&a2).contains("hit") && status_of(&b2).contains("hit"));
    assert_eq!(origin.count("/v"), 2);
    request("GET", &front.url("/star"), &[]).await;
    let s = request("GET", &front.url("/star"), &[]).await;
    assert!(status_of(&s).contains("bypass"), "{}", status_of(&s));
    assert_eq!(origin.count("/star"), 2);
}

// === §4.3: validation ===

#[tokio::test]
async fn client_conditionals_are_answered_from_cache() {
    let (origin, oaddr) = start_origin().await;
    origin.set(
        "/c",
        Obj::new(10, "max-age=60").header("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
    );
    let front = start_front(config(64 * KIB), oaddr).await;
    request("GET", &front.url("/c"), &[]).await;
    let r = request("GET", &front.url("/c"), &[("if-none-match", "\"v1\"")]).await;
    assert_eq!(r.status, StatusCode::NOT_MODIFIED);
    assert_eq!(r.headers["etag"], "\"v1\"");
    assert_eq!(body(&r).len(), 0);
    let r = request(
        "GET",
        &front.url("/c"),
        &[("if-modified-since", "Sun, 06 Nov 1994 08:49:37 GMT")],
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_MODIFIED);
    let r = request("GET", &front.url("/c"), &[("if-none-match", "\"v0\"")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(origin.count("/c"), 1);
}

#[tokio::test]
async fn stale_is_revalidated_and_a_304_refreshes_it() {
    let (origin, oaddr) = start_origin().await;
    origin.set("/r", Obj::new(100, "max-age=1").header("x-rev", "1"));
    let front = start_front(config(64 * KIB), oaddr).await;
    request("GET", &front.url("/r"), &[]).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    origin.update("/r", |o| {
        o.headers = vec![
            ("cache-control", "max-age=60".into()),
            ("x-rev", "2".into()),
        ]
    });
    let r = request("GET", &front.url("/r"), &[]).await;
    assert_eq!(status_of(&r), "sluice; fwd=stale; fwd-status=304; ttl=60");
    assert_eq!(
        r.headers["x-rev"], "2",
        "the 304's headers replace the stored ones"
    );
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 99)));
    let reqs = origin.requests_for("/r");
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[1]["if-none-match"], "\"v1\"");
    let again = request("GET", &front.url("/r"), &[]).await;
    assert!(status_of(&again).starts_with("sluice; hit; ttl="));
    assert_eq!(origin.count("/r"), 2);
}

#[tokio::test]
async fn client_no_cache_revalidates_unless_ignored() {
    let (origin, oaddr) = start_origin().await;
    origin.set("/nc", Obj::new(10, "max-age=60"));
    let front = start_front(config(64 * KIB), oaddr).await;
    request("GET", &front.url("/nc"), &[]).await;
    let r = request("GET", &front.url("/nc"), &[("cache-control", "no-cache")]).await;
    assert!(
        status_of(&r).contains("fwd=stale; fwd-status=304"),
        "{}",
        status_of(&r)
    );
    assert_eq!(origin.count("/nc"), 2);

    let mut cfg = config(64 * KIB);
    cfg.request_directives = sluice::cache::config::RequestDirectivesConfig::Ignore;
    let cdn = start_front(cfg, oaddr).await;
    request("GET", &cdn.url("/nc"), &[]).await;
    let r = request("GET", &cdn.url("/nc"), &[("cache-control", "no-cache")]).await;
    assert!(
        status_of(&r).starts_with("sluice; hit"),
        "{}",
        status_of(&r)
    );
    assert_eq!(origin.count("/nc"), 3);
}

// === RFC 5861 ===

#[tokio::test]
async fn stale_while_revalidate_serves_stale_and_refreshes_once() {
    let (origin, oaddr) = start_origin().await;
    origin.set(
        "/swr",
        Obj::new(100, "max-age=1, stale-while-revalidate=60"),
    );
    let front = start_front(config(64 * KIB), oaddr).await;
    request("GET", &front.url("/swr"), &[]).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    // The refresh is slow; every request meanwhile gets the stale copy at once.
    origin.update("/swr", |o| o.delay = Duration::from_millis(500));
    let replies = futures_util::future::join_all((0..10).map(|_| {
        let url = front.url("/swr");
        async move { request("GET", &url, &[]).await }
    }))
    .await;
    for r in &replies {
        assert!(
            status_of(r).contains("detail=stale-while-revalidate"),
            "{}",
            status_of(r)
        );
        assert_eq!(body(r), Bytes::from(bytes_of(1, 0, 99)));
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(origin.count("/swr"), 2, "one background refresh");
    let r = request("GET", &front.url("/swr"), &[]).await;
    assert!(
        status_of(&r).starts_with("sluice; hit; ttl="),
        "{}",
        status_of(&r)
    );
}

/// Finding: an object invalidated by a successful unsafe method (RFC 9111 §4.4) was only made
/// stale, so within its `stale-while-revalidate` window, or for a request's `max-stale`, the
/// next reader still got the bytes the `POST` had just changed. It is now validated first.
#[tokio::test]
async fn an_invalidated_object_is_validated_before_any_reuse() {
    let (origin, oaddr) = start_origin().await;
    for path in ["/inv-swr", "/inv-max-stale"] {
        origin.set(
            path,
            Obj::new(100, "max-age=60, stale-while-revalidate=600"),
        );
    }
    let front = start_front(config(64 * KIB), oaddr).await;
    for (path, ask) in [
        ("/inv-swr", None),
        ("/inv-max-stale", Some(("cache-control", "max-stale=3600"))),
    ] {
        let asked: Vec<(&str, &str)> = ask.into_iter().collect();
        request("GET", &front.url(path), &[]).await;
        let hit = request("GET", &front.url(path), &asked).await;
        assert!(
            status_of(&hit).starts_with("sluice; hit"),
            "{}",
            status_of(&hit)
        );
        assert_eq!(origin.count(path), 1);
        // What the front end does after a 2xx to a `POST` to the path; the origin has changed.
        origin.update(path, |o| o.version = 2);
        front
            .cache
            .invalidate(&[CacheKey::new("test", &path.parse().unwrap())]);
        let next = request("GET", &front.url(path), &asked).await;
        assert_eq!(
            body(&next),
            Bytes::from(bytes_of(2, 0, 99)),
            "{path}: {}",
            status_of(&next)
        );
        // The conditional request, then (the object changed) the refetch.
        assert_eq!(origin.count(path), 3, "{path}");
        assert_eq!(
            origin.requests_for(path)[1]
                .get("if-none-match")
                .map(String::as_str),
            Some("\"v1\""),
            "{path}: a conditional request"
        );
    }
}

/// Sends `n` concurrent GETs for `path` while the origin holds its conditional answers, and
/// lets them go once each request is either at the origin or waiting for another's
/// revalidation (or after a bound, so a failure is an assertion, not a hang).
async fn herd(
    front: &Front,
    origin: &OriginState,
    path: &str,
    n: usize,
    gate: &tokio::sync::Semaphore,
) -> Vec<support::Reply> {
    let conditionals = || {
        origin
            .requests_for(path)
            .iter()
            .filter(|h| h.contains_key("if-none-match"))
            .count() as u64
    };
    let (asked, waiting) = (
        conditionals(),
        metric(front, "sluice_cache_coalesced_waiters_total"),
    );
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let url = front.url(path);
            tokio::spawn(async move { request("GET", &url, &[]).await })
        })
        .collect();
    for _ in 0..1000 {
        let there = conditionals() - asked + metric(front, "sluice_cache_coalesced_waiters_total")
            - waiting;
        if there >= n as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    gate.add_permits(n);
    let mut replies = Vec::new();
    for t in tasks {
        replies.push(t.await.unwrap());
    }
    replies
}

/// Finding: after an invalidation (a soft purge, an unsafe method's success) or once a
/// `must-revalidate` object went stale, every request for the object sent the origin its own
/// conditional request: a hot object with 20 requests in flight cost 20 per purge. They are
/// coalesced now as misses are: one revalidation, the others wait for its answer and serve the
/// refreshed object, or follow the one refetch of the changed one.
#[tokio::test]
async fn concurrent_requests_after_an_invalidation_make_one_conditional_request() {
    const N: usize = 20;
    let (origin, oaddr) = start_origin().await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let held = |cache_control: &str| Obj {
        hold_conditionals: Some(gate.clone()),
        ..Obj::new(100, cache_control)
    };
    for path in ["/herd-purge", "/herd-post", "/herd-changed"] {
        origin.set(path, held("max-age=60"));
    }
    origin.set("/herd-stale", held("max-age=1, must-revalidate"));
    let front = start_front(config(64 * KIB), oaddr).await;
    for path in ["/herd-purge", "/herd-post", "/herd-changed", "/herd-stale"] {
        request("GET", &front.url(path), &[]).await;
        assert_eq!(origin.count(path), 1);
    }
    let soft_purge = |path: &'static str| {
        let url = front.url(path);
        async move {
            let r = request(
                "PURGE",
                &url,
                &[("x-purge-key", "purge-secret"), ("x-purge-soft", "1")],
            )
            .await;
            assert_eq!(
                body(&r),
                Bytes::from_static(b"{\"purged\":1,\"soft\":true}")
            );
        }
    };
    soft_purge("/herd-purge").await;
    front
        .cache
        .invalidate(&[CacheKey::new("test", &"/herd-post".parse().unwrap())]);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    for path in ["/herd-purge", "/herd-post", "/herd-stale"] {
        let replies = herd(&front, &origin, path, N, &gate).await;
        let conditionals = origin
            .requests_for(path)
            .iter()
            .filter(|h| h.get("if-none-match").map(String::as_str) == Some("\"v1\""))
            .count();
        assert_eq!(conditionals, 1, "{path}: one conditional request for {N}");
        assert_eq!(origin.count(path), 2, "{path}");
        let mut collapsed = 0;
        for r in &replies {
            assert_eq!(r.status, StatusCode::OK, "{path}");
            assert_eq!(body(r), Bytes::from(bytes_of(1, 0, 99)), "{path}");
            let s = status_of(r);
            assert!(s.contains("fwd=stale; fwd-status=304"), "{path}: {s}");
            collapsed += s.contains("collapsed") as usize;
        }
        assert_eq!(collapsed, N - 1, "{path}");
        if path != "/herd-stale" {
            // Refreshed for everyone after (the stale one's 304 gave it a second).
            let after = request("GET", &front.url(path), &[]).await;
            assert!(status_of(&after).starts_with("sluice; hit"), "{path}");
            assert_eq!(origin.count(path), 2, "{path}");
        }
    }

    // The object changed: the one conditional request is answered with the new version, and
    // everyone follows one refetch of it.
    origin.update("/herd-changed", |o| o.version = 2);
    soft_purge("/herd-changed").await;
    let replies = herd(&front, &origin, "/herd-changed", N, &gate).await;
    for r in &replies {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(body(r), Bytes::from(bytes_of(2, 0, 99)), "{}", status_of(r));
    }
    let asked = origin.requests_for("/herd-changed");
    assert_eq!(
        asked.len(),
        3,
        "the first fill, one conditional request, one refetch"
    );
    assert_eq!(
        asked
            .iter()
            .filter(|h| h.contains_key("if-none-match"))
            .count(),
        1
    );
}

#[tokio::test]
async fn stale_if_error_and_grace() {
    let (origin, oaddr) = start_origin().await;
    origin.set("/sie", Obj::new(100, "max-age=1, stale-if-error=60"));
    origin.set("/plain", Obj::new(100, "max-age=1"));
    let mut cfg = config(64 * KIB);
    cfg.grace_secs = 0;
    let front = start_front(cfg, oaddr).await;
    request("GET", &front.url("/sie"), &[]).await;
    request("GET", &front.url("/plain"), &[]).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    origin.update("/sie", |o| o.fail = true);
    origin.update("/plain", |o| o.fail = true);
    let r = request("GET", &front.url("/sie"), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        status_of(&r).contains("detail=stale-if-error"),
        "{}",
        status_of(&r)
    );
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 99)));
    let r = request("GET", &front.url("/plain"), &[]).await;
    assert_eq!(
        r.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "no stale copy without permission"
    );

    // Grace stands in for origins that send neither directive.
    let mut cfg = config(64 * KIB);
    cfg.grace_secs = 60;
    origin.update("/plain", |o| o.fail = false);
    let graced = start_front(cfg, oaddr).await;
    request("GET", &graced.url("/plain"), &[]).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    origin.update("/plain", |o| o.delay = Duration::from_millis(300));
    let r = request("GET", &graced.url("/plain"), &[]).await;
    assert!(
        status_of(&r).contains("detail=stale-while-revalidate"),
        "{}",
        status_of(&r)
    );
}

// === slices, ranges, coalescing ===

#[tokio::test]
async fn hundred_concurrent_misses_make_one_origin_request_per_slice() {
    let (origin, oaddr) = start_origin().await;
    let len = 5 * 64 * KIB + 123;
    let mut obj = Obj::new(len, "max-age=60");
    obj.delay = Duration::from_millis(100);
    origin.set("/big", obj);
    let front = start_front(config(64 * KIB), oaddr).await;
    let replies = futures_util::future::join_all((0..100).map(|_| {
        let url = front.url("/big");
        async move { request("GET", &url, &[]).await }
    }))
    .await;
    let want = sha256(&bytes_of(1, 0, len - 1));
    for r in &replies {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(sha256(&body(r)), want);
    }
    assert_eq!(
        origin.count("/big"),
        6,
        "six slices, one origin request each"
    );
    assert_eq!(origin.bytes(), len);
    // One request led; the others followed its fill (or, arriving after its head, found the
    // object and followed the same fills as hits).
    let leaders = replies
        .iter()
        .filter(|r| {
            let s = status_of(r);
            s.contains("fwd=uri-miss") && !s.contains("collapsed")
        })
        .count();
    assert_eq!(leaders, 1);
}

#[tokio::test]
async fn cold_range_on_a_multi_gb_object_fetches_only_the_covered_slices() {
    let (origin, oaddr) = start_origin().await;
    let len = 4 * 1024 * MIB;
    origin.set("/huge", Obj::new(len, "max-age=600"));
    let front = start_front(config(MIB), oaddr).await;
    let at = 3 * 1024 * MIB;
    let r = request(
        "GET",
        &front.url("/huge"),
        &[("range", &format!("bytes={at}-{}", at + MIB - 1))],
    )
    .await;
    assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        r.headers["content-range"],
        format!("bytes {at}-{}/{len}", at + MIB - 1)
    );
    assert_eq!(sha256(&body(&r)), sha256(&bytes_of(1, at, at + MIB - 1)));
    assert_eq!(origin.bytes(), MIB, "exactly one slice");
    assert_eq!(
        origin.requests_for("/huge")[0]["range"],
        format!("bytes={at}-{}", at + MIB - 1)
    );

    // Unaligned, across a boundary: two more slices, the first one already stored.
    let from = at + MIB - 10;
    let r = request(
        "GET",
        &front.url("/huge"),
        &[("range", &format!("bytes={from}-{}", from + 19))],
    )
    .await;
    assert_eq!(body(&r), Bytes::from(bytes_of(1, from, from + 19)));
    assert_eq!(origin.bytes(), 2 * MIB);
    // A suffix range on the now-known object.
    let r = request("GET", &front.url("/huge"), &[("range", "bytes=-5")]).await;
    assert_eq!(body(&r), Bytes::from(bytes_of(1, len - 5, len - 1)));
    assert_eq!(origin.bytes(), 3 * MIB);
    let head = request("HEAD", &front.url("/huge"), &[]).await;
    assert_eq!(head.headers["content-length"], len.to_string());
    assert_eq!(body(&head).len(), 0);
}

#[tokio::test]
async fn multi_range_and_unsatisfiable_range() {
    let (origin, oaddr) = start_origin().await;
    origin.set(
        "/m",
        Obj::new(200 * KIB, "max-age=60").header("content-type", "video/mp4"),
    );
    let front = start_front(config(64 * KIB), oaddr).await;
    request("GET", &front.url("/m"), &[("range", "bytes=0-0")]).await;
    let r = request(
        "GET",
        &front.url("/m"),
        &[("range", "bytes=0-9, 100000-100009")],
    )
    .await;
    assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
    let ct = r.headers["content-type"].to_str().unwrap().to_string();
    let boundary = ct.strip_prefix("multipart/byteranges; boundary=").unwrap();
    let mut want = Vec::new();
    for (a, z) in [(0u64, 9u64), (100_000, 100_009)] {
        want.extend_from_slice(
            format!(
                "\r\n--{boundary}\r\nContent-Type: video/mp4\r\nContent-Range: bytes {a}-{z}/204800\r\n\r\n"
            )
            .as_bytes(),
        );
        want.extend_from_slice(&bytes_of(1, a, z));
    }
    want.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    assert_eq!(body(&r), Bytes::from(want.clone()));
    assert_eq!(r.headers["content-length"], want.len().to_string());

    let r = request("GET", &front.url("/m"), &[("range", "bytes=999999-")]).await;
    assert_eq!(r.status, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(r.headers["content-range"], "bytes */204800");
    // A malformed Range is ignored: the whole object.
    let r = request("GET", &front.url("/m"), &[("range", "bytes=x-y")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(body(&r).len() as u64, 200 * KIB);
}

#[tokio::test]
async fn random_ranges_get_exact_bytes_cold_and_warm() {
    let (origin, oaddr) = start_origin().await;
    let len = MIB + 12_345;
    origin.set("/rnd", Obj::new(len, "max-age=60"));
    let front = start_front(config(64 * KIB), oaddr).await;
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..40 {
        let a = next() % len;
        let n = next() % (200 * KIB) + 1;
        let z = (a + n - 1).min(len - 1);
        let r = request(
            "GET",
            &front.url("/rnd"),
            &[("range", &format!("bytes={a}-{z}"))],
        )
        .await;
        assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
        assert_eq!(r.headers["content-range"], format!("bytes {a}-{z}/{len}"));
        assert_eq!(body(&r), Bytes::from(bytes_of(1, a, z)), "bytes={a}-{z}");
    }
    // Never more than the object, whatever the ranges: every slice fetched at most once.
    assert!(origin.bytes() <= len, "{} > {len}", origin.bytes());
}

/// Finding: a valid 206 other than the slice asked for (fewer bytes, RFC 9110 §14.2, or the
/// `/*` length of a file still growing) failed the fill; its readers elected a writer three
/// times and answered 502. The fill now ends as a pass: the URL is remembered as uncacheable and
/// each request is answered by its own request to the origin.
#[tokio::test]
async fn a_206_other_than_the_slice_asked_for_is_passed_not_a_502() {
    let (origin, oaddr) = start_origin().await;
    let slice = 64 * KIB;
    let len = 3 * slice;
    let mut short = Obj::new(len, "max-age=60");
    short.short_206 = Some(10 * KIB);
    origin.set("/short-206", short);
    let mut growing = Obj::new(len, "max-age=60");
    growing.star_length = true;
    origin.set("/growing", growing);
    let front = start_front(config(slice), oaddr).await;
    for path in ["/short-206", "/growing"] {
        // The whole object: the client's own request (no `Range`) is a 200 with every byte.
        let a = request("GET", &front.url(path), &[]).await;
        assert_eq!(a.status, StatusCode::OK, "{path}: {}", status_of(&a));
        assert_eq!(
            sha256(&body(&a)),
            sha256(&bytes_of(1, 0, len - 1)),
            "{path}"
        );
        assert!(status_of(&a).contains("detail=range"), "{}", status_of(&a));
        // The slice request, then the client's own.
        assert_eq!(origin.count(path), 2, "{path}");
        // A range: the origin's answer to it, as it is.
        let b = request("GET", &front.url(path), &[("range", "bytes=70000-80000")]).await;
        assert_eq!(b.status, StatusCode::PARTIAL_CONTENT, "{path}");
        let got = body(&b);
        assert_eq!(
            got,
            Bytes::from(bytes_of(1, 70000, 70000 + got.len() as u64 - 1))
        );
        assert!(
            status_of(&b).contains("detail=hit-for-pass"),
            "{}",
            status_of(&b)
        );
        // One origin request per request from now on.
        assert_eq!(origin.count(path), 3, "{path}");
        let c = request("GET", &front.url(path), &[]).await;
        assert_eq!(
            sha256(&body(&c)),
            sha256(&bytes_of(1, 0, len - 1)),
            "{path}"
        );
        assert_eq!(origin.count(path), 4, "{path}");
    }
    assert_eq!(front.cache.objects(), 0);
}

#[tokio::test]
async fn an_origin_that_ignores_range_still_works() {
    let (origin, oaddr) = start_origin().await;
    let len = 3 * 64 * KIB + 7;
    let mut obj = Obj::new(len, "max-age=60");
    obj.honor_range = false;
    origin.set("/norange", obj);
    let front = start_front(config(64 * KIB), oaddr).await;
    let r = request("GET", &front.url("/norange"), &[("range", "bytes=100-199")]).await;
    assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 100, 199)));
    // The whole answer was read into slices (well under the detached budget).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = request("GET", &front.url("/norange"), &[]).await;
    assert_eq!(sha256(&body(&r)), sha256(&bytes_of(1, 0, len - 1)));
    assert!(
        status_of(&r).starts_with("sluice; hit"),
        "{}",
        status_of(&r)
    );
    assert_eq!(origin.count("/norange"), 1);
    assert_eq!(origin.bytes(), len);
}

/// Slices are never put together under different `ETag`s, weak ones included: a stored first
/// slice under `W/"one"` and a second answered under `W/"two"` cut the response, and the next
/// request gets the new version whole.
#[tokio::test]
async fn slices_under_different_weak_etags_are_never_put_together() {
    let (origin, oaddr) = start_origin().await;
    let len = 3 * 64 * KIB;
    let mut obj = Obj::new(len, "max-age=60");
    obj.fixed_etag = Some("W/\"one\"");
    origin.set("/weak", obj);
    let front = start_front(config(64 * KIB), oaddr).await;
    // Only the first slice is stored, under the weak tag.
    let r = request("GET", &front.url("/weak"), &[("range", "bytes=0-9")]).await;
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 9)));
    assert_eq!(front.cache.objects(), 1);
    origin.update("/weak", |o| {
        o.version = 2;
        o.fixed_etag = Some("W/\"two\"");
    });
    let r = request("GET", &front.url("/weak"), &[]).await;
    if let Ok(b) = &r.body {
        assert!(
            b.len() < len as usize,
            "a body of two versions was completed"
        );
    }
    let r = request("GET", &front.url("/weak"), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(sha256(&body(&r)), sha256(&bytes_of(2, 0, len - 1)));
    assert_eq!(r.headers["etag"], "W/\"two\"");
}

/// Finding (a regression of the weak-`ETag` rule): an object under a weak `ETag` from an origin
/// that ignores `Range` (nginx's gzip) was stored, but once the memory tier had let its first
/// slices go, the next hit refetched one, took the same weak tag for another version, dropped
/// the object and cut the body. Equal weak tags are the same version: the hit is whole and the
/// object stays.
#[tokio::test]
async fn a_weak_etag_object_is_whole_when_its_slices_are_refetched() {
    let (origin, oaddr) = start_origin().await;
    let len = MIB + 7;
    let mut obj = Obj::new(len, "max-age=60");
    obj.honor_range = false;
    obj.fixed_etag = Some("W/\"gz\"");
    origin.set("/gz", obj);
    // A memory tier half the object's size: the first slices are gone once it is read. (The
    // object is over the default bound, a quarter of that tier: allowed explicitly.)
    let mut cfg = config(64 * KIB);
    cfg.memory_bytes = ByteSize(512 * KIB);
    cfg.max_object_bytes = ByteSize(2 * MIB);
    let front = start_front(cfg, oaddr).await;
    let want = sha256(&bytes_of(1, 0, len - 1));
    let r = request("GET", &front.url("/gz"), &[]).await;
    assert_eq!(sha256(&body(&r)), want);
    assert!(status_of(&r).contains("stored"), "{}", status_of(&r));
    let r = request("GET", &front.url("/gz"), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let got = r.body.as_ref().map(|b| sha256(b));
    assert_eq!(got.as_ref(), Ok(&want), "the hit's body");
    assert!(
        status_of(&r).starts_with("sluice; hit"),
        "{}",
        status_of(&r)
    );
    // The hit did refetch (the tier could not hold the object), and kept the object.
    assert!(origin.count("/gz") >= 2, "no slice was refetched");
    assert_eq!(front.cache.objects(), 1, "the object was dropped");
    assert_eq!(metric(&front, "sluice_cache_version_mismatches_total"), 0);
}

/// Finding (a regression of the known-lengths rule): a chunked answer stores its record without
/// a length until its body ends; when that first fill stopped early (nobody following past
/// `detached_fill_bytes`), every later hit that fetched a further slice took the chunked answer
/// (no length either) for another version, dropped the object and cut the body. Under an `ETag`
/// a missing length is left to the validators: the hit is whole.
#[tokio::test]
async fn a_chunked_object_whose_first_fill_stopped_early_is_read_whole() {
    let (origin, oaddr) = start_origin().await;
    let len = MIB + 7;
    let mut obj = Obj::new(len, "max-age=60");
    obj.honor_range = false;
    obj.chunked = true;
    // About 16 × 20 ms for the whole body: the client leaves well before its end.
    obj.pace = Some(Duration::from_millis(20));
    origin.set("/chunked", obj);
    let mut cfg = config(64 * KIB);
    cfg.detached_fill_bytes = ByteSize(128 * KIB);
    let front = start_front(cfg, oaddr).await;
    // A client that reads the start and goes away (a length unknown, a Range would be answered
    // whole).
    let s = sent(&front, "/chunked", "").await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    reset(s);
    // The fill reads on within the detached budget, then stops: the length never became known.
    let mut last = origin.bytes();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = origin.bytes();
        if now == last {
            break;
        }
        last = now;
    }
    assert!(
        last < len / 2,
        "{last} of {len} bytes read: the fill did not stop early"
    );
    assert_eq!(front.cache.objects(), 1);
    let r = request("GET", &front.url("/chunked"), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let got = r.body.as_ref().map(|b| sha256(b));
    assert_eq!(
        got.as_ref(),
        Ok(&sha256(&bytes_of(1, 0, len - 1))),
        "the hit's body"
    );
    assert!(
        status_of(&r).starts_with("sluice; hit"),
        "{}",
        status_of(&r)
    );
    assert_eq!(front.cache.objects(), 1, "the object was dropped");
    assert_eq!(metric(&front, "sluice_cache_version_mismatches_total"), 0);
}

/// Finding: one object's stored bytes had no bound: a chunked answer that never ends (a live
/// stream) was stored slice after slice while a client followed it, churning the whole of both
/// tiers, and a later joiner replayed it from slice 0 and broke once that was evicted. Past
/// `max_object_bytes` the object is forgotten and its URL passed; the client following gets
/// every byte.
#[tokio::test]
async fn an_answer_past_the_object_bound_is_relayed_not_stored() {
    let (origin, oaddr) = start_origin().await;
    let slice = 64 * KIB;
    let len = 24 * slice + 5;
    let mut obj = Obj::new(len, "max-age=60");
    obj.honor_range = false;
    obj.chunked = true;
    origin.set("/live", obj);
    let mut cfg = config(slice);
    cfg.max_object_bytes = ByteSize(4 * slice);
    let front = start_front(cfg, oaddr).await;
    let a = request("GET", &front.url("/live"), &[]).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.body.as_ref().map(|b| sha256(b)).ok(),
        Some(sha256(&bytes_of(1, 0, len - 1))),
        "every byte the origin sent"
    );
    assert_eq!(origin.count("/live"), 1);
    // Nothing of it indexed (its slices stay in the memory tier only, evictable, for readers
    // behind the origin: `a_slow_reader_past_the_object_bound_gets_every_byte_of_one_fetch`).
    assert_eq!(front.cache.objects(), 0);
    // The URL goes to the origin now, on each request's own.
    let b = request("GET", &front.url("/live"), &[]).await;
    assert_eq!(
        b.body.as_ref().map(|b| sha256(b)).ok(),
        Some(sha256(&bytes_of(1, 0, len - 1)))
    );
    assert!(status_of(&b).contains("hit-for-pass"), "{}", status_of(&b));
    assert_eq!(origin.count("/live"), 2);
    assert_eq!(front.cache.objects(), 0);
    // An answer within the bound is stored as before.
    let mut small = Obj::new(3 * slice, "max-age=60");
    small.honor_range = false;
    small.chunked = true;
    origin.set("/small", small);
    request("GET", &front.url("/small"), &[]).await;
    let hit = request("GET", &front.url("/small"), &[]).await;
    assert!(
        status_of(&hit).starts_with("sluice; hit"),
        "{}",
        status_of(&hit)
    );
}

/// A GET through `Cache::serve` whose body is read only once the origin has sent the whole
/// answer (or after 2 s, for an answer the origin sends only as it is read): a client slower
/// than the origin.
async fn slow_get(
    front: &Front,
    origin: &OriginState,
    oaddr: SocketAddr,
    policy: &sluice_http::freshness::FreshnessPolicy,
    path: &str,
    len: u64,
) -> (Response<sluice::body::Body>, Result<Bytes, String>) {
    let o: Arc<dyn Origin> = Arc::new(TestOrigin {
        client: Client::builder(TokioExecutor::new()).build_http(),
        addr: oaddr,
    });
    let (parts, ()) = Request::get(path).body(()).unwrap().into_parts();
    let key = CacheKey::new("test", &parts.uri);
    let resp = front.cache.serve(&parts, &key, o, policy).await;
    for _ in 0..200 {
        if origin.bytes() >= len {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Whatever the fill does with what it read, it has done it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (head, body) = resp.into_parts();
    let got = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| e.to_string());
    (
        Response::from_parts(head, sluice::body::boxed(Empty::new())),
        got,
    )
}

/// Finding (review of the object bound): past `max_object_bytes` only the last 4 slices were
/// kept, with no back-pressure on the origin read: a client slower than the origin found its
/// next slice gone and fetched the answer again (a chunked one without validators came out
/// truncated). Its slices now stay in the memory tier, evictable (with a disk tier too, whose
/// copies go): the slow client gets every byte of the one fetch, and nothing is indexed.
#[tokio::test]
async fn a_slow_reader_past_the_object_bound_gets_every_byte_of_one_fetch() {
    for disk in [false, true] {
        let (origin, oaddr) = start_origin().await;
        let slice = 64 * KIB;
        let len = 24 * slice + 5;
        let mut obj = Obj::new(len, "max-age=60");
        obj.honor_range = false;
        obj.chunked = true;
        origin.set("/live", obj);
        let mut cfg = config(slice);
        cfg.max_object_bytes = ByteSize(4 * slice);
        let dir = tempfile::tempdir().unwrap();
        if disk {
            cfg.disk_path = Some(dir.path().to_path_buf());
            cfg.disk_bytes = ByteSize(64 * MIB);
        }
        let policy = cfg.policy().freshness();
        let front = start_front(cfg, oaddr).await;
        let (resp, got) = slow_get(&front, &origin, oaddr, &policy, "/live", len).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            got.as_deref().map(sha256).ok(),
            Some(sha256(&bytes_of(1, 0, len - 1))),
            "every byte the origin sent (disk tier: {disk})"
        );
        assert_eq!(
            origin.count("/live"),
            1,
            "the answer fetched again (disk tier: {disk})"
        );
        assert_eq!(front.cache.objects(), 0);
    }
}

/// Finding (same review): a whole answer whose `Content-Length` is past the bound was read by
/// a fill as fast as the origin sent it; now it is passed at its head (and remembered), its
/// client reading the origin at its own pace: one fetch, nothing stored, not even in memory.
#[tokio::test]
async fn a_whole_answer_announced_past_the_bound_is_passed_at_its_head() {
    let (origin, oaddr) = start_origin().await;
    let slice = 64 * KIB;
    let len = 24 * slice + 5;
    let mut obj = Obj::new(len, "max-age=60");
    obj.honor_range = false;
    origin.set("/big", obj);
    let mut cfg = config(slice);
    cfg.max_object_bytes = ByteSize(4 * slice);
    let policy = cfg.policy().freshness();
    let front = start_front(cfg, oaddr).await;
    let (resp, got) = slow_get(&front, &origin, oaddr, &policy, "/big", len).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let status = resp
        .headers()
        .get("cache-status")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    assert_eq!(origin.count("/big"), 1, "the answer fetched again");
    assert!(status.contains("detail=too-large"), "{status}");
    assert_eq!(
        got.as_deref().map(sha256).ok(),
        Some(sha256(&bytes_of(1, 0, len - 1)))
    );
    assert_eq!(front.cache.objects(), 0);
    assert_eq!(
        metric(&front, "sluice_cache_tier_bytes{tier=\"memory\"}"),
        0,
        "slices of a passed answer kept"
    );
    let b = request("GET", &front.url("/big"), &[]).await;
    assert!(status_of(&b).contains("hit-for-pass"), "{}", status_of(&b));
    assert_eq!(origin.count("/big"), 2);
}

/// Finding (same review): a cold fill's odd 206 (fewer bytes than asked) marked its URL to
/// pass whatever the request: one client's credentials kept it out of the cache for everyone
/// for `hit_for_pass_secs`. An answer to `Authorization` leaves no memo, as any other.
#[tokio::test]
async fn an_odd_206_to_credentials_leaves_no_memo() {
    let (origin, oaddr) = start_origin().await;
    let slice = 64 * KIB;
    let len = 3 * slice;
    let mut short = Obj::new(len, "public, max-age=60");
    short.short_206 = Some(10 * KIB);
    origin.set("/short-auth", short);
    let front = start_front(config(slice), oaddr).await;
    let a = request(
        "GET",
        &front.url("/short-auth"),
        &[("authorization", "Bearer x")],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", status_of(&a));
    assert_eq!(sha256(&body(&a)), sha256(&bytes_of(1, 0, len - 1)));
    assert!(status_of(&a).contains("detail=range"), "{}", status_of(&a));
    let b = request("GET", &front.url("/short-auth"), &[]).await;
    assert_eq!(sha256(&body(&b)), sha256(&bytes_of(1, 0, len - 1)));
    assert!(
        !status_of(&b).contains("hit-for-pass"),
        "memo left by a request with credentials: {}",
        status_of(&b)
    );
    assert!(status_of(&b).contains("detail=range"), "{}", status_of(&b));
}

#[tokio::test]
async fn a_version_change_mid_object_drops_it_and_never_mixes_versions() {
    let (origin, oaddr) = start_origin().await;
    let len = 3 * 64 * KIB;
    origin.set("/ver", Obj::new(len, "max-age=60"));
    let front = start_front(config(64 * KIB), oaddr).await;
    // Only the first slice is stored.
    let r = request("GET", &front.url("/ver"), &[("range", "bytes=0-9")]).await;
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 9)));
    origin.update("/ver", |o| o.version = 2);
    // The stored first slice goes out, then the second slice comes back as v2: the response is
    // cut rather than completed with bytes of another version.
    let r = request("GET", &front.url("/ver"), &[]).await;
    if let Ok(b) = &r.body {
        assert!(b.len() < len as usize, "a mixed body was completed");
    }
    let r = request("GET", &front.url("/ver"), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(sha256(&body(&r)), sha256(&bytes_of(2, 0, len - 1)));
    assert_eq!(r.headers["etag"], "\"v2\"");
    // Slices 1 and 2 are in flight together (read-ahead): each may detect the change.
    let m = front.metrics();
    let mismatches: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("sluice_cache_version_mismatches_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&mismatches), "{m}");
}

#[tokio::test]
async fn a_failing_origin_mid_body_wakes_every_waiter() {
    let (origin, oaddr) = start_origin().await;
    // The origin closes the port: every fill fails, nobody hangs.
    let front = start_front(config(64 * KIB), oaddr).await;
    origin.set("/gone", Obj::new(10, "max-age=60"));
    origin.update("/gone", |o| o.fail = true);
    let replies = futures_util::future::join_all((0..20).map(|_| {
        let url = front.url("/gone");
        async move { request("GET", &url, &[]).await }
    }))
    .await;
    for r in &replies {
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let front = start_front(config(64 * KIB), dead).await;
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        request("GET", &front.url("/x"), &[]),
    )
    .await
    .expect("no hang");
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
}

#[tokio::test]
async fn a_writer_cut_mid_slice_hands_over_and_every_reader_gets_exact_bytes() {
    let (origin, oaddr) = start_origin().await;
    let slice = 256 * KIB;
    let len = 3 * slice + 1000;
    let mut obj = Obj::new(len, "max-age=60");
    obj.delay = Duration::from_millis(50);
    // The answer for the second slice stops after two of its four 64 KiB chunks.
    obj.cut_once_at = Some((
        slice + 128 * KIB,
        Arc::new(std::sync::atomic::AtomicBool::new(true)),
    ));
    origin.set("/cut", obj);
    let front = start_front(config(slice), oaddr).await;
    let replies = futures_util::future::join_all((0..30).map(|i| {
        let url = front.url("/cut");
        async move {
            // Every third client comes once the object is known and asks for a range that
            // starts inside the slice that fails (it joins that slice's fill as a hit).
            let range = format!("bytes={}-", slice + 1000 * i);
            let headers: Vec<(&str, &str)> = if i % 3 == 0 {
                tokio::time::sleep(Duration::from_millis(120)).await;
                vec![("range", range.as_str())]
            } else {
                vec![]
            };
            (i, request("GET", &url, &headers).await)
        }
    }))
    .await;
    for (i, r) in &replies {
        let from = if i % 3 == 0 { slice + 1000 * i } else { 0 };
        assert_eq!(
            sha256(&body(r)),
            sha256(&bytes_of(1, from, len - 1)),
            "client {i}: {}",
            r.status
        );
    }
    // The second slice was asked for twice (the cut answer, then the new writer's); the others once.
    let ranges: Vec<String> = origin
        .requests_for("/cut")
        .into_iter()
        .filter_map(|h| h.get("range").cloned())
        .collect();
    let second = format!("bytes={}-{}", slice, 2 * slice - 1);
    assert_eq!(
        ranges.iter().filter(|r| **r == second).count(),
        2,
        "{ranges:?}"
    );
    assert_eq!(origin.count("/cut"), 5, "{ranges:?}");
}

// === the disk tier ===

async fn wait_disk(front: &Front, files: usize) {
    for _ in 0..200 {
        let m = front.metrics();
        let written = m
            .lines()
            .find(|l| l.starts_with("sluice_cache_tier_bytes{tier=\"disk\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        if written >= files as u64 * (64 * KIB + 16) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("disk tier never filled");
}

#[tokio::test]
async fn a_restart_finds_the_disk_tier_warm() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, oaddr) = start_origin().await;
    let len = 4 * 64 * KIB;
    origin.set("/warm", Obj::new(len, "max-age=600"));
    let mut cfg = config(64 * KIB);
    cfg.disk_path = Some(dir.path().to_path_buf());
    cfg.disk_bytes = ByteSize(64 * MIB);
    let first = start_front(cfg.clone(), oaddr).await;
    request("GET", &first.url("/warm"), &[]).await;
    wait_disk(&first, 4).await;
    assert_eq!(origin.count("/warm"), 4);

    let second = start_front(cfg, oaddr).await;
    let r = request("GET", &second.url("/warm"), &[]).await;
    assert!(
        status_of(&r).starts_with("sluice; hit"),
        "{}",
        status_of(&r)
    );
    assert_eq!(sha256(&body(&r)), sha256(&bytes_of(1, 0, len - 1)));
    assert_eq!(origin.count("/warm"), 4, "nothing fetched again");
    assert!(second
        .metrics()
        .contains(&format!("sluice_cache_disk_sent_bytes_total {len}")));
}

fn metric(front: &Front, name: &str) -> u64 {
    front
        .metrics()
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {}", front.metrics()))
}

#[tokio::test]
async fn a_burst_of_fills_is_all_on_disk_after_a_graceful_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, oaddr) = start_origin().await;
    let len = 4 * 64 * KIB;
    let paths: Vec<String> = (0..100).map(|i| format!("/burst/{i}")).collect();
    for p in &paths {
        origin.set(p, Obj::new(len, "max-age=600"));
    }
    let mut cfg = config(64 * KIB);
    cfg.disk_path = Some(dir.path().to_path_buf());
    cfg.disk_bytes = ByteSize(256 * MIB);
    // A queue far smaller than the burst (400 slices, 100 records): fills wait for room instead
    // of dropping writes.
    cfg.disk_queue = 4;
    let first = start_front(cfg.clone(), oaddr).await;
    let want = sha256(&bytes_of(1, 0, len - 1));
    let replies = futures_util::future::join_all(
        paths
            .iter()
            .map(|p| {
                let url = first.url(p);
                async move { request("GET", &url, &[]).await }
            })
            .collect::<Vec<_>>(),
    )
    .await;
    for r in &replies {
        assert_eq!(sha256(&body(r)), want);
    }
    assert_eq!(origin.requests.lock().unwrap().len(), 400);
    // What a SIGTERM does after the connections are done (`serve_reloadable`).
    assert!(first.cache.flush(Duration::from_secs(20)).await);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(metric(&first, "sluice_cache_disk_dropped_writes_total"), 0);
    assert_eq!(metric(&first, "sluice_cache_disk_queue_jobs"), 0);
    let files = std::fs::read_dir(dir.path().join("slices"))
        .unwrap()
        .count();
    assert_eq!(files, 400);

    let second = start_front(cfg, oaddr).await;
    for p in &paths {
        let r = request("GET", &second.url(p), &[]).await;
        assert!(
            status_of(&r).starts_with("sluice; hit"),
            "{p}: {}",
            status_of(&r)
        );
        assert_eq!(sha256(&body(&r)), want);
    }
    assert_eq!(
        origin.requests.lock().unwrap().len(),
        400,
        "every object a hit after the restart"
    );
}

#[tokio::test]
async fn many_cold_streams_stay_within_the_byte_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, oaddr) = start_origin().await;
    let slice = 64 * KIB;
    let len = 2 * MIB + 77;
    let paths: Vec<String> = (0..20).map(|i| format!("/cold/{i}")).collect();
    for p in &paths {
        origin.set(p, Obj::new(len, "max-age=600"));
    }
    // The ones that ignore Range too: their writer reads on into the following slices.
    for p in &paths[..5] {
        origin.update(p, |o| o.honor_range = false);
    }
    let budget = 4 * MIB;
    let mut cfg = config(slice);
    cfg.memory_bytes = ByteSize(budget);
    cfg.disk_path = Some(dir.path().to_path_buf());
    cfg.disk_bytes = ByteSize(256 * MIB);
    cfg.disk_queue = 8;
    let front = start_front(cfg, oaddr).await;
    // 20 streams of 2 MiB each (40 MiB) through a 4 MiB budget, all at once.
    let want = sha256(&bytes_of(1, 0, len - 1));
    let replies = futures_util::future::join_all(
        paths
            .iter()
            .map(|p| {
                let url = front.url(p);
                async move { request("GET", &url, &[]).await }
            })
            .collect::<Vec<_>>(),
    )
    .await;
    for r in &replies {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(sha256(&body(r)), want);
    }
    assert!(front.cache.flush(Duration::from_secs(20)).await);
    // The gauges refresh once a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(metric(&front, "sluice_cache_budget_bytes"), budget);
    let peak = metric(&front, "sluice_cache_accounted_peak_bytes");
    // Per-entry bookkeeping (128 B a slice) is part of the tier's weight; the tier rounds its
    // capacity up by at most a byte per shard.
    assert!(peak <= budget + 64, "peak {peak} over the budget {budget}");
    assert!(peak >= budget / 2, "the tier was used: peak {peak}");
    assert_eq!(
        metric(&front, "sluice_cache_tier_bytes{tier=\"transit\"}"),
        0
    );
}

/// Finding: an object's stored fields and tags counted against nothing, so `max_objects`
/// answers with large fields held memory far past `memory_bytes`. Now they are charged to the
/// budget: the accounted bytes include them and stay within it, and the index keeps the objects
/// whose heads fit (the oldest go first, as past `max_objects`).
#[tokio::test]
async fn stored_heads_count_against_the_byte_budget() {
    let (origin, oaddr) = start_origin().await;
    let filler = "h".repeat(8 * KIB as usize);
    let paths: Vec<String> = (0..200).map(|i| format!("/heads/{i}")).collect();
    for p in &paths {
        origin.set(p, Obj::new(1000, "max-age=600").header("x-filler", &filler));
    }
    let budget = 256 * KIB;
    let mut cfg = config(16 * KIB);
    cfg.memory_bytes = ByteSize(budget);
    let front = start_front(cfg, oaddr).await;
    let want = Bytes::from(bytes_of(1, 0, 999));
    for p in &paths {
        let r = request("GET", &front.url(p), &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(body(&r), want);
        assert_eq!(r.headers["x-filler"], filler.as_str());
    }
    // The newest objects are still stored, and served from the cache.
    let last = request("GET", &front.url(&paths[199]), &[]).await;
    assert!(
        status_of(&last).starts_with("sluice; hit"),
        "{}",
        status_of(&last)
    );
    assert_eq!(body(&last), want);
    assert_eq!(origin.count(&paths[199]), 1);
    // The gauges refresh once a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let objects = front.cache.objects() as u64;
    assert!((4..200).contains(&objects), "{objects} objects indexed");
    let accounted = metric(&front, "sluice_cache_accounted_bytes");
    let peak = metric(&front, "sluice_cache_accounted_peak_bytes");
    // Each indexed object's 8 KiB field counts (twice: as stored and as a hit writes it).
    assert!(
        accounted >= objects * 2 * 8 * KIB,
        "{accounted} accounted for {objects} objects"
    );
    assert!(
        accounted <= budget + 64,
        "{accounted} over the budget {budget}"
    );
    assert!(peak <= budget + 64, "peak {peak} over the budget {budget}");
}

/// Unique long-query GETs to a URL the origin answers `private`: each leaves a hit-for-pass memo
/// keyed by its ~60 KB URL. The memos count against the budget like heads (uncharged, 100,000 of
/// them held ~12 GB beside a 256 MiB budget): the newest are kept and work, the oldest go, and
/// within their own share of the room for heads (sharing it all, ~2,000 such requests evicted
/// every stored object).
#[tokio::test]
async fn memos_with_long_urls_count_against_the_byte_budget() {
    let (origin, oaddr) = start_origin().await;
    origin.set("/private", Obj::new(100, "private, max-age=60"));
    origin.set("/stored", Obj::new(100, "max-age=60"));
    // 2 MiB for heads, an eighth of it for memos: two of ~120 KB.
    let budget = 4 * MIB;
    let mut cfg = config(16 * KIB);
    cfg.memory_bytes = ByteSize(budget);
    let front = start_front(cfg, oaddr).await;
    let stored = request("GET", &front.url("/stored"), &[]).await;
    assert_eq!(body(&stored), Bytes::from(bytes_of(1, 0, 99)));
    let filler = "q".repeat(60_000);
    let paths: Vec<String> = (0..40)
        .map(|i| format!("/private?{i:03}{filler}"))
        .collect();
    for p in &paths {
        let r = request("GET", &front.url(p), &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 99)));
        assert!(
            status_of(&r).contains("detail=private"),
            "{}",
            status_of(&r)
        );
    }
    // The newest memo still sends its URL straight to the origin...
    let newest = request("GET", &front.url(&paths[39]), &[]).await;
    assert!(
        status_of(&newest).contains("detail=hit-for-pass"),
        "{}",
        status_of(&newest)
    );
    // ...the oldest is gone: its URL is a plain miss again.
    let oldest = request("GET", &front.url(&paths[0]), &[]).await;
    assert!(
        status_of(&oldest).contains("detail=private"),
        "{}",
        status_of(&oldest)
    );
    assert_eq!(origin.count("/private"), 42);
    // Memos push out only older memos: the object stored before them is still a hit (the
    // 40 memos, ~4.8 MB, went far past the whole room for heads).
    let again = request("GET", &front.url("/stored"), &[]).await;
    assert!(
        status_of(&again).starts_with("sluice; hit"),
        "{}",
        status_of(&again)
    );
    assert_eq!(body(&again), Bytes::from(bytes_of(1, 0, 99)));
    assert_eq!(origin.count("/stored"), 1);
    // The gauges refresh once a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let accounted = metric(&front, "sluice_cache_accounted_bytes");
    // Two memos of ~120 KB are counted, and nothing past the budget.
    assert!(accounted >= 2 * 120_000, "{accounted} accounted");
    assert!(
        accounted <= budget + 64,
        "{accounted} over the budget {budget}"
    );
}

/// An answer whose fields and tags cost more than a stored head may (`MAX_HEAD_BYTES`, 64 KiB)
/// is served as the origin sent it, booked as uncacheable and not stored: the next request goes
/// to the origin again.
#[tokio::test]
async fn an_answer_with_a_head_too_large_to_keep_is_served_not_stored() {
    let (origin, oaddr) = start_origin().await;
    let filler = "h".repeat(70 * KIB as usize);
    let tags: Vec<String> = (0..2000).map(|i| format!("t{i:05}")).collect();
    let tags = tags.join(" ");
    origin.set(
        "/big-fields",
        Obj::new(5000, "max-age=600").header("x-filler", &filler),
    );
    origin.set(
        "/many-tags",
        Obj::new(5000, "max-age=600").header("surrogate-key", &tags),
    );
    origin.set("/small", Obj::new(5000, "max-age=600"));
    let front = start_front(config(64 * KIB), oaddr).await;
    let want = Bytes::from(bytes_of(1, 0, 4999));
    for (path, name, value) in [
        ("/big-fields", "x-filler", &filler),
        ("/many-tags", "surrogate-key", &tags),
    ] {
        for round in 1..=2 {
            let r = request("GET", &front.url(path), &[]).await;
            assert_eq!(r.status, StatusCode::OK);
            assert_eq!(body(&r), want);
            assert_eq!(r.headers[name], value.as_str());
            let detail = if round == 1 {
                "detail=head-too-large"
            } else {
                "detail=hit-for-pass"
            };
            assert!(status_of(&r).contains(detail), "{path}: {}", status_of(&r));
            assert_eq!(origin.count(path), round, "{path}: not stored");
        }
    }
    // An ordinary answer beside them is stored.
    request("GET", &front.url("/small"), &[]).await;
    let hit = request("GET", &front.url("/small"), &[]).await;
    assert!(
        status_of(&hit).starts_with("sluice; hit"),
        "{}",
        status_of(&hit)
    );
    assert_eq!(origin.count("/small"), 1);
    assert_eq!(front.cache.objects(), 1);
    assert_eq!(metric(&front, "sluice_cache_uncacheable_total"), 2);
}

/// A fill of a known object's short last slice holds only that slice's length of the budget
/// while it waits for the origin: holding a whole slice for a short object kept the memory tier
/// smaller than its budget by a slice per fill (S7: small objects through a cluster).
#[tokio::test]
async fn a_known_short_slice_reserves_its_own_length() {
    let (origin, oaddr) = start_origin().await;
    let len = MIB + 64 * KIB;
    origin.set("/tail", Obj::new(len, "max-age=600"));
    let front = start_front(config(MIB), oaddr).await;
    // The first slice: from here on the object and its length are known.
    let r = request("GET", &front.url("/tail"), &[("range", "bytes=0-9")]).await;
    assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
    // The last slice (64 KiB), from an origin that takes its time to answer.
    origin.update("/tail", |o| o.delay = Duration::from_millis(2500));
    let url = front.url("/tail");
    let tail = tokio::spawn(async move {
        let range = format!("bytes={MIB}-");
        request("GET", &url, &[("range", range.as_str())]).await
    });
    // The gauges refresh once a second.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(
        metric(&front, "sluice_cache_tier_bytes{tier=\"transit\"}"),
        64 * KIB,
        "the fill of a 64 KiB slice holds 64 KiB of the budget"
    );
    let r = tail.await.unwrap();
    assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(sha256(&body(&r)), sha256(&bytes_of(1, MIB, len - 1)));
}

#[tokio::test]
async fn corrupt_or_truncated_disk_files_are_dropped_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, oaddr) = start_origin().await;
    let len = 4 * 64 * KIB;
    origin.set("/rot", Obj::new(len, "max-age=600"));
    let mut cfg = config(64 * KIB);
    cfg.disk_path = Some(dir.path().to_path_buf());
    cfg.disk_bytes = ByteSize(64 * MIB);
    let first = start_front(cfg.clone(), oaddr).await;
    request("GET", &first.url("/rot"), &[]).await;
    wait_disk(&first, 4).await;

    let mut files: Vec<_> = std::fs::read_dir(dir.path().join("slices"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    // One flipped byte, one cut short.
    let mut raw = std::fs::read(&files[0]).unwrap();
    raw[1000] ^= 0xff;
    std::fs::write(&files[0], &raw).unwrap();
    let raw = std::fs::read(&files[1]).unwrap();
    std::fs::write(&files[1], &raw[..raw.len() / 2]).unwrap();

    let second = start_front(cfg, oaddr).await;
    let r = request("GET", &second.url("/rot"), &[]).await;
    assert_eq!(sha256(&body(&r)), sha256(&bytes_of(1, 0, len - 1)));
    assert_eq!(
        origin.count("/rot"),
        6,
        "the two damaged slices came from the origin again"
    );
}

#[tokio::test]
async fn a_failing_disk_drops_entries_and_requests_are_still_served() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, oaddr) = start_origin().await;
    let len = 3 * 64 * KIB;
    origin.set("/df", Obj::new(len, "max-age=600"));
    let mut cfg = config(64 * KIB);
    cfg.disk_path = Some(dir.path().to_path_buf());
    cfg.disk_bytes = ByteSize(64 * MIB);
    let front = start_front(cfg, oaddr).await;
    // Every slice write now fails (as on a full or broken disk).
    std::fs::remove_dir_all(dir.path().join("slices")).unwrap();
    std::fs::write(dir.path().join("slices"), b"not a directory").unwrap();
    for _ in 0..2 {
        let r = request("GET", &front.url("/df"), &[]).await;
        assert_eq!(sha256(&body(&r)), sha256(&bytes_of(1, 0, len - 1)));
    }
    for _ in 0..100 {
        if front
            .metrics()
            .contains("sluice_cache_disk_dropped_writes_total 3")
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("drops not counted: {}", front.metrics());
}

/// Slice files cut with one `slice_bytes` are never served as slices of another after a restart
/// (slice 1 of 64 KiB is bytes 64-128 KiB; slice 1 of 128 KiB is bytes 128-256 KiB).
#[tokio::test]
async fn a_restart_with_another_slice_size_serves_the_right_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, oaddr) = start_origin().await;
    let len = 4 * 64 * KIB;
    origin.set("/resize", Obj::new(len, "max-age=600"));
    let mut cfg = config(64 * KIB);
    cfg.disk_path = Some(dir.path().to_path_buf());
    cfg.disk_bytes = ByteSize(64 * MIB);
    let first = start_front(cfg.clone(), oaddr).await;
    request("GET", &first.url("/resize"), &[]).await;
    wait_disk(&first, 4).await;
    assert!(first.cache.flush(Duration::from_secs(10)).await);

    cfg.slice_bytes = ByteSize(128 * KIB);
    let second = start_front(cfg, oaddr).await;
    // A range across the old slices' boundaries first (nothing in memory yet), then the whole.
    let (a, z) = (60_000, 140_000);
    let range = format!("bytes={a}-{z}");
    let r = request("GET", &second.url("/resize"), &[("range", range.as_str())]).await;
    assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(sha256(&body(&r)), sha256(&bytes_of(1, a, z)));
    let r = request("GET", &second.url("/resize"), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(sha256(&body(&r)), sha256(&bytes_of(1, 0, len - 1)));
}

/// A slice file that cannot be read for another reason than its content (a directory in its
/// place; in production descriptors exhausted, permission, a passing EIO) is a miss: fetched
/// from the origin, the file left alone and not counted corrupt.
#[tokio::test]
async fn an_unreadable_slice_file_is_a_miss_not_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, oaddr) = start_origin().await;
    let len = 4 * 64 * KIB;
    origin.set("/eisdir", Obj::new(len, "max-age=600"));
    let mut cfg = config(64 * KIB);
    cfg.disk_path = Some(dir.path().to_path_buf());
    cfg.disk_bytes = ByteSize(64 * MIB);
    let first = start_front(cfg.clone(), oaddr).await;
    request("GET", &first.url("/eisdir"), &[]).await;
    wait_disk(&first, 4).await;
    assert!(first.cache.flush(Duration::from_secs(10)).await);

    // A restart (nothing in memory), then the first slice's file becomes unreadable.
    let second = start_front(cfg, oaddr).await;
    let mut files: Vec<_> = std::fs::read_dir(dir.path().join("slices"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 4);
    std::fs::remove_file(&files[0]).unwrap();
    std::fs::create_dir(&files[0]).unwrap();
    let r = request("GET", &second.url("/eisdir"), &[]).await;
    assert_eq!(sha256(&body(&r)), sha256(&bytes_of(1, 0, len - 1)));
    assert_eq!(
        origin.count("/eisdir"),
        5,
        "the unreadable slice came from the origin"
    );
    assert!(second.cache.flush(Duration::from_secs(10)).await);
    // The gauges refresh once a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(metric(&second, "sluice_cache_disk_corrupt_slices_total"), 0);
    assert!(files[0].is_dir(), "left alone");
}

/// An origin announcing an absurd total length (10^18 bytes) in a 206: the object is stored,
/// and dropping it (a purge) does not walk its 10^13 slices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purging_an_object_announced_huge_is_quick() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, oaddr) = start_origin().await;
    // A petabyte, the most an object may announce and be stored: 2^34 slices of 64 KiB.
    origin.set("/huge", Obj::new(1 << 50, "max-age=600"));
    // Past it (10^18 bytes) the answer is passed on and nothing is stored.
    origin.set(
        "/absurd",
        Obj::new(1_000_000_000_000_000_000, "max-age=600"),
    );
    let mut cfg = config(64 * KIB);
    cfg.disk_path = Some(dir.path().to_path_buf());
    cfg.disk_bytes = ByteSize(64 * MIB);
    let front = start_front(cfg, oaddr).await;
    let r = request("GET", &front.url("/absurd"), &[("range", "bytes=0-99")]).await;
    assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(sha256(&body(&r)), sha256(&bytes_of(1, 0, 99)));
    assert_eq!(front.cache.objects(), 0, "an absurd length is not stored");
    let r = request("GET", &front.url("/huge"), &[("range", "bytes=0-99")]).await;
    assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(sha256(&body(&r)), sha256(&bytes_of(1, 0, 99)));
    assert_eq!(front.cache.objects(), 1);
    let started = std::time::Instant::now();
    let purge = tokio::time::timeout(
        Duration::from_secs(5),
        request(
            "PURGE",
            &front.url("/huge"),
            &[("x-purge-key", "purge-secret")],
        ),
    )
    .await
    .expect("the purge answers");
    assert_eq!(purge.status, StatusCode::OK);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "purge took {:?}",
        started.elapsed()
    );
    assert_eq!(front.cache.objects(), 0);
}

// === purge ===

#[tokio::test]
async fn purge_by_url_prefix_and_tag_with_auth() {
    let (origin, oaddr) = start_origin().await;
    origin.set(
        "/p/a",
        Obj::new(10, "max-age=60").header("surrogate-key", "red blue"),
    );
    origin.set(
        "/p/b",
        Obj::new(10, "max-age=60").header("cache-tag", "green"),
    );
    origin.set("/q", Obj::new(10, "max-age=60"));
    let front = start_front(config(64 * KIB), oaddr).await;
    let warm = || async {
        for p in ["/p/a", "/p/b", "/q"] {
            request("GET", &front.url(p), &[]).await;
        }
    };
    warm().await;
    assert_eq!(front.cache.objects(), 3);

    // Wrong key, no key, and (below) a disallowed address all look the same.
    let denied = request("PURGE", &front.url("/q"), &[("x-purge-key", "nope")]).await;
    let none = request("PURGE", &front.url("/q"), &[]).await;
    assert_eq!(denied.status, StatusCode::FORBIDDEN);
    assert_eq!(body(&denied), body(&none));

    let ok = request(
        "PURGE",
        &front.url("/q"),
        &[("x-purge-key", "purge-secret")],
    )
    .await;
    assert_eq!(
        body(&ok),
        Bytes::from_static(b"{\"purged\":1,\"soft\":false}")
    );
    let tag = request(
        "PURGE",
        &front.url("/"),
        &[
            ("authorization", "Bearer purge-secret"),
            ("x-purge-mode", "tag"),
            ("x-purge-tag", "blue"),
        ],
    )
    .await;
    assert_eq!(
        body(&tag),
        Bytes::from_static(b"{\"purged\":1,\"soft\":false}")
    );
    assert_eq!(front.cache.objects(), 1);
    let prefix = request(
        "PURGE",
        &front.url("/p/"),
        &[("x-purge-key", "purge-secret"), ("x-purge-mode", "prefix")],
    )
    .await;
    assert_eq!(
        body(&prefix),
        Bytes::from_static(b"{\"purged\":1,\"soft\":false}")
    );
    assert_eq!(front.cache.objects(), 0);

    // Soft purge: kept, but revalidated (a 304 here) on next use.
    warm().await;
    let soft = request(
        "PURGE",
        &front.url("/q"),
        &[("x-purge-key", "purge-secret"), ("x-purge-soft", "1")],
    )
    .await;
    assert_eq!(
        body(&soft),
        Bytes::from_static(b"{\"purged\":1,\"soft\":true}")
    );
    let r = request("GET", &front.url("/q"), &[]).await;
    assert!(
        status_of(&r).contains("fwd=stale; fwd-status=304"),
        "{}",
        status_of(&r)
    );

    let mut cfg = config(64 * KIB);
    cfg.purge_allow = vec!["10.0.0.0/8".parse().unwrap()];
    let closed = start_front(cfg, oaddr).await;
    let r = request(
        "PURGE",
        &closed.url("/q"),
        &[("x-purge-key", "purge-secret")],
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(body(&r), body(&none));
}

/// Finding: a tag purge named as many tags as a header holds (a 64 KiB `X-Purge-Tag`, ~20,000),
/// each matched against every object with the index locked. Past 64 it is refused with a 400
/// that says why; 64 are purged as asked.
#[tokio::test]
async fn a_tag_purge_names_at_most_64_tags() {
    let (origin, oaddr) = start_origin().await;
    origin.set(
        "/t",
        Obj::new(10, "max-age=60").header("surrogate-key", "t63"),
    );
    let front = start_front(config(64 * KIB), oaddr).await;
    request("GET", &front.url("/t"), &[]).await;
    assert_eq!(front.cache.objects(), 1);
    let tags = |n: usize| {
        (0..n)
            .map(|i| format!("t{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let purge = |tags: String| {
        let url = front.url("/");
        async move {
            request(
                "PURGE",
                &url,
                &[
                    ("x-purge-key", "purge-secret"),
                    ("x-purge-mode", "tag"),
                    ("x-purge-tag", &tags),
                ],
            )
            .await
        }
    };
    for n in [65, 20_000] {
        let r = purge(tags(n)).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{n} tags");
        assert_eq!(
            body(&r),
            Bytes::from_static(
                b"{\"error\":\"X-Purge-Tag names more than 64 tags: send several purges\"}"
            )
        );
        assert_eq!(front.cache.objects(), 1, "nothing purged");
    }
    let r = purge(tags(64)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        body(&r),
        Bytes::from_static(b"{\"purged\":1,\"soft\":false}")
    );
    assert_eq!(front.cache.objects(), 0);
}

#[tokio::test]
async fn empty_objects_and_ranges_past_the_end_of_a_cold_object_are_passed() {
    let (origin, oaddr) = start_origin().await;
    origin.set("/empty", Obj::new(0, "max-age=60"));
    origin.set("/short", Obj::new(100, "max-age=60"));
    let front = start_front(config(64 * KIB), oaddr).await;
    let r = request("GET", &front.url("/empty"), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(body(&r).len(), 0);
    let r = request(
        "GET",
        &front.url("/short"),
        &[("range", "bytes=70000-70010")],
    )
    .await;
    assert_eq!(r.status, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(r.headers["content-range"], "bytes */100");
}

#[tokio::test]
async fn a_client_that_disconnects_does_not_abort_the_fill() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (origin, oaddr) = start_origin().await;
    let len = 4 * MIB;
    origin.set("/dc", Obj::new(len, "max-age=60"));
    let front = start_front(config(MIB), oaddr).await;
    let mut s = tokio::net::TcpStream::connect(front.addr).await.unwrap();
    s.write_all(b"GET /dc HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 64];
    let n = s.read(&mut first).await.unwrap();
    assert!(n > 0);
    // Gone after a few bytes of the first slice.
    drop(s);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = request("GET", &front.url("/dc"), &[("range", "bytes=0-1048575")]).await;
    assert!(
        status_of(&r).starts_with("sluice; hit"),
        "{}",
        status_of(&r)
    );
    assert_eq!(sha256(&body(&r)), sha256(&bytes_of(1, 0, MIB - 1)));
    let slice0 = origin
        .requests_for("/dc")
        .iter()
        .filter(|h| h.get("range").map(String::as_str) == Some("bytes=0-1048575"))
        .count();
    assert_eq!(slice0, 1, "the first slice was fetched once and completed");
    assert!(
        origin.count("/dc") <= 2,
        "nothing past the read-ahead was fetched"
    );
}

#[tokio::test]
async fn a_stalled_origin_fails_the_fill_instead_of_hanging() {
    let (origin, oaddr) = start_origin().await;
    let mut obj = Obj::new(200 * KIB, "max-age=60");
    obj.stall_after = Some(100 * KIB);
    origin.set("/stall", obj);
    let mut cfg = config(64 * KIB);
    cfg.origin_idle_timeout_secs = 1;
    let front = start_front(cfg, oaddr).await;
    let started = std::time::Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        request("GET", &front.url("/stall"), &[]),
    )
    .await
    .expect("no hang");
    assert!(r.body.is_err(), "a short body must not look complete");
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[tokio::test]
async fn a_trickling_fill_nobody_reads_gives_its_place_back() {
    let (origin, oaddr) = start_origin().await;
    let mut slow = Obj::new(16 * KIB, "max-age=60");
    // 16 KiB a byte every 200 ms: close to an hour, and never silent for the idle wait.
    slow.trickle = Some(Duration::from_millis(200));
    origin.set("/slow", slow);
    let mut slowish = Obj::new(20, "max-age=60");
    slowish.trickle = Some(Duration::from_millis(200));
    origin.set("/slowish", slowish);
    origin.set("/fast", Obj::new(16 * KIB, "max-age=60"));
    let mut cfg = config(64 * KIB);
    cfg.max_inflight_slices = 1;
    cfg.origin_idle_timeout_secs = 1;
    cfg.origin_slice_timeout_secs = 2;
    let front = start_front(cfg, oaddr).await;

    // A fill someone follows goes on past the slice timeout: 20 bytes over about 4 s.
    let whole = tokio::time::timeout(
        Duration::from_secs(30),
        request("GET", &front.url("/slowish"), &[]),
    )
    .await
    .expect("the followed fill finished");
    assert_eq!(body(&whole), Bytes::from(bytes_of(1, 0, 19)));

    // The client gives up on the slow object; its fill holds the one fill place.
    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        request("GET", &front.url("/slow"), &[]),
    )
    .await;
    assert!(gave_up.is_err(), "16 KiB cannot trickle in within a second");
    // Given up once its slice has taken the slice timeout with nobody reading (before, it held
    // the place for the hour and this miss waited for it).
    let started = std::time::Instant::now();
    let fast = tokio::time::timeout(
        Duration::from_secs(20),
        request("GET", &front.url("/fast"), &[]),
    )
    .await
    .expect("the fill place came free");
    assert_eq!(sha256(&body(&fast)), sha256(&bytes_of(1, 0, 16 * KIB - 1)));
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// Opens a connection, sends a GET for `path` with `extra` header lines, and returns the socket
/// once the front has had time to take the request.
async fn sent(front: &Front, path: &str, extra: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(front.addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n{extra}\r\n").as_bytes())
        .await
        .unwrap();
    s
}

/// Closes a client connection with a reset, as a client that gives up at once does.
fn reset(s: tokio::net::TcpStream) {
    socket2::SockRef::from(&s)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(s);
}

/// Finding: a fill queued for a fill place was fetched once it got one, even when every client
/// that wanted it had gone: a flood of cache-busting requests, each reset at once, cost the
/// origin a slice each, in front of every real miss. Now such a fill ends before the origin is
/// asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_fills_whose_clients_left_never_reach_the_origin() {
    let (origin, oaddr) = start_origin().await;
    let mut slow = Obj::new(100, "max-age=60");
    slow.delay = Duration::from_secs(2);
    origin.set("/slow", slow);
    for i in 0..3 {
        origin.set(&format!("/drop/{i}"), Obj::new(100, "max-age=60"));
    }
    let mut cfg = config(64 * KIB);
    cfg.max_inflight_slices = 1;
    let front = start_front(cfg, oaddr).await;
    // A slow origin holds the one fill place.
    let url = front.url("/slow");
    let held = tokio::spawn(async move { request("GET", &url, &[]).await });
    while origin.count("/slow") == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Misses queued behind it, whose clients then reset.
    let mut queued = Vec::new();
    for i in 0..3 {
        queued.push(sent(&front, &format!("/drop/{i}?x={i}"), "").await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    queued.into_iter().for_each(reset);
    let r = held.await.unwrap();
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 99)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked: usize = (0..3).map(|i| origin.count(&format!("/drop/{i}"))).sum();
    assert_eq!(asked, 0, "fills nobody followed any more asked the origin");
    assert_eq!(metric(&front, "sluice_cache_fills_given_up_total"), 3);
    // A client that asks again gets a fill of its own.
    let r = request("GET", &front.url("/drop/0?x=0"), &[]).await;
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 99)));
    assert_eq!(origin.count("/drop/0"), 1);
}

/// Finding: writers waiting for a fill place had no bound, so a miss could queue behind any
/// number of them. Past `max_inflight_slices` times four waiting, a new miss goes to the origin
/// as a pass at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_queue_of_fills_a_miss_is_passed_not_queued() {
    let (origin, oaddr) = start_origin().await;
    let mut slow = Obj::new(100, "max-age=60");
    slow.delay = Duration::from_secs(3);
    origin.set("/slow", slow);
    for i in 0..5 {
        origin.set(&format!("/q/{i}"), Obj::new(100, "max-age=60"));
    }
    let mut cfg = config(64 * KIB);
    cfg.max_inflight_slices = 1;
    let front = start_front(cfg, oaddr).await;
    let url = front.url("/slow");
    let held = tokio::spawn(async move { request("GET", &url, &[]).await });
    while origin.count("/slow") == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Four writers wait for the place: the queue is full.
    let waiting: Vec<_> = (0..4)
        .map(|i| {
            let url = front.url(&format!("/q/{i}"));
            tokio::spawn(async move { request("GET", &url, &[]).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        request("GET", &front.url("/q/4"), &[]),
    )
    .await
    .expect("answered");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "queued behind the slow fill: {:?}",
        started.elapsed()
    );
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 99)));
    assert!(status_of(&r).contains("detail=busy"), "{}", status_of(&r));
    // The queued ones are filled and stored once the place is free.
    assert_eq!(body(&held.await.unwrap()), Bytes::from(bytes_of(1, 0, 99)));
    for w in waiting {
        assert_eq!(body(&w.await.unwrap()), Bytes::from(bytes_of(1, 0, 99)));
    }
    let r = request("GET", &front.url("/q/0"), &[]).await;
    assert!(
        status_of(&r).starts_with("sluice; hit"),
        "{}",
        status_of(&r)
    );
}

/// Finding: the queue that turns misses into passes counted every waiting writer, read-ahead
/// and refetches of stored slices too (about two per streaming client), so streams of stored
/// objects behind a slow origin made every new miss a pass, and passes are not coalesced: N
/// viewers of a new live segment made N origin requests. Only misses count now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refetches_of_stored_slices_do_not_make_a_miss_a_pass() {
    let (origin, oaddr) = start_origin().await;
    let mut slow = Obj::new(100, "max-age=60");
    slow.delay = Duration::from_secs(2);
    origin.set("/slow", slow);
    let slice = 64 * KIB;
    let len = 10 * slice;
    origin.set("/stored", Obj::new(len, "max-age=60"));
    origin.set("/live", Obj::new(100, "max-age=60"));
    let mut cfg = config(slice);
    cfg.max_inflight_slices = 1;
    let front = start_front(cfg, oaddr).await;
    // A stored object whose first slice only is in the cache.
    let r = request("GET", &front.url("/stored"), &[("range", "bytes=0-9")]).await;
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 9)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A slow origin holds the one fill place.
    let url = front.url("/slow");
    let held = tokio::spawn(async move { request("GET", &url, &[]).await });
    while origin.count("/slow") == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Five clients of the stored object each need a slice fetched: five warm writers wait.
    let streams: Vec<_> = (1..=5u64)
        .map(|k| {
            let url = front.url("/stored");
            let range = format!("bytes={}-{}", k * slice, k * slice + 9);
            tokio::spawn(async move { request("GET", &url, &[("range", &range)]).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Two viewers of a new object at once: one fill, queued, not two passes.
    let viewers: Vec<_> = (0..2)
        .map(|_| {
            let url = front.url("/live");
            tokio::spawn(async move { request("GET", &url, &[]).await })
        })
        .collect();
    for v in viewers {
        let r = v.await.unwrap();
        assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 99)));
        assert!(!status_of(&r).contains("detail=busy"), "{}", status_of(&r));
    }
    assert_eq!(origin.count("/live"), 1, "the viewers were not coalesced");
    assert_eq!(body(&held.await.unwrap()), Bytes::from(bytes_of(1, 0, 99)));
    for (k, s) in (1..=5u64).zip(streams) {
        let r = s.await.unwrap();
        assert_eq!(body(&r), Bytes::from(bytes_of(1, k * slice, k * slice + 9)));
    }
}

/// Finding: with an origin that ignores `Range`, a client asking for the end of a long object
/// and leaving had every slice before it read and stored for nobody (the detached budget
/// applied only past the slice asked for). It applies before it too now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_nobody_follows_stops_before_the_slice_asked_for() {
    let (origin, oaddr) = start_origin().await;
    let len = 20 * MIB;
    let mut obj = Obj::new(len, "max-age=60");
    obj.honor_range = false;
    // 20 MiB in about 3 s.
    obj.pace = Some(Duration::from_millis(10));
    origin.set("/far", obj);
    let mut cfg = config(MIB);
    cfg.detached_fill_bytes = ByteSize(2 * MIB);
    let front = start_front(cfg, oaddr).await;
    let s = sent(&front, "/far", &format!("range: bytes={}-\r\n", len - 100)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    reset(s);
    // Wait until the origin stops sending (or has sent it all).
    let mut last = origin.bytes();
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = origin.bytes();
        if now == last {
            break;
        }
        last = now;
    }
    assert!(
        last < 8 * MIB,
        "{last} of {len} bytes read for a client long gone"
    );
}

#[tokio::test]
async fn negative_answers_with_freshness_are_cached() {
    let (origin, oaddr) = start_origin().await;
    let mut obj = Obj::new(10, "max-age=60");
    obj.status = 404;
    origin.set("/missing", obj);
    let front = start_front(config(64 * KIB), oaddr).await;
    let a = request("GET", &front.url("/missing"), &[]).await;
    let b = request("GET", &front.url("/missing"), &[]).await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND)
    );
    assert_eq!(body(&b), Bytes::from(bytes_of(1, 0, 9)));
    assert!(
        status_of(&b).starts_with("sluice; hit"),
        "{}",
        status_of(&b)
    );
    assert_eq!(origin.count("/missing"), 1);
}

#[tokio::test]
async fn through_the_shared_upstream_client() {
    let (origin, oaddr) = start_origin().await;
    origin.set("/media/seg.ts", Obj::new(150 * KIB, "max-age=60"));
    let upstream_cfg = sluice::config::UpstreamConfig {
        allow_private: true,
        ..Default::default()
    };
    let mut registry = Registry::default();
    let upstream = sluice::upstream::Upstream::new(&upstream_cfg, &mut registry).unwrap();
    let base = url::Url::parse(&format!("http://{oaddr}/media/")).unwrap();
    let cfg = config(64 * KIB);
    let cache = Cache::new(&cfg, None, &mut registry).unwrap();
    let origin_impl: Arc<dyn Origin> = sluice::cache::origin::UpstreamOrigin::new(upstream, base);
    let policy = cfg.policy().freshness();
    for round in 0..2 {
        let req = Request::get("/seg.ts").body(()).unwrap();
        let (parts, ()) = req.into_parts();
        let key = CacheKey::new("media", &parts.uri);
        let resp = cache
            .serve(&parts, &key, origin_impl.clone(), &policy)
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let cs = resp.headers()["cache-status"].to_str().unwrap().to_string();
        assert_eq!(cs.starts_with("sluice; hit"), round == 1, "{cs}");
        let got = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(sha256(&got), sha256(&bytes_of(1, 0, 150 * KIB - 1)));
    }
    assert_eq!(origin.count("/media/seg.ts"), 3);
}

/// An origin this process cannot ask for want of its own resources (the reverse path's
/// `FetchError::Local`: EMFILE on the connect): each fetch is counted, waits for the gate, and
/// fails `Local`.
struct OutOfDescriptors {
    asked: AtomicU64,
    gate: Arc<tokio::sync::Semaphore>,
}

impl Origin for OutOfDescriptors {
    fn fetch(&self, _req: Request<()>) -> OriginFuture {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let gate = self.gate.clone();
        Box::pin(async move {
            let _ = gate.acquire().await;
            Err(OriginError::Local(
                "upstream group \"app\": out of local resources: Too many open files".into(),
            ))
        })
    }
}

/// Finding: the cache took every origin failure for the origin's, so a cached route answered
/// sluice's own exhaustion (descriptors, memory) with a 502 `origin unavailable` booked to the
/// origin, after each request that waited for the miss had elected two more writers. A miss
/// whose fetch fails for local resources is now answered as the reverse path answers it (503
/// `local_resources`, booked on this side, the same body and error mark), at once for every
/// coalesced waiter, and counts no origin error; a request passed to the origin too.
#[tokio::test]
async fn a_miss_out_of_local_resources_is_a_503_for_every_waiter() {
    const N: u64 = 8;
    let origin = Arc::new(OutOfDescriptors {
        asked: AtomicU64::new(0),
        gate: Arc::new(tokio::sync::Semaphore::new(0)),
    });
    let cfg = config(64 * KIB);
    let policy = cfg.policy().freshness();
    let front = start_front_on(cfg, origin.clone(), policy.clone()).await;
    let tasks: Vec<_> = (0..N)
        .map(|_| {
            let url = front.url("/local");
            tokio::spawn(async move { request("GET", &url, &[]).await })
        })
        .collect();
    // Every request follows the one fill before its fetch fails.
    for _ in 0..1000 {
        if metric(&front, "sluice_cache_coalesced_waiters_total") >= N - 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(origin.asked.load(Ordering::SeqCst), 1);
    origin.gate.close();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", r.body);
        let json: serde_json::Value = serde_json::from_slice(&body(&r)).unwrap();
        assert_eq!(json["kind"], "local_resources", "{json}");
        assert_eq!(json["side"], "internal", "{json}");
        assert_eq!(json["error"], "the proxy is out of resources for now");
        assert_eq!(r.headers["content-type"], "application/json");
    }
    // No waiter elected another writer: it would fail the same way.
    assert_eq!(origin.asked.load(Ordering::SeqCst), 1);
    assert_eq!(metric(&front, "sluice_cache_origin_errors_total"), 0);

    // The error mark the server counts answers by, as on the reverse path; a request sent to
    // the origin as it is (its honoured `no-store`) is answered the same.
    for cc in [None, Some("no-store")] {
        let mut req = Request::get("/local");
        if let Some(cc) = cc {
            req = req.header("cache-control", cc);
        }
        let (parts, ()) = req.body(()).unwrap().into_parts();
        let key = CacheKey::new("test", &parts.uri);
        let resp = front
            .cache
            .serve(&parts, &key, origin.clone(), &policy)
            .await;
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE, "{cc:?}");
        let mark = resp.extensions().get::<sluice::error::ErrorMark>();
        assert_eq!(
            mark.map(|m| (m.side.label(), m.kind)),
            Some(("internal", "local_resources")),
            "{cc:?}"
        );
    }
    assert_eq!(metric(&front, "sluice_cache_origin_errors_total"), 0);
}

#[tokio::test]
async fn only_if_cached_and_methods() {
    let (origin, oaddr) = start_origin().await;
    origin.set("/o", Obj::new(10, "max-age=60"));
    let front = start_front(config(64 * KIB), oaddr).await;
    let r = request(
        "GET",
        &front.url("/o"),
        &[("cache-control", "only-if-cached")],
    )
    .await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(origin.count("/o"), 0);
    let r = request("POST", &front.url("/o"), &[]).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
}

/// Finding: `only-if-cached` was a 504 only when nothing was stored; a stored object the
/// request could not use as it was (stale, or asked with `no-cache`) was revalidated with
/// the origin the client asked not to be contacted. It is a 504 too; a fresh one is served.
#[tokio::test]
async fn only_if_cached_never_reaches_the_origin_for_a_stored_object() {
    let (origin, oaddr) = start_origin().await;
    origin.set("/oic", Obj::new(10, "max-age=60"));
    origin.set("/oic-stale", Obj::new(10, "max-age=0"));
    let front = start_front(config(64 * KIB), oaddr).await;
    request("GET", &front.url("/oic"), &[]).await;
    request("GET", &front.url("/oic-stale"), &[]).await;
    assert_eq!(front.cache.objects(), 2);
    let fresh = request(
        "GET",
        &front.url("/oic"),
        &[("cache-control", "only-if-cached")],
    )
    .await;
    assert_eq!(fresh.status, StatusCode::OK);
    assert_eq!(body(&fresh), Bytes::from(bytes_of(1, 0, 9)));
    for (path, cc) in [
        ("/oic-stale", "only-if-cached"),
        ("/oic", "only-if-cached, no-cache"),
    ] {
        let r = request("GET", &front.url(path), &[("cache-control", cc)]).await;
        assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT, "{path} {cc}");
    }
    assert_eq!(origin.count("/oic"), 1);
    assert_eq!(origin.count("/oic-stale"), 1);
}

// === missing slices: fetched for the shared object, not for the client that needed them ===

/// Finding: a missing slice was fetched with the asking client's fields, and any answer but a
/// 200 or 206 dropped the object, memory and disk, for everyone: a `Range` past what is stored
/// with a `User-Agent` the origin's WAF refuses dropped any large object. The refusal now fails
/// that client's fill alone.
#[tokio::test]
async fn a_refused_slice_fetch_leaves_the_object_for_everyone() {
    let (origin, oaddr) = start_origin().await;
    let slice = 64 * KIB;
    let len = 4 * slice;
    origin.set(
        "/waf",
        Obj {
            refuse_agent: Some("sqlmap"),
            ..Obj::new(len, "max-age=60")
        },
    );
    let front = start_front(config(slice), oaddr).await;
    let r = request("GET", &front.url("/waf"), &[("range", "bytes=0-9")]).await;
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 9)));
    let before = origin.count("/waf");
    let far = format!("bytes={}-", 3 * slice);
    let attack = request(
        "GET",
        &front.url("/waf"),
        &[("range", far.as_str()), ("user-agent", "sqlmap")],
    )
    .await;
    // The refused client gets none of the slice it was refused.
    assert!(
        attack.body.as_ref().map_or(true, |b| b.is_empty()),
        "{:?}",
        attack.body
    );
    let refused = origin.count("/waf") - before;
    assert!((1..=3).contains(&refused), "{refused} refused fetches");
    let r = request("GET", &front.url("/waf"), &[("range", "bytes=0-9")]).await;
    assert!(
        status_of(&r).starts_with("sluice; hit"),
        "{}",
        status_of(&r)
    );
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 9)));
    assert_eq!(
        origin.count("/waf"),
        before + refused,
        "the object was fetched again"
    );
}

/// Finding: a missing slice was fetched with the asking client's `Cookie`, on a route that does
/// not cache cookie requests, and stored for everyone: the next client got the first one's
/// personalised bytes under the same length and `ETag`. The slice is now asked for without it.
#[tokio::test]
async fn a_slice_fetched_for_a_cookie_is_not_served_to_the_next_client() {
    let (origin, oaddr) = start_origin().await;
    let slice = 64 * KIB;
    let len = 4 * slice;
    origin.set(
        "/per",
        Obj {
            by_user: true,
            ..Obj::new(len, "max-age=60")
        },
    );
    let cfg = config(slice);
    let mut policy = cfg.policy().freshness();
    policy.store_cookie_requests = false;
    let front = start_front_with(cfg, oaddr, policy).await;
    let r = request("GET", &front.url("/per"), &[("range", "bytes=0-9")]).await;
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 9)));
    let far = format!("bytes={}-", 3 * slice);
    let alice = request(
        "GET",
        &front.url("/per"),
        &[("range", far.as_str()), ("cookie", "sid=alice")],
    )
    .await;
    assert_eq!(alice.status, StatusCode::PARTIAL_CONTENT);
    let bob = request("GET", &front.url("/per"), &[("range", far.as_str())]).await;
    assert_eq!(
        sha256(&body(&bob)),
        sha256(&bytes_of(1, 3 * slice, len - 1)),
        "another client's bytes"
    );
    // The slice was fetched once, for the object, and is shared from then on.
    assert!(
        status_of(&bob).starts_with("sluice; hit"),
        "{}",
        status_of(&bob)
    );
    let reqs = origin.requests_for("/per");
    assert_eq!(reqs.len(), 2);
    assert!(
        !reqs[1].contains_key("cookie"),
        "the slice was asked for with the cookie: {:?}",
        reqs[1]
    );
}

/// A missing slice asked for with the client's `Authorization` (kept: the origin may check it
/// on each use) is answered for those credentials; the answer is not marked shared, so it is
/// neither stored nor given to anyone else: the client that asked gets it (a single range, and
/// a multipart one), the next client a fetch of its own.
#[tokio::test]
async fn a_slice_answered_for_credentials_goes_to_that_client_alone() {
    let (origin, oaddr) = start_origin().await;
    let slice = 64 * KIB;
    let len = 4 * slice;
    origin.set(
        "/auth",
        Obj {
            by_user: true,
            ..Obj::new(len, "max-age=60")
        },
    );
    let front = start_front(config(slice), oaddr).await;
    let r = request("GET", &front.url("/auth"), &[("range", "bytes=0-9")]).await;
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 9)));
    let far = format!("bytes={}-", 3 * slice);
    let alice = request(
        "GET",
        &front.url("/auth"),
        &[("range", far.as_str()), ("authorization", "Bearer alice")],
    )
    .await;
    assert_eq!(alice.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        sha256(&body(&alice)),
        sha256(&bytes_of(user_version("Bearer alice"), 3 * slice, len - 1))
    );
    // Two ranges: the body is written by a producer task, slice 2 from carol's own answer.
    let two = format!("bytes=0-9,{}-{}", 2 * slice, 2 * slice + 99);
    let carol = request(
        "GET",
        &front.url("/auth"),
        &[("range", two.as_str()), ("authorization", "Bearer carol")],
    )
    .await;
    assert_eq!(carol.status, StatusCode::PARTIAL_CONTENT);
    let want = bytes_of(user_version("Bearer carol"), 2 * slice, 2 * slice + 99);
    assert!(
        body(&carol)
            .windows(want.len())
            .any(|w| w == want.as_slice()),
        "carol's own bytes of slice 2"
    );
    let asked = origin.count("/auth");
    let bob = request("GET", &front.url("/auth"), &[]).await;
    assert_eq!(
        sha256(&body(&bob)),
        sha256(&bytes_of(1, 0, len - 1)),
        "another client's bytes"
    );
    assert_eq!(origin.count("/auth"), asked + 3, "slices 1 to 3 fetched");
}

/// Finding: a 304 was merged into the stored object whatever `ETag` it named, so a 304 for
/// another version (an origin comparing loosely) put the new version's tag on the old bytes.
/// Such a 304 does not update the object (RFC 9111 §4.3.4): the request is a miss.
#[tokio::test]
async fn a_304_naming_another_etag_does_not_refresh_the_stored_bytes() {
    let (origin, oaddr) = start_origin().await;
    origin.set(
        "/e304",
        Obj {
            any_304: true,
            ..Obj::new(1000, "max-age=0")
        },
    );
    let front = start_front(config(64 * KIB), oaddr).await;
    let r = request("GET", &front.url("/e304"), &[]).await;
    assert_eq!(sha256(&body(&r)), sha256(&bytes_of(1, 0, 999)));
    origin.update("/e304", |o| o.version = 2);
    let r = request("GET", &front.url("/e304"), &[]).await;
    assert_eq!(r.headers["etag"], "\"v2\"");
    assert_eq!(
        sha256(&body(&r)),
        sha256(&bytes_of(2, 0, 999)),
        "the old bytes under the new tag"
    );
    // The revalidation's 304, then a plain fetch of the new version.
    let reqs = origin.requests_for("/e304");
    assert_eq!(reqs.len(), 3);
    assert_eq!(reqs[1]["if-none-match"], "\"v1\"");
    assert!(!reqs[2].contains_key("if-none-match"));
}

/// Where `want` starts in `body`, if it is there whole.
fn find(body: &[u8], want: &[u8]) -> Option<usize> {
    body.windows(64)
        .enumerate()
        .filter(|(_, w)| *w == &want[..64])
        .map(|(at, _)| at)
        .find(|&at| body.get(at..at + want.len()) == Some(want))
}

/// Finding: a slice answered for a client's credentials (passed to it alone) that ended short
/// of the bytes wanted (a chunked 206 cut early) was taken as the slice's end, and a
/// multi-range body went on with the next slice right after it: bytes at the wrong offsets
/// under a 206 head. The rest of the slice is now asked for again.
#[tokio::test]
async fn a_short_answer_for_credentials_is_asked_again_not_taken_as_the_slice() {
    let (origin, oaddr) = start_origin().await;
    let slice = 256 * KIB;
    let len = 4 * slice;
    let mut obj = Obj::new(len, "max-age=60");
    obj.by_user = true;
    obj.chunked = true;
    obj.cut_once_at = Some((
        2 * slice + 64 * KIB,
        Arc::new(std::sync::atomic::AtomicBool::new(true)),
    ));
    origin.set("/short", obj);
    let front = start_front(config(slice), oaddr).await;
    let r = request("GET", &front.url("/short"), &[("range", "bytes=0-9")]).await;
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 9)));
    let two = format!("bytes=0-9,{}-{}", 2 * slice, len - 1);
    let alice = request(
        "GET",
        &front.url("/short"),
        &[("range", two.as_str()), ("authorization", "Bearer alice")],
    )
    .await;
    assert_eq!(alice.status, StatusCode::PARTIAL_CONTENT);
    let got = body(&alice);
    let want = bytes_of(user_version("Bearer alice"), 2 * slice, len - 1);
    assert!(
        find(&got, &want).is_some(),
        "slices 2 and 3 are not whole and in place ({} bytes)",
        got.len()
    );
    // Slice 2 cut, asked again; slice 3 once.
    assert_eq!(origin.count("/short"), 1 + 3);
}

/// Finding: a multi-range body read ahead every slice with the client's credentials; the read
/// ahead's answer passed (for those credentials), went to nobody, and the slice was fetched a
/// second time for the body. Slices are now fetched once each.
#[tokio::test]
async fn a_credentialed_read_whose_answers_pass_fetches_each_slice_once() {
    let (origin, oaddr) = start_origin().await;
    let slice = 64 * KIB;
    let len = 6 * slice;
    origin.set(
        "/once",
        Obj {
            by_user: true,
            ..Obj::new(len, "max-age=60")
        },
    );
    let front = start_front(config(slice), oaddr).await;
    let r = request("GET", &front.url("/once"), &[("range", "bytes=0-9")]).await;
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 9)));
    let two = format!("bytes=0-9,{}-{}", slice, len - 1);
    let alice = request(
        "GET",
        &front.url("/once"),
        &[("range", two.as_str()), ("authorization", "Bearer alice")],
    )
    .await;
    assert_eq!(alice.status, StatusCode::PARTIAL_CONTENT);
    let want = bytes_of(user_version("Bearer alice"), slice, len - 1);
    assert!(find(&body(&alice), &want).is_some(), "alice's own bytes");
    // Any read-ahead still running has had its time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reqs = origin.requests_for("/once");
    assert_eq!(reqs.len(), 1 + 5, "slices 1 to 5, once each");
    let mut ranges: Vec<&str> = reqs[1..].iter().map(|h| h["range"].as_str()).collect();
    ranges.sort_unstable();
    ranges.dedup();
    assert_eq!(ranges.len(), 5, "{ranges:?}");
}

/// Finding: only `Authorization` counted as credentials for the 404 that drops an object; a
/// client's `Cookie`, forwarded when cookie requests are cached (the default), met an origin
/// hiding a session's resources with a 404, and the shared object was dropped for everyone.
#[tokio::test]
async fn a_404_to_a_cookie_for_a_missing_slice_keeps_the_object() {
    let (origin, oaddr) = start_origin().await;
    let slice = 64 * KIB;
    let len = 4 * slice;
    origin.set(
        "/hid",
        Obj {
            hide_from_cookie: true,
            ..Obj::new(len, "max-age=60")
        },
    );
    let front = start_front(config(slice), oaddr).await;
    let r = request("GET", &front.url("/hid"), &[("range", "bytes=0-9")]).await;
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 9)));
    let far = format!("bytes={}-", 3 * slice);
    let eve = request(
        "GET",
        &front.url("/hid"),
        &[("range", far.as_str()), ("cookie", "sid=eve")],
    )
    .await;
    assert!(
        eve.body.as_ref().map_or(true, |b| b.is_empty()),
        "{:?}",
        eve.body
    );
    let before = origin.count("/hid");
    let r = request("GET", &front.url("/hid"), &[("range", "bytes=0-9")]).await;
    assert!(
        status_of(&r).starts_with("sluice; hit"),
        "{}",
        status_of(&r)
    );
    assert_eq!(body(&r), Bytes::from(bytes_of(1, 0, 9)));
    assert_eq!(origin.count("/hid"), before, "the object was fetched again");
}

/// Finding (review of a9211f4b): a field the origin's `Connection` names is not stored, but the
/// version check of each later slice read the origin's raw head. With `Connection: etag` the
/// stored head had no tag and every slice's answer had one: "another version", so a multi-slice
/// object was dropped and fetched again on every request. The check reads both sides as stored.
#[tokio::test]
async fn an_etag_named_in_connection_does_not_make_every_slice_another_version() {
    let (origin, oaddr) = start_origin().await;
    let len = 3 * 64 * KIB;
    origin.set(
        "/conn-etag",
        Obj::new(len, "max-age=60").header("connection", "etag"),
    );
    let front = start_front(config(64 * KIB), oaddr).await;
    for i in 0..3 {
        let r = request("GET", &front.url("/conn-etag"), &[]).await;
        assert_eq!(r.status, StatusCode::OK, "request {i}");
        assert_eq!(
            sha256(&body(&r)),
            sha256(&bytes_of(1, 0, len - 1)),
            "request {i}"
        );
        assert!(!r.headers.contains_key("etag"), "request {i}: not stored");
    }
    // One fill: one origin request per slice, none per later request.
    assert_eq!(origin.count("/conn-etag"), 3);
    let last = request("GET", &front.url("/conn-etag"), &[]).await;
    assert!(
        status_of(&last).starts_with("sluice; hit"),
        "{}",
        status_of(&last)
    );
}

/// Finding (review of a9211f4b): a revalidation's published failure sent each waiter back to
/// ask again, up to three times: against a stalling origin a waiter was held three header
/// timeouts, and an origin's 503 became a generic 502. A failure is now one for all and final:
/// each waiter serves the copy `stale-if-error` allows, else the origin's own status (with its
/// `Retry-After`), after the one conditional request.
#[tokio::test]
async fn a_failed_revalidation_is_the_answer_for_every_waiter() {
    const N: usize = 12;
    let origin = Arc::new(OriginState::default());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let oaddr = listener.local_addr().unwrap();
    let (state, held) = (origin.clone(), gate.clone());
    // An object of 100 bytes whose conditional requests are held, then answered 503.
    tokio::spawn(serve_loop(listener, move |req: Request<Incoming>, _| {
        let (state, held) = (state.clone(), held.clone());
        async move {
            let path = req.uri().path().to_string();
            let seen: HashMap<String, String> = req
                .headers()
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
                .collect();
            let conditional = seen.contains_key("if-none-match");
            state.requests.lock().unwrap().push((path.clone(), seen));
            if conditional {
                drop(held.acquire().await);
                return Response::builder()
                    .status(503)
                    .header("retry-after", "7")
                    .body(empty())
                    .unwrap();
            }
            let cache_control = if path == "/sie-503" {
                "max-age=1, stale-if-error=60"
            } else {
                "max-age=1"
            };
            Response::builder()
                .header("etag", "\"v1\"")
                .header("cache-control", cache_control)
                .header("content-length", "100")
                .body(BodyExt::boxed(http_body_util::Full::new(Bytes::from(
                    bytes_of(1, 0, 99),
                ))))
                .unwrap()
        }
    }));
    let mut cfg = config(64 * KIB);
    cfg.grace_secs = 0;
    let front = start_front(cfg, oaddr).await;
    for path in ["/sie-503", "/plain-503"] {
        let r = request("GET", &front.url(path), &[]).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    tokio::time::sleep(Duration::from_millis(2100)).await;
    for path in ["/sie-503", "/plain-503"] {
        let replies = herd(&front, &origin, path, N, &gate).await;
        let conditionals = origin
            .requests_for(path)
            .iter()
            .filter(|h| h.contains_key("if-none-match"))
            .count();
        assert_eq!(conditionals, 1, "{path}: one conditional request for {N}");
        assert_eq!(origin.count(path), 2, "{path}");
        let mut collapsed = 0;
        for r in &replies {
            let s = status_of(r);
            collapsed += s.contains("collapsed") as usize;
            if path == "/sie-503" {
                assert_eq!(r.status, StatusCode::OK, "{path}: {s}");
                assert!(s.contains("detail=stale-if-error"), "{path}: {s}");
                assert_eq!(body(r), Bytes::from(bytes_of(1, 0, 99)));
            } else {
                assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {s}");
                assert!(s.contains("fwd=stale; fwd-status=503"), "{path}: {s}");
                assert_eq!(r.headers["retry-after"], "7", "{path}");
            }
        }
        if path == "/plain-503" {
            assert_eq!(collapsed, N - 1, "{path}");
        }
    }
}
