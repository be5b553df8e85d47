//! The reverse proxy against hostile clients and broken upstreams: smuggling shapes, misdirected
//! absolute-form requests, oversize heads, slowloris, resets mid-body, garbage, silence.

mod reverse_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use reverse_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn route_to(addr: std::net::SocketAddr) -> sluice::config::Config {
    config(&format!(
        r#"
[[upstreams]]
name = "app"
servers = ["{addr}"]

[[routes]]
host = "app.test"
path = "/"
upstream = "app"
header_timeout_secs = 1
idle_timeout_secs = 1
"#
    ))
}

/// An origin that counts requests and answers "ok".
async fn counting() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let n = Arc::new(AtomicUsize::new(0));
    let m = n.clone();
    let addr = origin(move |_req| {
        let m = m.clone();
        async move {
            m.fetch_add(1, Ordering::SeqCst);
            http::Response::new(full("ok"))
        }
    })
    .await;
    (addr, n)
}

#[tokio::test]
async fn smuggling_shapes_are_refused_before_the_upstream() {
    let (o, count) = counting().await;
    let p = Proxy::start(route_to(o)).await;
    let shapes: &[&[u8]] = &[
        b"POST / HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        b"POST / HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: app.test\r\nContent-Length: +5\r\n\r\nhello",
        b"POST / HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: app.test\r\nBad Header\r\n\r\n",
        b"GET /\x01 HTTP/1.1\r\nHost: app.test\r\n\r\n",
    ];
    for shape in shapes {
        let reply = raw(p.addr, shape, Duration::from_secs(3)).await;
        assert!(
            reply.starts_with("HTTP/1.1 400"),
            "{:?} -> {reply:?}",
            String::from_utf8_lossy(shape)
        );
    }
    assert_eq!(
        count.load(Ordering::SeqCst),
        0,
        "a smuggling shape reached the upstream"
    );
    // CL+TE, in either order, with a request smuggled behind the body: the screen under hyper
    // refuses the head (400), the connection is closed at once, and nothing reaches the upstream,
    // neither the request nor what hides in its body. The same holds for the built-ins.
    let clte: &[&[u8]] = &[
        b"POST / HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: app.test\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\nContent-Length: 44\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: app.test\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: app.test\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        // After a well-formed keep-alive request on the same connection.
        b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\nPOST / HTTP/1.1\r\nHost: app.test\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n0\r\n\r\n",
    ];
    for shape in clte {
        let started = std::time::Instant::now();
        let reply = raw(p.addr, shape, Duration::from_secs(5)).await;
        // `raw` returned before its deadline: the server closed the connection.
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "left open: {reply}"
        );
        let last = reply.rfind("HTTP/1.1 ").map_or("", |i| &reply[i..]);
        assert!(last.starts_with("HTTP/1.1 400"), "{reply}");
        assert!(!reply.contains("smuggled"), "{reply}");
    }
    assert_eq!(
        count.load(Ordering::SeqCst),
        0,
        "a CL+TE request reached the upstream"
    );
    let metrics = get(&p.url("/metrics"), &[]).await;
    let metrics = String::from_utf8_lossy(metrics.body.as_ref().unwrap()).into_owned();
    assert!(
        // The four above and the four framing shapes before them.
        metrics.contains("sluice_downstream_smuggling_refused_total 8"),
        "{metrics}"
    );
    // The proxy still serves.
    let ok = raw(
        p.addr,
        b"GET / HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(ok.starts_with("HTTP/1.1 200") && ok.ends_with("ok"), "{ok}");
}

/// The same `Content-Length` in two fields, or with a leading zero, is read as the one length and
/// goes upstream as that one plain number (RFC 9110 §8.6), as HTTP/2 and HTTP/3 requests do:
/// passed on as written, the next hop could read it otherwise (or refuse it). A list inside one
/// field is refused (400), over every protocol.
#[tokio::test]
async fn a_content_length_goes_upstream_as_one_plain_number() {
    let p = Proxy::start(route_to(echo("o").await)).await;
    let shapes: &[&[u8]] = &[
        b"POST /a HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        b"POST /a HTTP/1.1\r\nHost: app.test\r\nContent-Length: 05\r\nConnection: close\r\n\r\nhello",
    ];
    for shape in shapes {
        let reply = raw(p.addr, shape, Duration::from_secs(5)).await;
        let shape = String::from_utf8_lossy(shape);
        assert!(reply.starts_with("HTTP/1.1 200"), "{shape:?} -> {reply:?}");
        let body = &reply[reply.find("\r\n\r\n").expect("a head") + 4..];
        let report: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(report["len"], 5, "{shape:?}: {report}");
        let lengths: Vec<&serde_json::Value> = report["headers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h[0] == "content-length")
            .map(|h| &h[1])
            .collect();
        assert_eq!(lengths, ["5"], "{shape:?}: {report}");
    }
    let list = raw(
        p.addr,
        b"POST /a HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5, 5\r\nConnection: close\r\n\r\nhello",
        Duration::from_secs(5),
    )
    .await;
    assert!(list.starts_with("HTTP/1.1 400"), "{list:?}");
}

/// A GET with a body on a caching route: the cache fetches without the body, so the client's
/// `Content-Length` must not go on either (the origin would wait for bytes that never come, and on
/// a pooled connection take the next request's as them). Over HTTP/1.1, and over HTTP/2, where a
/// GET with a length skips the fast exchange.
#[tokio::test]
async fn a_get_with_a_body_on_a_caching_route_goes_to_the_origin_without_its_length() {
    let o = echo("o").await;
    let p = Proxy::start(config(&format!(
        r#"
[[upstreams]]
name = "app"
servers = ["{o}"]

[[routes]]
host = "app.test"
path = "/"
upstream = "app"
cache = true
header_timeout_secs = 2

[cache]
memory_bytes = "16MiB"
"#
    )))
    .await;
    let seen_length = |report: &serde_json::Value| {
        report["headers"].as_array().unwrap().iter().any(|h| {
            ["content-length", "transfer-encoding", "expect"].contains(&h[0].as_str().unwrap())
        })
    };
    for path in ["/one", "/two"] {
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\nhello"
        );
        let reply = raw(p.addr, head.as_bytes(), Duration::from_secs(5)).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{path}: {reply:?}");
        let body = &reply[reply.find("\r\n\r\n").expect("a head") + 4..];
        let report: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(report["path"], path, "{report}");
        assert!(!seen_length(&report), "{path}: {report}");
    }
    let mut client = h2_client(p.addr).await;
    let req = http::Request::get("http://app.test/three")
        .header("content-length", "5")
        .body(full(bytes::Bytes::from_static(b"hello")))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), client.send_request(req))
        .await
        .expect("answered in time")
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let report: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(report["path"], "/three", "{report}");
    assert!(!seen_length(&report), "{report}");
}

#[tokio::test]
async fn no_open_proxy() {
    let (o, count) = counting().await;
    let p = Proxy::start(route_to(o)).await;
    let r = raw(
        p.addr,
        b"GET http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 421"), "{r}");
    // The host the route serves, in absolute form, is fine.
    let r = raw(
        p.addr,
        b"GET http://app.test/ HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    // Unknown Host header, origin form: no route. (Not `/`: on a host no route names, that is the
    // media front end's home page.)
    let r = get(&p.url("/no-route"), &[("host", "other.test")]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = raw(
        p.addr,
        b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(!r.starts_with("HTTP/1.1 2"), "{r}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn oversize_heads_and_slowloris_are_cut() {
    let (o, count) = counting().await;
    let mut c = route_to(o);
    c.server.max_header_bytes = 4096;
    c.server.header_read_timeout_secs = 1;
    let p = Proxy::start(c).await;
    let big = format!(
        "GET / HTTP/1.1\r\nHost: app.test\r\nX-Big: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let r = raw(p.addr, big.as_bytes(), Duration::from_secs(3)).await;
    assert!(
        r.is_empty() || r.starts_with("HTTP/1.1 431") || r.starts_with("HTTP/1.1 400"),
        "{r}"
    );
    // Slowloris: a head that never ends is dropped after the header read timeout.
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\n")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut buf = Vec::new();
    let done = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    assert!(done.is_ok(), "slow head kept the connection open");
    assert!(started.elapsed() < Duration::from_secs(4));
    assert_eq!(count.load(Ordering::SeqCst), 0);
}

/// A connection that never sends a request is closed after the header read timeout (the
/// connection's watchdog), while a keep-alive connection between two requests has the whole idle
/// timeout: the header read timeout holds for a head, not for the pause before one.
#[tokio::test]
async fn silent_connection_is_cut_but_keep_alive_pause_is_not() {
    let (o, count) = counting().await;
    let mut c = route_to(o);
    c.server.header_read_timeout_secs = 1;
    c.server.idle_timeout_secs = 8;
    let p = Proxy::start(c).await;

    let mut silent = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    let started = std::time::Instant::now();
    let mut buf = Vec::new();
    let done = tokio::time::timeout(Duration::from_secs(6), silent.read_to_end(&mut buf)).await;
    assert!(done.is_ok(), "a silent connection was kept open");
    assert!(buf.is_empty(), "{:?}", String::from_utf8_lossy(&buf));
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900), "cut after {took:?}");

    let request = b"GET /a HTTP/1.1\r\nHost: app.test\r\n\r\n";
    let mut kept = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    for round in 0..2 {
        if round == 1 {
            // Longer than the header read timeout, shorter than the idle timeout.
            tokio::time::sleep(Duration::from_millis(2500)).await;
        }
        kept.write_all(request).await.unwrap();
        let mut head = vec![0u8; 4096];
        let mut got = 0;
        let reply = loop {
            let n = tokio::time::timeout(Duration::from_secs(3), kept.read(&mut head[got..]))
                .await
                .expect("no answer")
                .unwrap();
            assert!(n > 0, "round {round}: connection closed");
            got += n;
            let text = String::from_utf8_lossy(&head[..got]).to_string();
            if text.ends_with("\r\n\r\nok") {
                break text;
            }
        };
        assert!(reply.starts_with("HTTP/1.1 200"), "round {round}: {reply}");
    }
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

/// A raw origin that answers each connection with `reply` and then closes or stalls.
async fn raw_origin(reply: &'static [u8], stall: bool) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(reply).await;
                if stall {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
                // Dropping `s` closes (a reset if unread bytes remain).
            });
        }
    });
    addr
}

#[tokio::test]
async fn broken_upstreams_give_clear_errors() {
    let garbage = raw_origin(b"SSH-2.0-OpenSSH_9.0\r\n\xff\xfe garbage\r\n\r\n", false).await;
    let p = Proxy::start(route_to(garbage)).await;
    let r = get(&p.url("/"), &[("host", "app.test")]).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert!(String::from_utf8_lossy(r.body.as_ref().unwrap()).contains("upstream_failed"));

    // Promises 1000 bytes, sends 10, closes: the client must see a cut body, not a short success.
    let short = raw_origin(
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789",
        false,
    )
    .await;
    let p = Proxy::start(route_to(short)).await;
    let r = get(&p.url("/"), &[("host", "app.test")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.body.is_err(),
        "a truncated body was delivered as complete"
    );

    // Sends a head and part of the body, then goes quiet: cut after the idle timeout.
    let stall = raw_origin(
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789",
        true,
    )
    .await;
    let p = Proxy::start(route_to(stall)).await;
    let started = std::time::Instant::now();
    let r = get(&p.url("/"), &[("host", "app.test")]).await;
    assert!(r.body.is_err());
    assert!(started.elapsed() < Duration::from_secs(5));

    // Everything down: 502 naming the group, with a JSON body.
    let dead = dead_port().await;
    let p = Proxy::start(route_to(dead)).await;
    let r = get(&p.url("/"), &[("host", "app.test")]).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(r.headers["content-type"], "application/json");
    assert!(String::from_utf8_lossy(r.body.as_ref().unwrap()).contains("upstream_refused"));
}

#[tokio::test]
async fn a_failure_disturbs_nothing_else() {
    let (good, _) = counting().await;
    let dead = dead_port().await;
    let c = config(&format!(
        r#"
[[upstreams]]
name = "good"
servers = ["{good}"]
[[upstreams]]
name = "bad"
servers = ["{dead}"]
[[routes]]
path = "/bad"
upstream = "bad"
[[routes]]
path = "/"
upstream = "good"
"#
    ));
    let p = Proxy::start(c).await;
    let mut tasks = Vec::new();
    for i in 0..40 {
        let url = p.url(if i % 2 == 0 { "/bad" } else { "/ok" });
        tasks.push(tokio::spawn(async move { get(&url, &[]).await.status }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let status = t.await.unwrap();
        let want = if i % 2 == 0 {
            StatusCode::BAD_GATEWAY
        } else {
            StatusCode::OK
        };
        assert_eq!(status, want);
    }
}

/// An upstream's `101` gets the clean-up of any answer: its hop-by-hop fields (`Keep-Alive`, and
/// `X-Hop`, which its `Connection` names) and the route's `response_headers_remove` field do not
/// reach the client, the route's addition and this hop's `Via` do; `Upgrade` and
/// `Connection: upgrade` are there, and the tunnel still carries bytes both ways.
#[tokio::test]
async fn a_switch_is_cleaned_up_like_any_answer() {
    let o = origin(|mut req: http::Request<hyper::body::Incoming>| async move {
        let key = req.headers().get("sec-websocket-key").cloned();
        let on = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(up) = on.await {
                let mut io = hyper_util::rt::TokioIo::new(up);
                let mut buf = [0u8; 1024];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        let mut resp = http::Response::new(full(bytes::Bytes::new()));
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = resp.headers_mut();
        for (name, value) in [
            ("upgrade", "websocket"),
            ("connection", "upgrade, x-hop"),
            ("keep-alive", "timeout=5"),
            ("x-hop", "1"),
            ("x-backend-server", "10.0.3.7:8080"),
            ("x-kept", "yes"),
        ] {
            h.insert(name, http::HeaderValue::from_static(value));
        }
        h.insert("sec-websocket-accept", key.unwrap());
        resp
    })
    .await;
    let p = Proxy::start(config(&format!(
        r#"
[[upstreams]]
name = "app"
servers = ["{o}"]

[[routes]]
path = "/"
upstream = "app"
response_headers_remove = ["x-backend-server"]
response_headers_add = {{ x-frame-options = "DENY" }}
"#
    )))
    .await;
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    s.write_all(
        b"GET /chat HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut byte))
            .await
            .expect("the answer's head")
            .unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    for gone in ["x-backend-server", "keep-alive", "x-hop", "10.0.3.7"] {
        assert!(!head.contains(gone), "{gone} reached the client: {head}");
    }
    for kept in [
        "\r\nupgrade: websocket\r\n",
        "\r\nconnection: upgrade\r\n",
        "\r\nx-frame-options: deny\r\n",
        "\r\nvia: 1.1 sluice\r\n",
        "\r\nx-kept: yes\r\n",
        "\r\nsec-websocket-accept: dghlihnhbxbszsbub25jzq==\r\n",
    ] {
        assert!(head.contains(kept), "{kept:?} missing: {head}");
    }
    for msg in [&b"hello"[..], &pattern(100_000)[..]] {
        s.write_all(msg).await.unwrap();
        let mut got = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
            .await
            .expect("the bytes echoed")
            .unwrap();
        assert_eq!(got, msg);
    }
}

/// Opens a WebSocket tunnel through the proxy at `addr` and checks it carries bytes both ways.
async fn open_tunnel(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        b"GET /chat HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut byte))
            .await
            .expect("the switch's head")
            .unwrap();
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    echoes(&mut s).await;
    s
}

/// The tunnel on `s` echoes what is written to it.
async fn echoes(s: &mut tokio::net::TcpStream) {
    s.write_all(b"ping").await.unwrap();
    let mut got = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
        .await
        .expect("the bytes echoed")
        .unwrap();
    assert_eq!(&got, b"ping");
}

/// A plain GET on a new connection: its status line's code, or `None` when the connection was
/// closed without an answer.
async fn plain_get(addr: std::net::SocketAddr) -> Option<u16> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = s
        .write_all(b"GET /plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
        .await
        .expect("the connection was neither answered nor closed")
        .ok()?;
    let text = String::from_utf8_lossy(&got);
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// Finding: an HTTP/1.1 connection upgraded to a WebSocket tunnel gave back its connection slot
/// and its place in `max_connections_per_ip` at the switch (hyper's connection ends there, the
/// tunnel runs on in a task of its own), so one address could hold any number of tunnels, two
/// sockets each, while under its share. The connection's task now lasts as long as the tunnel's
/// socket: with a share of 2, two open tunnels leave no room for a third connection from the
/// address, and closing one makes room again.
#[tokio::test]
async fn an_open_tunnel_keeps_its_place_in_the_per_ip_share() {
    let o = origin(|mut req: http::Request<hyper::body::Incoming>| async move {
        if !req.headers().contains_key("upgrade") {
            return http::Response::new(full("plain"));
        }
        let key = req.headers().get("sec-websocket-key").cloned();
        let on = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(up) = on.await {
                let mut io = hyper_util::rt::TokioIo::new(up);
                let mut buf = [0u8; 1024];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        let mut resp = http::Response::new(full(bytes::Bytes::new()));
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = resp.headers_mut();
        h.insert("upgrade", http::HeaderValue::from_static("websocket"));
        h.insert("connection", http::HeaderValue::from_static("upgrade"));
        h.insert("sec-websocket-accept", key.unwrap());
        resp
    })
    .await;
    let mut c = config(&format!(
        r#"
[[upstreams]]
name = "app"
servers = ["{o}"]

[[routes]]
path = "/"
upstream = "app"
idle_timeout_secs = 30
"#
    ));
    c.server.max_connections_per_ip = 2;
    c.server.per_ip_exempt = Vec::new();
    let p = Proxy::start(c).await;
    assert_eq!(plain_get(p.addr).await, Some(200));
    let mut first = open_tunnel(p.addr).await;
    let second = open_tunnel(p.addr).await;
    // Both tunnels hold their places: a third connection is closed unanswered.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        plain_get(p.addr).await,
        None,
        "a third connection was served while two tunnels held the share of 2"
    );
    echoes(&mut first).await;
    // One tunnel closes: its place comes back.
    drop(second);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match plain_get(p.addr).await {
            Some(200) => break,
            other => assert!(
                std::time::Instant::now() < deadline,
                "no place came back after a tunnel closed: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    echoes(&mut first).await;
}

/// Finding: an upstream that answered a plain request `101 Switching Protocols` had that `101`
/// passed on as the final answer (no such thing on HTTP/2 or HTTP/3, and a client that asked
/// for no switch is left waiting). It is a broken answer: `502` `upstream_failed`, booked to the
/// server that sent it.
#[tokio::test]
async fn an_unasked_switch_is_a_502_booked_to_the_upstream() {
    let o = raw_origin(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        true,
    )
    .await;
    let p = Proxy::start(route_to(o)).await;
    // A POST (not the fast path's), over HTTP/1.1 and over HTTP/2 (h2c).
    let r = send(
        "POST",
        &p.url("/"),
        &[("host", "app.test")],
        full("payload"),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    let body = String::from_utf8_lossy(r.body.as_ref().unwrap()).into_owned();
    assert!(body.contains("upstream_failed"), "{body}");
    let mut h2 = h2_client(p.addr).await;
    let req = http::Request::post("http://app.test/")
        .version(http::Version::HTTP_2)
        .body(full("payload"))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), h2.send_request(req))
        .await
        .expect("an HTTP/2 answer")
        .expect("an HTTP/2 answer, not a reset");
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    let m = get(&p.url("/metrics"), &[]).await;
    let m = String::from_utf8_lossy(m.body.as_ref().unwrap()).into_owned();
    let booked =
        format!("sluice_upstream_server_consecutive_failures{{group=\"app\",server=\"{o}\"}} 2");
    assert!(m.lines().any(|l| l == booked), "{booked} not in {m}");
}

/// A `..` that only a server decoding `%2F` or `%5C` (Python's `http.server`), or reading `;` as
/// the start of parameters (Tomcat, Jetty), would resolve is refused (400) before any upstream:
/// under a rewrite it would leave the rewritten subtree (`/docs/..%2F..%2Fsecret` went up as
/// `/public/docs/..%2F..%2Fsecret`, `/secret` to such a server). An encoded `..` sluice resolves
/// itself (`%2E%2E`), so it leaves the route, not its rewrite. With the fast path and without.
#[tokio::test]
async fn a_dot_dot_only_the_upstream_would_resolve_is_refused() {
    let seen: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    let o = origin(move |req: http::Request<hyper::body::Incoming>| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push(req.uri().path().to_string());
            http::Response::new(full("ok"))
        }
    })
    .await;
    for fast in [true, false] {
        seen.lock().unwrap().clear();
        let p = Proxy::start(config(&format!(
            r#"
[server]
h1_fast_path = {fast}

[[upstreams]]
name = "app"
servers = ["{o}"]

[[routes]]
host = "app.test"
path = "/docs/"
upstream = "app"
rewrite = "/public/docs/"
"#
        )))
        .await;
        let ask = |target: &str| {
            format!("GET {target} HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
        };
        for target in [
            "/docs/..%2F..%2Fsecret",
            "/docs/..%2f..%2fsecret",
            "/docs/..%5C..%5Csecret",
            "/docs/a%2F..%2F..%2F..%2Fsecret",
            "/docs/..;/..;/secret",
            "/docs/..;jsessionid=1/..;/secret",
            "/docs/%2e%2e%2F%2e%2e%2Fsecret",
            "/docs/.%2e;/.%2E;/secret",
            // Encoded twice (an upstream or a hop between that decodes once more), an encoded
            // `;`, and trailing dots and spaces, which IIS trims from a segment.
            "/docs/..%252F..%252Fsecret",
            "/docs/..%255c..%255csecret",
            "/docs/%252E%252E%252Fsecret",
            "/docs/..%3B/..%3B/secret",
            "/docs/..%20%5Csecret",
            "/docs/..%20/..%20/secret",
            "/docs/..../..../secret",
        ] {
            let reply = raw(p.addr, ask(target).as_bytes(), Duration::from_secs(3)).await;
            assert!(
                reply.starts_with("HTTP/1.1 400"),
                "fast {fast}: {target}: {reply}"
            );
            assert!(reply.contains("bad_path"), "fast {fast}: {target}: {reply}");
        }
        // Resolved by sluice: `/secret`, which no route serves.
        for target in ["/docs/%2E%2E/secret", "/docs/.%2e/secret"] {
            let reply = raw(p.addr, ask(target).as_bytes(), Duration::from_secs(3)).await;
            assert!(
                reply.starts_with("HTTP/1.1 404"),
                "fast {fast}: {target}: {reply}"
            );
        }
        assert_eq!(
            *seen.lock().unwrap(),
            Vec::<String>::new(),
            "fast {fast}: reached the upstream"
        );
        // What stays under the subtree still goes up.
        for target in [
            "/docs/a",
            "/docs/file;v=1",
            "/docs/a%2Fb",
            "/docs/x..%2F",
            "/docs/a%252Fb",
            "/docs/a..%20b",
        ] {
            let reply = raw(p.addr, ask(target).as_bytes(), Duration::from_secs(3)).await;
            assert!(
                reply.starts_with("HTTP/1.1 200"),
                "fast {fast}: {target}: {reply}"
            );
        }
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "/public/docs/a",
                "/public/docs/file;v=1",
                "/public/docs/a%2Fb",
                "/public/docs/x..%2F",
                "/public/docs/a%252Fb",
                "/public/docs/a..%20b"
            ],
            "fast {fast}"
        );
    }
}

/// What a WebSocket origin saw of one request: its method, whether it asked to upgrade, and
/// its body's length.
type Seen = Arc<std::sync::Mutex<Vec<(String, bool, usize)>>>;

/// An origin that switches every request naming `Upgrade` to a tunnel echoing what it gets, and
/// answers any other `plain`; each request is noted in [`Seen`].
async fn ws_echo_origin() -> (std::net::SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let notes = seen.clone();
    let addr = origin(move |mut req: http::Request<hyper::body::Incoming>| {
        let notes = notes.clone();
        async move {
            use http_body_util::BodyExt;
            let upgrade = req.headers().contains_key("upgrade");
            let method = req.method().to_string();
            if !upgrade {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                notes.lock().unwrap().push((method, false, body.len()));
                return http::Response::new(full("plain"));
            }
            notes.lock().unwrap().push((method, true, 0));
            let key = req.headers().get("sec-websocket-key").cloned();
            let on = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                if let Ok(up) = on.await {
                    let mut io = hyper_util::rt::TokioIo::new(up);
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = io.read(&mut buf).await {
                        if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                }
            });
            let mut resp = http::Response::new(full(bytes::Bytes::new()));
            *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            let h = resp.headers_mut();
            h.insert("upgrade", http::HeaderValue::from_static("websocket"));
            h.insert("connection", http::HeaderValue::from_static("upgrade"));
            if let Some(key) = key {
                h.insert("sec-websocket-accept", key);
            }
            resp
        }
    })
    .await;
    (addr, seen)
}

/// A WebSocket over HTTP/2 extended CONNECT on `send`, from `client` as a trusted proxy
/// names it: the tunnel, or the status it was refused with.
async fn h2_websocket(
    send: &mut hyper::client::conn::http2::SendRequest<BoxBody>,
    client: &str,
) -> Result<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>, StatusCode> {
    send.ready().await.unwrap();
    let mut req = http::Request::builder()
        .method("CONNECT")
        .uri("http://app.test/chat")
        .header("sec-websocket-version", "13")
        .header("x-forwarded-for", client)
        .body(full(bytes::Bytes::new()))
        .unwrap();
    req.extensions_mut()
        .insert(hyper::ext::Protocol::from_static("websocket"));
    let mut resp = tokio::time::timeout(Duration::from_secs(5), send.send_request(req))
        .await
        .expect("an answer to the extended CONNECT")
        .unwrap();
    if resp.status() != StatusCode::OK {
        return Err(resp.status());
    }
    let up = hyper::upgrade::on(&mut resp).await.unwrap();
    Ok(hyper_util::rt::TokioIo::new(up))
}

/// The tunnel `io` echoes what is written to it.
async fn echoes_h2(io: &mut hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>) {
    io.write_all(b"ping").await.unwrap();
    let mut got = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), io.read_exact(&mut got))
        .await
        .expect("the bytes echoed")
        .unwrap();
    assert_eq!(&got, b"ping");
}

/// Finding: WebSockets over HTTP/2 extended CONNECT held no place anywhere: an HTTP/1.1 upgrade
/// keeps its connection's place in `max_connections_per_ip`, but one HTTP/2 connection carries
/// a tunnel per stream, each with an upstream socket of its own, so one address's 256
/// connections × 100 streams held 25,600 upstream sockets while `max_connections` counted 256.
/// Each tunnel now takes a place in its client's share (`max_connections_per_ip`, by default
/// 256) before its upstream is dialled: one client opening more than its share over HTTP/2 is
/// refused 429 past it, the origin never asked, while another client still gets a tunnel; a
/// tunnel that ends gives its place back. (Clients named by `X-Forwarded-For` from a trusted
/// proxy, so the share applies to them, not to the loopback peer.)
#[tokio::test]
async fn http2_tunnels_hold_places_in_their_clients_share() {
    let (o, seen) = ws_echo_origin().await;
    let mut c = route_to(o);
    c.routes[0].idle_timeout_secs = 30;
    c.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    // Every tunnel on one connection, so the connection limits play no part.
    c.server.h2_max_concurrent_streams = 1000;
    let share = sluice::server::config::ServerConfig::default().max_connections_per_ip;
    let p = Proxy::start(c).await;
    let mut send = h2_client(p.addr).await;
    // The server's SETTINGS (ENABLE_CONNECT_PROTOCOL) first.
    send.ready().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut held = Vec::new();
    for i in 0..share {
        match h2_websocket(&mut send, "203.0.113.7").await {
            Ok(io) => held.push(io),
            Err(status) => panic!("tunnel {i} of a share of {share} refused: {status}"),
        }
    }
    echoes_h2(&mut held[0]).await;
    echoes_h2(held.last_mut().unwrap()).await;
    let dialled = seen.lock().unwrap().len();
    assert_eq!(dialled, share);
    // One more from the same client: refused before its upstream is dialled.
    assert_eq!(
        h2_websocket(&mut send, "203.0.113.7").await.err(),
        Some(StatusCode::TOO_MANY_REQUESTS),
        "a tunnel past the client's share of {share} was opened"
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        dialled,
        "the upstream was dialled"
    );
    // Another client on the same connection still gets one.
    let mut other = h2_websocket(&mut send, "203.0.113.8")
        .await
        .expect("another client's tunnel");
    echoes_h2(&mut other).await;
    // A tunnel that ends gives its place back.
    drop(held.pop());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut again = loop {
        match h2_websocket(&mut send, "203.0.113.7").await {
            Ok(io) => break io,
            Err(status) => assert!(
                std::time::Instant::now() < deadline,
                "no place came back after a tunnel closed: {status}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    echoes_h2(&mut again).await;
    echoes_h2(&mut held[0]).await;
}

/// Findings: tunnels took their per-client bound from `max_connections_per_ip`, so a site
/// allowing thousands of connections per office address allowed as many long-lived tunnels; and
/// a reload that changed the bounds started their counts at zero, so a client holding its share
/// got a whole new share on top after each one. `server.max_tunnels_per_ip` bounds tunnels on
/// its own (here 2 under a connection share of 2,000), and a reload's bounds count the tunnels
/// open: raised to 3 it lets in one more, not three; lowered to 1 it refuses new ones while the
/// open ones go on. (Clients named by `X-Forwarded-For` from a trusted proxy, all on one HTTP/2
/// connection, so the connection limits play no part.)
#[tokio::test]
async fn a_reload_that_changes_the_tunnel_share_counts_the_tunnels_open() {
    let (o, seen) = ws_echo_origin().await;
    let mut c = route_to(o);
    c.routes[0].idle_timeout_secs = 30;
    c.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    c.server.max_connections_per_ip = 2000;
    c.server.max_tunnels_per_ip = Some(2);
    let p = Proxy::start(c.clone()).await;
    let mut send = h2_client(p.addr).await;
    // The server's SETTINGS (ENABLE_CONNECT_PROTOCOL) first.
    send.ready().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let client = "203.0.113.7";
    let mut held = Vec::new();
    for i in 0..2 {
        match h2_websocket(&mut send, client).await {
            Ok(io) => held.push(io),
            Err(status) => panic!("tunnel {i} of a share of 2 refused: {status}"),
        }
    }
    assert_eq!(
        h2_websocket(&mut send, client).await.err(),
        Some(StatusCode::TOO_MANY_REQUESTS),
        "a third tunnel opened under max_tunnels_per_ip = 2"
    );
    c.server.max_tunnels_per_ip = Some(3);
    p.app.reload(&c).unwrap();
    held.push(
        h2_websocket(&mut send, client)
            .await
            .expect("a third tunnel under a share raised to 3"),
    );
    assert_eq!(
        h2_websocket(&mut send, client).await.err(),
        Some(StatusCode::TOO_MANY_REQUESTS),
        "a fourth tunnel opened under a share of 3: the reload forgot the tunnels open"
    );
    c.server.max_tunnels_per_ip = Some(1);
    p.app.reload(&c).unwrap();
    assert_eq!(
        h2_websocket(&mut send, client).await.err(),
        Some(StatusCode::TOO_MANY_REQUESTS),
        "a tunnel opened under a share lowered to 1 while 3 are open"
    );
    for io in &mut held {
        echoes_h2(io).await;
    }
    assert_eq!(
        seen.lock().unwrap().len(),
        3,
        "a refused tunnel was dialled"
    );
    // Another client still gets its one.
    let mut other = h2_websocket(&mut send, "203.0.113.8")
        .await
        .expect("another client's tunnel");
    echoes_h2(&mut other).await;
}

/// Finding: an `Upgrade: websocket` on an HTTP/1.0 request was honoured (HTTP/1.0 has no
/// Upgrade, RFC 9110 section 7.8): the origin was asked to switch. It goes on as the plain
/// request it is, its `Upgrade` and `Connection` dropped.
#[tokio::test]
async fn an_http10_upgrade_is_forwarded_as_a_plain_request() {
    let (o, seen) = ws_echo_origin().await;
    let p = Proxy::start(route_to(o)).await;
    let reply = raw(
        p.addr,
        b"GET /chat HTTP/1.0\r\nHost: app.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(reply.contains(" 200 "), "{reply}");
    assert!(reply.ends_with("plain"), "{reply}");
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        &[("GET".to_string(), false, 0)],
        "the origin was asked to switch for an HTTP/1.0 request"
    );
}

/// Finding: a non-GET request naming `Upgrade: websocket` was sent upstream as a GET upgrade
/// (its body kept behind the switch); only a GET is an HTTP/1.1 WebSocket upgrade (RFC 6455
/// section 4.1). A POST goes on as a POST with its body, `Upgrade` and `Connection` dropped.
#[tokio::test]
async fn a_post_naming_an_upgrade_is_forwarded_as_itself() {
    let (o, seen) = ws_echo_origin().await;
    let p = Proxy::start(route_to(o)).await;
    let reply = raw(
        p.addr,
        b"POST /chat HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade, close\r\n\
          Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nContent-Length: 5\r\n\r\nhello",
        Duration::from_secs(3),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.ends_with("plain"), "{reply}");
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        &[("POST".to_string(), false, 5)],
        "the origin did not get the POST as it was sent"
    );
}
