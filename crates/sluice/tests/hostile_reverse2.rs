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

/// An origin that reads the whole request body, then takes `delay` to answer `got <len>`.
async fn delayed_origin(delay: Duration) -> std::net::SocketAddr {
    origin(
        move |req: http::Request<hyper::body::Incoming>| async move {
            let len = match req.into_body().collect().await {
                Ok(b) => b.to_bytes().len(),
                Err(_) => usize::MAX,
            };
            tokio::time::sleep(delay).await;
            http::Response::new(full(format!("got {len}")))
        },
    )
    .await
}

/// A 2-byte POST to `host` whose last byte comes `late` after the first (inside the idle
/// timeout): what sluice answered and how long the exchange took.
async fn late_last_byte(
    addr: std::net::SocketAddr,
    host: &str,
    late: Duration,
) -> (String, Duration) {
    let start = std::time::Instant::now();
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /up HTTP/1.1\r\nHost: {host}\r\nContent-Length: 2\r\nConnection: close\r\n\r\na"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(late).await;
    // The proxy may already have answered (and closed): a failed write shows in the reply.
    let _ = s.write_all(b"b").await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(6), s.read_to_end(&mut out)).await;
    (String::from_utf8_lossy(&out).into_owned(), start.elapsed())
}

/// The same over HTTP/2 (h2c): a `content-length` body whose last byte comes late in a DATA
/// frame without END_STREAM (the END_STREAM frame follows after the answer could have come).
/// The upstream sender stops polling once the length is written, so the body's end was only
/// seen with END_STREAM: the timeout fired with the whole body at the origin, booked to it.
async fn late_last_byte_h2(addr: std::net::SocketAddr, host: &str, late: Duration) -> u16 {
    let io = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let mut send = send.ready().await.unwrap();
    let req = http::Request::post(format!("http://{host}/up"))
        .header("content-length", "2")
        .body(())
        .unwrap();
    let (resp, mut body) = send.send_request(req, false).unwrap();
    body.send_data(bytes::Bytes::from_static(b"a"), false)
        .unwrap();
    tokio::time::sleep(late).await;
    body.send_data(bytes::Bytes::from_static(b"b"), false)
        .unwrap();
    let ends = async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let _ = body.send_data(bytes::Bytes::new(), true);
        // Kept until the answer came.
        tokio::time::sleep(Duration::from_secs(10)).await;
    };
    let ends = tokio::spawn(ends);
    let status = tokio::time::timeout(Duration::from_secs(6), resp)
        .await
        .expect("an answer")
        .expect("an answer")
        .status()
        .as_u16();
    ends.abort();
    status
}

#[tokio::test]
async fn a_late_last_body_byte_over_http2_does_not_eject_the_server() {
    let quick = delayed_origin(Duration::from_millis(500)).await;
    let p = Proxy::start(config(&format!(
        r#"
[[upstreams]]
name = "quick"
servers = ["{quick}"]
max_fails = 1
fail_timeout_secs = 60

[[routes]]
host = "quick.test"
path = "/"
upstream = "quick"
header_timeout_secs = 1
idle_timeout_secs = 30
"#
    )))
    .await;
    let status = late_last_byte_h2(p.addr, "quick.test", Duration::from_millis(800)).await;
    assert_eq!(status, 200);
    let groups = p.app.groups().current();
    let server = &groups.get("quick").unwrap().servers()[0];
    assert_eq!(server.failures(), 0);
    assert!(!server.is_ejected());
}

/// A proxy with one route, `h2.test`, to an h2c origin that answers `got N` once it has read
/// the whole body.
async fn h2c_route(header_timeout_secs: u64) -> Proxy {
    let origin = delayed_origin(Duration::ZERO).await;
    Proxy::start(config(&format!(
        r#"
[[upstreams]]
name = "h2"
servers = ["{origin}"]
max_fails = 1
fail_timeout_secs = 60

[[routes]]
host = "h2.test"
path = "/"
upstream = "h2"
upstream_protocol = "h2c"
header_timeout_secs = {header_timeout_secs}
idle_timeout_secs = 30
"#
    )))
    .await
}

/// Over HTTP/2, a POST to `h2.test` with `content-length` of `data`'s length, `data` sent (if
/// any) and the stream never ended (kept open until the answer came): the answer's status and
/// body, within `within`.
async fn post_never_ended(p: &Proxy, data: &'static [u8], within: Duration) -> (u16, Vec<u8>) {
    let io = TcpStream::connect(p.addr).await.unwrap();
    let (send, conn) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let mut send = send.ready().await.unwrap();
    let req = http::Request::post("http://h2.test/up")
        .header("content-length", data.len().to_string())
        .body(())
        .unwrap();
    let (resp, mut body) = send.send_request(req, false).unwrap();
    if !data.is_empty() {
        body.send_data(bytes::Bytes::from_static(data), false)
            .unwrap();
    }
    let resp = tokio::time::timeout(within, resp)
        .await
        .expect("an answer in time")
        .expect("an answer");
    let status = resp.status().as_u16();
    let mut answer = resp.into_body();
    let mut got = Vec::new();
    while let Some(chunk) = answer.data().await {
        got.extend_from_slice(&chunk.unwrap());
    }
    drop(body);
    (status, got)
}

/// Over HTTP/2 to an HTTP/2 origin (h2c): a client sends its `content-length` worth and never
/// ends the stream. The upstream stream ended only with the client's END_STREAM, so an origin
/// reading to the end never answered, and the header timeout, run from the body's end, booked
/// the server. A body whose length is spent now ends the upstream stream with its last byte.
#[tokio::test]
async fn a_spent_body_ends_the_upstream_http2_stream() {
    let p = h2c_route(1).await;
    let (status, got) = post_never_ended(&p, b"ab", Duration::from_secs(5)).await;
    assert_eq!(status, 200);
    assert_eq!(got, b"got 2");
    let groups = p.app.groups().current();
    let server = &groups.get("h2").unwrap().servers()[0];
    assert_eq!(server.failures(), 0);
    assert!(!server.is_ejected());
}

/// The same with `content-length: 0` and HEADERS without END_STREAM: nothing to send, so the
/// upstream stream ends at once (it waited for the client's END_STREAM, until the body's idle
/// timeout).
#[tokio::test]
async fn an_empty_body_ends_the_upstream_http2_stream_at_once() {
    let p = h2c_route(5).await;
    let (status, got) = post_never_ended(&p, b"", Duration::from_secs(3)).await;
    assert_eq!(status, 200);
    assert_eq!(got, b"got 0");
}

/// Finding: the header timeout ran from the start of the attempt, so it counted the time the
/// client took to send its body. A client that sent its last byte just before the timeout, to
/// an origin that needs a moment after the body to answer, had the timeout fire with the body
/// complete: booked to the server as a header timeout (toward `max_fails`), and a few such
/// requests per server took every server out for everyone. The server's time now runs from the
/// end of the body; an origin that is really slow after having the whole body is still booked.
#[tokio::test]
async fn a_late_last_body_byte_does_not_eject_the_server() {
    let quick = delayed_origin(Duration::from_millis(500)).await;
    let slow = delayed_origin(Duration::from_millis(1500)).await;
    let p = Proxy::start(config(&format!(
        r#"
[[upstreams]]
name = "quick"
servers = ["{quick}"]
max_fails = 1
fail_timeout_secs = 60

[[upstreams]]
name = "slow"
servers = ["{slow}"]
max_fails = 1
fail_timeout_secs = 60

[[routes]]
host = "quick.test"
path = "/"
upstream = "quick"
header_timeout_secs = 1
idle_timeout_secs = 30

[[routes]]
host = "slow.test"
path = "/"
upstream = "slow"
header_timeout_secs = 1
idle_timeout_secs = 30
"#
    )))
    .await;
    // The last byte at 0.8 s, the answer 0.5 s later: past 1 s from the start, well within
    // 1 s of the body's end. The client gets its answer and nothing is booked.
    let (reply, _) = late_last_byte(p.addr, "quick.test", Duration::from_millis(800)).await;
    assert!(
        reply.starts_with("HTTP/1.1 200") && reply.ends_with("got 2"),
        "{reply}"
    );
    let groups = p.app.groups().current();
    let server = &groups.get("quick").unwrap().servers()[0];
    assert_eq!(server.failures(), 0);
    assert!(!server.is_ejected());
    let r = get(&p.url("/after"), &[("host", "quick.test")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body.as_ref().unwrap().as_ref(), b"got 0");
    // An origin still silent 1 s after it had the whole body is slow: 504, booked, ejected;
    // and only once that full second after the body's end has passed.
    let (reply, took) = late_last_byte(p.addr, "slow.test", Duration::from_millis(800)).await;
    assert!(reply.starts_with("HTTP/1.1 504"), "{reply}");
    assert!(
        took >= Duration::from_millis(1700),
        "answered after {took:?}"
    );
    let server = &groups.get("slow").unwrap().servers()[0];
    assert_eq!(server.failures(), 1);
    assert!(server.is_ejected());
}

/// An origin that answers `ok` to a GET and gives up on every POST after reading its head:
/// after `wait` (its own worker timeout; zero for uploads that fail at once, a crashed worker
/// or a full disk) it closes with the body unread and no answer.
async fn origin_giving_up_on_posts(wait: Duration) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let end = loop {
                        if let Some(i) = find(&buf, b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    if buf.starts_with(b"POST") {
                        tokio::time::sleep(wait).await;
                        return;
                    }
                    buf.drain(..end);
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if s.write_all(ok).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A proxy for `app.test` in front of the one server `o` (`max_fails = 2`, 60 s out), with a
/// 10 s header timeout and a 30 s idle timeout: room for the upload tests' bodies.
async fn upload_proxy(o: std::net::SocketAddr) -> Proxy {
    Proxy::start(config(&format!(
        r#"
[[upstreams]]
name = "app"
servers = ["{o}"]
max_fails = 2
fail_timeout_secs = 60

[[routes]]
host = "app.test"
path = "/"
upstream = "app"
header_timeout_secs = 10
idle_timeout_secs = 30
"#
    )))
    .await
}

/// A POST of `total` bytes to `host`, written as `piece` bytes every `every` (after the head,
/// which carries the first byte): the status line of sluice's answer, or what came within 6 s.
async fn upload(
    addr: std::net::SocketAddr,
    host: &str,
    total: usize,
    piece: usize,
    every: Duration,
) -> String {
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut r, mut w) = s.into_split();
    let head = format!("POST /up HTTP/1.1\r\nHost: {host}\r\nContent-Length: {total}\r\n\r\na");
    w.write_all(head.as_bytes()).await.unwrap();
    let writer = tokio::spawn(async move {
        let chunk = vec![b'a'; piece];
        let mut sent = 1;
        while sent < total {
            tokio::time::sleep(every).await;
            let n = piece.min(total - sent);
            if w.write_all(&chunk[..n]).await.is_err() {
                return;
            }
            sent += n;
        }
    });
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(6), async {
        let mut chunk = [0u8; 1024];
        while find(&out, b"\r\n").is_none() {
            match r.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    writer.abort();
    let text = String::from_utf8_lossy(&out).into_owned();
    text.lines().next().unwrap_or("").to_string()
}

/// A POST of 100000 bytes to `host` that trickles one byte every 300 ms (well inside the idle
/// timeout).
async fn trickled_upload(addr: std::net::SocketAddr, host: &str) -> String {
    upload(addr, host, 100_000, 1, Duration::from_millis(300)).await
}

/// Finding: a server that gave up on an upload still coming from the client (its own worker
/// timeout: closed or reset without an answer) was booked a failure, since only sluice's own
/// header timeout looked at whether the body was waiting for the client. A few uploads
/// trickled under the idle timeout per server ejected every one, for everyone. The failure of
/// a server while the body waits for the client now ends the request (502) and books nothing.
#[tokio::test]
async fn a_server_giving_up_on_a_trickled_upload_is_not_ejected() {
    let o = origin_giving_up_on_posts(Duration::from_secs(1)).await;
    let p = upload_proxy(o).await;
    // Three at once, as an attacker would send them: more than `max_fails`.
    let uploads: Vec<_> = (0..3)
        .map(|_| tokio::spawn(trickled_upload(p.addr, "app.test")))
        .collect();
    for u in uploads {
        let status = u.await.unwrap();
        assert!(status.starts_with("HTTP/1.1 502"), "{status:?}");
    }
    let groups = p.app.groups().current();
    let server = &groups.get("app").unwrap().servers()[0];
    assert_eq!(server.failures(), 0);
    assert!(!server.is_ejected());
    let r = get(&p.url("/after"), &[("host", "app.test")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body.as_ref().unwrap().as_ref(), b"ok");
    let m = metrics(&p).await;
    let line = format!("sluice_upstream_server_ejections_total{{group=\"app\",server=\"{o}\"}} 0");
    assert!(m.lines().any(|l| l == line), "{line} not in {m}");
    assert!(
        !m.lines()
            .any(|l| l.starts_with("sluice_reverse_server_failures_total{") && !l.ends_with(" 0")),
        "{m}"
    );
}

/// A POST of 1 MB to `host` streamed steadily, 16 KiB every 2 ms (slower than the loopback
/// link, so sluice's reads nearly always wait on the client, as over a real client's link).
async fn streamed_upload(addr: std::net::SocketAddr, host: &str) -> String {
    upload(addr, host, 1024 * 1024, 16 * 1024, Duration::from_millis(2)).await
}

/// Finding: the server's error was laid to the client whenever sluice's last read of the body
/// waited for the client's bytes, which is nearly always while a client is slower than the
/// upstream link: a server resetting every upload at once was never booked, never ejected.
/// Only a body stalled on its client for a real while (half a second of waits in all) excuses the
/// server now: `max_fails` steadily streamed uploads that it resets eject it.
#[tokio::test]
async fn a_server_resetting_steady_uploads_is_ejected() {
    uploads_eject(Duration::ZERO, streamed_upload).await;
}

/// Review: the first mend counted the client's waits in all, so after half a second every
/// upload from a client slower than the link looked stalled, and a server breaking such an
/// upload a second in (a full disk) was never booked. An upload coming at a link's pace (4 KiB
/// every 5 ms, ~800 KB/s, for a second and more) that the server breaks is booked now.
#[tokio::test]
async fn a_server_breaking_a_long_steady_upload_is_ejected() {
    async fn long_upload(addr: std::net::SocketAddr, host: &str) -> String {
        upload(addr, host, 1024 * 1024, 4096, Duration::from_millis(5)).await
    }
    uploads_eject(Duration::from_secs(1), long_upload).await;
}

/// Two uploads, each a `502` when a server (`max_fails = 2`) gives up on it after `wait`, book
/// two failures and eject the server: the next request finds none.
async fn uploads_eject<F, Fut>(wait: Duration, upload: F)
where
    F: Fn(std::net::SocketAddr, &'static str) -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let o = origin_giving_up_on_posts(wait).await;
    let p = upload_proxy(o).await;
    for _ in 0..2 {
        let status = upload(p.addr, "app.test").await;
        assert!(status.starts_with("HTTP/1.1 502"), "{status:?}");
    }
    let groups = p.app.groups().current();
    let server = &groups.get("app").unwrap().servers()[0];
    assert_eq!(server.failures(), 2);
    assert!(server.is_ejected());
    assert_eq!(server.ejections(), 1);
    // Ejected, the group's one server is still tried (passive ejection alone never empties a
    // group: `Group::plan`), and the GET it answers ends its ejection.
    let r = get(&p.url("/after"), &[("host", "app.test")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(server.is_usable());
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

/// Finding: `X_Forwarded_For`, `Transfer_Encoding`... (underscore twins that CGI-style backends
/// merge with the real fields), the method and URL overrides, the client's own `X-Real-IP` and
/// the purge key reached the origin. On the fast path (GET) and through hyper (POST).
#[tokio::test]
async fn underscore_twins_overrides_real_ip_and_purge_key_stay_here() {
    let (o, seen) = counted_echo().await;
    let p = Proxy::start(config(&format!(
        r#"
[[upstreams]]
name = "app"
servers = ["{o}"]

[[routes]]
host = "strict.test"
path = "/"
upstream = "app"

[[routes]]
host = "open.test"
path = "/"
upstream = "app"
underscores_in_headers = true
override_headers = true
"#
    )))
    .await;
    let hostile = "X_Forwarded_For: 6.6.6.6\r\nX_Forwarded_Host: evil.test\r\n\
                   Transfer_Encoding: chunked\r\nContent_Length: 5\r\nX-Real-IP: 6.6.6.6\r\n\
                   X-Original-URL: /admin\r\nX-Rewrite-URL: /admin\r\n\
                   X-HTTP-Method-Override: DELETE\r\nX-Purge-Key: purge-secret\r\n";
    let dropped = [
        "x_forwarded_for",
        "x_forwarded_host",
        "transfer_encoding",
        "content_length",
        "x-original-url",
        "x-rewrite-url",
        "x-http-method-override",
        "x-purge-key",
    ];
    for host in ["strict.test", "open.test"] {
        for method in ["GET", "POST"] {
            let req = format!(
                "{method} /h HTTP/1.1\r\nHost: {host}\r\n{hostile}Content-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let reply = raw(p.addr, req.as_bytes(), Duration::from_secs(5)).await;
            assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
            let report = seen.lock().unwrap().pop().unwrap();
            let fields: Vec<(String, String)> = report["headers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_str().unwrap().into(), p[1].as_str().unwrap().into()))
                .collect();
            let value = |n: &str| {
                let all: Vec<&str> = fields
                    .iter()
                    .filter(|(k, _)| k == n)
                    .map(|(_, v)| v.as_str())
                    .collect();
                assert!(all.len() <= 1, "{n} twice: {fields:?}");
                all.first().map(|v| v.to_string())
            };
            assert_eq!(
                value("x-real-ip").as_deref(),
                Some("127.0.0.1"),
                "{fields:?}"
            );
            assert_eq!(value("x-forwarded-for").as_deref(), Some("127.0.0.1"));
            assert_eq!(value("x-purge-key"), None, "{fields:?}");
            if host == "strict.test" {
                for name in dropped {
                    assert_eq!(
                        value(name),
                        None,
                        "{host} {method}: {name} reached the origin"
                    );
                }
            } else {
                // The route's opt-ins pass them.
                assert_eq!(value("x_forwarded_for").as_deref(), Some("6.6.6.6"));
                assert_eq!(value("x-http-method-override").as_deref(), Some("DELETE"));
                assert_eq!(value("x-original-url").as_deref(), Some("/admin"));
            }
        }
    }
}

/// The other proxies' forwarding fields sluice does not write itself.
const PROXY_FIELDS: [&str; 8] = [
    "x-forwarded-scheme",
    "x-forwarded-port",
    "x-forwarded-ssl",
    "x-forwarded-prefix",
    "x-forwarded-server",
    "x-host",
    "x-original-host",
    "front-end-https",
];

/// The fields of an echo report, lowercase names, in order.
fn report_fields(report: &serde_json::Value) -> Vec<(String, String)> {
    report["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_str().unwrap().into(), p[1].as_str().unwrap().into()))
        .collect()
}

/// Finding: a client's `X-Forwarded-Scheme`, `-Port`, `-Ssl`, `-Prefix`, `-Server`, `X-Host`,
/// `X-Original-Host` and `Front-End-Https` reached the origin, though no cache key holds them
/// (Rack reads `X-Forwarded-Scheme` before `X-Forwarded-Proto`). Now they go from an untrusted
/// peer's request on the HTTP/1.1 fast path (GET), through hyper (POST) and over HTTP/2 (the h2
/// fast exchange), and a trusted proxy's pass.
#[tokio::test]
async fn other_proxies_forwarding_fields_pass_only_from_a_trusted_proxy() {
    let (o, seen) = counted_echo().await;
    let routes = format!(
        r#"
[[upstreams]]
name = "app"
servers = ["{o}"]

[[routes]]
path = "/"
upstream = "app"
"#
    );
    let untrusted = Proxy::start(config(&routes)).await;
    let trusted = Proxy::start(config(&format!(
        "{routes}\n[auth]\ntrusted_proxies = [\"127.0.0.1/32\"]\n"
    )))
    .await;
    let hostile: String = PROXY_FIELDS
        .iter()
        .map(|n| format!("{n}: evil\r\n"))
        .collect();
    for (p, kept) in [(&untrusted, false), (&trusted, true)] {
        let mut reports = Vec::new();
        for method in ["GET", "POST"] {
            let req = format!(
                "{method} /h HTTP/1.1\r\nHost: a.test\r\n{hostile}Content-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let reply = raw(p.addr, req.as_bytes(), Duration::from_secs(5)).await;
            assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
            reports.push((method, seen.lock().unwrap().pop().unwrap()));
        }
        let mut h2 = h2_client(p.addr).await;
        let mut req = http::Request::builder().uri(format!("http://{}/h", p.addr));
        for n in PROXY_FIELDS {
            req = req.header(n, "evil");
        }
        let resp = tokio::time::timeout(
            Duration::from_secs(5),
            h2.send_request(req.body(full("")).unwrap()),
        )
        .await
        .expect("answered in time")
        .unwrap();
        assert_eq!(resp.status(), 200);
        let _ = resp.into_body().collect().await.unwrap();
        reports.push(("h2 GET", seen.lock().unwrap().pop().unwrap()));
        for (how, report) in reports {
            let fields = report_fields(&report);
            for n in PROXY_FIELDS {
                let got = fields.iter().any(|(k, v)| k == n && v == "evil");
                assert_eq!(got, kept, "{how} trusted={kept}: {n}: {fields:?}");
            }
        }
    }
}

/// Finding: the attack the fields above made. On a `force_ssl` origin (Rack), one request with
/// `X-Forwarded-Scheme: http` got a `301` to the same URL, which was stored for everyone: every
/// later client looped on the redirect. Now the field never reaches the origin: the plain client
/// gets the page.
#[tokio::test]
async fn a_forwarded_scheme_cannot_store_a_redirect_for_everyone() {
    let origin_addr = origin(|req: http::Request<hyper::body::Incoming>| async move {
        let b = http::Response::builder().header("cache-control", "public, max-age=3600");
        let scheme = req.headers().get("x-forwarded-scheme");
        if scheme.is_some_and(|v| v == "http") {
            b.status(301)
                .header("location", "https://shop.test/")
                .body(full(""))
                .unwrap()
        } else {
            b.body(full("the shop")).unwrap()
        }
    })
    .await;
    let p = Proxy::start(caching(origin_addr, "", "")).await;
    for (path, h2) in [("/", false), ("/h2", true)] {
        if h2 {
            let mut c = h2_client(p.addr).await;
            let req = http::Request::builder()
                .uri(format!("http://{}{path}", p.addr))
                .header("x-forwarded-scheme", "http")
                .body(full(""))
                .unwrap();
            let resp = c.send_request(req).await.unwrap();
            let _ = resp.into_body().collect().await;
        } else {
            let attack = format!(
                "GET {path} HTTP/1.1\r\nHost: {}\r\nX-Forwarded-Scheme: http\r\nConnection: close\r\n\r\n",
                p.addr
            );
            raw(p.addr, attack.as_bytes(), Duration::from_secs(5)).await;
        }
        let plain = get(&p.url(path), &[]).await;
        assert_eq!(plain.status, StatusCode::OK, "{path}: {:?}", plain.headers);
        assert_eq!(plain.body.as_deref().unwrap(), b"the shop");
    }
}

/// One request a caching origin answered.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    target: String,
    headers: http::HeaderMap,
}

const OBJ_ETAG: &str = "\"e1\"";
const BIG: usize = 3 << 20;

/// An origin for caching routes. GET/HEAD: `/big` is 3 MiB of pattern bytes, `/personal` greets
/// the request's `Cookie`, anything else is `body of <target> for <host>`; every answer is fresh
/// for an hour with an ETag, honours one `Range` and `If-None-Match`. Any other method: 200.
async fn cache_origin() -> (std::net::SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let big = pattern(BIG);
    let addr = origin(move |req: http::Request<hyper::body::Incoming>| {
        let (s, big) = (s.clone(), big.clone());
        async move {
            let target = req
                .uri()
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_string();
            s.lock().unwrap().push(Seen {
                method: req.method().to_string(),
                target: target.clone(),
                headers: req.headers().clone(),
            });
            let h = req.headers();
            if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
                return http::Response::new(full(format!("{} done", req.method())));
            }
            let text = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).unwrap_or("");
            let body = match req.uri().path() {
                "/big" => big,
                "/slow-private" => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    bytes::Bytes::from(format!("private for {}", text("authorization")))
                }
                "/personal" => bytes::Bytes::from(format!("hello {}", text("cookie"))),
                _ => bytes::Bytes::from(format!("body of {target} for {}", text("host"))),
            };
            let b = http::Response::builder()
                .header("cache-control", "max-age=3600")
                .header("etag", OBJ_ETAG)
                .header("content-type", "text/plain");
            if text("if-none-match") == OBJ_ETAG {
                return b.status(304).body(full("")).unwrap();
            }
            let len = body.len();
            let range = text("range")
                .strip_prefix("bytes=")
                .and_then(|r| r.split_once('-'))
                .and_then(|(a, z)| {
                    let a: usize = a.parse().ok()?;
                    let z: usize = if z.is_empty() {
                        len - 1
                    } else {
                        z.parse().ok()?
                    };
                    (a < len).then_some((a, z.min(len - 1)))
                });
            match range {
                Some((a, z)) => b
                    .status(206)
                    .header("content-range", format!("bytes {a}-{z}/{len}"))
                    .body(full(body.slice(a..=z)))
                    .unwrap(),
                None => b.body(full(body)).unwrap(),
            }
        }
    })
    .await;
    (addr, seen)
}

fn caching(o: std::net::SocketAddr, extra_route: &str, extra: &str) -> sluice::config::Config {
    config(&format!(
        r#"
[[upstreams]]
name = "app"
servers = ["{o}"]

[[routes]]
path = "/"
upstream = "app"
cache = true
{extra_route}

[cache]
memory_bytes = "64MiB"
slice_bytes = "1MiB"
purge_key = "purge-secret"
{extra}
"#
    ))
}

/// Requests of `method` for `target` the origin saw, and how many of those were conditional.
fn count(seen: &Mutex<Vec<Seen>>, method: &str, target: &str) -> (usize, usize) {
    let seen = seen.lock().unwrap();
    let of: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.method == method && s.target == target)
        .collect();
    let conditional = of
        .iter()
        .filter(|s| s.headers.contains_key("if-none-match"))
        .count();
    (of.len(), conditional)
}

/// Finding: any unsafe method (`POST`, `FOO`, lowercase `purge`) evicted a cached object without
/// the purge key, and a lowercase `purge` went to the origin with the client's `X-Purge-Key`.
/// Now: methods are case-sensitive (`purge` is an unknown method, forwarded without the key), and
/// only a successful unsafe request invalidates, by marking the object stale (RFC 9111 §4.4): the
/// next reader revalidates (304) instead of refetching.
#[tokio::test]
async fn unsafe_methods_mark_stale_and_lowercase_purge_is_not_purge() {
    let (o, seen) = cache_origin().await;
    let p = Proxy::start(caching(o, "", "")).await;
    let url = p.url("/obj/a");
    let expect = format!("body of /obj/a for {}", p.addr);
    let r = get(&url, &[]).await;
    assert_eq!(r.body.as_ref().unwrap().as_ref(), expect.as_bytes());
    let r = get(&url, &[]).await;
    assert_eq!(r.body.as_ref().unwrap().as_ref(), expect.as_bytes());
    assert_eq!(count(&seen, "GET", "/obj/a"), (1, 0), "not a hit");
    // `PURGE` without the key: refused, the object stays.
    let r = send("PURGE", &url, &[], full("")).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    get(&url, &[]).await;
    assert_eq!(count(&seen, "GET", "/obj/a"), (1, 0));
    for method in ["purge", "POST", "FOO"] {
        let r = send(method, &url, &[("x-purge-key", "purge-secret")], full("")).await;
        assert_eq!(r.status, StatusCode::OK, "{method}");
        assert_eq!(
            r.body.as_ref().unwrap().as_ref(),
            format!("{method} done").as_bytes(),
            "{method} was not forwarded"
        );
        let last = seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!(last.method, method);
        assert!(
            !last.headers.contains_key("x-purge-key"),
            "{method} carried the purge key upstream"
        );
        let before = count(&seen, "GET", "/obj/a");
        let r = get(&url, &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body.as_ref().unwrap().as_ref(), expect.as_bytes());
        let after = count(&seen, "GET", "/obj/a");
        // One conditional request, answered 304: the object was marked, not dropped.
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (1, 1),
            "{method}: {after:?}"
        );
    }
}

/// Finding: `bytes=0-` 32 times turned a 3 MiB cached object into a 100 MB answer. Ranges are
/// coalesced, and a set whose parts cost as much as the whole gets the whole (200).
#[tokio::test]
async fn range_sets_cannot_amplify() {
    let (o, _seen) = cache_origin().await;
    let p = Proxy::start(caching(o, "", "")).await;
    let big = pattern(BIG);
    let url = p.url("/big");
    let r = get(&url, &[]).await;
    assert_eq!(sha256(r.body.as_ref().unwrap()), sha256(&big));
    let many = format!("bytes={}", vec!["0-"; 32].join(","));
    let r = get(&url, &[("range", &many)]).await;
    assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        r.headers["content-range"],
        format!("bytes 0-{}/{BIG}", BIG - 1)
    );
    assert_eq!(sha256(r.body.as_ref().unwrap()), sha256(&big));
    // Overlapping ranges in any order: one part.
    let r = get(&url, &[("range", "bytes=500-999,0-499,100-200")]).await;
    assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(r.headers["content-range"], format!("bytes 0-999/{BIG}"));
    assert_eq!(r.body.as_ref().unwrap().as_ref(), &big[..1000]);
    // Two disjoint halves: the whole, as a 200.
    let halves = format!("bytes=0-{},{}-", BIG / 2 - 2, BIG / 2);
    let r = get(&url, &[("range", &halves)]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(sha256(r.body.as_ref().unwrap()), sha256(&big));
    // A small disjoint set is still answered in parts.
    let r = get(&url, &[("range", "bytes=0-9,100-109")]).await;
    assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
    let body = r.body.as_ref().unwrap();
    assert!(body.len() < 500, "{}", body.len());
}

/// Finding: responses to requests carrying `Cookie` were stored, the set-up for web cache
/// deception: a victim's personalised page was served to the next client. Not stored unless the
/// route opts in (`cache_cookies = true`).
#[tokio::test]
async fn responses_to_cookie_requests_are_not_stored() {
    let (o, seen) = cache_origin().await;
    let p = Proxy::start(caching(o, "", "")).await;
    let url = p.url("/personal");
    let r = get(&url, &[("cookie", "user=victim")]).await;
    assert_eq!(r.body.as_ref().unwrap().as_ref(), b"hello user=victim");
    let r = get(&url, &[]).await;
    assert_eq!(
        r.body.as_ref().unwrap().as_ref(),
        b"hello ",
        "a victim's page was served"
    );
    // A cookie-less answer is stored, and served to anyone, with or without cookies.
    let r = get(&url, &[("cookie", "user=other")]).await;
    assert_eq!(r.body.as_ref().unwrap().as_ref(), b"hello ");
    assert_eq!(count(&seen, "GET", "/personal").0, 2);
    // The opt-in stores them.
    let (o, seen) = cache_origin().await;
    let p = Proxy::start(caching(o, "cache_cookies = true", "")).await;
    let url = p.url("/personal");
    get(&url, &[("cookie", "user=a")]).await;
    let r = get(&url, &[]).await;
    assert_eq!(r.body.as_ref().unwrap().as_ref(), b"hello user=a");
    assert_eq!(count(&seen, "GET", "/personal").0, 1);
}

/// Checked with the cookie finding: an answer to a request with `Authorization` is not stored
/// (RFC 9111 §3.5), but a request without it that joined its fetch could be handed that answer
/// (when the request that started the fetch was gone, or simply slower to take it). Only the
/// request that started a fetch gets its unstorable answer; the others ask the origin.
#[tokio::test]
async fn an_unstorable_answer_goes_only_to_the_request_that_fetched_it() {
    let (o, seen) = cache_origin().await;
    let p = Proxy::start(caching(o, "", "")).await;
    let url = p.url("/slow-private");
    // Alice starts the fetch (the origin takes 300 ms) over HTTP/2 and gives up after 150 ms.
    let tcp = TcpStream::connect(p.addr).await.unwrap();
    let (mut h2, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let alice = h2.send_request(
        http::Request::builder()
            .uri(&url)
            .header("authorization", "Bearer alice")
            .body(full(""))
            .unwrap(),
    );
    let others = async {
        // The others arrive while alice's fetch is under way.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let all = (0..3).map(|_| get(&url, &[]));
        futures_util::future::join_all(all).await
    };
    let (gave_up, others) = tokio::join!(
        tokio::time::timeout(Duration::from_millis(150), alice),
        others
    );
    assert!(gave_up.is_err(), "alice was answered before giving up");
    for r in others {
        assert_eq!(
            r.body.as_ref().unwrap().as_ref(),
            b"private for ",
            "another request's private answer was handed out"
        );
    }
    assert_eq!(count(&seen, "GET", "/slow-private").0, 4);
}

/// Finding: an unparsable right-most `X-Forwarded-For` hop (`unknown`, `IP:port`) made the
/// trusted proxy itself the client, which passed `purge_allow` behind a same-host proxy. Hops
/// with a port are read; anything else leaves the client unknown, and refused.
#[tokio::test]
async fn unreadable_forwarded_for_is_no_client() {
    let (o, _seen) = cache_origin().await;
    let p = Proxy::start(caching(
        o,
        "",
        "purge_allow = [\"127.0.0.1/32\"]\n\n[auth]\ntrusted_proxies = [\"127.0.0.1/32\"]",
    ))
    .await;
    let url = p.url("/obj/p");
    get(&url, &[]).await;
    let purge = |xff: &'static str| {
        let url = url.clone();
        async move {
            let mut h = vec![("x-purge-key", "purge-secret")];
            if !xff.is_empty() {
                h.push(("x-forwarded-for", xff));
            }
            send("PURGE", &url, &h, full("")).await.status
        }
    };
    for refused in [
        "unknown",
        "127.0.0.1:port",
        "1.2.3.4:80",
        "[::1",
        "127.0.0.1, _x",
    ] {
        assert_eq!(purge(refused).await, StatusCode::FORBIDDEN, "{refused}");
    }
    // `IP:port` of an allowed address, and no chain at all (the trusted peer is the client).
    assert_eq!(purge("127.0.0.1:5555").await, StatusCode::OK);
    assert_eq!(purge("").await, StatusCode::OK);
}

/// Finding: the cache key `route|host|target` was ambiguous when the host held `|`: a request
/// with `Host: shop.test|/y` for `/z` was stored under the key of `shop.test`'s `/y|/z`. Such a
/// host is refused now, and the key's fields are length-prefixed.
#[tokio::test]
async fn a_host_cannot_reach_into_another_cache_key() {
    let (o, seen) = cache_origin().await;
    let p = Proxy::start(caching(o, "", "")).await;
    let poison = raw(
        p.addr,
        b"GET /z HTTP/1.1\r\nHost: shop.test|/y\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(poison.starts_with("HTTP/1.1 400"), "{poison}");
    let victim = raw(
        p.addr,
        b"GET /y|/z HTTP/1.1\r\nHost: shop.test\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(victim.starts_with("HTTP/1.1 200"), "{victim}");
    assert!(victim.ends_with("body of /y|/z for shop.test"), "{victim}");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

/// Also found: on a caching route the access log said 0 bytes for every answer, and cached
/// answers carried no `Via` while relayed ones did. Both paths: the HTTP/1.1 fast path (GET) and
/// hyper's (HTTP/2).
#[tokio::test]
async fn cached_answers_carry_via_and_log_their_bytes() {
    let (o, _seen) = cache_origin().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let mut c = caching(o, "", "");
    c.reverse.access_log = log.display().to_string();
    let p = Proxy::start(c).await;
    let big = pattern(BIG);
    // Miss then hit, on the fast path.
    for _ in 0..2 {
        let r = get(&p.url("/big"), &[]).await;
        assert_eq!(r.headers["via"], "1.1 sluice");
        assert_eq!(sha256(r.body.as_ref().unwrap()), sha256(&big));
    }
    // A hit through hyper (HTTP/2).
    let tcp = TcpStream::connect(p.addr).await.unwrap();
    let (mut h2, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let resp = h2
        .send_request(
            http::Request::builder()
                .uri(format!("http://{}/big", p.addr))
                .body(full(""))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.headers()["via"], "1.1 sluice");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(sha256(&body), sha256(&big));
    // Three lines, each with the bytes sent.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let lines = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if lines.len() >= 3 || std::time::Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(lines.len(), 3, "{lines:?}");
    for l in &lines {
        assert_eq!(l["status"], 200, "{l}");
        assert_eq!(l["bytes"], BIG as u64, "{l}");
    }
}

/// A client that sends half a request head and stops does not hold a graceful shutdown: the
/// drain closes it at once instead of waiting for the header timeout (30 s) or the grace (20 s).
#[tokio::test]
async fn a_half_sent_head_does_not_hold_the_drain() {
    let config = route_config(
        echo("o").await,
        "shutdown_grace_secs = 20\nheader_read_timeout_secs = 30",
    );
    let (addr, stop, done) = serve_until_stopped(&config).await;
    // A whole request first, so the connection is on the fast path's loop, then half a head.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /a HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut got = vec![0u8; 4096];
    let n = s.read(&mut got).await.unwrap();
    assert!(
        got[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&got[..n])
    );
    s.write_all(b"GET /b HTTP/1.1\r\nHost: loc").await.unwrap();
    // A fresh connection with half a head from the start.
    let mut fresh = TcpStream::connect(addr).await.unwrap();
    fresh.write_all(b"GET /c HTTP/1.1\r\nHo").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(5), done)
        .await
        .expect("the drain did not wait for the half-sent heads")
        .unwrap();
    // Both connections were closed by the server (whatever the first had buffered before).
    for conn in [&mut s, &mut fresh] {
        let mut rest = Vec::new();
        let end = tokio::time::timeout(Duration::from_secs(2), conn.read_to_end(&mut rest)).await;
        assert!(end.is_ok(), "the connection was closed");
    }
}

/// sluice with one reverse route to `o`, the HTTP/1.1 fast path on or off, and `server` as more
/// `[server]` lines.
async fn proxy_to(o: std::net::SocketAddr, fast: bool, server: &str) -> Proxy {
    Proxy::start(route_config(o, &format!("h1_fast_path = {fast}\n{server}"))).await
}

/// A request head over `server.max_header_bytes` is answered 431 and reaches no origin, however it
/// arrives: whole in one write (one read could bring more than the limit, and the fast path served
/// such a head), or without its end; on the fast path and under hyper alike (hyper's own limit
/// cannot go below 8 KiB, so a 3 KB head passed there at a 2 KiB limit). A head at the limit is
/// served.
#[tokio::test]
async fn a_head_over_the_limit_is_431_however_it_arrives() {
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let o = {
        let seen = seen.clone();
        origin(move |_req: http::Request<hyper::body::Incoming>| {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move { http::Response::new(full("ok")) }
        })
        .await
    };
    let head = |len: usize, end: bool| {
        let mut h = b"GET /a HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nX-Pad: ".to_vec();
        h.resize(len - 4, b'p');
        if end {
            h.extend_from_slice(b"\r\n\r\n");
        }
        h
    };
    for fast in [true, false] {
        let p = proxy_to(o, fast, "max_header_bytes = 2048").await;
        // (Each at most one first read, so the server reads all of it: a close with bytes left
        // unread would be a reset that could take the 431 with it.)
        for (len, end) in [(3000, true), (2049, true), (4000, false), (2500, false)] {
            let mut s = TcpStream::connect(p.addr).await.unwrap();
            s.set_nodelay(true).unwrap();
            s.write_all(&head(len, end)).await.unwrap();
            let mut out = Vec::new();
            let closed =
                tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
            let text = String::from_utf8_lossy(&out);
            assert!(
                text.starts_with("HTTP/1.1 431"),
                "fast path {fast}, {len} bytes, whole {end}: {text}"
            );
            assert!(
                closed.is_ok(),
                "fast path {fast}, {len}: connection left open"
            );
        }
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 0);
        // At the limit: served.
        let r = raw(p.addr, &head(2048, true), Duration::from_secs(5)).await;
        assert!(r.starts_with("HTTP/1.1 200"), "fast path {fast}: {r}");
        assert_eq!(seen.swap(0, std::sync::atomic::Ordering::SeqCst), 1);
    }
}

/// A connection's first head has `server.header_read_timeout_secs` from the connection's accept,
/// as the wait for its first byte had: a client that sends its first byte just before the limit
/// and then trickles the rest is cut at the limit, not at twice it (the fast path restarted the
/// clock at the first byte). Under hyper alike.
#[tokio::test]
async fn a_first_head_has_the_header_timeout_from_accept() {
    let o = echo("o").await;
    for fast in [true, false] {
        let p = proxy_to(o, fast, "header_read_timeout_secs = 2").await;
        let mut s = TcpStream::connect(p.addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        let accepted = std::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        s.write_all(b"GET /a HTTP/1.1\r\n").await.unwrap();
        // A byte of a field every 200 ms until the server closes (bounded: 30 bytes, 6 s).
        let mut closed_at = None;
        for _ in 0..30 {
            let mut byte = [0u8; 64];
            match tokio::time::timeout(Duration::from_millis(200), s.read(&mut byte)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    closed_at = Some(accepted.elapsed());
                    break;
                }
                Ok(Ok(n)) => panic!("fast path {fast}: answered {:?}", &byte[..n]),
                Err(_) => {}
            }
            if s.write_all(b"x").await.is_err() {
                closed_at = Some(accepted.elapsed());
                break;
            }
        }
        let took = closed_at.unwrap_or_else(|| panic!("fast path {fast}: never closed"));
        assert!(
            took >= Duration::from_millis(1900) && took < Duration::from_millis(2900),
            "fast path {fast}: closed {took:?} after accept (limit 2 s)"
        );
    }
}

/// An origin that reads each request's body, answers `ok`, and records the paths it was asked
/// for, in order.
async fn path_recording_origin() -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let o = {
        let seen = seen.clone();
        origin(move |req: http::Request<hyper::body::Incoming>| {
            seen.lock().unwrap().push(req.uri().path().to_string());
            async move {
                let _ = req.into_body().collect().await;
                http::Response::new(full("ok"))
            }
        })
        .await
    };
    (o, seen)
}

/// A request asking for an upgrade the origin does not take leaves an HTTP/1.1 connection whose
/// next heads are screened like the first: a client cannot turn the smuggling screen or the head
/// limit off by asking for one (the screen stopped following a connection after any such request,
/// so a `Content-Length` + `Transfer-Encoding` head behind it reached the origin and a head over
/// `server.max_header_bytes` was served). When the next request comes in the same write, it is
/// held, not passed on, until the upgrade request is answered. Taken upgrades: the WebSocket test
/// in reverse.rs.
#[tokio::test]
async fn an_upgrade_not_taken_leaves_the_screen_on() {
    let (o, seen) = path_recording_origin().await;
    let upgrade =
        b"GET /up HTTP/1.1\r\nHost: localhost\r\nUpgrade: foo\r\nConnection: upgrade\r\n\r\n";
    let smuggle = b"POST /next HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\
                    Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    let mut large = b"GET /large HTTP/1.1\r\nHost: localhost\r\nX-Pad: ".to_vec();
    large.resize(3000, b'p');
    large.extend_from_slice(b"\r\n\r\n");
    for fast in [true, false] {
        let p = proxy_to(o, fast, "max_header_bytes = 2048").await;
        for (next, status, together) in [
            (&smuggle[..], "400", false),
            (&smuggle[..], "400", true),
            (&large[..], "431", false),
            (&large[..], "431", true),
        ] {
            seen.lock().unwrap().clear();
            let mut s = TcpStream::connect(p.addr).await.unwrap();
            s.set_nodelay(true).unwrap();
            let mut first = upgrade.to_vec();
            if together {
                first.extend_from_slice(next);
            }
            s.write_all(&first).await.unwrap();
            let mut out = Vec::new();
            // The upgrade request's answer (not a switch), whole, before the next is sent.
            while !String::from_utf8_lossy(&out).contains("\r\n\r\nok") {
                let mut buf = [0u8; 4096];
                let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
                    .await
                    .expect("an answer to the upgrade request")
                    .unwrap();
                assert!(
                    n > 0,
                    "fast {fast}: closed after {:?}",
                    String::from_utf8_lossy(&out)
                );
                out.extend_from_slice(&buf[..n]);
            }
            let text = String::from_utf8_lossy(&out).to_string();
            assert!(text.starts_with("HTTP/1.1 200"), "fast {fast}: {text}");
            out.clear();
            if !together {
                s.write_all(next).await.unwrap();
            }
            let closed =
                tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
            assert!(
                closed.is_ok(),
                "fast {fast}, together {together}: left open"
            );
            let text = String::from_utf8_lossy(&out);
            // Refused and closed. Sent in the same write, hyper closes without an answer (as for
            // any head it refuses pipelined behind another).
            assert!(
                text.starts_with(&format!("HTTP/1.1 {status}")) || (together && text.is_empty()),
                "fast {fast}, together {together}: {text}"
            );
            assert_eq!(
                *seen.lock().unwrap(),
                vec!["/up".to_string()],
                "fast {fast}"
            );
        }
    }
}

/// A chunked body's trailer section ends where hyper's decoder ends it: a bare LF right after the
/// last chunk is trailer content to hyper, so the screen must not take it as the body's end (it
/// did: it then read a head hidden in the trailers, whose `Content-Length` covered the next
/// request, and let that request through unscreened).
#[tokio::test]
async fn a_bare_lf_does_not_end_the_trailers() {
    let (o, seen) = path_recording_origin().await;
    let smuggle = b"POST /s HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\
                    Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    let mut attack = b"POST /a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n\
                       0\r\n\nGET /x HTTP/1.1\r\nContent-Length: "
        .to_vec();
    attack.extend_from_slice(format!("{}\r\n\r\n", smuggle.len()).as_bytes());
    attack.extend_from_slice(smuggle);
    for fast in [true, false] {
        let p = proxy_to(o, fast, "").await;
        seen.lock().unwrap().clear();
        let r = raw(p.addr, &attack, Duration::from_secs(3)).await;
        let seen = seen.lock().unwrap().clone();
        // The first request is served (hyper takes the odd trailer lines), the one behind the
        // real end of its trailers is screened and refused.
        assert_eq!(
            seen,
            vec!["/a".to_string()],
            "fast {fast}: the request behind the trailers reached the origin: {r}"
        );
        assert!(
            r.starts_with("HTTP/1.1 200") && r.contains("\r\n\r\nokHTTP/1.1 400 "),
            "fast {fast}: {r}"
        );
    }
}

/// A client that leaves while its upgrade request waits for a slow origin is seen to leave, and
/// the origin request is dropped (the screen holds what follows an upgrade request until it is
/// answered, but still reads once, as hyper does, to see the connection end).
#[tokio::test]
async fn a_client_that_leaves_during_an_upgrade_request_cancels_it() {
    struct Flag(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let o = {
        let (dropped, started) = (dropped.clone(), started.clone());
        origin(move |_req: http::Request<hyper::body::Incoming>| {
            started.store(true, std::sync::atomic::Ordering::SeqCst);
            let flag = Flag(dropped.clone());
            async move {
                let _flag = flag;
                tokio::time::sleep(Duration::from_secs(20)).await;
                http::Response::new(full("late"))
            }
        })
        .await
    };
    for fast in [true, false] {
        let p = proxy_to(o, fast, "").await;
        dropped.store(false, std::sync::atomic::Ordering::SeqCst);
        started.store(false, std::sync::atomic::Ordering::SeqCst);
        let mut s = TcpStream::connect(p.addr).await.unwrap();
        s.write_all(b"GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n")
            .await
            .unwrap();
        // Until the origin has the request (bounded: 10 s).
        for _ in 0..200 {
            if started.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            started.load(std::sync::atomic::Ordering::SeqCst),
            "fast {fast}: never asked"
        );
        drop(s);
        let mut gone = false;
        for _ in 0..100 {
            if dropped.load(std::sync::atomic::Ordering::SeqCst) {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            gone,
            "fast {fast}: the origin request outlived its client by 10 s"
        );
    }
}
