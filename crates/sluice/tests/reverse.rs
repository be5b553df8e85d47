//! The reverse proxy end to end against real origins on 127.0.0.1: routing and precedence, exact
//! forwarded headers, streamed bodies by hash, limits, retries, WebSocket, gRPC over h2, reload.

mod reverse_support;

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use reverse_support::*;

fn one_group(addr: std::net::SocketAddr, extra_routes: &str) -> sluice::config::Config {
    config(&format!(
        r#"
[[upstreams]]
name = "app"
servers = ["{addr}"]

[[routes]]
path = "/"
upstream = "app"
response_headers_add = {{ "x-served-by" = "sluice" }}
response_headers_remove = ["x-internal"]
{extra_routes}
"#
    ))
}

#[tokio::test]
async fn forwards_exact_headers_and_strips_hop_by_hop() {
    let o = echo("a").await;
    let p = Proxy::start(one_group(o, "")).await;
    let r = get(
        &p.url("/some/path?q=1"),
        &[
            ("host", "example.com"),
            ("connection", "keep-alive, x-drop"),
            ("x-drop", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic Zm9v"),
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-host", "evil"),
            ("x-kept", "yes"),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let j = r.json();
    assert_eq!(j["path"], "/some/path?q=1");
    assert_eq!(r.seen("host").as_deref(), Some("example.com"));
    assert_eq!(r.seen("x-kept").as_deref(), Some("yes"));
    for gone in ["x-drop", "keep-alive", "proxy-authorization", "connection"] {
        assert_eq!(r.seen(gone), None, "{gone} was forwarded");
    }
    // The peer is not a trusted proxy: its forwarding claims are replaced.
    assert_eq!(r.seen("x-forwarded-for").as_deref(), Some("127.0.0.1"));
    assert_eq!(r.seen("x-forwarded-host").as_deref(), Some("example.com"));
    assert_eq!(r.seen("x-forwarded-proto").as_deref(), Some("http"));
    assert_eq!(r.seen("via").as_deref(), Some("1.1 sluice"));
    // Response side: hop-by-hop from the origin stripped, route header edits applied.
    assert_eq!(r.headers["x-served-by"], "sluice");
    assert!(r.headers.get("x-internal").is_none());
    assert!(r.headers.get("x-hop").is_none());
    assert_eq!(r.headers["via"], "1.1 sluice");
    assert_eq!(r.headers["x-origin"], "a");
    // A reverse-proxied response is the app's own: no CORS added by sluice.
    assert!(r.headers.get("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn trusted_proxy_chain_is_extended() {
    let o = echo("a").await;
    let mut c = one_group(o, "");
    c.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    c.reverse.forwarded = true;
    let p = Proxy::start(c).await;
    let r = get(
        &p.url("/"),
        &[
            ("host", "example.com"),
            ("x-forwarded-for", "203.0.113.7"),
            ("x-forwarded-proto", "https"),
            ("forwarded", "for=203.0.113.7;proto=https"),
        ],
    )
    .await;
    assert_eq!(
        r.seen("x-forwarded-for").as_deref(),
        Some("203.0.113.7, 127.0.0.1")
    );
    assert_eq!(r.seen("x-forwarded-proto").as_deref(), Some("https"));
    assert_eq!(
        r.seen("forwarded").as_deref(),
        Some("for=203.0.113.7;proto=https, for=127.0.0.1;host=example.com;proto=http")
    );
}

#[tokio::test]
async fn routes_by_host_and_longest_prefix_after_normalisation() {
    let (a, b, c) = (echo("a").await, echo("b").await, echo("c").await);
    let cfg = config(&format!(
        r#"
[[upstreams]]
name = "a"
servers = ["{a}"]
[[upstreams]]
name = "b"
servers = ["{b}"]
[[upstreams]]
name = "c"
servers = ["{c}"]

[[routes]]
path = "/"
upstream = "a"

[[routes]]
path = "/api/"
upstream = "b"
strip_prefix = true
preserve_host = false

[[routes]]
host = "*.example.com"
path = "/"
upstream = "c"
rewrite = "/v2"
"#
    ));
    let p = Proxy::start(cfg).await;
    let r = get(&p.url("/api/users?x=1"), &[]).await;
    assert_eq!(r.headers["x-origin"], "b");
    assert_eq!(r.json()["path"], "/users?x=1");
    assert_eq!(r.seen("host"), Some(b.to_string()));
    // `..` resolves before routing: this is /admin, not under /api/.
    let r = get(&p.url("/api/../admin"), &[]).await;
    assert_eq!(r.headers["x-origin"], "a");
    assert_eq!(r.json()["path"], "/admin");
    let r = get(&p.url("/api/%2e%2e/admin"), &[]).await;
    assert_eq!(r.headers["x-origin"], "a");
    let r = get(&p.url("/x"), &[("host", "shop.example.com")]).await;
    assert_eq!(r.headers["x-origin"], "c");
    assert_eq!(r.json()["path"], "/v2/x");
    let r = get(&p.url("/../../etc/passwd"), &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn builtins_share_the_table_and_can_move_or_switch_off() {
    let o = echo("a").await;
    let p = Proxy::start(one_group(o, "")).await;
    // The built-in /health is a longer prefix than the user's "/".
    let r = get(&p.url("/health"), &[]).await;
    assert_eq!(
        r.body.unwrap(),
        Bytes::from_static(br#"{"status":"healthy"}"#)
    );
    let r = get(&p.url("/healthz"), &[]).await;
    assert_eq!(r.headers["x-origin"], "a");

    let mut c = one_group(o, "");
    c.endpoints.health = false;
    c.endpoints.host = "admin.local".into();
    let p = Proxy::start(c).await;
    let r = get(&p.url("/health"), &[]).await;
    assert_eq!(r.headers["x-origin"], "a");
    let r = get(&p.url("/metrics"), &[("host", "admin.local")]).await;
    assert!(String::from_utf8_lossy(&r.body.unwrap()).contains("sluice_reverse_requests"));
    let r = get(&p.url("/metrics"), &[("host", "other")]).await;
    assert_eq!(r.headers["x-origin"], "a");
}

#[tokio::test]
async fn multi_megabyte_bodies_stream_both_ways() {
    let o = echo("a").await;
    let p = Proxy::start(one_group(o, "")).await;
    let data = pattern(9 * 1024 * 1024 + 7);
    // Chunked upload.
    let r = send(
        "POST",
        &p.url("/up"),
        &[],
        streamed(data.clone(), 64 * 1024),
    )
    .await;
    let j = r.json();
    assert_eq!(j["len"], data.len());
    assert_eq!(j["sha256"], sha256(&data));
    // Content-Length upload with Expect: 100-continue.
    let r = send(
        "PUT",
        &p.url("/up"),
        &[
            ("expect", "100-continue"),
            ("content-length", &data.len().to_string()),
        ],
        full(data.clone()),
    )
    .await;
    assert_eq!(r.json()["sha256"], sha256(&data));
    assert_eq!(r.seen("expect"), None);
    // Download.
    let n = 7 * 1024 * 1024;
    let r = get(&p.url(&format!("/size/{n}")), &[]).await;
    assert_eq!(r.headers["content-length"], n.to_string().as_str());
    assert_eq!(sha256(&r.body.unwrap()), sha256(&pattern(n)));
}

#[tokio::test]
async fn body_limit_is_413() {
    let o = echo("a").await;
    let mut c = one_group(o, "");
    c.routes[0].max_body_bytes = 1000;
    let p = Proxy::start(c).await;
    let r = send(
        "POST",
        &p.url("/"),
        &[("content-length", "1001")],
        full(pattern(1001)),
    )
    .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    let r = send("POST", &p.url("/"), &[], streamed(pattern(5000), 100)).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    let r = send("POST", &p.url("/"), &[], full(pattern(1000))).await;
    assert_eq!(r.json()["len"], 1000);
}

#[tokio::test]
async fn connect_failures_move_to_the_next_server_even_with_a_body() {
    let dead = dead_port().await;
    let live = echo("live").await;
    let c = config(&format!(
        r#"
[[upstreams]]
name = "app"
servers = ["{dead}", "{live}"]
max_fails = 0

[[routes]]
upstream = "app"
"#
    ));
    let p = Proxy::start(c).await;
    let data = pattern(300_000);
    for _ in 0..4 {
        let r = send("POST", &p.url("/x"), &[], streamed(data.clone(), 10_000)).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.json()["sha256"], sha256(&data));
    }
    let m = get(&p.url("/metrics"), &[]).await;
    let text = String::from_utf8_lossy(m.body.as_ref().unwrap()).into_owned();
    assert!(
        text.contains(&format!(
            "sluice_reverse_server_failures_total{{group=\"app\",server=\"{dead}\"}}"
        )),
        "{text}"
    );
    assert!(
        text.contains("sluice_reverse_retries_total{route=\"*/\"}"),
        "{text}"
    );
}

#[tokio::test]
async fn errors_distinguish_refused_and_timed_out() {
    let dead = dead_port().await;
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    // Accepts and never answers.
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let c = config(&format!(
        r#"
[[upstreams]]
name = "down"
servers = ["{dead}"]
[[upstreams]]
name = "mute"
servers = ["{silent_addr}"]

[[routes]]
path = "/down"
upstream = "down"

[[routes]]
path = "/mute"
upstream = "mute"
header_timeout_secs = 1
"#
    ));
    let p = Proxy::start(c).await;
    let r = get(&p.url("/down"), &[]).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    let j: serde_json::Value = serde_json::from_slice(r.body.as_ref().unwrap()).unwrap();
    assert!(j.to_string().contains("upstream_refused"), "{j}");
    let r = get(&p.url("/mute"), &[]).await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    assert!(String::from_utf8_lossy(r.body.as_ref().unwrap()).contains("upstream_timeout"));
}

/// A 502 or 504 tells the client what failed (status, kind, side), never where: the group's name
/// and its servers' addresses are the operator's (nginx and HAProxy answer a plain 502/504).
#[tokio::test]
async fn error_answers_name_no_group_or_server() {
    let dead = dead_port().await;
    // Accepts, reads the request and closes without a word.
    let rude = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let rude_addr = rude.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = rude.accept().await {
            let mut buf = [0u8; 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
        }
    });
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let c = config(&format!(
        r#"
[[upstreams]]
name = "pool-dead-7"
servers = ["{dead}"]
[[upstreams]]
name = "pool-rude-7"
servers = ["{rude_addr}"]
[[upstreams]]
name = "pool-mute-7"
servers = ["{silent_addr}"]

[[routes]]
path = "/dead"
upstream = "pool-dead-7"

[[routes]]
path = "/rude"
upstream = "pool-rude-7"

[[routes]]
path = "/mute"
upstream = "pool-mute-7"
header_timeout_secs = 1
"#
    ));
    let p = Proxy::start(c).await;
    for (path, status, kind) in [
        ("/dead", StatusCode::BAD_GATEWAY, "upstream_refused"),
        ("/rude", StatusCode::BAD_GATEWAY, "upstream_failed"),
        ("/mute", StatusCode::GATEWAY_TIMEOUT, "upstream_timeout"),
    ] {
        let r = get(&p.url(path), &[]).await;
        assert_eq!(r.status, status, "{path}");
        let body = String::from_utf8_lossy(r.body.as_ref().unwrap()).into_owned();
        let j: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(j["kind"], kind, "{body}");
        assert_eq!(j["side"], "upstream", "{body}");
        assert!(j.get("upstream").is_none(), "{body}");
        for named in [
            "127.0.0.1",
            "pool-",
            &dead.port().to_string(),
            &rude_addr.port().to_string(),
            &silent_addr.port().to_string(),
        ] {
            assert!(!body.contains(named), "{path} names {named}: {body}");
        }
    }
}

#[tokio::test]
async fn websocket_over_http1_upgrade_echoes() {
    let o = origin(|mut req: http::Request<hyper::body::Incoming>| async move {
        let key = req.headers().get("sec-websocket-key").cloned();
        let on = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(up) = on.await {
                let mut io = hyper_util::rt::TokioIo::new(up);
                let mut buf = [0u8; 1024];
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        let mut resp = http::Response::new(full(Bytes::new()));
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        resp.headers_mut()
            .insert("upgrade", http::HeaderValue::from_static("websocket"));
        resp.headers_mut()
            .insert("connection", http::HeaderValue::from_static("upgrade"));
        resp.headers_mut()
            .insert("sec-websocket-accept", key.unwrap());
        resp
    })
    .await;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Bytes sent right behind the request, in the same write, are held by the request screen
    // until the answer is known, then go through the tunnel like the rest (fast path on and off:
    // on it, the request is handed over to hyper with what was read).
    for (fast, early) in [(true, false), (true, true), (false, true)] {
        let p = Proxy::start(one_group(o, &format!("[server]\nh1_fast_path = {fast}\n"))).await;
        let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
        let mut request =
            b"GET /chat HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
              Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
                .to_vec();
        if early {
            request.extend_from_slice(b"early!");
        }
        s.write_all(&request).await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_lowercase();
        assert!(head.starts_with("http/1.1 101"), "{head}");
        assert!(
            head.contains("sec-websocket-accept: dghlihnhbxbszsbub25jzq=="),
            "{head}"
        );
        if early {
            let mut got = [0u8; 6];
            tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
                .await
                .expect("the early bytes echoed")
                .unwrap();
            assert_eq!(&got, b"early!", "fast {fast}");
        }
        for msg in [&b"hello"[..], &pattern(100_000)[..]] {
            s.write_all(msg).await.unwrap();
            let mut got = vec![0u8; msg.len()];
            tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(got, msg);
        }
    }
}

/// An h2c origin answering like a gRPC server: streamed messages, then `grpc-status` in trailers.
async fn grpc_origin() -> std::net::SocketAddr {
    origin(|req: http::Request<hyper::body::Incoming>| async move {
        use http_body_util::BodyExt;
        assert_eq!(req.version(), http::Version::HTTP_2);
        let te = req.headers().get("te").cloned();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        trailers.insert("grpc-message", http::HeaderValue::from_static("ok"));
        let frames = vec![
            Ok(hyper::body::Frame::data(body.clone())),
            Ok(hyper::body::Frame::data(body)),
            Ok(hyper::body::Frame::trailers(trailers)),
        ];
        let stream = futures_util::stream::iter(frames);
        let mut resp = http::Response::new(http_body_util::StreamBody::new(stream).boxed());
        resp.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("application/grpc"),
        );
        if let Some(te) = te {
            resp.headers_mut().insert("x-seen-te", te);
        }
        resp
    })
    .await
}

#[tokio::test]
async fn grpc_over_h2_keeps_trailers() {
    let o = grpc_origin().await;
    let mut c = one_group(o, "");
    c.routes[0].upstream_protocol = sluice::reverse::config::UpstreamProtocol::H2c;
    let p = Proxy::start(c).await;
    // An h2c (prior knowledge) client, as gRPC clients are.
    let mut send = h2_client(p.addr).await;
    let msg = Bytes::from_static(b"\x00\x00\x00\x00\x05hello");
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{}/pkg.Svc/Call", p.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(full(msg.clone()))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/grpc");
    assert_eq!(resp.headers()["x-seen-te"], "trailers");
    use http_body_util::BodyExt;
    let collected = resp.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("trailers");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers["grpc-message"], "ok");
    let mut want = msg.to_vec();
    want.extend_from_slice(&msg);
    assert_eq!(collected.to_bytes(), Bytes::from(want));
}

#[tokio::test]
async fn reload_swaps_routes_and_in_flight_requests_finish() {
    let slow = origin(|_req| async move {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let mut r = http::Response::new(full("slow-old"));
        r.headers_mut()
            .insert("x-origin", http::HeaderValue::from_static("old"));
        r
    })
    .await;
    let new = echo("new").await;
    let p = Proxy::start(one_group(slow, "")).await;
    let url = p.url("/x");
    let in_flight = tokio::spawn(async move { get(&url, &[]).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    p.app.reload(&one_group(new, "")).unwrap();
    let r = get(&p.url("/x"), &[]).await;
    assert_eq!(r.headers["x-origin"], "new");
    let old = in_flight.await.unwrap();
    assert_eq!(old.body.unwrap(), Bytes::from_static(b"slow-old"));
    // An invalid config is refused and the running table stays.
    let mut bad = one_group(new, "");
    bad.routes[0].upstream = "missing".into();
    assert!(p.app.reload(&bad).is_err());
    let r = get(&p.url("/x"), &[]).await;
    assert_eq!(r.headers["x-origin"], "new");
}

#[tokio::test]
async fn round_robin_spreads_over_two_servers() {
    let (a, b) = (echo("a").await, echo("b").await);
    let c = config(&format!(
        r#"
[[upstreams]]
name = "app"
servers = ["{a}", "{b}"]

[[routes]]
upstream = "app"
"#
    ));
    let p = Proxy::start(c).await;
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..10 {
        let r = get(&p.url("/"), &[]).await;
        *seen
            .entry(r.headers["x-origin"].to_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    assert_eq!(seen.get("a"), Some(&5));
    assert_eq!(seen.get("b"), Some(&5));
}

/// An HTTP/1.1 WebSocket origin that echoes whatever arrives after the upgrade.
async fn ws_echo_origin() -> std::net::SocketAddr {
    origin(|mut req: http::Request<hyper::body::Incoming>| async move {
        let key = req.headers().get("sec-websocket-key").cloned();
        let on = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(up) = on.await {
                let mut io = hyper_util::rt::TokioIo::new(up);
                let mut buf = [0u8; 4096];
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        let mut resp = http::Response::new(full(Bytes::new()));
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = resp.headers_mut();
        h.insert("upgrade", http::HeaderValue::from_static("websocket"));
        h.insert("connection", http::HeaderValue::from_static("upgrade"));
        if let Some(k) = key {
            h.insert("sec-websocket-accept", k);
        }
        h.insert(
            "sec-websocket-protocol",
            http::HeaderValue::from_static("chat"),
        );
        resp
    })
    .await
}

#[tokio::test]
async fn websocket_over_h2_extended_connect() {
    let o = ws_echo_origin().await;
    let p = Proxy::start(one_group(o, "")).await;
    let mut send = h2_client(p.addr).await;
    // Let the server's SETTINGS (with ENABLE_CONNECT_PROTOCOL) arrive.
    send.ready().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut req = http::Request::builder()
        .method("CONNECT")
        .uri(format!("http://{}/chat", p.addr))
        .header("sec-websocket-version", "13")
        .header("sec-websocket-protocol", "chat")
        .body(full(Bytes::new()))
        .unwrap();
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    let mut resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["sec-websocket-protocol"], "chat");
    let up = hyper::upgrade::on(&mut resp).await.unwrap();
    let mut io = hyper_util::rt::TokioIo::new(up);
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let msg = pattern(50_000);
    io.write_all(&msg).await.unwrap();
    let mut got = vec![0u8; msg.len()];
    tokio::time::timeout(Duration::from_secs(5), io.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got[..], &msg[..]);
}

#[tokio::test]
async fn server_sent_events_flow_unbuffered() {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let rx = std::sync::Arc::new(tokio::sync::Mutex::new(Some(rx)));
    let o = origin(move |_req| {
        let rx = rx.clone();
        async move {
            let rx = rx.lock().await.take().unwrap();
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv()
                    .await
                    .map(|b| (Ok::<_, std::io::Error>(hyper::body::Frame::data(b)), rx))
            });
            use http_body_util::BodyExt;
            let mut r = http::Response::new(http_body_util::StreamBody::new(stream).boxed());
            r.headers_mut().insert(
                "content-type",
                http::HeaderValue::from_static("text/event-stream"),
            );
            r
        }
    })
    .await;
    let p = Proxy::start(one_group(o, "")).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<BoxBody>();
    let resp = client
        .request(
            http::Request::get(p.url("/events"))
                .body(full(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    use http_body_util::BodyExt;
    for i in 0..3 {
        let event = Bytes::from(format!("data: event {i}\n\n"));
        tx.send(event.clone()).await.unwrap();
        // Each event arrives on its own before the next is even produced.
        let frame = tokio::time::timeout(Duration::from_secs(2), body.frame())
            .await
            .expect("event held back")
            .unwrap()
            .unwrap();
        assert_eq!(frame.into_data().unwrap(), event);
    }
}

#[tokio::test]
async fn reload_under_load_drops_nothing() {
    let (a, b) = (echo("a").await, echo("b").await);
    let p = Proxy::start(one_group(a, "")).await;
    let url = p.url("/load");
    let load = tokio::spawn(async move {
        let mut statuses = Vec::new();
        for _ in 0..300 {
            statuses.push(get(&url, &[]).await.status);
        }
        statuses
    });
    for i in 0..20 {
        let target = if i % 2 == 0 { b } else { a };
        p.app.reload(&one_group(target, "")).unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let statuses = load.await.unwrap();
    assert_eq!(statuses.len(), 300);
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );
}

/// An HTTP/1.1 origin on raw sockets that counts the connections it accepts: `/204` answers 204,
/// HEAD gets the GET head without a body, anything else `hello`.
async fn counting_raw_origin() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let mut chunk = [0u8; 4096];
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_string();
                        buf.drain(..end + 4);
                        let answer: &[u8] = if head.starts_with("GET /204 ") {
                            b"HTTP/1.1 204 No Content\r\n\r\n"
                        } else if head.starts_with("HEAD ") {
                            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"
                        } else {
                            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"
                        };
                        if s.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn upstream_connections_are_reused_across_requests_and_bodiless_answers() {
    let (o, accepted) = counting_raw_origin().await;
    let p = Proxy::start(one_group(o, "")).await;
    for round in 0..4 {
        let r = get(&p.url("/a"), &[]).await;
        assert_eq!(r.status, StatusCode::OK, "round {round}");
        assert_eq!(r.body.as_ref().unwrap().as_ref(), b"hello");
        let r = send("HEAD", &p.url("/a"), &[], full(Bytes::new())).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.headers["content-length"], "5");
        assert!(r.body.as_ref().unwrap().is_empty());
        let r = get(&p.url("/204"), &[]).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT);
        assert!(r.body.as_ref().unwrap().is_empty());
    }
    // Twelve sequential requests, one upstream connection.
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// Bytes that depend on both the position and the body's length, so no two of the sizes asked
/// for below share a prefix (a body cut short or taken from another stream shows).
fn sized_body(n: usize) -> Bytes {
    (0..n)
        .map(|i| (i.wrapping_mul(31) ^ n.wrapping_mul(7)) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// Asks for `/n/<n>` on an HTTP/2 connection in a task of its own: the task returns `n` and the
/// body, after checking the status.
fn fetch_sized(
    send: &hyper::client::conn::http2::SendRequest<BoxBody>,
    addr: std::net::SocketAddr,
    n: usize,
) -> tokio::task::JoinHandle<(usize, Bytes)> {
    let mut send = send.clone();
    let uri = format!("http://{addr}/n/{n}");
    tokio::spawn(async move {
        let req = http::Request::get(uri).body(full(Bytes::new())).unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        use http_body_util::BodyExt;
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (n, body)
    })
}

#[tokio::test]
async fn many_small_h2_responses_at_once_each_arrive_whole() {
    // Sizes around the points where the h2 writer copies a DATA payload into its buffer or
    // chains it (256 B, 4 KiB, a full 16 KiB buffer), many streams at once so their frames
    // share writes.
    let o = origin(|req: http::Request<hyper::body::Incoming>| async move {
        let n: usize = req.uri().path().trim_start_matches("/n/").parse().unwrap();
        http::Response::new(full(sized_body(n)))
    })
    .await;
    let p = Proxy::start(one_group(o, "")).await;
    let send = h2_client(p.addr).await;
    let mut sizes = vec![
        0, 1, 200, 255, 256, 257, 1000, 1024, 2048, 4087, 4095, 4096, 4097,
    ];
    sizes.extend([5000, 8192, 12000, 16375, 16384, 16385, 20000, 70000]);
    sizes.extend((0..40).map(|i| 900 + i * 97));
    let tasks: Vec<_> = sizes
        .iter()
        .map(|&n| fetch_sized(&send, p.addr, n))
        .collect();
    for t in tasks {
        let (n, body) = tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("h2 stream timed out")
            .unwrap();
        assert_eq!(body.len(), n, "stream for {n} bytes");
        assert_eq!(
            sha256(&body),
            sha256(&sized_body(n)),
            "stream for {n} bytes"
        );
    }
}

#[tokio::test]
async fn h2_bursts_of_streams_after_idle_moments_each_arrive_whole() {
    // h2 frees a connection's stream store and frame buffers whenever no stream is open and
    // takes room for the last burst's streams with the next one: bursts larger than that room,
    // smaller, and larger again on one connection, each answered whole.
    let o = origin(|req: http::Request<hyper::body::Incoming>| async move {
        let n: usize = req.uri().path().trim_start_matches("/n/").parse().unwrap();
        http::Response::new(full(sized_body(n)))
    })
    .await;
    let p = Proxy::start(one_group(o, "")).await;
    let send = h2_client(p.addr).await;
    for (round, streams) in [40usize, 3, 1, 50, 10].into_iter().enumerate() {
        let tasks: Vec<_> = (0..streams)
            .map(|i| fetch_sized(&send, p.addr, 700 + round * 1000 + i * 131))
            .collect();
        for t in tasks {
            let (n, body) = tokio::time::timeout(Duration::from_secs(20), t)
                .await
                .expect("h2 stream timed out")
                .unwrap();
            assert_eq!(
                sha256(&body),
                sha256(&sized_body(n)),
                "round {round}: stream for {n} bytes"
            );
        }
    }
}

/// Response fields that test the HTTP/2 response encoder: many of them, names in the static
/// table and not, repeated names, long values, obs-text bytes, several `set-cookie`s.
fn odd_fields() -> Vec<(&'static str, Vec<u8>)> {
    let mut f: Vec<(&'static str, Vec<u8>)> = vec![
        ("content-type", b"text/plain; charset=utf-8".to_vec()),
        ("etag", b"\"6b0ff0fc-400\"".to_vec()),
        ("last-modified", b"Wed, 02 Dec 2026 10:20:44 GMT".to_vec()),
        ("cache-control", b"public, max-age=60".to_vec()),
        ("set-cookie", b"id=a3fWa; Path=/; Secure; HttpOnly".to_vec()),
        ("set-cookie", b"lang=en-US; Max-Age=3600".to_vec()),
        (
            "set-cookie",
            b"session=; Expires=Thu, 01 Jan 1970 00:00:00 GMT".to_vec(),
        ),
        ("x-obs-text", b"caf\xe9 \xff\x80 na\xefve".to_vec()),
        ("x-long", vec![b'L'; 5000]),
        (
            "link",
            format!("{}</end>", "</a.css>; rel=preload; as=style, ".repeat(60)).into_bytes(),
        ),
        ("x-empty", Vec::new()),
        ("www-authenticate", b"Basic realm=\"x\"".to_vec()),
        ("x-127", vec![b'q'; 127]),
        ("x-126", vec![b'q'; 126]),
    ];
    const NAMES: [&str; 30] = [
        "x-f00", "x-f01", "x-f02", "x-f03", "x-f04", "x-f05", "x-f06", "x-f07", "x-f08", "x-f09",
        "x-f10", "x-f11", "x-f12", "x-f13", "x-f14", "x-f15", "x-f16", "x-f17", "x-f18", "x-f19",
        "x-f20", "x-f21", "x-f22", "x-f23", "x-f24", "x-f25", "x-f26", "x-f27", "x-f28", "x-f29",
    ];
    for (i, name) in NAMES.into_iter().enumerate() {
        f.push((
            name,
            format!("value {i} ~!@#$%^&*()_+`-={{}}|[]\\:\";'<>?,./").into_bytes(),
        ));
    }
    f
}

async fn odd_fields_origin() -> std::net::SocketAddr {
    origin(|_req: http::Request<hyper::body::Incoming>| async move {
        let mut r = http::Response::new(full("odd"));
        for (name, value) in odd_fields() {
            r.headers_mut()
                .append(name, http::HeaderValue::from_bytes(&value).unwrap());
        }
        r
    })
    .await
}

/// A field's values, in order.
fn values_of(h: &http::HeaderMap, name: &str) -> Vec<Vec<u8>> {
    h.get_all(name)
        .iter()
        .map(|v| v.as_bytes().to_vec())
        .collect()
}

#[tokio::test]
async fn h2_responses_keep_every_field_byte_exact() {
    let o = odd_fields_origin().await;
    let p = Proxy::start(one_group(o, "")).await;
    let send = h2_client(p.addr).await;
    // Several responses on one connection: GETs (the fast h2 exchange) and POSTs (hyper's
    // client), each with every field.
    for i in 0..6 {
        let mut send = send.clone();
        let method = if i % 2 == 0 { "GET" } else { "POST" };
        let req = http::Request::builder()
            .method(method)
            .uri(format!("http://{}/odd/{i}", p.addr))
            .body(full(if method == "POST" { "x" } else { "" }))
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let h = resp.headers();
        let want = odd_fields();
        for (name, _) in &want {
            let sent: Vec<Vec<u8>> = want
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
                .collect();
            assert_eq!(values_of(h, name), sent, "{method} field {name}");
        }
        assert_eq!(h["x-served-by"], "sluice");
        use http_body_util::BodyExt;
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, Bytes::from_static(b"odd"));
    }
}

#[tokio::test]
async fn curl_decodes_h2_responses_field_for_field() {
    // An outside HTTP/2 implementation (curl on nghttp2) reads the same fields. scripts/test.sh
    // installs curl where it is missing.
    assert!(
        std::process::Command::new("curl")
            .arg("--version")
            .output()
            .is_ok(),
        "curl is not installed (scripts/test.sh installs it)"
    );
    let o = odd_fields_origin().await;
    let p = Proxy::start(one_group(o, "")).await;
    let url = p.url("/odd");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["-sS", "--http2-prior-knowledge", "--max-time", "10"])
            .args(["-D", "-", "-o", "/dev/null", &url])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One response: curl 7.88 fails ("Error in the HTTP2 framing layer") on a second request
    // over a reused prior-knowledge connection, whatever the server sends (sluice before this
    // encoder too); several responses on one connection are the test above's.
    let text = out.stdout;
    let mut heads = Vec::new();
    let mut rest = &text[..];
    while let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
        heads.push(&rest[..end]);
        rest = &rest[end + 4..];
    }
    assert_eq!(heads.len(), 1, "{}", String::from_utf8_lossy(&text));
    for head in heads {
        let mut lines = head.split(|&b| b == b'\n');
        assert_eq!(lines.next().unwrap().trim_ascii_end(), b"HTTP/2 200");
        let mut got: Vec<(String, Vec<u8>)> = Vec::new();
        for line in lines {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|&b| b == b':').unwrap();
            let name = String::from_utf8(line[..colon].to_vec()).unwrap();
            let value = line[colon + 1..]
                .strip_prefix(b" ")
                .unwrap_or(&line[colon + 1..]);
            got.push((name, value.to_vec()));
        }
        for (name, value) in odd_fields() {
            let sent: Vec<Vec<u8>> = odd_fields()
                .into_iter()
                .filter(|(n, _)| *n == name)
                .map(|(_, v)| v)
                .collect();
            let seen: Vec<Vec<u8>> = got
                .iter()
                .filter(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
                .collect();
            assert_eq!(seen, sent, "field {name} ({} bytes)", value.len());
        }
        assert!(got
            .iter()
            .any(|(n, v)| n == "x-served-by" && v == b"sluice"));
    }
}
