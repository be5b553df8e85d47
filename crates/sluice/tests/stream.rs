//! `/proxy/stream` against a real origin: bytes, ranges, HEAD, errors, timeouts, auth, SSRF, shutdown.

mod support;

use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn stream_url(s: &Sluice, d: &str, extra: &str) -> String {
    s.url(&format!("/proxy/stream?d={}{extra}", enc(d)))
}

#[tokio::test]
async fn large_body_is_byte_identical() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    let r = get(&stream_url(&s, &origin.url("/big"), "")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-length"], BIG_LEN.to_string());
    assert_eq!(r.headers["content-type"], "video/mp4");
    let body = r.body.unwrap();
    assert_eq!(sha256(&body), sha256(&origin.big));
    // No Range was invented on the way.
    assert!(origin.seen_path("/big")[0].headers.get("range").is_none());
}

#[tokio::test]
async fn ranges_are_mirrored() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    let url = stream_url(&s, &origin.url("/big"), "");
    let len = BIG_LEN;
    for (range, a, b) in [
        ("bytes=100-199", 100, 199),
        ("bytes=-500", len - 500, len - 1),
        (&*format!("bytes={}-", len - 1000), len - 1000, len - 1),
    ] {
        let r = request("GET", &url, &[("range", range)]).await;
        assert_eq!(r.status, 206, "{range}");
        assert_eq!(
            r.headers["content-range"],
            format!("bytes {a}-{b}/{len}"),
            "{range}"
        );
        assert_eq!(r.body.unwrap(), origin.big.slice(a..=b), "{range}");
    }
}

#[tokio::test]
async fn if_range_goes_upstream() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    let url = stream_url(&s, &origin.url("/big"), "");
    let r = request("GET", &url, &[("range", "bytes=0-9"), ("if-range", ETAG)]).await;
    assert_eq!(r.status, 206);
    assert_eq!(r.body.unwrap().len(), 10);
    let r = request(
        "GET",
        &url,
        &[("range", "bytes=0-9"), ("if-range", "\"stale\"")],
    )
    .await;
    assert_eq!(r.status, 200, "a stale If-Range gets the whole entity");
    assert_eq!(r.body.unwrap().len(), BIG_LEN);
}

#[tokio::test]
async fn head_stays_head() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    let r = request("HEAD", &stream_url(&s, &origin.url("/big"), ""), &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-length"], BIG_LEN.to_string());
    assert!(r.body.unwrap().is_empty());
    let seen = origin.seen_path("/big");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "HEAD");
}

#[tokio::test]
async fn params_and_headers() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    let url = stream_url(
        &s,
        &origin.url("/small"),
        "&h_referer=https%3A%2F%2Fsite.example%2F&h_user-agent=TestUA&r_content-type=video%2Fmp2t\
         &x_headers=etag",
    );
    let r = get(&url).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), "hello");
    assert_eq!(r.headers["content-type"], "video/mp2t");
    assert!(r.headers.get("etag").is_none(), "x_headers strips");
    assert!(r.headers.get("set-cookie").is_none(), "cookies stay behind");
    assert!(r.headers.get("server").is_none());
    let seen = &origin.seen_path("/small")[0];
    assert_eq!(seen.headers["referer"], "https://site.example/");
    assert_eq!(seen.headers["user-agent"], "TestUA");
    // A filename sets Content-Disposition.
    let r = get(&s.url(&format!(
        "/proxy/stream/My%20Movie.mkv?d={}",
        enc(&origin.url("/small"))
    )))
    .await;
    assert_eq!(
        r.headers["content-disposition"],
        "attachment; filename=\"My Movie.mkv\""
    );
    // The default User-Agent is a browser's.
    get(&stream_url(&s, &origin.url("/small"), "")).await;
    let ua = origin.seen_path("/small")[2].headers["user-agent"].clone();
    assert!(ua.to_str().unwrap().starts_with("Mozilla/5.0"));
}

#[tokio::test]
async fn upstream_errors_are_mirrored_not_502() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    let r = get(&stream_url(&s, &origin.url("/forbidden"), "")).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.body.unwrap(), "go away");
    let r = get(&stream_url(&s, &origin.url("/missing"), "")).await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn unreachable_upstream_is_502_with_json() {
    // A port nothing listens on: bind, note the port, close.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let s = Sluice::start(test_config()).await;
    let r = get(&stream_url(&s, &format!("http://127.0.0.1:{port}/x"), "")).await;
    assert_eq!(r.status, 502);
    let v: serde_json::Value = serde_json::from_slice(&r.body.unwrap()).unwrap();
    assert_eq!(v["upstream"], "127.0.0.1");
    assert_eq!(v["side"], "upstream");
    assert_eq!(v["kind"], "connect");
}

#[tokio::test]
async fn header_timeout_is_504() {
    let origin = Origin::start().await;
    let mut config = test_config();
    config.upstream.header_timeout_secs = 1;
    let s = Sluice::start(config).await;
    let t = Instant::now();
    let r = get(&stream_url(&s, &origin.url("/hang"), "")).await;
    assert_eq!(r.status, 504);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let v: serde_json::Value = serde_json::from_slice(&r.body.unwrap()).unwrap();
    assert_eq!(v["kind"], "header_timeout");
}

#[tokio::test]
async fn slow_steady_stream_is_not_cut() {
    let origin = Origin::start().await;
    let mut config = test_config();
    config.upstream.header_timeout_secs = 1;
    config.upstream.idle_read_timeout_secs = 1;
    config.upstream.connect_timeout_secs = 1;
    let s = Sluice::start(config).await;
    let r = get(&stream_url(&s, &origin.url("/slow"), "")).await;
    assert_eq!(r.status, 200);
    let body = r.body.unwrap();
    assert_eq!(body.len(), 12_000);
    assert_eq!(body[11_999], b'a' + 11);
}

#[tokio::test]
async fn upstream_reset_truncates_visibly() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    let r = get(&stream_url(&s, &origin.url("/reset"), "")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-length"], (1024 * 1024).to_string());
    assert!(
        r.body.is_err(),
        "the client must see the body fail, not a short success"
    );
}

#[tokio::test]
async fn redirects_followed_up_to_the_limit() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    let r = get(&stream_url(&s, &origin.url("/redirect/3"), "")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), "hello");
    let r = get(&stream_url(&s, &origin.url("/redirect/9"), "")).await;
    assert_eq!(r.status, 502);
    let v: serde_json::Value = serde_json::from_slice(&r.body.unwrap()).unwrap();
    assert_eq!(v["kind"], "redirect");
}

#[tokio::test]
async fn stalled_client_does_not_slow_another() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    // Client A asks for the big body and never reads it.
    let mut stalled = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let path = format!("/proxy/stream?d={}", enc(&origin.url("/big")));
    stalled
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut first = [0u8; 12];
    stalled.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    // Client B gets the whole body while A sits there.
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        get(&stream_url(&s, &origin.url("/big"), "")),
    )
    .await
    .expect("second client finished");
    assert_eq!(sha256(&r.body.unwrap()), sha256(&origin.big));
    drop(stalled);
}

#[tokio::test]
async fn bad_input_is_400() {
    let s = Sluice::start(test_config()).await;
    for q in [
        "",
        "?d=",
        "?d=ftp%3A%2F%2Fh%2Fx",
        "?d=not-a-url",
        "?d=http%3A%2F%2Fh%2Fx&h_x=a%0d%0ab",
    ] {
        let r = get(&s.url(&format!("/proxy/stream{q}"))).await;
        assert_eq!(r.status, 400, "{q}");
        let v: serde_json::Value = serde_json::from_slice(&r.body.unwrap()).unwrap();
        assert_eq!(v["side"], "downstream", "{q}");
    }
    let r = request("POST", &s.url("/proxy/stream?d=http://h/x"), &[]).await;
    assert_eq!(r.status, 405);
    let r = get(&s.url("/nothing")).await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn auth_cases() {
    let origin = Origin::start().await;
    let mut config = test_config();
    config.auth.api_password = "s3cret pw".into();
    let s = Sluice::start(config).await;
    let url = stream_url(&s, &origin.url("/small"), "");
    let r = get(&url).await;
    assert_eq!(r.status, 403);
    let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(body.contains("missing api_password"), "{body}");
    let r = get(&format!("{url}&api_password=wrong")).await;
    assert_eq!(r.status, 403);
    assert!(!String::from_utf8_lossy(&r.body.unwrap()).contains("s3cret"));
    let r = get(&format!("{url}&api_password=s3cret%20pw")).await;
    assert_eq!(r.status, 200);
    let r = request("GET", &url, &[("api_password", "s3cret pw")]).await;
    assert_eq!(r.status, 200);
    // The password is never passed upstream.
    for seen in origin.seen_path("/small") {
        assert!(seen.headers.get("api_password").is_none());
    }
    // Health needs nothing.
    assert_eq!(get(&s.url("/health")).await.status, 200);
}

#[tokio::test]
async fn metrics_need_password_off_loopback() {
    let mut config = test_config();
    config.auth.api_password = "pw".into();
    // Pretend a public listener is configured; the test still binds loopback.
    config.server.listen = vec!["0.0.0.0:1".parse().unwrap()];
    let s = Sluice::start(config).await;
    assert_eq!(get(&s.url("/metrics")).await.status, 403);
    let r = get(&s.url("/metrics?api_password=pw")).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(text.contains("sluice_requests_total"), "{text}");
}

#[tokio::test]
async fn metrics_count_streams() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    get(&stream_url(&s, &origin.url("/small"), "")).await;
    get(&stream_url(&s, &origin.url("/small"), "")).await;
    get(&stream_url(&s, &origin.url("/hang-not"), "")).await;
    let text = String::from_utf8(get(&s.url("/metrics")).await.body.unwrap().to_vec()).unwrap();
    for want in [
        "sluice_requests_total{endpoint=\"stream\",status=\"200\"} 2",
        "sluice_requests_total{endpoint=\"stream\",status=\"404\"} 1",
        "sluice_sent_bytes_total{endpoint=\"stream\"} 14",
        "sluice_upstream_connections_opened_total 1",
        "sluice_upstream_connections_reused_total 2",
        "sluice_time_to_first_byte_seconds_count{endpoint=\"stream\"} 3",
        "sluice_request_duration_seconds_count{endpoint=\"stream\"} 3",
        "sluice_active_streams{endpoint=\"stream\"} 0",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
}

#[tokio::test]
async fn ssrf_guard() {
    let origin = Origin::start().await;
    let mut config = test_config();
    config.upstream.allow_private = false;
    let s = Sluice::start(config).await;
    for d in [
        origin.url("/small"),
        format!("http://localhost:{}/small", origin.addr.port()),
        "http://10.0.0.1/x".to_string(),
        "http://169.254.169.254/latest/meta-data".to_string(),
        "http://[::1]:1/x".to_string(),
        "http://0.0.0.0:1/x".to_string(),
    ] {
        let r = get(&stream_url(&s, &d, "")).await;
        assert_eq!(r.status, 403, "{d}");
        let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        assert!(body.contains("allow_private"), "{body}");
    }
    assert!(
        origin.seen_path("/small").is_empty(),
        "nothing reached the origin"
    );
}

#[tokio::test]
async fn h2c_prior_knowledge() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let resp = client
        .get(stream_url(&s, &origin.url("/small"), "").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    use http_body_util::BodyExt;
    assert_eq!(
        resp.into_body().collect().await.unwrap().to_bytes(),
        "hello"
    );
}

#[tokio::test]
async fn graceful_shutdown_finishes_in_flight() {
    let origin = Origin::start().await;
    let mut s = Sluice::start(test_config()).await;
    let url = stream_url(&s, &origin.url("/slow"), "");
    let inflight = tokio::spawn(async move { get(&url).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    s.shutdown();
    let r = inflight.await.unwrap();
    assert_eq!(r.body.unwrap().len(), 12_000, "in-flight response finished");
    tokio::time::timeout(Duration::from_secs(5), &mut s.done)
        .await
        .expect("server stopped after the last response")
        .unwrap();
    assert!(tokio::net::TcpStream::connect(s.addr).await.is_err());
}

#[tokio::test]
async fn cors_for_browser_players() {
    let origin = Origin::start().await;
    // CORS is for players of a password-guarded server (a password-free one answers only
    // this machine, and grants no other origin anything).
    let mut config = test_config();
    config.auth.api_password = "pw".into();
    let s = Sluice::start(config).await;
    let r = get(&stream_url(&s, &origin.url("/small"), "&api_password=pw")).await;
    assert_eq!(r.headers["access-control-allow-origin"], "*");
    let r = request(
        "OPTIONS",
        &stream_url(&s, &origin.url("/small"), ""),
        &[
            ("origin", "https://player.example"),
            ("access-control-request-method", "GET"),
        ],
    )
    .await;
    assert_eq!(r.status, 204);
    assert!(r.headers["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .contains("Range"));
    assert!(
        origin.seen_path("/small").len() == 1,
        "a preflight fetches nothing"
    );
}

/// An origin that sends `Transfer-Encoding: chunked` and a `Content-Length` that disagrees with
/// it: the chunked framing wins (RFC 9112 6.3), so the length is not the body's and must not be
/// mirrored to the client, which would otherwise take 3 bytes of an 11-byte body (or a cut).
#[tokio::test]
async fn a_length_beside_chunked_is_not_mirrored() {
    let addr = support::raw_origin(
        b"HTTP/1.1 200 OK\r\nContent-Type: video/mp2t\r\nTransfer-Encoding: chunked\r\n\
          Content-Length: 3\r\n\r\n6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n",
    )
    .await;
    let s = Sluice::start(test_config()).await;
    let r = get(&stream_url(&s, &format!("http://{addr}/live.ts"), "")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "video/mp2t");
    assert_eq!(r.body.unwrap(), "hello world");
    assert!(
        r.headers.get("content-length").is_none_or(|v| v == "11"),
        "{:?}",
        r.headers
    );
}
