//! Attacks on sluice's own HTTP/2 server, each against a running server with raw frames over
//! h2c: the rapid-reset flood (CVE-2023-44487) ends in GOAWAY `ENHANCE_YOUR_CALM`; a PING flood
//! from a client that never reads stops being read (memory stays bounded) while other clients are
//! served; streams past the limit are refused; a window pushed past 2^31 - 1 is a flow-control
//! error; an oversized head gets a 431; the request-body windows are the configured ones; a
//! `content-length` is one plain number held to the body; cancelling responses under way is not
//! a rapid reset; an oversized request trailer section is not passed on cut; cookie fields reach
//! an HTTP/1.1 origin as one line; an origin's connection-specific trailers are dropped; a stream
//! held at a one-byte window on a busy connection, even one opened a byte at a time, is reset at
//! the send timeout. (A
//! request body past its window: `server/http2`'s own tests, where the handler can be made never
//! to read.) After each, a fresh client is served.

mod reverse_support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use reverse_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const WINDOW_UPDATE: u8 = 8;
const END_STREAM: u8 = 1;
const END_HEADERS: u8 = 4;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK block for `GET http://localhost/` from static-table entries and one literal.
fn get_block() -> Vec<u8> {
    // :method GET (2), :scheme http (6), :path / (4), :authority literal "localhost" (name 1).
    let mut b = vec![0x82, 0x86, 0x84, 0x41, 9];
    b.extend_from_slice(b"localhost");
    b
}

fn post_block() -> Vec<u8> {
    // :method POST (3), :scheme http, :path /, :authority localhost.
    let mut b = vec![0x83, 0x86, 0x84, 0x41, 9];
    b.extend_from_slice(b"localhost");
    b
}

/// A connection past the preface and the empty SETTINGS.
async fn open(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    s.write_all(&hello).await.unwrap();
    s
}

/// Reads frames until one of `kind` arrives (its flags, stream and payload), the connection
/// closes, or `wait` passes.
async fn until(s: &mut TcpStream, kind: u8, wait: Duration) -> Option<(u8, u32, Vec<u8>)> {
    let read = async {
        loop {
            let mut head = [0u8; 9];
            s.read_exact(&mut head).await.ok()?;
            let len =
                (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            s.read_exact(&mut payload).await.ok()?;
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            if head[3] == kind {
                return Some((head[4], stream, payload));
            }
        }
    };
    tokio::time::timeout(wait, read).await.ok().flatten()
}

fn goaway_code(payload: &[u8]) -> u32 {
    u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]])
}

async fn proxy() -> (Proxy, SocketAddr) {
    proxy_with("h2_max_concurrent_streams = 10\nmax_header_bytes = 8192").await
}

/// sluice with `server` as its `[server]` lines, one reverse route to an echo origin.
async fn proxy_with(server: &str) -> (Proxy, SocketAddr) {
    let p = Proxy::start(route_config(echo("o").await, server)).await;
    let addr = p.addr;
    (p, addr)
}

/// A well-behaved client still gets its answer.
async fn still_served(addr: SocketAddr) {
    let mut client = h2_client(addr).await;
    let req = http::Request::get(format!("http://{addr}/after"))
        .body(full(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), client.send_request(req))
        .await
        .expect("answered in time")
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn rapid_reset_flood_ends_in_enhance_your_calm() {
    let (_p, addr) = proxy().await;
    let mut s = open(addr).await;
    let mut burst = Vec::new();
    for i in 0..400u32 {
        let id = 2 * i + 1;
        burst.extend(frame(HEADERS, END_STREAM | END_HEADERS, id, &get_block()));
        burst.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
    }
    let _ = s.write_all(&burst).await;
    let (_, _, payload) = until(&mut s, GOAWAY, Duration::from_secs(5))
        .await
        .expect("GOAWAY");
    assert_eq!(goaway_code(&payload), 0xb, "ENHANCE_YOUR_CALM");
    still_served(addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_flood_from_a_client_that_never_reads_is_not_buffered() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let (_p, addr) = proxy().await;
    let s = open(addr).await;
    let (_keep_reader, mut w) = s.into_split();
    let pings: Vec<u8> = (0..2000u64)
        .flat_map(|i| frame(PING, 0, 0, &i.to_be_bytes()))
        .collect();
    // Never read: the server's answers fill the sockets' buffers, then it must stop reading,
    // and these writes stop moving. Bounded: at most 12 s or 4,000 rounds.
    let written = Arc::new(AtomicU64::new(0));
    let count = written.clone();
    let flood = tokio::spawn(async move {
        for _ in 0..4000 {
            let mut at = 0;
            while at < pings.len() {
                match w.write(&pings[at..]).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        at += n;
                        count.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            }
        }
    });
    // Wait until the writes stop moving for a whole second (the buffers full).
    let mut last = u64::MAX;
    let mut stalled = false;
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = written.load(Ordering::Relaxed);
        if now == last {
            // Stopped short of the whole flood: the server stopped reading.
            stalled = !flood.is_finished();
            break;
        }
        last = now;
    }
    flood.abort();
    assert!(
        stalled,
        "the server kept reading a client that never read its answers ({last} bytes)"
    );
    still_served(addr).await;
}

#[tokio::test]
async fn streams_past_the_limit_are_refused() {
    let (_p, addr) = proxy().await;
    let mut s = open(addr).await;
    // Eleven POSTs left open (no END_STREAM) on a limit of ten.
    let mut burst = Vec::new();
    for i in 0..11u32 {
        burst.extend(frame(HEADERS, END_HEADERS, 2 * i + 1, &post_block()));
    }
    s.write_all(&burst).await.unwrap();
    let (_, stream, payload) = until(&mut s, RST_STREAM, Duration::from_secs(5))
        .await
        .expect("a reset");
    assert_eq!(stream, 21);
    assert_eq!(
        u32::from_be_bytes(payload[..4].try_into().unwrap()),
        7,
        "REFUSED_STREAM"
    );
    still_served(addr).await;
}

#[tokio::test]
async fn a_window_pushed_past_its_limit_is_a_flow_control_error() {
    let (_p, addr) = proxy().await;
    let mut s = open(addr).await;
    // Two increments that together take the connection's send window past 2^31 - 1.
    let mut two = frame(WINDOW_UPDATE, 0, 0, &0x7fff_0000u32.to_be_bytes());
    two.extend(frame(WINDOW_UPDATE, 0, 0, &0x7fff_0000u32.to_be_bytes()));
    s.write_all(&two).await.unwrap();
    let (_, _, payload) = until(&mut s, GOAWAY, Duration::from_secs(5))
        .await
        .expect("GOAWAY");
    assert_eq!(goaway_code(&payload), 0x3, "FLOW_CONTROL_ERROR");
    still_served(addr).await;
}

/// DATA, RST_STREAM and WINDOW_UPDATE on an even stream id (one only the server could open, and
/// sluice never pushes) end the connection with PROTOCOL_ERROR, below the highest stream opened
/// too (DATA there was answered with a reset, the others ignored).
#[tokio::test]
async fn frames_on_even_stream_ids_are_a_protocol_error() {
    let (_p, addr) = proxy().await;
    for (kind, payload) in [
        (DATA, vec![0u8; 10]),
        (RST_STREAM, 8u32.to_be_bytes().to_vec()),
        (WINDOW_UPDATE, 1u32.to_be_bytes().to_vec()),
    ] {
        let mut s = open(addr).await;
        let mut out = frame(HEADERS, END_STREAM | END_HEADERS, 1, &get_block());
        out.extend(frame(HEADERS, END_STREAM | END_HEADERS, 3, &get_block()));
        out.extend(frame(kind, 0, 2, &payload));
        s.write_all(&out).await.unwrap();
        let (_, _, payload) = until(&mut s, GOAWAY, Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("frame type {kind} on stream 2: no GOAWAY"));
        assert_eq!(
            goaway_code(&payload),
            0x1,
            "frame type {kind}: PROTOCOL_ERROR"
        );
    }
    still_served(addr).await;
}

/// The connection's request-body window is `server.h2_recv_window_bytes`, and each body's a
/// quarter of it, at least 64 KiB (one body nobody reads yet leaves the rest to the others),
/// also for h2c on a listener that does not start on the HTTP/1.1 fast path (`h1_fast_path =
/// false`): its first bytes send it to sluice's own HTTP/2 server there too (hyper's advertised
/// a window of its own).
#[tokio::test]
async fn the_request_body_window_is_the_configured_one() {
    // (Past it: `a_body_past_the_window_nobody_reads_is_a_flow_control_error` in
    // `server/http2`, where the handler can be made never to read.)
    for fast in [true, false] {
        let (_p, addr) = proxy_with(&format!(
            "h2_recv_window_bytes = 131072\nh1_fast_path = {fast}"
        ))
        .await;
        let mut s = open(addr).await;
        let (_, _, settings) = until(&mut s, SETTINGS, Duration::from_secs(5))
            .await
            .expect("the server's SETTINGS");
        let initial = settings
            .chunks(6)
            .find(|f| f[..2] == [0, 4])
            .map(|f| u32::from_be_bytes([f[2], f[3], f[4], f[5]]));
        assert_eq!(
            initial,
            Some(65_536),
            "SETTINGS_INITIAL_WINDOW_SIZE, fast path {fast}"
        );
        let (_, stream, update) = until(&mut s, WINDOW_UPDATE, Duration::from_secs(5))
            .await
            .expect("the connection's window");
        assert_eq!(stream, 0);
        assert_eq!(
            u32::from_be_bytes([update[0], update[1], update[2], update[3]]),
            131_072 - 65_535
        );
        drop(s);
        // A body of four connection windows and more reaches the origin whole: the windows are
        // given back as the body is read, in updates of a quarter window.
        let body = pattern(4 * 131_072 + 1_000);
        let mut client = h2_client(addr).await;
        let req = http::Request::post(format!("http://{addr}/up"))
            .body(full(body.clone()))
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(10), client.send_request(req))
            .await
            .expect("answered in time")
            .unwrap();
        assert_eq!(resp.status(), 200);
        let bytes = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        let report: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(report["len"], 4 * 131_072 + 1_000);
        assert_eq!(report["sha256"], sha256(&body));
        still_served(addr).await;
    }
}

#[tokio::test]
async fn an_oversized_head_gets_431() {
    let (_p, addr) = proxy().await;
    let mut s = open(addr).await;
    let mut block = get_block();
    // x-big: 10,000 bytes, a literal without indexing with a new name.
    block.extend([0x00, 5]);
    block.extend_from_slice(b"x-big");
    let value = vec![b'a'; 10_000];
    // 10,000 as an HPACK integer with a 7-bit prefix: 127, then 9,873 in 7-bit groups.
    block.extend([0x7f, 0x91, 0x4d]);
    block.extend_from_slice(&value);
    s.write_all(&frame(HEADERS, END_STREAM | END_HEADERS, 1, &block))
        .await
        .unwrap();
    let (flags, stream, payload) = until(&mut s, HEADERS, Duration::from_secs(5))
        .await
        .expect("an answer");
    assert_eq!(stream, 1);
    assert!(flags & END_STREAM != 0);
    // `:status 431` is not in the static table: a literal with `:status`'s name, its value
    // "431" plain or Huffman-coded.
    assert!(
        payload
            .windows(3)
            .any(|w| w == b"431" || w == [0x69, 0x90, 0xff]),
        "{payload:?}"
    );
    still_served(addr).await;
}

/// An HTTP/1.1 origin on raw bytes: for each request, the `content-length` and `cookie` lines of
/// its head as written, the body's length and SHA-256 as JSON, once its body (by the first length) has come
/// whole; `reached` counts those.
async fn recording_origin(reached: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let reached = reached.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end);
                    let values = |wanted: &str| -> Vec<String> {
                        head.lines()
                            .filter_map(|l| {
                                let (name, value) = l.split_once(':')?;
                                let hit = name.eq_ignore_ascii_case(wanted);
                                hit.then(|| value.trim().to_string())
                            })
                            .collect()
                    };
                    let lengths = values("content-length");
                    let cookies = values("cookie");
                    let want: usize = lengths.first().and_then(|v| v.parse().ok()).unwrap_or(0);
                    while buf.len() < want {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body: Vec<u8> = buf.drain(..want).collect();
                    reached.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let report = serde_json::json!({
                        "lengths": lengths, "cookies": cookies, "len": body.len(),
                        "sha256": sha256(&body),
                    })
                    .to_string();
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{report}",
                        report.len()
                    );
                    if s.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// `content-length` is read as HTTP/1.1 and HTTP/3 read it: the same number in several fields
/// (or with leading zeros) is that one length, forwarded as one plain value and held to the body;
/// a list inside one field, numbers that disagree, a value with a space at either end, or a body
/// that breaks the length reset the stream (`PROTOCOL_ERROR`), and no body reaches the origin
/// whole. (Before, HTTP/2 passed `010` or repeated fields on as written, and HTTP/3 took lists.)
#[tokio::test]
async fn a_content_length_is_one_plain_number_held_to_the_body() {
    /// POST with a `content-length` field for each of `declared` and `body`, on stream `id`: the
    /// answer's body (a JSON report from the origin), or the `RST_STREAM` code.
    async fn post(
        s: &mut TcpStream,
        id: u32,
        declared: &[&str],
        body: &[u8],
    ) -> Result<serde_json::Value, u32> {
        let mut block = post_block();
        for value in declared {
            // content-length (static index 28): a literal without indexing, the value raw.
            block.extend([0x0f, 0x0d, value.len() as u8]);
            block.extend_from_slice(value.as_bytes());
        }
        let mut out = frame(HEADERS, END_HEADERS, id, &block);
        out.extend(frame(DATA, END_STREAM, id, body));
        s.write_all(&out).await.unwrap();
        let mut got = Vec::new();
        loop {
            let mut head = [0u8; 9];
            let read = tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut head));
            read.await.expect("an answer in time").unwrap();
            let len =
                (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            s.read_exact(&mut payload).await.unwrap();
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            if stream != id {
                continue;
            }
            match head[3] {
                RST_STREAM => {
                    return Err(u32::from_be_bytes([
                        payload[0], payload[1], payload[2], payload[3],
                    ]))
                }
                DATA => {
                    got.extend_from_slice(&payload);
                    if head[4] & END_STREAM != 0 {
                        return Ok(serde_json::from_slice(&got).unwrap());
                    }
                }
                _ => {}
            }
        }
    }
    // The origin reads each request as bytes (a server library would merge repeated equal
    // fields itself), counts the bodies it receives whole and reports each request's
    // `content-length` lines as written.
    let reached = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let o = recording_origin(reached.clone()).await;
    let _p = Proxy::start(route_config(o, "")).await;
    let addr = _p.addr;
    let mut s = open(addr).await;
    let body = b"0123456789";
    let mut id = 1;
    for declared in [&["10", "10"][..], &["010"], &["10", "010", "10"]] {
        let report = post(&mut s, id, declared, body).await.expect("answered");
        id += 2;
        assert_eq!(report["len"], 10, "{declared:?}: {report}");
        assert_eq!(report["sha256"], sha256(body));
        assert_eq!(report["lengths"], serde_json::json!(["10"]), "{declared:?}");
    }
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 3);
    // A list inside one field (hyper's HTTP/1.1 parser refuses it too), numbers that disagree,
    // a length the body breaks, and not numbers.
    for (declared, sent) in [
        (&["10, 10"][..], &body[..]),
        (&["10,10"], &body[..]),
        (&["10", "10, 10"], &body[..]),
        (&["10", "11"], &body[..]),
        (&["5", "5"], &body[..]),
        (&["11"], &body[..]),
        (&["10, "], &body[..]),
        (&["1 0"], &body[..]),
        // RFC 9113 section 8.2.1: no space or tab at either end of a value.
        (&[" 10"], &body[..]),
        (&["10 "], &body[..]),
    ] {
        let r = post(&mut s, id, declared, sent).await;
        id += 2;
        assert_eq!(r, Err(1), "{declared:?}: PROTOCOL_ERROR");
    }
    assert_eq!(
        reached.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "a refused request's body reached the origin whole"
    );
    // Each refusal counted as HTTP/1.1's ambiguous framing is.
    let metrics = get(&_p.url("/metrics"), &[]).await;
    let metrics = String::from_utf8_lossy(metrics.body.as_ref().unwrap()).into_owned();
    assert!(
        metrics.contains("sluice_downstream_smuggling_refused_total 10"),
        "{metrics}"
    );
    still_served(addr).await;
}

/// A client that keeps a stream's window shut and then goes silent does not keep its connection
/// open: the stream's body is released at the send timeout, the connection's close begins at the
/// idle timeout, and a send timeout later, nothing having been written, it is dropped although
/// the stream never ended (the server's close waited for the stream, so the connection stayed
/// open for ever).
#[tokio::test]
async fn a_stream_held_shut_does_not_keep_a_silent_connection_open() {
    let (_p, addr) = proxy_with("send_timeout_secs = 1\nidle_timeout_secs = 1").await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut hello = PREFACE.to_vec();
    // SETTINGS_INITIAL_WINDOW_SIZE = 0: no DATA on any stream until the client says.
    hello.extend(frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 0]));
    hello.extend(frame(HEADERS, END_STREAM | END_HEADERS, 1, &get_block()));
    s.write_all(&hello).await.unwrap();
    let started = std::time::Instant::now();
    // Nothing more from the client: read until the server closes.
    let closed = async {
        let mut buf = [0u8; 4096];
        while s.read(&mut buf).await.is_ok_and(|n| n > 0) {}
    };
    tokio::time::timeout(Duration::from_secs(15), closed)
        .await
        .expect("the connection closed");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "closed early: {:?}",
        started.elapsed()
    );
    still_served(addr).await;
}

/// A client that reads a response slowly, opening its windows a little at a time, gets all of it
/// even when the response's last bytes wait for its window past the idle and send timeouts (the
/// handler is done with them, so nothing is in flight): only a connection that writes nothing
/// for the send timeout after its close began is dropped, not one still sending.
#[tokio::test]
async fn a_slow_reader_gets_the_whole_response_past_the_idle_close() {
    let (_p, addr) = proxy_with("send_timeout_secs = 1\nidle_timeout_secs = 1").await;
    let mut s = open(addr).await;
    // GET /size/100000 (`:path` a literal without indexing, its name from the static table).
    let path = b"/size/100000";
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path);
    block.extend_from_slice(&[0x41, 9]);
    block.extend_from_slice(b"localhost");
    s.write_all(&frame(HEADERS, END_STREAM | END_HEADERS, 1, &block))
        .await
        .unwrap();
    let (mut r, mut w) = s.into_split();
    // 1,000 bytes more of both windows every 150 ms: the last 35 KB take about 5 s.
    let opener = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let mut up = frame(WINDOW_UPDATE, 0, 0, &1_000u32.to_be_bytes());
            up.extend(frame(WINDOW_UPDATE, 0, 1, &1_000u32.to_be_bytes()));
            if w.write_all(&up).await.is_err() {
                return;
            }
        }
    });
    let mut body = Vec::new();
    let read = async {
        loop {
            let mut head = [0u8; 9];
            if r.read_exact(&mut head).await.is_err() {
                return false;
            }
            let len =
                (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            if r.read_exact(&mut payload).await.is_err() {
                return false;
            }
            if head[3] == DATA && u32::from_be_bytes([head[5], head[6], head[7], head[8]]) == 1 {
                body.extend_from_slice(&payload);
                if head[4] & END_STREAM != 0 {
                    return true;
                }
            }
        }
    };
    let ended = tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("answered in time");
    opener.abort();
    assert!(ended, "the connection was cut after {} bytes", body.len());
    assert_eq!(body.len(), 100_000);
    assert_eq!(sha256(&body), sha256(&pattern(100_000)));
}

/// A drain (graceful shutdown, or the binary upgrade handing over) tells a busy HTTP/2 connection
/// to go away at once: a client that keeps opening streams gets a GOAWAY, its streams up to the
/// final GOAWAY's last id are answered, and the server's run ends soon after, not at the end of
/// the grace. (The drain waited for the connection to be idle for a second before it said GOAWAY, so
/// a client sending a request every 100 ms was never told and was cut at the grace.)
#[tokio::test]
async fn a_drain_sends_goaway_to_a_busy_connection() {
    let config = route_config(echo("o").await, "shutdown_grace_secs = 20");
    let (addr, stop, done) = serve_until_stopped(&config).await;
    let (mut r, mut w) = open(addr).await.into_split();
    // Every frame's kind, stream and (for a GOAWAY) last stream id, until the server closes.
    let reader = tokio::spawn(async move {
        let mut seen: Vec<(u8, u32, Option<u32>, std::time::Instant)> = Vec::new();
        loop {
            let mut head = [0u8; 9];
            if r.read_exact(&mut head).await.is_err() {
                return seen;
            }
            let len =
                (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            if r.read_exact(&mut payload).await.is_err() {
                return seen;
            }
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let last = (head[3] == GOAWAY).then(|| {
                u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff
            });
            seen.push((head[3], stream, last, std::time::Instant::now()));
        }
    });
    // A connection accepted before the drain whose client speaks only after it began: its
    // preface and first request 200 ms into the drain are answered, not dropped.
    let mut late = TcpStream::connect(addr).await.unwrap();
    let (began_tx, began) = tokio::sync::oneshot::channel::<()>();
    let late = tokio::spawn(async move {
        let _ = began.await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        hello.extend(frame(HEADERS, END_STREAM | END_HEADERS, 1, &get_block()));
        late.write_all(&hello).await.unwrap();
        let sent = std::time::Instant::now();
        // Its frames until the server closes it (at most 5 s): the answer on stream 1, and the
        // GOAWAY, as soon as its request began (not a second of idleness later).
        let (mut answered, mut goaway) = (false, None);
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let mut head = [0u8; 9];
                if late.read_exact(&mut head).await.is_err() {
                    return;
                }
                let len = (usize::from(head[0]) << 16)
                    | (usize::from(head[1]) << 8)
                    | usize::from(head[2]);
                let mut payload = vec![0u8; len];
                if late.read_exact(&mut payload).await.is_err() {
                    return;
                }
                let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
                answered |= head[3] == HEADERS && stream == 1;
                if head[3] == GOAWAY && goaway.is_none() {
                    goaway = Some(sent.elapsed());
                }
            }
        })
        .await;
        (answered, goaway)
    });
    let mut began_tx = Some(began_tx);
    // A request every 100 ms for at most 4 s; the drain after the fifth.
    let mut stop = Some(stop);
    let mut drained_at = None;
    let mut id = 1u32;
    for i in 0..40 {
        if i == 5 {
            let _ = stop.take().unwrap().send(());
            drained_at = Some(std::time::Instant::now());
            let _ = began_tx.take().unwrap().send(());
        }
        if reader.is_finished()
            || w.write_all(&frame(HEADERS, END_STREAM | END_HEADERS, id, &get_block()))
                .await
                .is_err()
        {
            break;
        }
        id += 2;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("the server closed the connection")
        .unwrap();
    let drained_at = drained_at.unwrap();
    // Two GOAWAYs (RFC 9113 §6.8): the first at once, with the highest stream id (requests in
    // flight are still taken); the final one names the last stream opened, after the drain's
    // PING comes back or (this client answers no PING) a second later.
    let goaways: Vec<_> = seen.iter().filter(|f| f.0 == GOAWAY).copied().collect();
    assert_eq!(goaways.len(), 2, "{goaways:?}");
    let (_, _, first, at) = goaways[0];
    assert_eq!(first, Some(0x7fff_ffff));
    assert!(
        at.duration_since(drained_at) < Duration::from_millis(1500),
        "GOAWAY {:?} after the drain",
        at.duration_since(drained_at)
    );
    // This client answers no PING: the final GOAWAY a second after the first, and the requests
    // it sent meanwhile (one every 100 ms after stream 9, the last before the drain) were taken.
    let (_, _, last, final_at) = goaways[1];
    let last = last.unwrap();
    assert!(
        final_at.duration_since(at) >= Duration::from_millis(900),
        "final GOAWAY {:?} after the first",
        final_at.duration_since(at)
    );
    assert!(
        (13..0x7fff_ffff).contains(&last),
        "final GOAWAY's last id {last}"
    );
    // Every stream up to the final GOAWAY's last id was answered.
    for stream in (1..=last).step_by(2) {
        assert!(
            seen.iter().any(|f| f.0 == HEADERS && f.1 == stream),
            "stream {stream} of {last} unanswered"
        );
    }
    let (answered, goaway) = late.await.unwrap();
    assert!(
        answered,
        "a request on a connection accepted before the drain was answered"
    );
    assert!(
        goaway.is_some_and(|d| d < Duration::from_millis(600)),
        "the late connection's GOAWAY: {goaway:?} after its request"
    );
    tokio::time::timeout(Duration::from_secs(5), done)
        .await
        .expect("the drain ended before the grace")
        .unwrap();
}

/// On a listener that does not start on the HTTP/1.1 fast path, a connection's first bytes are
/// read to tell h2c from HTTP/1.1: a preface split across two writes still reaches sluice's own
/// HTTP/2 server (its SETTINGS carry a quarter of the configured window, each stream's), HTTP/1.1
/// still reaches hyper's, and a client that sends one byte of a preface and stops is closed at
/// the header timeout.
#[tokio::test]
async fn the_first_bytes_tell_h2c_from_http1() {
    let (p, addr) = proxy_with(
        "h1_fast_path = false\nh2_recv_window_bytes = 524288\nheader_read_timeout_secs = 1",
    )
    .await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(&PREFACE[..16]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut rest = PREFACE[16..].to_vec();
    rest.extend(frame(SETTINGS, 0, 0, &[]));
    s.write_all(&rest).await.unwrap();
    let (_, _, settings) = until(&mut s, SETTINGS, Duration::from_secs(5))
        .await
        .expect("the server's SETTINGS");
    assert!(
        settings.chunks(6).any(|f| f == [0, 4, 0, 2, 0, 0]),
        "SETTINGS_INITIAL_WINDOW_SIZE 131072: {settings:02x?}"
    );
    s.write_all(&frame(HEADERS, END_STREAM | END_HEADERS, 1, &get_block()))
        .await
        .unwrap();
    let (_, stream, _) = until(&mut s, HEADERS, Duration::from_secs(5))
        .await
        .expect("an answer over h2c");
    assert_eq!(stream, 1);
    // HTTP/1.1 on the same listener.
    let r = raw(
        addr,
        b"GET /a HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    // One byte of a preface, then nothing: closed at the header timeout (1 s).
    let mut p_only = TcpStream::connect(addr).await.unwrap();
    p_only.write_all(b"P").await.unwrap();
    let started = std::time::Instant::now();
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), p_only.read_to_end(&mut buf)).await;
    assert!(
        closed.is_ok(),
        "a connection that sent one byte was kept open"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    drop(p);
}

/// The next frame (kind, flags, stream, payload), or `None` if the connection closed or nothing
/// came for 5 s.
async fn next_frame(s: &mut TcpStream) -> Option<(u8, u8, u32, Vec<u8>)> {
    let read = async {
        let mut head = [0u8; 9];
        s.read_exact(&mut head).await.ok()?;
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).await.ok()?;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        Some((head[3], head[4], stream, payload))
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .ok()
        .flatten()
}

/// A player cancelling responses under way (a seek, a channel switch, a segment given up) is not
/// a rapid reset: 250 streams, each reset once its head and some of its body came, with another
/// stream open throughout, do not close the connection with `ENHANCE_YOUR_CALM`, and the other
/// stream is answered. (Before, every reset of a stream whose response was not complete was
/// charged, and only complete responses earned the budget back: the 200th closed the connection
/// with everything on it.)
#[tokio::test]
async fn cancelling_responses_under_way_is_not_a_rapid_reset() {
    use http_body_util::BodyExt as _;
    // GET: a body that never ends, a piece every 20 ms; POST: "done" once the body is read.
    let o = origin(|req: http::Request<hyper::body::Incoming>| async move {
        if req.method() == http::Method::POST {
            let _ = req.into_body().collect().await;
            return http::Response::new(full("done"));
        }
        let ticks = futures_util::stream::unfold(0u64, |n| async move {
            if n > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let piece = hyper::body::Frame::data(Bytes::from(format!("tick {n}\n")));
            Some((Ok::<_, std::io::Error>(piece), n + 1))
        });
        http::Response::new(http_body_util::StreamBody::new(ticks).boxed())
    })
    .await;
    let p = Proxy::start(route_config(o, "h2_max_concurrent_streams = 10")).await;
    let mut s = open(p.addr).await;
    // A large connection window: the cancelled streams' bytes in flight never stop the others.
    let mut first = frame(WINDOW_UPDATE, 0, 0, &(1u32 << 30).to_be_bytes());
    // Stream 1: a POST whose body ends only after all the cancellations.
    first.extend(frame(HEADERS, END_HEADERS, 1, &post_block()));
    first.extend(frame(DATA, 0, 1, b"abc"));
    s.write_all(&first).await.unwrap();
    let path = b"/trickle";
    let mut get = vec![0x82, 0x86, 0x04, path.len() as u8];
    get.extend_from_slice(path);
    get.extend_from_slice(&[0x41, 9]);
    get.extend_from_slice(b"localhost");
    for i in 0..250u32 {
        let id = 3 + 2 * i;
        s.write_all(&frame(HEADERS, END_STREAM | END_HEADERS, id, &get))
            .await
            .unwrap();
        let (mut head, mut data) = (false, false);
        while !(head && data) {
            let (kind, _, stream, payload) = next_frame(&mut s)
                .await
                .unwrap_or_else(|| panic!("stream {id} answered in time"));
            assert!(
                kind != GOAWAY,
                "GOAWAY {:#x} after {i} cancellations",
                goaway_code(&payload)
            );
            if stream == id {
                assert_ne!(kind, RST_STREAM, "stream {id} reset");
                head |= kind == HEADERS;
                data |= kind == DATA;
            }
        }
        s.write_all(&frame(RST_STREAM, 0, id, &8u32.to_be_bytes()))
            .await
            .unwrap();
    }
    s.write_all(&frame(DATA, END_STREAM, 1, b"def"))
        .await
        .unwrap();
    let mut body = Vec::new();
    loop {
        let (kind, flags, stream, payload) = next_frame(&mut s).await.expect("stream 1 answered");
        assert!(kind != GOAWAY, "GOAWAY {:#x}", goaway_code(&payload));
        if stream == 1 {
            assert_ne!(kind, RST_STREAM, "stream 1 reset");
            if kind == DATA {
                body.extend_from_slice(&payload);
                if flags & END_STREAM != 0 {
                    break;
                }
            }
        }
    }
    assert_eq!(body, b"done");

    // Resetting every stream as soon as its answer begins, on and on, still ends the connection:
    // past the free cancels each is charged as a reset.
    let mut goaway = None;
    for i in 0..500u32 {
        let id = 3 + 2 * (250 + i);
        if s.write_all(&frame(HEADERS, END_STREAM | END_HEADERS, id, &get))
            .await
            .is_err()
        {
            break;
        }
        let mut head = false;
        while !head && goaway.is_none() {
            let Some((kind, _, stream, payload)) = next_frame(&mut s).await else {
                break;
            };
            if kind == GOAWAY {
                goaway = Some((i, goaway_code(&payload)));
            }
            head |= stream == id && kind == HEADERS;
        }
        if goaway.is_some() {
            break;
        }
        let _ = s
            .write_all(&frame(RST_STREAM, 0, id, &8u32.to_be_bytes()))
            .await;
    }
    let (after, code) = goaway.expect("a GOAWAY within 500 more cancels");
    assert_eq!(code, 0xb, "ENHANCE_YOUR_CALM after {after} more");
}

/// HTTP/2 clients send each cookie as a field of its own (RFC 9113 section 8.2.3): an HTTP/1.1
/// origin gets them as one `Cookie` line, joined with "; " in the order sent, on the fast path's
/// exchange (a GET) and hyper's client (a POST). (Before, each went as its own line, which PHP or
/// WSGI join with ", ", breaking them.)
#[tokio::test]
async fn cookie_fields_reach_an_http1_origin_as_one_line() {
    use http_body_util::BodyExt as _;
    let reached = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let o = recording_origin(reached).await;
    // sluice's own HTTP/2 server, and hyper's (`h2_own_server = false`).
    for (own, server) in [(true, ""), (false, "h2_own_server = false")] {
        let p = Proxy::start(route_config(o, server)).await;
        let mut client = h2_client(p.addr).await;
        for post in [false, true] {
            let req = http::Request::builder()
                .method(if post { "POST" } else { "GET" })
                .uri(format!("http://{}/c", p.addr))
                .header("cookie", "a=1")
                .header("accept", "*/*")
                .header("cookie", "b=2")
                .body(full(if post { "xyz" } else { "" }))
                .unwrap();
            let resp = tokio::time::timeout(Duration::from_secs(5), client.send_request(req))
                .await
                .expect("answered in time")
                .unwrap();
            assert_eq!(resp.status(), 200);
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            let report: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(
                report["cookies"],
                serde_json::json!(["a=1; b=2"]),
                "own server {own}, POST {post}: {report}"
            );
        }
    }
}

/// An origin that ends a chunked body with `Connection: close` (or another field of its own hop)
/// among its trailers: the HTTP/2 client gets the body and the other trailers, not a trailer
/// section it must take as malformed (a stream reset at the very end), on the fast path's
/// exchange (a GET) and hyper's client (a POST).
#[tokio::test]
async fn trailers_reach_an_h2_client_without_connection_fields() {
    use http_body_util::BodyExt as _;
    let trailer = "Connection: close\r\nKeep-Alive: timeout=5\r\nProxy-Connection: close\r\n\
                   Upgrade: h2c\r\nTE: trailers\r\nx-sum: 1\r\n";
    let answer: Answer =
        std::sync::Arc::new(move |_: &str| chunked(b"hello, trailers", 4, trailer));
    let (o, _, _) = raw_origin(answer).await;
    let p = Proxy::start(route_config(o, "")).await;
    for post in [false, true] {
        let mut client = h2_client(p.addr).await;
        let req = http::Request::builder()
            .method(if post { "POST" } else { "GET" })
            .uri(format!("http://{}/t", p.addr))
            .header("te", "trailers")
            .body(full(if post { "xyz" } else { "" }))
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(5), client.send_request(req))
            .await
            .expect("answered in time")
            .unwrap();
        assert_eq!(resp.status(), 200);
        let got = tokio::time::timeout(Duration::from_secs(5), resp.into_body().collect())
            .await
            .expect("the body in time")
            .unwrap_or_else(|e| panic!("POST {post}: {e}"));
        let trailers = got.trailers().cloned().expect("trailers");
        assert_eq!(&got.to_bytes()[..], b"hello, trailers");
        assert_eq!(trailers.get("x-sum").unwrap(), "1", "POST {post}");
        for name in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "upgrade",
            "te",
        ] {
            assert!(!trailers.contains_key(name), "POST {post}: {trailers:?}");
        }
    }
}

/// A request trailer section past `max_header_bytes` (70 KB against the default 64 KiB) is not
/// passed on cut to the fields that fit: the stream ends with a 431 (nothing was answered yet),
/// and the origin never sees the request's end. (Before, the fields up to the limit went on as
/// the whole section.)
#[tokio::test]
async fn an_oversized_request_trailer_section_is_not_passed_on_cut() {
    const CONTINUATION: u8 = 9;
    let (_p, addr) = proxy_with("").await;
    let mut s = open(addr).await;
    let mut out = frame(HEADERS, END_HEADERS, 1, &post_block());
    out.extend(frame(DATA, 0, 1, b"abc"));
    // 70 fields of 1,000 bytes: literals without indexing, new names.
    let mut block = Vec::new();
    for i in 0..70 {
        block.extend([0x00, 5]);
        block.extend_from_slice(format!("x-t{i:02}").as_bytes());
        // 1,000 as an HPACK integer with a 7-bit prefix: 127, then 873 in 7-bit groups.
        block.extend([0x7f, 0xe9, 0x06]);
        block.extend_from_slice(&[b'a'; 1000]);
    }
    let pieces: Vec<&[u8]> = block.chunks(16_384).collect();
    for (n, piece) in pieces.iter().enumerate() {
        let last = n + 1 == pieces.len();
        let flags = if last { END_HEADERS } else { 0 };
        if n == 0 {
            out.extend(frame(HEADERS, flags | END_STREAM, 1, piece));
        } else {
            out.extend(frame(CONTINUATION, flags, 1, piece));
        }
    }
    s.write_all(&out).await.unwrap();
    let (kind, flags, payload) = loop {
        let (kind, flags, stream, payload) = next_frame(&mut s).await.expect("an answer");
        assert_ne!(kind, GOAWAY, "GOAWAY {:#x}", goaway_code(&payload));
        if stream == 1 && (kind == HEADERS || kind == RST_STREAM) {
            break (kind, flags, payload);
        }
    };
    assert_eq!(kind, HEADERS, "a 431, not a reset");
    assert!(flags & END_STREAM != 0);
    assert!(
        payload
            .windows(3)
            .any(|w| w == b"431" || w == [0x69, 0x90, 0xff]),
        "not a 431: {payload:?}"
    );
    still_served(addr).await;
}

/// An HPACK block for `GET http://localhost{path}` (`:path` a literal without indexing).
fn get_path_block(path: &str) -> Vec<u8> {
    let mut b = vec![0x82, 0x86, 0x04, path.len() as u8];
    b.extend_from_slice(path.as_bytes());
    b.extend_from_slice(&[0x41, 9]);
    b.extend_from_slice(b"localhost");
    b
}

/// A stream whose client holds its window at one byte, opening it by one more byte every third
/// of the send timeout, while the connection stays busy (another stream read slowly but
/// steadily, short requests read at once), is reset (`CANCEL`) within about twice the send
/// timeout, and its place under `h2_max_concurrent_streams` comes back; the steady reader is not
/// reset and gets its whole response. (The send watch released the held stream's body, but the
/// server kept the chunk it had taken from it, parked on the window, and the stream itself, for
/// as long as the connection lived: the send timeout did not bound what a stalled stream held.
/// Then any room at all restarted the clock, so the byte-at-a-time trickle kept them again.)
#[tokio::test]
async fn a_stream_parked_on_a_shut_window_is_reset_while_the_connection_is_busy() {
    const CANCEL: u32 = 8;
    const REFUSED_STREAM: u32 = 7;
    let (_p, addr) =
        proxy_with("send_timeout_secs = 1\nidle_timeout_secs = 30\nh2_max_concurrent_streams = 3")
            .await;
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut r, mut w) = s.into_split();
    // Every frame from the server as (kind, flags, stream, payload).
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u8, u8, u32, Vec<u8>)>();
    let reader = tokio::spawn(async move {
        loop {
            let mut head = [0u8; 9];
            if r.read_exact(&mut head).await.is_err() {
                return;
            }
            let len =
                (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            if r.read_exact(&mut payload).await.is_err() {
                return;
            }
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            if tx.send((head[3], head[4], stream, payload)).is_err() {
                return;
            }
        }
    });
    let mut hello = PREFACE.to_vec();
    // SETTINGS_INITIAL_WINDOW_SIZE = 1: one byte on any stream until the client says more.
    hello.extend(frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 1]));
    // Stream 1: a large response, its window opened by one byte every 333 ms (a third of the
    // send timeout) until it is reset.
    hello.extend(frame(
        HEADERS,
        END_STREAM | END_HEADERS,
        1,
        &get_path_block("/size/1000000"),
    ));
    // Stream 3: read slowly but steadily, 1,000 bytes every 200 ms (about 6 s in all).
    hello.extend(frame(
        HEADERS,
        END_STREAM | END_HEADERS,
        3,
        &get_path_block("/size/30000"),
    ));
    w.write_all(&hello).await.unwrap();
    let started = std::time::Instant::now();
    let mut resets: Vec<(u32, u32, Duration)> = Vec::new();
    let (mut steady, mut steady_done) = (Vec::new(), false);
    // Short requests, each with its window opened at once: (stream, answered whole).
    let mut short: Vec<(u32, bool)> = Vec::new();
    let mut next_id = 5u32;
    let mut trickled = started;
    // Until the steady reader is done and a reset came, or 15 s.
    while (!steady_done || resets.is_empty()) && started.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut out = Vec::new();
        if !steady_done {
            out.extend(frame(WINDOW_UPDATE, 0, 0, &1_000u32.to_be_bytes()));
            out.extend(frame(WINDOW_UPDATE, 0, 3, &1_000u32.to_be_bytes()));
        }
        if resets.is_empty() && trickled.elapsed() >= Duration::from_millis(333) {
            out.extend(frame(WINDOW_UPDATE, 0, 1, &1u32.to_be_bytes()));
            trickled = std::time::Instant::now();
        }
        // A new short request once the previous one is answered (three streams at most).
        if short.last().is_none_or(|&(_, done)| done) {
            out.extend(frame(
                HEADERS,
                END_STREAM | END_HEADERS,
                next_id,
                &get_path_block("/size/100"),
            ));
            out.extend(frame(WINDOW_UPDATE, 0, next_id, &100_000u32.to_be_bytes()));
            out.extend(frame(WINDOW_UPDATE, 0, 0, &100u32.to_be_bytes()));
            short.push((next_id, false));
            next_id += 2;
        }
        w.write_all(&out).await.unwrap();
        while let Ok((kind, flags, stream, payload)) = rx.try_recv() {
            match kind {
                RST_STREAM => resets.push((
                    stream,
                    u32::from_be_bytes(payload[..4].try_into().unwrap()),
                    started.elapsed(),
                )),
                DATA if stream == 3 => {
                    steady.extend_from_slice(&payload);
                    steady_done |= flags & END_STREAM != 0;
                }
                DATA if flags & END_STREAM != 0 => {
                    if let Some(s) = short.iter_mut().find(|s| s.0 == stream) {
                        s.1 = true;
                    }
                }
                GOAWAY => panic!("GOAWAY {:x}", goaway_code(&payload)),
                _ => {}
            }
        }
    }
    assert_eq!(
        resets.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(),
        vec![(1, CANCEL)],
        "only the stream held shut is reset, with CANCEL: {resets:?}"
    );
    assert!(
        resets[0].2 >= Duration::from_secs(1),
        "reset before the send timeout: {resets:?}"
    );
    // Checked once a second (the send timeout's tick): parked from about 0 s, reset at 2 s.
    assert!(
        resets[0].2 <= Duration::from_millis(2_600),
        "the trickled stream reset late: {resets:?}"
    );
    assert!(steady_done, "the steady reader got {} bytes", steady.len());
    assert_eq!(steady.len(), 30_000);
    assert_eq!(sha256(&steady), sha256(&pattern(30_000)));
    let answered = short.iter().filter(|s| s.1).count();
    assert!(answered >= 10, "{answered} short requests answered");
    // Stream 1's place is free again: three streams at once are all taken (the last would be
    // refused if the held stream still counted).
    let mut three = Vec::new();
    for id in [next_id, next_id + 2, next_id + 4] {
        three.extend(frame(
            HEADERS,
            END_STREAM | END_HEADERS,
            id,
            &get_path_block("/size/1000000"),
        ));
    }
    // Wait for the last short request to finish first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.write_all(&three).await.unwrap();
    let mut heads = 0;
    let took = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some((kind, _, stream, payload)) = rx.recv().await {
            if kind == RST_STREAM && stream >= next_id {
                let code = u32::from_be_bytes(payload[..4].try_into().unwrap());
                assert_ne!(code, REFUSED_STREAM, "stream {stream} refused");
            }
            if kind == HEADERS && stream >= next_id {
                heads += 1;
                if heads == 3 {
                    return;
                }
            }
        }
    })
    .await;
    assert!(took.is_ok(), "{heads} of three streams answered");
    reader.abort();
    still_served(addr).await;
}
