//! HTTP/2 streams on the fast path's upstream exchange (`reverse/fast_h2.rs`) end to end, each
//! case against the same requests with `reverse.h2_fast_path = false` (hyper's client): the
//! upstream head byte for byte, response fields, bodies by SHA-256 (1 KB, 64 KiB, 7 MB, chunked
//! with trailers, close-delimited), HEAD, 204 and 304, plain heads sent as HPACK lines (one past a
//! frame among them), an upstream that closes mid-body, upstream errors, many streams at once on
//! one connection, pooled upstream connections, and the metrics and access log.

mod reverse_support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use reverse_support::*;
use tokio::net::TcpListener;

fn proxy_config(origin: SocketAddr, fast: bool) -> sluice::config::Config {
    let mut c = config(&format!(
        r#"
[reverse]
forwarded = true

[[upstreams]]
name = "app"
servers = ["{origin}"]

[[routes]]
path = "/api"
upstream = "app"
strip_prefix = true
request_headers_add = {{ "x-route" = "api" }}
request_headers_remove = ["x-secret"]
response_headers_add = {{ "x-served-by" = "sluice" }}
response_headers_remove = ["x-internal"]
header_timeout_secs = 2
idle_timeout_secs = 2

# No response field edits: a plain head goes out as HPACK lines (`plain_head`).
[[routes]]
path = "/plain"
upstream = "app"
strip_prefix = true
header_timeout_secs = 2
idle_timeout_secs = 2
"#
    ));
    c.reverse.h2_fast_path = fast;
    c
}

/// An h2c (prior knowledge) client connection to `p`.
async fn h2(p: &Proxy) -> hyper::client::conn::http2::SendRequest<BoxBody> {
    h2_client(p.addr).await
}

/// One HTTP/2 answer, whole: status, fields, body (or the error that cut it) and trailers.
#[derive(Debug)]
struct Answered {
    status: StatusCode,
    headers: HeaderMap,
    body: Result<Bytes, String>,
    trailers: Option<HeaderMap>,
}

impl Answered {
    /// The response fields but `date`, sorted, as text.
    fn fields(&self) -> Vec<String> {
        let mut f: Vec<String> = self
            .headers
            .iter()
            .filter(|(k, _)| *k != "date")
            .map(|(k, v)| format!("{k}: {}", String::from_utf8_lossy(v.as_bytes())))
            .collect();
        f.sort();
        f
    }
}

async fn ask(
    send: &mut hyper::client::conn::http2::SendRequest<BoxBody>,
    p: &Proxy,
    method: &str,
    path: &str,
    fields: &[(&str, &str)],
) -> Answered {
    // One authority for every proxy, so upstream heads compare across proxies.
    let _ = p;
    let mut b = http::Request::builder()
        .method(method)
        .uri(format!("http://h2.test{path}"));
    for (k, v) in fields {
        b = b.header(*k, *v);
    }
    let req = b.body(full(Bytes::new())).unwrap();
    let resp = match tokio::time::timeout(Duration::from_secs(20), send.send_request(req))
        .await
        .expect("no response head")
    {
        Ok(resp) => resp,
        // The stream was reset before its head was read (a body cut right after the head).
        Err(e) => {
            return Answered {
                status: StatusCode::from_u16(599).unwrap(),
                headers: HeaderMap::new(),
                body: Err(e.to_string()),
                trailers: None,
            }
        }
    };
    let (parts, body) = resp.into_parts();
    let collected = tokio::time::timeout(Duration::from_secs(20), body.collect())
        .await
        .expect("body timed out");
    let (body, trailers) = match collected {
        Ok(c) => {
            let trailers = c.trailers().cloned();
            (Ok(c.to_bytes()), trailers)
        }
        Err(e) => (Err(e.to_string()), None),
    };
    Answered {
        status: parts.status,
        headers: parts.headers,
        body,
        trailers,
    }
}

/// The same request through a fresh proxy with the HTTP/2 fast path on and then off: the two
/// answers and the two upstream heads.
async fn both_ways(
    origin: SocketAddr,
    heads: &Mutex<Vec<Vec<u8>>>,
    method: &str,
    path: &str,
    fields: &[(&str, &str)],
) -> Vec<(Answered, Option<String>)> {
    let mut out = Vec::new();
    for fast in [true, false] {
        heads.lock().unwrap().clear();
        let p = Proxy::start(proxy_config(origin, fast)).await;
        let mut send = h2(&p).await;
        let a = ask(&mut send, &p, method, path, fields).await;
        let head = heads
            .lock()
            .unwrap()
            .pop()
            .map(|h| String::from_utf8(h).unwrap());
        out.push((a, head));
    }
    out
}

fn counted(body: &[u8], extra: &str) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nX-Internal: 1\r\nConnection: keep-alive, x-hop\r\nX-Hop: 1\r\n{extra}\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

const SIZES: [usize; 4] = [1024, 64 * 1024, 7 * 1024 * 1024, 0];

fn sized(target: &str) -> Option<usize> {
    let path = target.split('?').next()?;
    path.strip_prefix("/n/")?.parse().ok()
}

/// A head the fast path may pass on as it came (`plain_head`): one length, only this hop's
/// connection fields to leave out, repeated and long fields, a `Date`, and an `Alt-Svc` for the map.
fn plain_answer(body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nServer: o\r\nSet-Cookie: a=1\r\nContent-Type: text/plain\r\n\
         Date: Tue, 01 Dec 2026 00:00:00 GMT\r\nContent-Length: {}\r\nSet-Cookie: b=2\r\n\
         Connection: keep-alive\r\nKeep-Alive: timeout=5\r\nETag: \"e\"\r\nAlt-Svc: clear\r\n\
         X-Long: {}\r\nCache-Control: max-age=60\r\nX-Obs: caf\u{e9}\r\n\r\n",
        body.len(),
        "v".repeat(300)
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

fn answers() -> Answer {
    Arc::new(|t: &str| {
        if let Some(n) = sized(t) {
            return counted(&pattern(n), "");
        }
        if let Some(n) = t.strip_prefix("/p/").and_then(|n| n.parse().ok()) {
            return plain_answer(&pattern(n));
        }
        match t {
            // Plain without a `Date` (sluice's own goes in), after an interim answer, with a
            // repeated `Alt-Svc` (the map path keeps both), and a head past one HTTP/2 frame.
            "/p-no-date" => {
                return b"HTTP/1.1 200 OK\r\nServer: o\r\nContent-Length: 5\r\n\r\nhello".to_vec()
            }
            "/p-early" => {
                let mut out = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n".to_vec();
                out.extend_from_slice(&plain_answer(&pattern(3000)));
                return out;
            }
            "/p-two-alt" => {
                return b"HTTP/1.1 200 OK\r\nAlt-Svc: clear\r\nContent-Length: 2\r\nAlt-Svc: h3=\":1\"\r\n\r\nok".to_vec()
            }
            "/p-big" => {
                let mut out = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n".to_vec();
                for i in 0..3 {
                    out.extend_from_slice(format!("X-Big-{i}: {}\r\n", "b".repeat(7000)).as_bytes());
                }
                out.extend_from_slice(b"\r\nok");
                return out;
            }
            _ => {}
        }
        match t {
            "/chunked" => chunked(&pattern(300_000), 70_000, "X-Sum: abc\r\nGrpc-Status: 0\r\n"),
            "/chunked-plain" => chunked(&pattern(5000), 1000, ""),
            "/head" => b"HTTP/1.1 200 OK\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nContent-Length: 12345\r\nETag: \"e\"\r\n\r\n".to_vec(),
            "/204" => b"HTTP/1.1 204 No Content\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nX-A: 1\r\n\r\n".to_vec(),
            "/304" => b"HTTP/1.1 304 Not Modified\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nETag: \"x\"\r\nContent-Length: 99\r\n\r\n".to_vec(),
            // Length fields a bodiless answer may not carry, or not so.
            "/204-length" => b"HTTP/1.1 204 No Content\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nContent-Length: 5\r\n\r\n".to_vec(),
            "/304-two" => b"HTTP/1.1 304 Not Modified\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nContent-Length: 5, 7\r\n\r\n".to_vec(),
            "/close" => {
                let mut out = b"HTTP/1.1 200 OK\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nX-Mode: close-now\r\n\r\n".to_vec();
                out.extend_from_slice(&pattern(200_000));
                out
            }
            "/cut" => {
                let mut out = b"HTTP/1.1 200 OK\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nContent-Length: 1000000\r\nX-Mode: close-now\r\n\r\n".to_vec();
                out.extend_from_slice(&pattern(100_000));
                out
            }
            "/garbage" => b"SPDY/9 banana\r\n\r\nclose-now".to_vec(),
            _ => b"HTTP/1.1 404 Not Found\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nContent-Length: 0\r\n\r\n".to_vec(),
        }
    })
}

#[tokio::test]
async fn the_upstream_head_is_the_hyper_paths_byte_for_byte() {
    let (origin, heads, _) = raw_origin(answers()).await;
    let fields = [
        ("user-agent", "t/1"),
        ("accept", "*/*"),
        ("x-multi", "1"),
        ("x-secret", "s"),
        ("x-multi", "2"),
        ("x-forwarded-for", "6.6.6.6"),
        ("via", "1.0 front"),
        ("te", "trailers"),
        ("cookie", "a=b"),
        ("x-http-method-override", "DELETE"),
        ("x_under", "1"),
    ];
    let got = both_ways(origin, &heads, "GET", "/api/x/../n/1024?q=1&r=%20", &fields).await;
    let fast = got[0].1.clone().unwrap();
    let hyper = got[1].1.clone().unwrap();
    assert_eq!(fast, hyper, "the HTTP/2 fast path's upstream head differs");
    assert!(
        fast.starts_with("GET /n/1024?q=1&r=%20 HTTP/1.1\r\n"),
        "{fast}"
    );
    assert!(fast.contains("\r\nvia: 1.0 front, 2 sluice\r\n"), "{fast}");
    assert!(
        fast.contains("\r\nx-forwarded-for: 127.0.0.1\r\n"),
        "{fast}"
    );
    assert!(fast.contains("\r\nx-route: api\r\n"), "{fast}");
    assert!(fast.contains("\r\nte: trailers\r\n"), "{fast}");
    for gone in ["x-secret", "x-http-method-override", "x_under"] {
        assert!(!fast.contains(gone), "{gone} reached the upstream: {fast}");
    }
    assert!(fast.ends_with("host: h2.test\r\n\r\n"), "{fast}");
    // The response: same status and fields both ways, the origin's hop-by-hop ones dropped.
    let (a, b) = (&got[0].0, &got[1].0);
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.fields(), b.fields());
    assert_eq!(a.headers["x-served-by"], "sluice");
    assert_eq!(a.headers["via"], "1.1 sluice");
    assert_eq!(a.headers["content-length"], "1024");
    assert!(a.headers.get("x-internal").is_none());
    assert!(a.headers.get("x-hop").is_none());
    assert_eq!(a.body.as_ref().unwrap(), &pattern(1024));
}

/// A head without forwarding fields of its own, on a route without header edits and without
/// `Forwarded`: this hop's fields follow the client's in `forwarded::apply`'s order, then `host`,
/// the same on the fast path (written as bytes) and through hyper's client; the target goes up
/// as the client sent it.
#[tokio::test]
async fn forwarding_fields_after_a_plain_head_are_the_hyper_paths() {
    let (origin, heads, _) = raw_origin(answers()).await;
    let mut got = Vec::new();
    for fast in [true, false] {
        heads.lock().unwrap().clear();
        let mut c = config(&format!(
            r#"
[[upstreams]]
name = "app"
servers = ["{origin}"]

[[routes]]
path = "/"
upstream = "app"
header_timeout_secs = 2
idle_timeout_secs = 2
"#
        ));
        c.reverse.h2_fast_path = fast;
        let p = Proxy::start(c).await;
        let mut send = h2(&p).await;
        let a = ask(
            &mut send,
            &p,
            "GET",
            "/n/16?x=1&y=%20",
            &[("accept", "*/*")],
        )
        .await;
        assert_eq!(a.status, StatusCode::OK);
        let head = heads.lock().unwrap().pop().unwrap();
        got.push(String::from_utf8(head).unwrap());
    }
    assert_eq!(
        got[0], got[1],
        "the HTTP/2 fast path's upstream head differs"
    );
    assert!(
        got[0].starts_with("GET /n/16?x=1&y=%20 HTTP/1.1\r\n"),
        "{}",
        got[0]
    );
    assert!(
        got[0].ends_with(
            "\r\naccept: */*\r\nx-forwarded-for: 127.0.0.1\r\nx-forwarded-proto: http\r\n\
             x-forwarded-host: h2.test\r\nx-real-ip: 127.0.0.1\r\nvia: 2 sluice\r\n\
             host: h2.test\r\n\r\n"
        ),
        "{}",
        got[0]
    );
}

#[tokio::test]
async fn counted_bodies_arrive_whole_by_hash() {
    let (origin, heads, _) = raw_origin(answers()).await;
    for n in SIZES {
        let got = both_ways(origin, &heads, "GET", &format!("/api/n/{n}"), &[]).await;
        for (a, _) in &got {
            assert_eq!(a.status, StatusCode::OK, "{n}");
            let body = a.body.as_ref().unwrap();
            assert_eq!(body.len(), n);
            assert_eq!(sha256(body), sha256(&pattern(n)), "{n} bytes");
            assert_eq!(a.headers["content-length"], n.to_string().as_str());
        }
        assert_eq!(got[0].0.fields(), got[1].0.fields(), "{n}");
    }
}

#[tokio::test]
async fn plain_heads_go_out_as_hpack_lines_with_the_hyper_paths_fields() {
    let (origin, heads, _) = raw_origin(answers()).await;
    for (method, path) in [
        ("GET", "/plain/p/1024".to_string()),
        ("GET", "/plain/p/0".to_string()),
        ("GET", format!("/plain/p/{}", 7 * 1024 * 1024)),
        ("HEAD", "/plain/p/1024".to_string()),
        ("HEAD", "/plain/head".to_string()),
        ("GET", "/plain/missing".to_string()),
    ] {
        let got = both_ways(origin, &heads, method, &path, &[]).await;
        let n = sized(&path.replace("/plain/p/", "/n/")).unwrap_or(0);
        for (a, _) in &got {
            let body = a.body.as_ref().unwrap();
            if method == "GET" && path.contains("/p/") {
                assert_eq!(a.status, StatusCode::OK);
                assert_eq!(sha256(body), sha256(&pattern(n)), "{path}");
                assert_eq!(a.headers["content-length"], n.to_string().as_str());
            } else {
                assert!(body.is_empty(), "{method} {path}");
            }
        }
        assert_eq!(got[0].0.status, got[1].0.status, "{method} {path}");
        assert_eq!(got[0].0.fields(), got[1].0.fields(), "{method} {path}");
        assert_eq!(got[0].0.headers["date"], got[1].0.headers["date"]);
        if path.contains("/p/") {
            // The HPACK path keeps the origin's order but for its `Alt-Svc`, which goes in the
            // response's map and so ahead of the lines; the map path keeps it in its place.
            let first = |a: &Answered| a.headers.keys().next().unwrap().as_str().to_string();
            assert_eq!(first(&got[0].0), "alt-svc", "{method} {path}");
            assert_eq!(first(&got[1].0), "server", "{method} {path}");
            let a = &got[0].0;
            assert_eq!(a.headers["via"], "1.1 sluice");
            assert_eq!(a.headers["alt-svc"], "clear");
            assert_eq!(a.headers["x-long"], "v".repeat(300).as_str());
            assert_eq!(a.headers["x-obs"].as_bytes(), "caf\u{e9}".as_bytes());
            let cookies: Vec<_> = a.headers.get_all("set-cookie").iter().collect();
            assert_eq!(cookies, ["a=1", "b=2"]);
            assert!(a.headers.get("connection").is_none() && a.headers.get("keep-alive").is_none());
        }
    }
    // Many plain answers on one connection: every stream whole, the same fields each time.
    let p = Proxy::start(proxy_config(origin, true)).await;
    let mut send = h2(&p).await;
    let mut tasks = Vec::new();
    for i in 0..40 {
        let mut send = send.clone();
        tasks.push(tokio::spawn(async move {
            let n = 1000 + i * 97;
            let req = http::Request::builder()
                .uri(format!("http://h2.test/plain/p/{n}"))
                .body(full(Bytes::new()))
                .unwrap();
            let resp = send.send_request(req).await.unwrap();
            let fields = resp.headers().len();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(sha256(&body), sha256(&pattern(n)));
            fields
        }));
    }
    for t in tasks {
        // alt-svc; server, 2 set-cookie, content-type, date, content-length, etag, x-long,
        // cache-control, x-obs; via.
        assert_eq!(t.await.unwrap(), 12);
    }
    let a = ask(&mut send, &p, "GET", "/plain/p/10", &[]).await;
    assert_eq!(a.body.unwrap(), pattern(10));
}

#[tokio::test]
async fn plain_heads_without_date_after_interim_answers_repeated_or_large_match_the_hyper_path() {
    let (origin, heads, _) = raw_origin(answers()).await;
    for path in ["/plain/p-no-date", "/plain/p-early", "/plain/p-two-alt"] {
        let got = both_ways(origin, &heads, "GET", path, &[]).await;
        assert_eq!(got[0].0.status, StatusCode::OK, "{path}");
        assert_eq!(got[0].0.body, got[1].0.body, "{path}");
        assert_eq!(got[0].0.fields(), got[1].0.fields(), "{path}");
        let date: Vec<_> = got[0].0.headers.get_all("date").iter().collect();
        assert_eq!(
            date.len(),
            1,
            "{path}: one Date, the origin's or the server's"
        );
    }
    let got = both_ways(origin, &heads, "GET", "/plain/p-early", &[]).await;
    assert_eq!(
        sha256(got[0].0.body.as_ref().unwrap()),
        sha256(&pattern(3000))
    );
    let got = both_ways(origin, &heads, "GET", "/plain/p-two-alt", &[]).await;
    let alt: Vec<_> = got[0].0.headers.get_all("alt-svc").iter().collect();
    assert_eq!(alt, ["clear", "h3=\":1\""]);
    // 21 KB of fields: the HEADERS frame and a CONTINUATION, read by a client that takes them.
    let mut seen = Vec::new();
    for fast in [true, false] {
        let p = Proxy::start(proxy_config(origin, fast)).await;
        let tcp = tokio::net::TcpStream::connect(p.addr).await.unwrap();
        let (mut send, conn) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .max_header_list_size(64 * 1024)
                .handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .unwrap();
        tokio::spawn(conn);
        let a = ask(&mut send, &p, "GET", "/plain/p-big", &[]).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.body.as_deref().unwrap(), b"ok");
        for i in 0..3 {
            assert_eq!(
                a.headers[format!("x-big-{i}").as_str()],
                "b".repeat(7000).as_str()
            );
        }
        seen.push(a.fields());
    }
    assert_eq!(seen[0], seen[1]);
}

/// hyper's HTTP/2 dating is off (the fast path's lines carry their own `Date`): every answer, the
/// proxy's own ones too, still has exactly one, and a current one.
#[tokio::test]
async fn every_http2_answer_has_one_date() {
    let (origin, _, _) = raw_origin(answers()).await;
    let p = Proxy::start(proxy_config(origin, true)).await;
    let mut send = h2(&p).await;
    // The proxy's own 404 (no route), a plain answer without a `Date` (the fast path's line), a
    // plain one with the origin's, a mapped one (`/api`), a 204 and an upstream that sends garbage
    // (the proxy's 502).
    for (path, status, origin_date) in [
        ("/nowhere", 404, false),
        ("/plain/p-no-date", 200, false),
        ("/plain/p/10", 200, true),
        ("/api/n/10", 200, true),
        ("/plain/204", 204, true),
        ("/plain/garbage", 502, false),
    ] {
        let a = ask(&mut send, &p, "GET", path, &[]).await;
        assert_eq!(a.status.as_u16(), status, "{path}");
        let dates: Vec<_> = a.headers.get_all("date").iter().collect();
        assert_eq!(dates.len(), 1, "{path}: {dates:?}");
        let date = dates[0].to_str().unwrap();
        if origin_date {
            assert_eq!(date, "Tue, 01 Dec 2026 00:00:00 GMT", "{path}");
        } else {
            let at = httpdate::parse_http_date(date).unwrap();
            let off = std::time::SystemTime::now()
                .duration_since(at)
                .unwrap_or_default();
            assert!(off.as_secs() <= 2, "{path}: {date}");
        }
    }
}

#[tokio::test]
async fn chunked_bodies_are_decoded_and_their_trailers_kept() {
    let (origin, heads, _) = raw_origin(answers()).await;
    let got = both_ways(origin, &heads, "GET", "/api/chunked", &[]).await;
    for (a, _) in &got {
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(sha256(a.body.as_ref().unwrap()), sha256(&pattern(300_000)));
        assert!(a.headers.get("transfer-encoding").is_none());
        assert!(a.headers.get("content-length").is_none());
        let t = a.trailers.as_ref().expect("trailers");
        assert_eq!(t["x-sum"], "abc");
        assert_eq!(t["grpc-status"], "0");
    }
    assert_eq!(got[0].0.fields(), got[1].0.fields());
    assert_eq!(got[0].0.trailers, got[1].0.trailers);
    let got = both_ways(origin, &heads, "GET", "/api/chunked-plain", &[]).await;
    for (a, _) in &got {
        assert_eq!(sha256(a.body.as_ref().unwrap()), sha256(&pattern(5000)));
        assert_eq!(a.trailers, None);
    }
    let got = both_ways(origin, &heads, "GET", "/api/close", &[]).await;
    for (a, _) in &got {
        assert_eq!(sha256(a.body.as_ref().unwrap()), sha256(&pattern(200_000)));
    }
    assert_eq!(got[0].0.fields(), got[1].0.fields());
}

#[tokio::test]
async fn bodiless_answers_match_the_hyper_path() {
    let (origin, heads, _) = raw_origin(answers()).await;
    for (method, path, status) in [
        ("HEAD", "/api/head", 200),
        ("HEAD", "/api/n/1024", 200),
        ("GET", "/api/204", 204),
        ("GET", "/api/304", 304),
        ("GET", "/api/missing", 404),
    ] {
        let got = both_ways(origin, &heads, method, path, &[]).await;
        for (a, _) in &got {
            assert_eq!(a.status.as_u16(), status, "{method} {path}");
            assert!(a.body.as_ref().unwrap().is_empty(), "{method} {path}");
        }
        assert_eq!(got[0].0.fields(), got[1].0.fields(), "{method} {path}");
    }
    let got = both_ways(origin, &heads, "HEAD", "/api/head", &[]).await;
    assert_eq!(got[0].0.headers["content-length"], "12345");
    // A 204's length, and one that is not one decimal, are not relayed (as `fast_write` and
    // hyper's HTTP/1.1 server write them; the hyper path's HTTP/2 answers differ today: the 204
    // keeps its `Content-Length`, the 304 is reset).
    for path in ["/api/204-length", "/api/304-two"] {
        let got = both_ways(origin, &heads, "GET", path, &[]).await;
        assert!(got[0].0.body.as_ref().unwrap().is_empty(), "{path}");
        assert!(got[0].0.headers.get("content-length").is_none(), "{path}");
    }
}

#[tokio::test]
async fn upstream_faults_match_the_hyper_path() {
    let (origin, heads, _) = raw_origin(answers()).await;
    // Cut mid-body: the head went out, then the stream is reset, never a short body passed off
    // as whole.
    let got = both_ways(origin, &heads, "GET", "/api/cut", &[]).await;
    for (a, _) in &got {
        // The reset may overtake the head on its way to the client's code.
        assert!(
            a.status == StatusCode::OK || a.status.as_u16() == 599,
            "{}",
            a.status
        );
        assert!(
            a.body.is_err(),
            "the cut was hidden: {:?}",
            a.body.as_ref().map(|b| b.len())
        );
    }
    let got = both_ways(origin, &heads, "GET", "/api/garbage", &[]).await;
    assert_eq!(got[0].0.status, StatusCode::BAD_GATEWAY);
    assert_eq!(got[0].0.body, got[1].0.body);
    assert_eq!(got[0].0.fields(), got[1].0.fields());
    let dead = dead_port().await;
    let mut refused = Vec::new();
    for fast in [true, false] {
        let p = Proxy::start(proxy_config(dead, fast)).await;
        let mut send = h2(&p).await;
        refused.push(ask(&mut send, &p, "GET", "/api/x", &[]).await);
    }
    assert_eq!(refused[0].status, StatusCode::BAD_GATEWAY);
    assert_eq!(refused[0].body, refused[1].body);
    // A server that never answers: the route's header timeout (2 s), 504, both ways. The fast
    // path keeps it without a timer, looked at when its connection's tick (1 s here) wakes the
    // stream: three streams waiting at once on one connection each end within a tick of it.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let mut timed_out = Vec::new();
    for fast in [true, false] {
        let p = Proxy::start(proxy_config(addr, fast)).await;
        let send = h2(&p).await;
        let started = tokio::time::Instant::now();
        let streams = (0..3).map(|_| {
            let (mut send, p) = (send.clone(), &p);
            async move {
                let a = ask(&mut send, p, "GET", "/api/x", &[]).await;
                (a, started.elapsed())
            }
        });
        // Each stream's own time (a second allowed beyond the tick for a loaded machine).
        for (a, took) in futures_util::future::join_all(streams).await {
            assert!(
                took >= Duration::from_millis(1990) && took < Duration::from_millis(4500),
                "fast={fast}: answered after {took:?}"
            );
            timed_out.push(a);
        }
    }
    assert_eq!(timed_out[0].status, StatusCode::GATEWAY_TIMEOUT);
    for a in &timed_out[1..] {
        assert_eq!(
            (a.status, &a.body),
            (timed_out[0].status, &timed_out[0].body)
        );
    }
}

#[tokio::test]
async fn many_streams_at_once_each_arrive_whole_over_pooled_connections() {
    let (origin, _, accepted) = raw_origin(answers()).await;
    let p = Proxy::start(proxy_config(origin, true)).await;
    let send = h2(&p).await;
    // One at a time first: a single upstream connection carries them all.
    let mut one = send.clone();
    for _ in 0..20 {
        let a = ask(&mut one, &p, "GET", "/api/n/1024", &[]).await;
        assert_eq!(a.body.unwrap(), pattern(1024));
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    let mut sizes: Vec<usize> = vec![0, 1, 255, 4096, 16_384, 16_385, 70_000, 300_000];
    sizes.extend((0..92).map(|i| 900 + i * 97));
    let addr = p.addr;
    let tasks: Vec<_> = sizes
        .iter()
        .map(|&n| {
            let mut send = send.clone();
            tokio::spawn(async move {
                let req = http::Request::get(format!("http://{addr}/api/n/{n}"))
                    .body(full(Bytes::new()))
                    .unwrap();
                let resp = send.send_request(req).await.unwrap();
                assert_eq!(resp.status(), StatusCode::OK);
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                (n, body)
            })
        })
        .collect();
    for t in tasks {
        let (n, body) = tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("h2 stream timed out")
            .unwrap();
        assert_eq!(sha256(&body), sha256(&pattern(n)), "stream for {n} bytes");
    }
    // The connections opened for them went back to the pool: another round opens none.
    let opened = accepted.load(Ordering::SeqCst);
    assert!(opened <= sizes.len() + 1, "{opened}");
    let mut again = send.clone();
    for _ in 0..5 {
        let a = ask(&mut again, &p, "GET", "/api/n/1024", &[]).await;
        assert_eq!(a.body.unwrap(), pattern(1024));
    }
    assert_eq!(accepted.load(Ordering::SeqCst), opened);
}

#[tokio::test]
async fn requests_are_metered_and_logged() {
    let (origin, _, _) = raw_origin(answers()).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let mut config = proxy_config(origin, true);
    config.reverse.access_log = log.to_str().unwrap().to_string();
    let p = Proxy::start(config).await;
    let mut send = h2(&p).await;
    for _ in 0..7 {
        let a = ask(
            &mut send,
            &p,
            "GET",
            "/api/n/1024",
            &[("user-agent", "probe/1")],
        )
        .await;
        assert_eq!(a.body.unwrap().len(), 1024);
    }
    let a = ask(&mut send, &p, "HEAD", "/api/n/1024", &[]).await;
    assert_eq!(a.status, StatusCode::OK);
    let m = get(&p.url("/metrics"), &[]).await;
    let text = String::from_utf8(m.body.unwrap().to_vec()).unwrap();
    let line = |prefix: &str| -> Option<String> {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .map(str::to_string)
    };
    assert_eq!(
        line("sluice_requests_total{endpoint=\"reverse\",status=\"200\"}").as_deref(),
        Some("sluice_requests_total{endpoint=\"reverse\",status=\"200\"} 8"),
        "{text}"
    );
    assert!(
        line("sluice_sent_bytes_total{endpoint=\"reverse\"}")
            .is_some_and(|l| l.ends_with(&format!(" {}", 7 * 1024))),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("sluice_reverse_server_requests_total{") && l.ends_with(" 8")),
        "{text}"
    );
    let mut lines = Vec::new();
    for _ in 0..50 {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        lines = text.lines().map(str::to_string).collect();
        if lines.len() >= 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lines.len(), 8, "{lines:?}");
    let first: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(first["method"], "GET");
    assert_eq!(first["target"], "/api/n/1024");
    assert_eq!(first["proto"], "HTTP/2");
    assert_eq!(first["status"], 200);
    assert_eq!(first["bytes"], 1024);
    assert_eq!(first["server"], origin.to_string());
    assert_eq!(first["user_agent"], "probe/1");
    let head: serde_json::Value = serde_json::from_str(&lines[7]).unwrap();
    assert_eq!(head["method"], "HEAD");
    assert_eq!(head["bytes"], 0);
}
