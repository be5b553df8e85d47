//! Round 2 of the reverse proxy under attack, each test against a running sluice with real origins
//! on 127.0.0.1: client-side body failures that must not eject a server, `Host` validation,
//! underscore twins, range amplification, method confusion around `PURGE`, forwarding-header
//! spoofing, cache-key ambiguity and cache deception, and the cached answer's `Via` and log line.

mod reverse_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use http_body_util::BodyExt;
use reverse_support::*;
use sluice::tcp::{TcpMetrics, TcpProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// sluice with its `[[tcp]]` listeners over the app's groups, as the binary wires them.
async fn start_with_tcp(config: sluice::config::Config) -> (Proxy, Arc<TcpProxy>) {
    let p = Proxy::start(config.clone()).await;
    let tcp = Arc::new(TcpProxy::new(TcpMetrics::register(
        &mut prometheus_client::registry::Registry::default(),
    )));
    tcp.apply(&config.tcp, p.app.groups().current()).unwrap();
    (p, tcp)
}

/// An origin that reads the whole request body and answers `got <len>`.
async fn reading_origin() -> std::net::SocketAddr {
    origin(|req: http::Request<hyper::body::Incoming>| async move {
        let len = match req.into_body().collect().await {
            Ok(b) => b.to_bytes().len(),
            Err(_) => usize::MAX,
        };
        http::Response::new(full(format!("got {len}")))
    })
    .await
}

/// Writes `bytes`, then closes the write side (`close`) or keeps it open for `hold`, and returns
/// what the server answered within `wait`.
async fn send_then(
    addr: std::net::SocketAddr,
    bytes: &[u8],
    close: bool,
    wait: Duration,
) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    if close {
        // The client goes away mid-body.
        drop(s);
        return String::new();
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(wait, s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

async fn metrics(p: &Proxy) -> String {
    let m = get(&p.url("/metrics"), &[]).await;
    String::from_utf8_lossy(m.body.as_ref().unwrap()).into_owned()
}

/// Finding: a request body that fails on the client's side (aborted upload, broken chunk, chunk
/// size overflow, an upload slower than the header timeout) was booked as a failure of the
/// server, so three aborted POSTs ejected it for everyone, `[[tcp]]` listeners included.
#[tokio::test]
async fn client_body_failures_do_not_eject_the_server() {
    let o = reading_origin().await;
    let (p, tcp) = start_with_tcp(config(&format!(
        r#"
[[upstreams]]
name = "app"
servers = ["{o}"]
max_fails = 3
fail_timeout_secs = 60

[[routes]]
host = "app.test"
path = "/"
upstream = "app"
header_timeout_secs = 1
idle_timeout_secs = 30

[[tcp]]
name = "raw"
listen = "127.0.0.1:0"
upstream = "app"
"#
    )))
    .await;
    let tcp_addr = tcp.local_addrs()[0].1;
    let head = "POST /up HTTP/1.1\r\nHost: app.test\r\n";
    // Aborted uploads: 100 of 100000 bytes, then the client is gone.
    for _ in 0..4 {
        let req = format!("{head}Content-Length: 100000\r\n\r\n{}", "a".repeat(100));
        send_then(p.addr, req.as_bytes(), true, Duration::ZERO).await;
    }
    // A chunked upload cut inside a chunk.
    for _ in 0..3 {
        let req = format!("{head}Transfer-Encoding: chunked\r\n\r\n5\r\nabc");
        send_then(p.addr, req.as_bytes(), true, Duration::ZERO).await;
    }
    // A broken chunk and a chunk size that overflows 64 bits: 400.
    for bad in [
        "1\r\na\r\nzz\r\nabc\r\n0\r\n\r\n",
        "1\r\na\r\nfffffffffffffffffffff\r\nabc\r\n",
    ] {
        for _ in 0..3 {
            let req = format!("{head}Transfer-Encoding: chunked\r\n\r\n{bad}");
            let reply = send_then(p.addr, req.as_bytes(), false, Duration::from_secs(5)).await;
            assert!(reply.starts_with("HTTP/1.1 400"), "{bad:?}: {reply}");
        }
    }
    // An upload slower than the header timeout (1 s; the idle timeout is 30 s): 408, as nginx.
    for _ in 0..3 {
        let req = format!("{head}Content-Length: 10\r\n\r\nab");
        let reply = send_then(p.addr, req.as_bytes(), false, Duration::from_secs(6)).await;
        assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    }
    // The server is still in service: the origin answers a GET and a whole POST through the
    // route, and the TCP listener on the same group relays.
    let r = get(&p.url("/after"), &[("host", "app.test")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body.as_ref().unwrap().as_ref(), b"got 0");
    let r = send(
        "POST",
        &p.url("/after"),
        &[("host", "app.test")],
        full(vec![7u8; 5000]),
    )
    .await;
    assert_eq!(r.body.as_ref().unwrap().as_ref(), b"got 5000");
    let mut c = TcpStream::connect(tcp_addr).await.unwrap();
    c.write_all(b"GET /tcp HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.starts_with("HTTP/1.1 200") && text.ends_with("got 0"),
        "{text}"
    );
    let groups = p.app.groups().current();
    assert!(!groups.get("app").unwrap().servers()[0].is_ejected());
    let m = metrics(&p).await;
    // Each failure is the client's, counted as such; nothing was booked against the server.
    for line in [
        format!("sluice_upstream_server_ejections_total{{group=\"app\",server=\"{o}\"}} 0"),
        format!("sluice_upstream_server_consecutive_failures{{group=\"app\",server=\"{o}\"}} 0"),
        "sluice_errors_total{side=\"downstream\",kind=\"client_body_aborted\"} 7".to_string(),
        "sluice_errors_total{side=\"downstream\",kind=\"bad_body\"} 6".to_string(),
        "sluice_errors_total{side=\"downstream\",kind=\"client_body_timeout\"} 3".to_string(),
    ] {
        assert!(m.lines().any(|l| l == line), "{line} not in {m}");
    }
    assert!(
        !m.lines()
            .any(|l| l.starts_with("sluice_reverse_server_failures_total{") && !l.ends_with(" 0")),
        "{m}"
    );
}

/// An origin that counts requests and answers with the JSON echo report (`echo`).
async fn counted_echo() -> (std::net::SocketAddr, Arc<Mutex<Vec<serde_json::Value>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let inner = echo("o").await;
    let s = seen.clone();
    let addr = origin(move |req: http::Request<hyper::body::Incoming>| {
        let s = s.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            let mut b = http::Request::builder()
                .method(parts.method.clone())
                .uri(format!(
                    "http://{inner}{}",
                    parts.uri.path_and_query().map_or("/", |p| p.as_str())
                ));
            for (k, v) in &parts.headers {
                b = b.header(k, v);
            }
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http::<BoxBody>();
            let resp = client.request(b.body(full(body)).unwrap()).await.unwrap();
            let (rp, rb) = resp.into_parts();
            let bytes = rb.collect().await.unwrap().to_bytes();
            if let Ok(j) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                s.lock().unwrap().push(j);
            }
            let mut out = http::Response::new(full(bytes));
            *out.status_mut() = rp.status;
            out
        }
    })
    .await;
    (addr, seen)
}

/// Finding: `evil.com/.wild.example.com`, `evil.com#.wild.example.com` and `a..wild.example.com`
/// were routed to `*.wild.example.com` and forwarded verbatim; a request without `Host` and one
/// with two were accepted. All are 400 now (the HTTP/1.1 fast path hands them to hyper's path,
/// which refuses them), and HTTP/2's `Host` must agree with `:authority`.
#[tokio::test]
async fn invalid_missing_and_repeated_hosts_are_refused() {
    let (o, seen) = counted_echo().await;
    let p = Proxy::start(config(&format!(
        r#"
[[upstreams]]
name = "app"
servers = ["{o}"]

[[routes]]
host = "*.wild.example.com"
path = "/"
upstream = "app"
"#
    )))
    .await;
    let bad_hosts = [
        "evil.com/.wild.example.com",
        "evil.com#.wild.example.com",
        "a..wild.example.com",
        "evil.com?.wild.example.com",
        "evil.com@a.wild.example.com",
        "evil.com|a.wild.example.com",
    ];
    for method in ["GET", "POST"] {
        for h in bad_hosts {
            let req = format!(
                "{method} /x HTTP/1.1\r\nHost: {h}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let reply = raw(p.addr, req.as_bytes(), Duration::from_secs(5)).await;
            assert!(reply.starts_with("HTTP/1.1 400"), "{h}: {reply}");
            assert!(reply.contains("\"kind\":\"bad_host\""), "{h}: {reply}");
        }
        for req in [
            format!("{method} /x HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
            format!(
                "{method} /x HTTP/1.1\r\nHost: a.wild.example.com\r\nHost: b.wild.example.com\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            ),
            format!(
                "{method} http://a.wild.example.com/x HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            ),
        ] {
            let reply = raw(p.addr, req.as_bytes(), Duration::from_secs(5)).await;
            assert!(reply.starts_with("HTTP/1.1 400"), "{req:?}: {reply}");
        }
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "a bad host reached the origin"
    );
    // HTTP/2: `Host` beside a different `:authority`.
    let tcp = TcpStream::connect(p.addr).await.unwrap();
    let (mut h2, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = |host: &str| {
        http::Request::builder()
            .uri("http://a.wild.example.com/x")
            .header("host", host)
            .body(full(""))
            .unwrap()
    };
    let resp = h2.send_request(req("b.wild.example.com")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(
        seen.lock().unwrap().is_empty(),
        "a mismatched host reached the origin"
    );
    let resp = h2.send_request(req("a.wild.example.com")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    // A valid host is served, on the fast path and through hyper, and forwarded as it came.
    for method in ["GET", "POST"] {
        let req = format!(
            "{method} /x HTTP/1.1\r\nHost: A.wild.example.com\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let reply = raw(p.addr, req.as_bytes(), Duration::from_secs(5)).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    let hosts: Vec<&str> = seen
        .iter()
        .map(|j| {
            j["headers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p[0] == "host")
                .unwrap()[1]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(
        hosts,
        [
            "a.wild.example.com",
            "A.wild.example.com",
            "A.wild.example.com"
        ]
    );
}
