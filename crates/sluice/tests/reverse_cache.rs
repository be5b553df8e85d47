//! `[[routes]] cache = true` end to end: a running sluice in front of a counting origin on
//! 127.0.0.1. Hits, coalesced cold fills (one origin request per slice), ranged fills of only the
//! covered slices, `no-store`, `PURGE`, invalidation by `POST`, and a route that never caches.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use support::{pattern, request, sha256, Sluice};
use tokio::net::TcpListener;

const MIB: usize = 1 << 20;
/// Four 1 MiB slices, the last one short.
const BIG_LEN: usize = 3 * MIB + 5;
const PURGE_KEY: &str = "purge-secret-1";

/// One request the origin answered: method, path, `Range`.
type Hit = (String, String, Option<String>);

struct CountingOrigin {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Hit>>>,
}

impl CountingOrigin {
    async fn start() -> CountingOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(answer(req, &s)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        CountingOrigin { addr, seen }
    }

    /// Requests with this method and path.
    fn count(&self, method: &str, path: &str) -> usize {
        self.requests(method, path).len()
    }

    fn requests(&self, method: &str, path: &str) -> Vec<Hit> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|h| h.0 == method && h.1 == path)
            .cloned()
            .collect()
    }
}

/// `/big*`: 3 MiB + 5 bytes; `/nostore`: `no-store`; anything else: a small body naming its path.
/// Every GET is cacheable for an hour (apart from `/nostore`) and honours `Range`; other methods
/// get 204. A path with `tagged` in it carries `Surrogate-Key: product-7`. A path with `cond` in
/// it is not `public`, answers `Authorization: Bearer bad` with 401 and a matching
/// `If-None-Match` with 304; its conditional requests are logged as `REVALIDATE`, not `GET`. A
/// path with `novalid` in it has no `ETag` (no validator: its revalidation is a plain GET). A
/// request with `x-refuse` gets 400, as an origin refusing a field it dislikes. A path with `swr`
/// in it is stale at once, reusable stale for a minute while revalidated in the background.
fn answer(req: Request<Incoming>, seen: &Mutex<Vec<Hit>>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let range = req
        .headers()
        .get("range")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let cond = path.contains("cond");
    let conditional = cond && req.headers().contains_key("if-none-match");
    let method = if conditional {
        "REVALIDATE".to_string()
    } else {
        req.method().to_string()
    };
    seen.lock()
        .unwrap()
        .push((method, path.clone(), range.clone()));
    if req.headers().contains_key("x-refuse") {
        return Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .body(Full::new(Bytes::from_static(b"refused")))
            .unwrap();
    }
    if cond && req.method() == http::Method::GET {
        if req
            .headers()
            .get("authorization")
            .is_some_and(|v| v == "Bearer bad")
        {
            return Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .body(Full::new(Bytes::from_static(b"denied")))
                .unwrap();
        }
        if req
            .headers()
            .get("if-none-match")
            .is_some_and(|v| v == "\"e1\"")
        {
            return Response::builder()
                .status(StatusCode::NOT_MODIFIED)
                .header("cache-control", "max-age=3600")
                .header("etag", "\"e1\"")
                .body(Full::new(Bytes::new()))
                .unwrap();
        }
    }
    if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
        return Response::builder()
            .status(StatusCode::NO_CONTENT)
            .body(Full::new(Bytes::new()))
            .unwrap();
    }
    if path == "/vary-xff" {
        // Varies on the forwarding field sluice writes: the body names the value it got.
        let xff = req
            .headers()
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string();
        return Response::builder()
            .header("cache-control", "public, max-age=3600")
            .header("vary", "X-Forwarded-For")
            .body(Full::new(Bytes::from(format!("for {xff}"))))
            .unwrap();
    }
    if path == "/claimed" {
        // Builds its answer from the scheme and host a front proxy reports, as a `force_ssl`
        // origin or a page of absolute links does; cacheable for everyone, no `Vary`.
        let field = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_string()
        };
        let (proto, host) = (field("x-forwarded-proto"), field("x-forwarded-host"));
        return Response::builder()
            .header("cache-control", "public, max-age=3600")
            .body(Full::new(Bytes::from(format!("{proto}://{host}/"))))
            .unwrap();
    }
    if path == "/vary-odd" {
        // Varies on `Cookie` and on a name with a byte past ASCII: the body names the cookie.
        let cookie = req
            .headers()
            .get("cookie")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string();
        return Response::builder()
            .header("cache-control", "public, max-age=3600")
            .header(
                "vary",
                http::HeaderValue::from_bytes(b"Cookie, X-\xe9").unwrap(),
            )
            .body(Full::new(Bytes::from(format!("for {cookie}"))))
            .unwrap();
    }
    if path == "/per-user" || path == "/vary-change" {
        // Fresh for a second. `/per-user`'s 304 names the cookie it was asked with (a per-user
        // field an origin may well send); `/vary-change`'s 304 names a `Vary` its 200 did not.
        let b = Response::builder()
            .header("cache-control", "max-age=1")
            .header("etag", "\"p1\"");
        if !req.headers().contains_key("if-none-match") {
            return b
                .body(Full::new(Bytes::from(format!("body of {path}"))))
                .unwrap();
        }
        let b = match req.headers().get("cookie") {
            Some(c) if path == "/per-user" => b.header("x-user", c.clone()),
            _ if path == "/vary-change" => b.header("vary", "accept-language"),
            _ => b,
        };
        return b
            .status(StatusCode::NOT_MODIFIED)
            .body(Full::new(Bytes::new()))
            .unwrap();
    }
    if path == "/short" {
        // Fresh for a second; revalidated with a 304 whose `x-served` names the request count.
        let served = seen.lock().unwrap().len().to_string();
        let b = Response::builder()
            .header("cache-control", "max-age=1")
            .header("etag", "\"s1\"")
            .header("x-served", served);
        let status = if req.headers().contains_key("if-none-match") {
            StatusCode::NOT_MODIFIED
        } else {
            StatusCode::OK
        };
        let body = if status == StatusCode::OK {
            Bytes::from_static(b"short body")
        } else {
            Bytes::new()
        };
        return b.status(status).body(Full::new(body)).unwrap();
    }
    let body = if path.starts_with("/big") {
        pattern(BIG_LEN)
    } else {
        Bytes::from(format!("body of {path}"))
    };
    let cache_control = if path == "/nostore" {
        "no-store"
    } else if path.contains("swr") {
        "max-age=0, stale-while-revalidate=60"
    } else if cond {
        "max-age=3600"
    } else {
        "public, max-age=3600"
    };
    let len = body.len();
    let mut b = Response::builder();
    if path.contains("tagged") {
        b = b.header("surrogate-key", "product-7 other");
    }
    b = b.header("cache-control", cache_control);
    if !path.contains("novalid") {
        b = b.header("etag", "\"e1\"");
    }
    let b = b
        .header("accept-ranges", "bytes")
        .header("content-type", "application/octet-stream");
    let span = range.as_deref().and_then(|r| {
        let (a, z) = r.strip_prefix("bytes=")?.split_once('-')?;
        let a: usize = a.parse().ok()?;
        let z: usize = if z.is_empty() {
            len - 1
        } else {
            z.parse::<usize>().ok()?.min(len - 1)
        };
        (a <= z).then_some((a, z))
    });
    match span {
        Some((a, z)) => b
            .status(StatusCode::PARTIAL_CONTENT)
            .header("content-range", format!("bytes {a}-{z}/{len}"))
            .body(Full::new(body.slice(a..=z)))
            .unwrap(),
        None => b.body(Full::new(body)).unwrap(),
    }
}

fn cached_config(origin: SocketAddr) -> sluice::config::Config {
    cached_config_with(origin, "")
}

/// [`cached_config`] with `extra` sections after it.
fn cached_config_with(origin: SocketAddr, extra: &str) -> sluice::config::Config {
    let text = format!(
        r#"
[[upstreams]]
name = "app"
servers = ["{}"]

[[routes]]
path = "/"
upstream = "app"
cache = true
response_headers_add = {{ "x-route" = "cached" }}

[[routes]]
path = "/plain/"
upstream = "app"

[[routes]]
path = "/shop/"
upstream = "app"
cache = true

[cache]
memory_bytes = "64MiB"
slice_bytes = "1MiB"
purge_key = "{PURGE_KEY}"
{extra}
"#,
        origin
    );
    let mut config = sluice::config::Config::parse_file(&text).unwrap();
    config.server.listen = vec!["127.0.0.1:0".parse().unwrap()];
    config.validate().unwrap();
    config
}

async fn start() -> (CountingOrigin, Sluice) {
    let origin = CountingOrigin::start().await;
    let sluice = Sluice::start(cached_config(origin.addr)).await;
    (origin, sluice)
}

fn cache_status(r: &support::Reply) -> String {
    r.headers
        .get("cache-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

#[tokio::test]
async fn second_get_is_a_hit() {
    let (origin, s) = start().await;
    let first = request("GET", &s.url("/a.txt"), &[]).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body.as_deref().unwrap(), b"body of /a.txt");
    assert!(
        !cache_status(&first).contains("; hit"),
        "{}",
        cache_status(&first)
    );
    let second = request("GET", &s.url("/a.txt"), &[]).await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.body.as_deref().unwrap(), b"body of /a.txt");
    assert!(
        cache_status(&second).starts_with("sluice; hit"),
        "{:?}",
        cache_status(&second)
    );
    assert_eq!(second.headers["x-route"], "cached");
    assert_eq!(origin.count("GET", "/a.txt"), 1);
    // A HEAD is answered from the GET's object.
    let head = request("HEAD", &s.url("/a.txt"), &[]).await;
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(origin.count("GET", "/a.txt"), 1);
    assert_eq!(origin.count("HEAD", "/a.txt"), 0);
    // Another query string is another object.
    let other = request("GET", &s.url("/a.txt?v=2"), &[]).await;
    assert_eq!(other.body.as_deref().unwrap(), b"body of /a.txt");
    assert_eq!(origin.count("GET", "/a.txt"), 2);
}

#[tokio::test]
async fn concurrent_cold_gets_fetch_each_slice_once() {
    let (origin, s) = start().await;
    let url = s.url("/big-cold");
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { request("GET", &url, &[]).await })
        })
        .collect();
    let want = sha256(&pattern(BIG_LEN));
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(sha256(r.body.as_deref().unwrap()), want);
    }
    let seen = origin.requests("GET", "/big-cold");
    assert_eq!(seen.len(), 4, "one origin request per slice: {seen:?}");
    let mut ranges: Vec<String> = seen.into_iter().filter_map(|h| h.2).collect();
    ranges.sort();
    assert_eq!(
        ranges,
        [
            "bytes=0-1048575",
            "bytes=1048576-2097151",
            "bytes=2097152-3145727",
            "bytes=3145728-4194303",
        ]
    );
}

#[tokio::test]
async fn range_on_a_cold_object_fetches_only_covered_slices() {
    let (origin, s) = start().await;
    let r = request(
        "GET",
        &s.url("/big-range"),
        &[("range", "bytes=1048600-1048699")],
    )
    .await;
    assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        r.headers["content-range"],
        format!("bytes 1048600-1048699/{BIG_LEN}").as_str()
    );
    assert_eq!(
        r.body.as_deref().unwrap(),
        &pattern(BIG_LEN)[1_048_600..1_048_700]
    );
    let seen = origin.requests("GET", "/big-range");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].2.as_deref(), Some("bytes=1048576-2097151"));
    // The same slice again is a hit.
    let again = request(
        "GET",
        &s.url("/big-range"),
        &[("range", "bytes=1048576-1048579")],
    )
    .await;
    assert_eq!(again.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        again.body.as_deref().unwrap(),
        &pattern(BIG_LEN)[1_048_576..1_048_580]
    );
    assert_eq!(origin.count("GET", "/big-range"), 1);
}

#[tokio::test]
async fn no_store_is_not_cached() {
    let (origin, s) = start().await;
    for _ in 0..2 {
        let r = request("GET", &s.url("/nostore"), &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body.as_deref().unwrap(), b"body of /nostore");
        assert!(!cache_status(&r).contains("; hit"));
    }
    assert_eq!(origin.count("GET", "/nostore"), 2);
}

#[tokio::test]
async fn purge_then_refetch() {
    let (origin, s) = start().await;
    request("GET", &s.url("/p.txt"), &[]).await;
    request("GET", &s.url("/p.txt"), &[]).await;
    assert_eq!(origin.count("GET", "/p.txt"), 1);
    // Without the key: refused, nothing purged, nothing sent upstream.
    let refused = request("PURGE", &s.url("/p.txt"), &[]).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let wrong = request("PURGE", &s.url("/p.txt"), &[("x-purge-key", "nope")]).await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN);
    assert_eq!(wrong.body, refused.body);
    request("GET", &s.url("/p.txt"), &[]).await;
    assert_eq!(origin.count("GET", "/p.txt"), 1);
    let purged = request("PURGE", &s.url("/p.txt"), &[("x-purge-key", PURGE_KEY)]).await;
    assert_eq!(purged.status, StatusCode::OK, "{:?}", purged.body);
    assert_eq!(origin.count("PURGE", "/p.txt"), 0);
    let r = request("GET", &s.url("/p.txt"), &[]).await;
    assert_eq!(r.body.as_deref().unwrap(), b"body of /p.txt");
    assert!(!cache_status(&r).contains("; hit"));
    assert_eq!(origin.count("GET", "/p.txt"), 2);
}

/// Finding: `PURGE` took the API password as a purge key (even with `purge_key` set) and never
/// charged a wrong key anywhere: an unlimited oracle for either secret. A wrong key is now a
/// wrong guess for the client's network (`auth::guesses`), and past the limit every purge from
/// it is refused (429, `Retry-After`) before its key is compared, the right one included.
#[tokio::test]
async fn wrong_purge_keys_are_guesses_under_the_limit() {
    let (origin, s) = start().await;
    request("GET", &s.url("/g.txt"), &[]).await;
    for i in 0..sluice::auth::guesses::MAX_FAILURES {
        let key = format!("guess-{i}");
        let wrong = request("PURGE", &s.url("/g.txt"), &[("x-purge-key", &key)]).await;
        assert_eq!(wrong.status, StatusCode::FORBIDDEN, "guess {i}");
    }
    let right = request("PURGE", &s.url("/g.txt"), &[("x-purge-key", PURGE_KEY)]).await;
    assert_eq!(
        right.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{:?}",
        right.body
    );
    assert!(right.headers.contains_key("retry-after"));
    // Nothing purged: still a hit.
    let r = request("GET", &s.url("/g.txt"), &[]).await;
    assert!(cache_status(&r).contains("; hit"), "{}", cache_status(&r));
    assert_eq!(origin.count("GET", "/g.txt"), 1);
    // Counted by the API password's own limiter (one count, not a second one beside it).
    let text = request("GET", &s.url("/metrics"), &[]).await;
    let text = String::from_utf8_lossy(text.body.as_deref().unwrap_or_default()).to_string();
    let want = format!(
        "sluice_auth_failures_total {}\n",
        sluice::auth::guesses::MAX_FAILURES
    );
    assert!(text.contains(&want), "{want}");
}

/// Finding: a wrong key was charged to the client's network whatever its address, so 20 wrong
/// `PURGE`s a minute from any visitor outside `purge_allow` (every visitor, behind a balancer
/// without `trusted_proxies`) locked that address out of the API password everywhere, though
/// no key purges from there. Keys from outside `purge_allow` are now neither compared nor
/// charged: every answer is the same 403.
#[tokio::test]
async fn wrong_purge_keys_from_outside_purge_allow_are_no_guesses() {
    let origin = CountingOrigin::start().await;
    // The test client (127.0.0.1) is outside this list.
    let elsewhere = "purge_allow = [\"192.0.2.0/24\"]";
    let s = Sluice::start(cached_config_with(origin.addr, elsewhere)).await;
    request("GET", &s.url("/o.txt"), &[]).await;
    for i in 0..=sluice::auth::guesses::MAX_FAILURES {
        let key = format!("guess-{i}");
        let wrong = request("PURGE", &s.url("/o.txt"), &[("x-purge-key", &key)]).await;
        assert_eq!(wrong.status, StatusCode::FORBIDDEN, "guess {i}");
    }
    // The address is not locked out: the right key is refused as any other from here (403,
    // not 429), and nothing was counted against its password guesses.
    let right = request("PURGE", &s.url("/o.txt"), &[("x-purge-key", PURGE_KEY)]).await;
    assert_eq!(right.status, StatusCode::FORBIDDEN, "{:?}", right.body);
    let r = request("GET", &s.url("/o.txt"), &[]).await;
    assert!(cache_status(&r).contains("; hit"), "{}", cache_status(&r));
    let text = request("GET", &s.url("/metrics"), &[]).await;
    let text = String::from_utf8_lossy(text.body.as_deref().unwrap_or_default()).to_string();
    assert!(
        !text.contains("sluice_auth_failures_total ")
            || text.contains("sluice_auth_failures_total 0\n"),
        "wrong purge keys from outside purge_allow were charged"
    );
}

/// Finding: a tag purge matched the tag alone, so a `PURGE` sent to one host dropped every object
/// with that tag on every route and host. It now stays within the route and host it was sent to.
#[tokio::test]
async fn a_tag_purge_stays_within_its_route_and_host() {
    let (origin, s) = start().await;
    let get = |path: &'static str, host: &'static str| {
        let url = s.url(path);
        async move { request("GET", &url, &[("host", host)]).await }
    };
    for _ in 0..2 {
        get("/tagged/x", "a.example").await;
        get("/tagged/x", "b.example").await;
        get("/shop/tagged", "a.example").await;
    }
    assert_eq!(origin.count("GET", "/tagged/x"), 2, "one fill per host");
    assert_eq!(origin.count("GET", "/shop/tagged"), 1);
    let purged = request(
        "PURGE",
        &s.url("/x"),
        &[
            ("host", "a.example"),
            ("x-purge-key", PURGE_KEY),
            ("x-purge-mode", "tag"),
            ("x-purge-tag", "product-7"),
        ],
    )
    .await;
    assert_eq!(purged.status, StatusCode::OK, "{:?}", purged.body);
    assert_eq!(
        std::str::from_utf8(purged.body.as_deref().unwrap()).unwrap(),
        "{\"purged\":1,\"soft\":false}"
    );
    // The other host's object and the other route's are still hits.
    let r = get("/tagged/x", "b.example").await;
    assert!(cache_status(&r).contains("; hit"), "{}", cache_status(&r));
    let r = get("/shop/tagged", "a.example").await;
    assert!(cache_status(&r).contains("; hit"), "{}", cache_status(&r));
    assert_eq!(origin.count("GET", "/tagged/x"), 2);
    assert_eq!(origin.count("GET", "/shop/tagged"), 1);
    // The purged one is fetched again.
    let r = get("/tagged/x", "a.example").await;
    assert_eq!(r.body.as_deref().unwrap(), b"body of /tagged/x");
    assert_eq!(origin.count("GET", "/tagged/x"), 3);
}

#[tokio::test]
async fn post_invalidates() {
    let (origin, s) = start().await;
    request("GET", &s.url("/doc"), &[]).await;
    request("GET", &s.url("/doc"), &[]).await;
    assert_eq!(origin.count("GET", "/doc"), 1);
    let post = request("POST", &s.url("/doc"), &[]).await;
    assert_eq!(post.status, StatusCode::NO_CONTENT);
    assert_eq!(origin.count("POST", "/doc"), 1);
    // The object is marked stale, not dropped: the next GET revalidates. This origin ignores
    // `If-None-Match` (it answers the conditional request in full), so the object is then
    // fetched again; an origin answering 304 keeps it (`hostile_reverse2`).
    let r = request("GET", &s.url("/doc"), &[]).await;
    assert_eq!(r.body.as_deref().unwrap(), b"body of /doc");
    assert_eq!(origin.count("GET", "/doc"), 3);
    request("GET", &s.url("/doc"), &[]).await;
    assert_eq!(origin.count("GET", "/doc"), 3);
    // Another path stays cached.
    request("GET", &s.url("/other"), &[]).await;
    request("POST", &s.url("/doc"), &[]).await;
    request("GET", &s.url("/other"), &[]).await;
    assert_eq!(origin.count("GET", "/other"), 1);
}

#[tokio::test]
async fn route_without_cache_never_caches() {
    let (origin, s) = start().await;
    for _ in 0..3 {
        let r = request("GET", &s.url("/plain/x"), &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body.as_deref().unwrap(), b"body of /plain/x");
        assert!(r.headers.get("cache-status").is_none());
    }
    assert_eq!(origin.count("GET", "/plain/x"), 3);
    // PURGE on it is just another method sent upstream.
    request("PURGE", &s.url("/plain/x"), &[]).await;
    assert_eq!(origin.count("PURGE", "/plain/x"), 1);
}

#[test]
fn cache_route_keys_parse_and_validate() {
    let text = r#"
[[upstreams]]
name = "app"
servers = ["127.0.0.1:9"]

[[routes]]
path = "/"
upstream = "app"
cache = true
cache_grace_secs = 30
cache_default_ttl_secs = 5
cache_request_directives = "ignore"
"#;
    let c = sluice::config::Config::parse_file(text).unwrap();
    c.validate().unwrap();
    assert!(c.routes[0].cache);
    assert_eq!(c.routes[0].cache_policy().cache_grace_secs, Some(30));
    assert!(
        sluice::config::Config::parse_file(&text.replace("cache = true", "cache = 1")).is_err()
    );
    assert!(sluice::config::Config::parse_file(&format!("{text}cache_bogus = 1\n")).is_err());
    let mut c = sluice::config::Config::parse_file(text).unwrap();
    c.cache.memory_bytes = sluice::cache::ByteSize(0);
    assert!(c.validate().is_err());
}

#[tokio::test]
async fn cached_objects_survive_a_reload() {
    let origin = CountingOrigin::start().await;
    let config = cached_config(origin.addr);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = sluice::app::App::new(&config).unwrap();
    let server =
        sluice::server::Server::from_listeners(vec![listener], &config.server, app.clone())
            .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    let url = format!("http://{addr}/r.txt");
    request("GET", &url, &[]).await;
    // A changed route table (a header edit) is a new table over the same cache.
    let mut changed = config.clone();
    changed.routes[0]
        .response_headers_add
        .insert("x-route".into(), "reloaded".into());
    app.reload(&changed).unwrap();
    let r = request("GET", &url, &[]).await;
    assert_eq!(r.headers["x-route"], "reloaded");
    assert!(cache_status(&r).starts_with("sluice; hit"));
    assert_eq!(origin.count("GET", "/r.txt"), 1);
    let _ = stop.send(());
}

#[tokio::test]
async fn a_reload_that_adds_the_first_caching_route_builds_the_cache() {
    let origin = CountingOrigin::start().await;
    // Nothing caches at start (no caching route, and the media front end does not cache), so no
    // cache is built.
    let mut caching = cached_config(origin.addr);
    caching.media.cache = false;
    let mut plain = caching.clone();
    for r in &mut plain.routes {
        r.cache = false;
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = sluice::app::App::new(&plain).unwrap();
    let server =
        sluice::server::Server::from_listeners(vec![listener], &plain.server, app.clone()).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    let url = format!("http://{addr}/r.txt");
    let r = request("GET", &url, &[]).await;
    assert!(!r.headers.contains_key("cache-status"));
    assert_eq!(origin.count("GET", "/r.txt"), 1);
    // The reload turns caching on: the cache is built then, and the route uses it at once.
    app.reload(&caching).unwrap();
    let first = request("GET", &url, &[]).await;
    assert!(
        cache_status(&first).starts_with("sluice; fwd=uri-miss"),
        "{}",
        cache_status(&first)
    );
    let again = request("GET", &url, &[]).await;
    assert!(cache_status(&again).starts_with("sluice; hit"));
    assert_eq!(again.body, first.body);
    assert_eq!(origin.count("GET", "/r.txt"), 2);
    // Later reloads (here one that turns caching off and on again) keep the same cache.
    app.reload(&plain).unwrap();
    app.reload(&caching).unwrap();
    let r = request("GET", &url, &[]).await;
    assert!(cache_status(&r).starts_with("sluice; hit"));
    assert_eq!(origin.count("GET", "/r.txt"), 2);
    // A reload whose [cache] cannot be built is refused as a whole; the running table stays.
    let mut broken = caching.clone();
    broken.cache.slice_bytes = sluice::cache::ByteSize(10);
    let fresh = sluice::app::App::new(&plain).unwrap();
    assert!(fresh.reload(&broken).is_err());
    let _ = stop.send(());
}

/// One response read from a raw connection: the head as text, the body (by its
/// `Content-Length`; none for HEAD and 304).
async fn read_response(s: &mut tokio::net::TcpStream, head_only: bool) -> (String, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), s.read(&mut chunk))
            .await
            .expect("a response within 10 s")
            .unwrap();
        assert!(
            n > 0,
            "closed inside a head: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..end].to_vec()).unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |v| v.trim().parse().unwrap());
    let want = if head_only || head.starts_with("HTTP/1.1 304") {
        0
    } else {
        len
    };
    let mut body = buf[end..].to_vec();
    while body.len() < want {
        let mut chunk = vec![0u8; want - body.len()];
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed inside a body");
        body.extend_from_slice(&chunk[..n]);
    }
    assert_eq!(body.len(), want, "nothing past the body");
    (head, body)
}

/// The head with the clock's fields made comparable: the origin's `Date` value, `Age` and the
/// `ttl` in `Cache-Status` (each within a second of what a hit right after the fill says).
fn clockless(head: &str) -> String {
    head.split("\r\n")
        .map(|l| {
            if l.starts_with("date: ") {
                "date: <date>".to_string()
            } else if let Some(age) = l.strip_prefix("age: ") {
                assert!(age == "0" || age == "1", "{l}");
                "age: <age>".to_string()
            } else if let Some((before, ttl)) = l.split_once("ttl=") {
                assert!(ttl == "3600" || ttl == "3599", "{l}");
                format!("{before}ttl=<ttl>")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\r\n")
}

#[tokio::test]
async fn fast_path_hits_are_exact_bytes() {
    use tokio::io::AsyncWriteExt;
    let (origin, s) = start().await;
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let get = |extra: &str| format!("GET /exact.txt HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n");
    c.write_all(get("").as_bytes()).await.unwrap();
    let (miss, body) = read_response(&mut c, false).await;
    assert_eq!(body, b"body of /exact.txt");
    assert!(
        miss.contains("cache-status: sluice; fwd=uri-miss"),
        "{miss}"
    );
    // The hit: the whole head, field by field in order, and the body.
    c.write_all(get("").as_bytes()).await.unwrap();
    let (hit, body) = read_response(&mut c, false).await;
    assert_eq!(
        clockless(&hit),
        "HTTP/1.1 200 OK\r\n\
         cache-control: public, max-age=3600\r\n\
         etag: \"e1\"\r\n\
         accept-ranges: bytes\r\n\
         content-type: application/octet-stream\r\n\
         date: <date>\r\n\
         content-length: 18\r\n\
         age: <age>\r\n\
         cache-status: sluice; hit; ttl=<ttl>\r\n\
         via: 1.1 sluice\r\n\
         x-route: cached\r\n\r\n"
    );
    assert_eq!(body, b"body of /exact.txt");
    // A range of the hit.
    c.write_all(get("Range: bytes=2-5\r\n").as_bytes())
        .await
        .unwrap();
    let (ranged, body) = read_response(&mut c, false).await;
    assert_eq!(
        clockless(&ranged),
        "HTTP/1.1 206 Partial Content\r\n\
         cache-control: public, max-age=3600\r\n\
         etag: \"e1\"\r\n\
         accept-ranges: bytes\r\n\
         content-type: application/octet-stream\r\n\
         date: <date>\r\n\
         content-range: bytes 2-5/18\r\n\
         content-length: 4\r\n\
         age: <age>\r\n\
         cache-status: sluice; hit; ttl=<ttl>\r\n\
         via: 1.1 sluice\r\n\
         x-route: cached\r\n\r\n"
    );
    assert_eq!(body, b"dy o");
    // A conditional request the hit satisfies: 304 with the validators, no body.
    c.write_all(get("If-None-Match: \"e1\"\r\n").as_bytes())
        .await
        .unwrap();
    let (not_modified, body) = read_response(&mut c, false).await;
    assert_eq!(
        clockless(&not_modified),
        "HTTP/1.1 304 Not Modified\r\n\
         cache-control: public, max-age=3600\r\n\
         date: <date>\r\n\
         etag: \"e1\"\r\n\
         age: <age>\r\n\
         cache-status: sluice; hit; ttl=<ttl>\r\n\
         via: 1.1 sluice\r\n\
         x-route: cached\r\n\r\n"
    );
    assert!(body.is_empty());
    // HEAD: the GET's head, no body; the connection still carries the next request.
    c.write_all(b"HEAD /exact.txt HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = read_response(&mut c, true).await;
    assert_eq!(clockless(&head), clockless(&hit));
    assert!(body.is_empty());
    c.write_all(get("").as_bytes()).await.unwrap();
    let (again, body) = read_response(&mut c, false).await;
    assert_eq!(clockless(&again), clockless(&hit));
    assert_eq!(body, b"body of /exact.txt");
    assert_eq!(origin.count("GET", "/exact.txt"), 1);
}

/// An object that varies on `X-Forwarded-For` is matched on the value sluice sends upstream,
/// never on one a client wrote: a client that forges another client's address gets its own
/// variant, fetched for its own address.
#[tokio::test]
async fn a_forged_forwarding_field_does_not_pick_another_clients_variant() {
    use tokio::io::AsyncWriteExt;
    let (origin, s) = start().await;
    let ask = |from: [u8; 4], extra: &'static str| async move {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(SocketAddr::from((from, 0))).unwrap();
        let mut c = sock.connect(s.addr).await.unwrap();
        let req = format!("GET /vary-xff HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n");
        c.write_all(req.as_bytes()).await.unwrap();
        let (head, body) = read_response(&mut c, false).await;
        (head, String::from_utf8(body).unwrap())
    };
    let (_, first) = ask([127, 0, 0, 1], "").await;
    assert_eq!(first, "for 127.0.0.1");
    let (head, again) = ask([127, 0, 0, 1], "").await;
    assert_eq!(again, "for 127.0.0.1");
    assert!(head.contains("cache-status: sluice; hit"), "{head}");
    assert_eq!(origin.count("GET", "/vary-xff"), 1);
    // Another client claiming to be 127.0.0.1.
    let (head, forged) = ask([127, 0, 0, 2], "X-Forwarded-For: 127.0.0.1\r\n").await;
    assert_eq!(forged, "for 127.0.0.2", "{head}");
    assert_eq!(origin.count("GET", "/vary-xff"), 2);
}

/// A route that adds nothing to a response (no `Via`, no edits) has its whole hits' heads written
/// from the bytes stored with the object: the same head as the map-built one (a HEAD's), with
/// `Age` and `Cache-Status` of each answer, and new bytes once a revalidation changed the fields.
#[tokio::test]
async fn a_hits_stored_head_follows_age_and_revalidation() {
    use tokio::io::AsyncWriteExt;
    let origin = CountingOrigin::start().await;
    let mut config = cached_config(origin.addr);
    config.reverse.via = false;
    for r in &mut config.routes {
        r.response_headers_add.clear();
    }
    let s = Sluice::start(config).await;
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let get =
        |method: &str, path: &str| format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    let field = |head: &str, name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(": ")))
            .map(str::to_string)
    };
    c.write_all(get("GET", "/exact.txt").as_bytes())
        .await
        .unwrap();
    let (_, body) = read_response(&mut c, false).await;
    assert_eq!(body, b"body of /exact.txt");
    c.write_all(get("GET", "/exact.txt").as_bytes())
        .await
        .unwrap();
    let (hit, body) = read_response(&mut c, false).await;
    assert_eq!(body, b"body of /exact.txt");
    assert_eq!(
        clockless(&hit),
        "HTTP/1.1 200 OK\r\n\
         cache-control: public, max-age=3600\r\n\
         etag: \"e1\"\r\n\
         accept-ranges: bytes\r\n\
         content-type: application/octet-stream\r\n\
         date: <date>\r\n\
         content-length: 18\r\n\
         age: <age>\r\n\
         cache-status: sluice; hit; ttl=<ttl>\r\n\r\n"
    );
    // A HEAD's head is built as a map: the same fields in the same order.
    c.write_all(get("HEAD", "/exact.txt").as_bytes())
        .await
        .unwrap();
    let (head, _) = read_response(&mut c, true).await;
    assert_eq!(clockless(&head), clockless(&hit));
    // Age moves on while the stored bytes stay (bounded wait for the next second).
    let first_age: u64 = field(&hit, "age").unwrap().parse().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let later = loop {
        c.write_all(get("GET", "/exact.txt").as_bytes())
            .await
            .unwrap();
        let (h, body) = read_response(&mut c, false).await;
        assert_eq!(body, b"body of /exact.txt");
        let age: u64 = field(&h, "age").unwrap().parse().unwrap();
        if age > first_age {
            break h;
        }
        assert!(std::time::Instant::now() < deadline, "age stuck at {age}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let ttl = |h: &str| -> i64 {
        field(h, "cache-status")
            .unwrap()
            .rsplit("ttl=")
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(ttl(&later) < ttl(&hit), "{later}");
    assert_eq!(origin.count("GET", "/exact.txt"), 1);

    // Revalidation: the 304's fields replace the stored ones, and the next hit writes those.
    c.write_all(get("GET", "/short").as_bytes()).await.unwrap();
    let (miss, body) = read_response(&mut c, false).await;
    assert_eq!(body, b"short body");
    let first = field(&miss, "x-served").unwrap();
    c.write_all(get("GET", "/short").as_bytes()).await.unwrap();
    let (hit, _) = read_response(&mut c, false).await;
    assert_eq!(field(&hit, "x-served"), Some(first.clone()), "{hit}");
    assert!(hit.contains("cache-status: sluice; hit"), "{hit}");
    // Stale after a second: the next GET revalidates (bounded wait).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let revalidated = loop {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        c.write_all(get("GET", "/short").as_bytes()).await.unwrap();
        let (h, body) = read_response(&mut c, false).await;
        assert_eq!(body, b"short body");
        if !h.contains("cache-status: sluice; hit") {
            break h;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never revalidated: {h}"
        );
    };
    let second = field(&revalidated, "x-served").unwrap();
    assert_ne!(second, first, "{revalidated}");
    assert!(origin.requests("GET", "/short").len() >= 2);
    c.write_all(get("GET", "/short").as_bytes()).await.unwrap();
    let (after, body) = read_response(&mut c, false).await;
    assert_eq!(body, b"short body");
    if after.contains("cache-status: sluice; hit") {
        assert_eq!(field(&after, "x-served"), Some(second), "{after}");
    }
}

/// Sends `GET path` (with `headers`) until the answer is not a hit, in a bounded wait: the first
/// request that found the object stale.
async fn until_revalidated(s: &Sluice, path: &str, headers: &[(&str, &str)]) -> support::Reply {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(6);
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let r = request("GET", &s.url(path), headers).await;
        assert_eq!(r.status, StatusCode::OK);
        if !cache_status(&r).contains("; hit") {
            return r;
        }
        assert!(std::time::Instant::now() < deadline, "never revalidated");
    }
}

/// Finding: a revalidation carried the `Cookie` of the client that found the object stale, and
/// the 304's fields were merged into the shared object: a per-user field in it (here `X-User`)
/// went to every later client. Now the revalidation is the object's, made without the cookie.
#[tokio::test]
async fn a_revalidation_made_for_one_user_is_not_served_to_the_next() {
    let (origin, s) = start().await;
    let first = request("GET", &s.url("/per-user"), &[]).await;
    assert_eq!(first.body.as_deref().unwrap(), b"body of /per-user");
    let alice = until_revalidated(&s, "/per-user", &[("cookie", "sid=alice")]).await;
    assert_eq!(alice.body.as_deref().unwrap(), b"body of /per-user");
    assert_eq!(origin.count("GET", "/per-user"), 2);
    let next = request("GET", &s.url("/per-user"), &[]).await;
    assert_eq!(next.body.as_deref().unwrap(), b"body of /per-user");
    assert_eq!(
        next.headers.get("x-user"),
        None,
        "another user's field: {:?}",
        next.headers
    );
    assert!(alice.headers.get("x-user").is_none(), "{:?}", alice.headers);
}

/// A 304 that names another `Vary` than the stored object's describes other variants: the object
/// goes and the request is answered as a miss (one more, unconditional, origin request), instead
/// of serving a `Vary` the object is not looked up by.
#[tokio::test]
async fn a_304_that_changes_vary_drops_the_object() {
    let (origin, s) = start().await;
    let first = request("GET", &s.url("/vary-change"), &[]).await;
    assert_eq!(first.body.as_deref().unwrap(), b"body of /vary-change");
    let again = until_revalidated(&s, "/vary-change", &[]).await;
    assert_eq!(again.body.as_deref().unwrap(), b"body of /vary-change");
    // The 200, the 304, then the miss's 200.
    assert_eq!(
        origin.count("GET", "/vary-change"),
        3,
        "{:?}",
        again.headers
    );
    assert!(again.headers.get("vary").is_none(), "{:?}", again.headers);
}

/// A range starting at the last byte a u64 can name, with a decimal slice size (`1MB`, allowed):
/// the slice it falls in ends past u64::MAX. It is answered as unsatisfiable (the origin
/// ignored the range the cache asked for and sent the whole object), and the route goes on
/// serving the right bytes.
#[tokio::test]
async fn a_range_at_the_end_of_u64_is_refused_cleanly() {
    let origin = CountingOrigin::start().await;
    let mut config = cached_config(origin.addr);
    config.cache.slice_bytes = sluice::cache::ByteSize(1_000_000);
    let s = Sluice::start(config).await;
    let far = request(
        "GET",
        &s.url("/big-far"),
        &[("range", "bytes=18446744073709551615-")],
    )
    .await;
    assert_eq!(far.status, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(
        far.headers["content-range"],
        format!("bytes */{BIG_LEN}").as_str()
    );
    let near = request("GET", &s.url("/big-far"), &[("range", "bytes=1000-1003")]).await;
    assert_eq!(near.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(near.body.as_deref().unwrap(), &pattern(BIG_LEN)[1000..1004]);
}

/// Finding: a revalidation's 304 was judged storable against the fields of the client that
/// asked, so `Cache-Control: no-cache, no-store` (honoured by default) made any client's request
/// drop any stored object, memory and disk, and the miss that followed stored nothing. The 304 is
/// now judged as the object was stored; the client's `no-store` only keeps its fields out.
#[tokio::test]
async fn a_clients_no_store_does_not_drop_what_is_stored() {
    let (origin, s) = start().await;
    let whole = sha256(&pattern(BIG_LEN));
    let first = request("GET", &s.url("/big-cond"), &[]).await;
    assert_eq!(sha256(first.body.as_deref().unwrap()), whole);
    let fetched = origin.count("GET", "/big-cond");
    assert!(fetched >= 1);
    let attack = request(
        "GET",
        &s.url("/big-cond"),
        &[("cache-control", "no-cache, no-store")],
    )
    .await;
    assert_eq!(attack.status, StatusCode::OK);
    assert_eq!(sha256(attack.body.as_deref().unwrap()), whole);
    assert_eq!(origin.count("REVALIDATE", "/big-cond"), 1);
    assert_eq!(origin.count("GET", "/big-cond"), fetched, "refetched");
    let after = request("GET", &s.url("/big-cond"), &[]).await;
    assert_eq!(sha256(after.body.as_deref().unwrap()), whole);
    assert!(
        cache_status(&after).starts_with("sluice; hit"),
        "{}",
        cache_status(&after)
    );
    assert_eq!(
        origin.count("GET", "/big-cond"),
        fetched,
        "the object was dropped"
    );
}

/// Finding: with `request_directives = "ignore"`, a stale object's revalidation made for a client
/// with `Authorization` failed the store-time `Authorization` rule on its 304, and a 401 from the
/// origin for the client's bad credentials counted as a new representation: either dropped the
/// object for everyone. A 304 to credentials the object is not shared for now serves that client
/// and leaves the object as it was (its fields are not stored for everyone), and a 401 is passed
/// on with the object kept.
#[tokio::test]
async fn a_clients_credentials_on_a_revalidation_do_not_drop_the_object() {
    let origin = CountingOrigin::start().await;
    let mut config = cached_config(origin.addr);
    config.cache.request_directives = sluice::cache::config::RequestDirectivesConfig::Ignore;
    let s = Sluice::start(config).await;
    let soft_purge = || async {
        let r = request(
            "PURGE",
            &s.url("/cond-doc"),
            &[("x-purge-key", PURGE_KEY), ("x-purge-soft", "1")],
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    };
    let first = request("GET", &s.url("/cond-doc"), &[]).await;
    assert_eq!(first.body.as_deref().unwrap(), b"body of /cond-doc");
    assert_eq!(origin.count("GET", "/cond-doc"), 1);

    soft_purge().await;
    let alice = request(
        "GET",
        &s.url("/cond-doc"),
        &[("authorization", "Bearer alice")],
    )
    .await;
    assert_eq!(alice.body.as_deref().unwrap(), b"body of /cond-doc");
    assert_eq!(origin.count("REVALIDATE", "/cond-doc"), 1);
    // Alice's 304 was not stored: still stale, the next request revalidates for itself (a 304
    // without credentials, stored) and is then a hit.
    let next = request("GET", &s.url("/cond-doc"), &[]).await;
    assert_eq!(next.body.as_deref().unwrap(), b"body of /cond-doc");
    assert_eq!(origin.count("REVALIDATE", "/cond-doc"), 2);
    let next = request("GET", &s.url("/cond-doc"), &[]).await;
    assert!(
        cache_status(&next).starts_with("sluice; hit"),
        "{}",
        cache_status(&next)
    );
    assert_eq!(origin.count("GET", "/cond-doc"), 1, "dropped on a 304");

    soft_purge().await;
    let refused = request(
        "GET",
        &s.url("/cond-doc"),
        &[("authorization", "Bearer bad")],
    )
    .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(refused.body.as_deref().unwrap(), b"denied");
    assert_eq!(origin.count("REVALIDATE", "/cond-doc"), 3);
    // Still stored, still stale: revalidated (a 304), not fetched again.
    let next = request("GET", &s.url("/cond-doc"), &[]).await;
    assert_eq!(next.status, StatusCode::OK);
    assert_eq!(next.body.as_deref().unwrap(), b"body of /cond-doc");
    assert_eq!(origin.count("REVALIDATE", "/cond-doc"), 4);
    assert_eq!(origin.count("GET", "/cond-doc"), 1, "dropped on a 401");
}

/// Finding (a review of the fix above): an object without validators is revalidated with a
/// plain GET, which the origin answers in full (206 to the slice's range); that counted as a new
/// representation, so `Cache-Control: no-cache, no-store` still dropped such an object for
/// everyone, and the miss that followed stored nothing. A full answer to a revalidation made
/// with the client's `no-store` is now for that client alone: its request goes to the origin as
/// a pass, and the object stays.
#[tokio::test]
async fn a_clients_no_store_does_not_drop_an_object_without_validators() {
    let (origin, s) = start().await;
    let first = request("GET", &s.url("/novalid-doc"), &[]).await;
    assert_eq!(first.body.as_deref().unwrap(), b"body of /novalid-doc");
    assert!(!first.headers.contains_key("etag"));
    let fetched = origin.count("GET", "/novalid-doc");
    let attack = request(
        "GET",
        &s.url("/novalid-doc"),
        &[("cache-control", "no-cache, no-store")],
    )
    .await;
    assert_eq!(attack.status, StatusCode::OK);
    assert_eq!(attack.body.as_deref().unwrap(), b"body of /novalid-doc");
    let asked = origin.count("GET", "/novalid-doc");
    assert!(asked > fetched, "not revalidated");
    let after = request("GET", &s.url("/novalid-doc"), &[]).await;
    assert_eq!(after.body.as_deref().unwrap(), b"body of /novalid-doc");
    assert!(
        cache_status(&after).starts_with("sluice; hit"),
        "{}",
        cache_status(&after)
    );
    assert_eq!(
        origin.count("GET", "/novalid-doc"),
        asked,
        "the object was dropped"
    );
}

/// Finding (a review of the mend above): the revalidation carries the client's other fields too,
/// and any 4xx but 401, 407 and 429 dropped the object: a field the origin refuses (a 9 KB
/// header nginx answers 400, a blocked `Referer`) with `no-cache` dropped any object, and the
/// miss after it stored nothing. Such a refusal is now passed on with the object kept.
#[tokio::test]
async fn a_refusal_of_a_clients_field_does_not_drop_the_object() {
    let (origin, s) = start().await;
    let first = request("GET", &s.url("/cond-refuse"), &[]).await;
    assert_eq!(first.body.as_deref().unwrap(), b"body of /cond-refuse");
    assert_eq!(origin.count("GET", "/cond-refuse"), 1);
    let attack = request(
        "GET",
        &s.url("/cond-refuse"),
        &[("cache-control", "no-cache"), ("x-refuse", "1")],
    )
    .await;
    assert_eq!(attack.status, StatusCode::BAD_REQUEST);
    assert_eq!(attack.body.as_deref().unwrap(), b"refused");
    let after = request("GET", &s.url("/cond-refuse"), &[]).await;
    assert_eq!(after.body.as_deref().unwrap(), b"body of /cond-refuse");
    assert!(
        cache_status(&after).starts_with("sluice; hit"),
        "{}",
        cache_status(&after)
    );
    assert_eq!(
        origin.count("GET", "/cond-refuse"),
        1,
        "the object was dropped"
    );
}

/// Finding (the same review): a background revalidation carried the credentials of the client
/// that found the object stale, so the 304 of an object not shared for credentials was that
/// client's alone and never stored: while such clients came, the object stayed stale and every
/// request revalidated again. It is now made without the client's `Authorization`.
#[tokio::test]
async fn a_background_revalidation_is_made_for_the_shared_object() {
    let (origin, s) = start().await;
    let first = request("GET", &s.url("/cond-swr"), &[]).await;
    assert_eq!(first.body.as_deref().unwrap(), b"body of /cond-swr");
    let stale = request(
        "GET",
        &s.url("/cond-swr"),
        &[("authorization", "Bearer alice")],
    )
    .await;
    assert_eq!(stale.body.as_deref().unwrap(), b"body of /cond-swr");
    assert!(
        cache_status(&stale).contains("stale-while-revalidate"),
        "{}",
        cache_status(&stale)
    );
    // Bounded wait for the background revalidation.
    for _ in 0..100 {
        if origin.count("REVALIDATE", "/cond-swr") == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(origin.count("REVALIDATE", "/cond-swr"), 1);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    // Its 304 (max-age=3600) was stored: fresh for everyone now.
    let next = request("GET", &s.url("/cond-swr"), &[]).await;
    assert!(
        cache_status(&next).starts_with("sluice; hit"),
        "{}",
        cache_status(&next)
    );
    assert_eq!(origin.count("REVALIDATE", "/cond-swr"), 1);
    assert_eq!(origin.count("GET", "/cond-swr"), 1);
}

/// Finding: a `Vary` line with a byte past ASCII was skipped whole, so `Vary: Cookie, X-\xe9`
/// stored the answer with no `Vary` on a route that caches cookie requests: one user's page
/// answered the next. Such an answer is now not stored, as `Vary: *`.
#[tokio::test]
async fn an_unreadable_vary_is_not_served_to_another_user() {
    let origin = CountingOrigin::start().await;
    let mut config = cached_config(origin.addr);
    for route in &mut config.routes {
        route.cache_cookies = true;
    }
    let s = Sluice::start(config).await;
    let alice = request("GET", &s.url("/vary-odd"), &[("cookie", "sid=alice")]).await;
    assert_eq!(alice.body.as_deref().unwrap(), b"for sid=alice");
    let bob = request("GET", &s.url("/vary-odd"), &[("cookie", "sid=bob")]).await;
    assert_eq!(bob.body.as_deref().unwrap(), b"for sid=bob");
    assert!(
        !cache_status(&bob).contains("; hit"),
        "{}",
        cache_status(&bob)
    );
    assert_eq!(origin.count("GET", "/vary-odd"), 2);
}

/// Finding: from a trusted proxy (a balancer on :80 and :443 that says `X-Forwarded-Proto: http`
/// for its plain clients), the scheme and host it reports reach the origin, which builds its
/// answer from them (a `force_ssl` redirect, absolute links), but the cache key held route,
/// `Host` and target alone: the answer made for `http` was served to `https` clients (a redirect
/// loop), one made for one `X-Forwarded-Host` to another. Each claim is its own variant now.
#[tokio::test]
async fn a_trusted_proxys_scheme_and_host_are_part_of_the_key() {
    let origin = CountingOrigin::start().await;
    let trusted = "[auth]\ntrusted_proxies = [\"127.0.0.1/32\"]";
    let s = Sluice::start(cached_config_with(origin.addr, trusted)).await;
    let url = s.url("/claimed");
    let get = |headers: &'static [(&'static str, &'static str)]| {
        let url = url.clone();
        async move {
            let r = request("GET", &url, headers).await;
            assert_eq!(r.status, StatusCode::OK);
            sha256(r.body.as_ref().unwrap())
        }
    };
    let plain = get(&[
        ("x-forwarded-proto", "http"),
        ("x-forwarded-host", "shop.test"),
    ])
    .await;
    assert_eq!(plain, sha256(b"http://shop.test/"));
    // The same claims again: a hit.
    let again = get(&[
        ("x-forwarded-proto", "http"),
        ("x-forwarded-host", "shop.test"),
    ])
    .await;
    assert_eq!(again, plain);
    assert_eq!(origin.count("GET", "/claimed"), 1);
    // The other scheme: its own fetch and answer, not the `http` one.
    let https = get(&[
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "shop.test"),
    ])
    .await;
    assert_eq!(https, sha256(b"https://shop.test/"));
    assert_eq!(origin.count("GET", "/claimed"), 2);
    // Another host the proxy reports: likewise.
    let other = get(&[
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "other.test"),
    ])
    .await;
    assert_eq!(other, sha256(b"https://other.test/"));
    assert_eq!(origin.count("GET", "/claimed"), 3);
    // Each is still served from the cache to its own claims.
    let https_again = get(&[
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "shop.test"),
    ])
    .await;
    assert_eq!(https_again, https);
    assert_eq!(origin.count("GET", "/claimed"), 3);
}

/// Finding: behind a balancer that always sends `X-Forwarded-Proto: https` and
/// `X-Forwarded-Port: 443` (Traefik, nginx-ingress), every object is stored under a claimed key;
/// an operator's `PURGE` sent straight to sluice (no such fields) purged 0, and a `PUT` or
/// `DELETE` whose fields differed left the stored answers fresh. Both now reach every claimed
/// variant of the URL.
#[tokio::test]
async fn purge_and_invalidation_reach_claimed_variants() {
    let origin = CountingOrigin::start().await;
    let trusted = "[auth]\ntrusted_proxies = [\"127.0.0.1/32\"]";
    let s = Sluice::start(cached_config_with(origin.addr, trusted)).await;
    let url = s.url("/claimed");
    const BALANCER: &[(&str, &str)] =
        &[("x-forwarded-proto", "https"), ("x-forwarded-port", "443")];
    let get = || async {
        let r = request("GET", &url, BALANCER).await;
        assert_eq!(r.status, StatusCode::OK);
        r
    };
    get().await;
    let hit = get().await;
    assert!(
        cache_status(&hit).contains("; hit"),
        "{}",
        cache_status(&hit)
    );
    assert_eq!(origin.count("GET", "/claimed"), 1);
    // A PURGE with no forwarding fields: the claimed variant goes.
    let purged = request("PURGE", &url, &[("x-purge-key", PURGE_KEY)]).await;
    assert_eq!(purged.status, StatusCode::OK);
    let text = String::from_utf8_lossy(purged.body.as_deref().unwrap()).to_string();
    assert!(text.contains("\"purged\":1"), "{text}");
    let refetched = get().await;
    assert!(!cache_status(&refetched).contains("; hit"));
    assert_eq!(origin.count("GET", "/claimed"), 2);
    get().await;
    assert_eq!(origin.count("GET", "/claimed"), 2);
    // A PUT and a DELETE without the balancer's fields: each makes the stored answer stale.
    for method in ["PUT", "DELETE"] {
        let before = origin.count("GET", "/claimed");
        let r = request(method, &url, &[]).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT);
        let after = get().await;
        assert!(!cache_status(&after).contains("; hit"), "{method}");
        assert!(origin.count("GET", "/claimed") > before, "{method}");
    }
}
