//! Attack catalogue against a running server's resource bounds: too many connections, clients that
//! stop reading, request heads sent a byte at a time, TLS handshakes that never finish, HTTP/2
//! stream floods and oversize header lists, and an IPTV viewer that freezes while others watch.

mod iptv_support;
mod self_signed;
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use self_signed::SelfSigned;
use sha2::{Digest, Sha256};
use support::{enc, get, test_config, Sluice};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;

/// The value of one metric line (`name value`) in a `/metrics` body.
async fn metric(s: &Sluice, name: &str) -> f64 {
    let body = get(&s.url("/metrics")).await.body.unwrap();
    let text = String::from_utf8(body.to_vec()).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}

/// Reads until the peer closes (EOF or reset) or `limit` passes; true if it closed.
async fn closed_within(tcp: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = vec![0u8; 64 * 1024];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

// === Connections ===

#[tokio::test]
async fn connection_limit_pauses_accept_until_one_closes() {
    let mut config = test_config();
    config.server.max_connections = 2;
    let s = Sluice::start(config).await;
    let mut first = TcpStream::connect(s.addr).await.unwrap();
    let _second = TcpStream::connect(s.addr).await.unwrap();
    // Make sure both are accepted (and hold their slots) before the third arrives.
    first
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    first.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    tokio::time::sleep(Duration::from_millis(100)).await;

    // The third completes the TCP handshake (kernel backlog) but is not served...
    let mut third = TcpStream::connect(s.addr).await.unwrap();
    third
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let early =
        tokio::time::timeout(Duration::from_millis(700), third.read_to_end(&mut answer)).await;
    assert!(early.is_err(), "served beyond the limit: {answer:?}");

    // ...until one of the first two closes.
    drop(first);
    tokio::time::timeout(Duration::from_secs(5), third.read_to_end(&mut answer))
        .await
        .expect("the waiting connection is served once a slot frees")
        .unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with(r#"{"status":"healthy"}"#), "{answer}");
    drop(third);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Counted once per pause; this run paused at least while the third waited.
    assert!(metric(&s, "sluice_downstream_accept_paused_total").await >= 1.0);
}

// === Clients that stop reading ===

/// An origin that answers every request with an endless body and reports when (and how) its
/// connection ends. Small send buffer so back-pressure reaches it quickly.
async fn endless_origin() -> (SocketAddr, mpsc::UnboundedReceiver<(u64, std::io::Error)>) {
    let sock = TcpSocket::new_v4().unwrap();
    sock.set_send_buffer_size(16 * 1024).unwrap();
    sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = sock.listen(16).unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut req = vec![0u8; 4096];
                let _ = tcp.read(&mut req).await;
                let head =
                    b"HTTP/1.1 200 OK\r\nContent-Type: video/mp2t\r\nConnection: close\r\n\r\n";
                if tcp.write_all(head).await.is_err() {
                    return;
                }
                let chunk = vec![0x47u8; 64 * 1024];
                let mut sent = 0u64;
                loop {
                    match tcp.write_all(&chunk).await {
                        Ok(()) => sent += chunk.len() as u64,
                        Err(e) => {
                            let _ = tx.send((sent, e));
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn client_that_stops_reading_is_cut_and_its_upstream_closed() {
    let (origin, mut ended) = endless_origin().await;
    let mut config = test_config();
    config.server.send_timeout_secs = 1;
    // Long upstream timeouts: only the send timeout may end this.
    config.upstream.idle_read_timeout_secs = 60;
    config.upstream.header_timeout_secs = 60;
    let s = Sluice::start(config).await;

    let sock = TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut client = sock.connect(s.addr).await.unwrap();
    let path = format!(
        "/proxy/stream?d={}",
        enc(&format!("http://{origin}/live.ts"))
    );
    client
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 15];
    client.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200 OK");
    let stopped = Instant::now();
    // From here on the client reads nothing: its window closes, sluice's writes block.
    let (sent, err) = tokio::time::timeout(Duration::from_secs(15), ended.recv())
        .await
        .expect("the origin's connection is closed once the client has stalled")
        .unwrap();
    let took = stopped.elapsed();
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        "{err}"
    );
    assert!(
        took >= Duration::from_millis(900),
        "cut too early: {took:?}"
    );
    assert!(sent < 64 * 1024 * 1024, "the origin kept streaming: {sent}");
    assert!(closed_within(&mut client, Duration::from_secs(5)).await);
    assert_eq!(
        metric(&s, "sluice_downstream_send_timeouts_total").await,
        1.0
    );
}

#[tokio::test]
async fn slow_but_reading_client_is_not_cut() {
    let (origin, mut ended) = endless_origin().await;
    let mut config = test_config();
    config.server.send_timeout_secs = 1;
    config.upstream.idle_read_timeout_secs = 60;
    let s = Sluice::start(config).await;
    let mut client = TcpStream::connect(s.addr).await.unwrap();
    let path = format!("/proxy/stream?d={}", enc(&format!("http://{origin}/a")));
    client
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    // A trickle for 3 s: 64 KiB every 100 ms, far below the stream rate but never stopped, so
    // sluice's writes are blocked most of the time yet keep making progress.
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0;
    for _ in 0..30 {
        client.read_exact(&mut buf).await.unwrap();
        got += buf.len();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(got > 0);
    assert_eq!(
        metric(&s, "sluice_downstream_send_timeouts_total").await,
        0.0
    );
    if let Ok((sent, e)) = ended.try_recv() {
        panic!("a reading client was cut after {sent} bytes: {e}");
    }
}

// === Slow request heads ===

/// A head just under `server.max_header_bytes` (60 KiB of 64 KiB) sent a byte per write is still
/// answered. Each read brought one byte and the whole held head was parsed again after each (about
/// 2×10⁹ bytes scanned for one connection); now it is parsed again only when an LF arrives (the
/// CPU part is shown by `server::screen`'s and `server::h1fast`'s unit tests).
#[tokio::test]
async fn a_long_head_sent_a_byte_at_a_time_is_answered() {
    let s = Sluice::start(test_config()).await;
    let mut head = format!("GET /health HTTP/1.1\r\nHost: {}\r\n", s.addr).into_bytes();
    for i in 0..62 {
        head.extend_from_slice(format!("X-Pad-{i}: {}\r\n", "v".repeat(1000)).as_bytes());
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    assert!(head.len() > 60 * 1024 && head.len() < 64 * 1024);
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let started = Instant::now();
    for b in &head {
        tcp.write_all(std::slice::from_ref(b)).await.unwrap();
    }
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer))
        .await
        .expect("answered in time")
        .unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

// === TLS ===

#[tokio::test]
async fn tls_handshake_that_never_finishes_is_closed() {
    let pair = SelfSigned::new(&["localhost"]);
    let mut config = test_config();
    config.server.tls_cert = Some(pair.cert.path().to_path_buf());
    config.server.tls_key = Some(pair.key.path().to_path_buf());
    config.server.tls_handshake_timeout_secs = 1;
    config.server.idle_timeout_secs = 30;
    let s = Sluice::start(config).await;

    // Opens TCP and says nothing.
    let silent_start = Instant::now();
    let mut silent = TcpStream::connect(s.addr).await.unwrap();
    // Half a ClientHello: a record header announcing 512 bytes, then 6 of them.
    let mut half = TcpStream::connect(s.addr).await.unwrap();
    half.write_all(&[
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ])
    .await
    .unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(5)).await);
    assert!(closed_within(&mut half, Duration::from_secs(5)).await);
    let took = silent_start.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "closed too early: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

// === HTTP/2 (h2c, prior knowledge) with raw frames: a real client would obey the limits ===

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// HPACK integer with an `n`-bit prefix whose high bits are `first`.
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u32, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// A GET header block: static-table method and scheme, literal path and authority (no Huffman),
/// plus `extra` literal headers.
fn request_block(path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut b = vec![0x82, 0x86]; // :method GET, :scheme http
    for (index, value) in [(4usize, path), (1, "127.0.0.1")] {
        hpack_int(&mut b, 0x00, 4, index); // literal without indexing, indexed name
        hpack_int(&mut b, 0x00, 7, value.len());
        b.extend_from_slice(value.as_bytes());
    }
    for (name, value) in extra {
        b.push(0x00);
        hpack_int(&mut b, 0x00, 7, name.len());
        b.extend_from_slice(name.as_bytes());
        hpack_int(&mut b, 0x00, 7, value.len());
        b.extend_from_slice(value.as_bytes());
    }
    b
}

/// Reads frames until `want` matches one (returned as kind, flags, stream, payload) or 5 s pass.
async fn read_until(
    tcp: &mut TcpStream,
    want: impl Fn(u8, u32) -> bool,
) -> Option<(u8, u8, u32, Vec<u8>)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut head = [0u8; 9];
        tokio::time::timeout_at(deadline, tcp.read_exact(&mut head))
            .await
            .ok()?
            .ok()?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        tokio::time::timeout_at(deadline, tcp.read_exact(&mut payload))
            .await
            .ok()?
            .ok()?;
        if want(head[3], stream) {
            return Some((head[3], head[4], stream, payload));
        }
    }
}

async fn h2_connect(addr: SocketAddr) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    tcp.write_all(&hello).await.unwrap();
    tcp
}

/// An origin that accepts and never answers, so proxied streams stay open.
async fn silent_origin() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    (addr, task)
}

#[tokio::test]
async fn h2_streams_beyond_the_limit_are_refused() {
    let (origin, _held) = silent_origin().await;
    let mut config = test_config();
    config.server.h2_max_concurrent_streams = 2;
    config.upstream.header_timeout_secs = 30;
    let s = Sluice::start(config).await;
    let mut tcp = h2_connect(s.addr).await;
    let path = format!("/proxy/stream?d={}", enc(&format!("http://{origin}/x")));
    // Three requests in one write; the first two wait on the silent origin and stay open.
    let mut burst = Vec::new();
    for id in [1u32, 3, 5] {
        burst.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            id,
            &request_block(&path, &[]),
        ));
    }
    tcp.write_all(&burst).await.unwrap();
    let (_, _, stream, payload) = read_until(&mut tcp, |kind, _| kind == RST_STREAM)
        .await
        .expect("a RST_STREAM for the stream over the limit");
    assert_eq!(stream, 5);
    assert_eq!(payload, 7u32.to_be_bytes(), "REFUSED_STREAM");
    // The connection itself stays usable: once a stream ends, a new one is served.
    tcp.write_all(&frame(RST_STREAM, 0, 1, &8u32.to_be_bytes())) // CANCEL
        .await
        .unwrap();
    tcp.write_all(&frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        7,
        &request_block("/health", &[]),
    ))
    .await
    .unwrap();
    let (_, _, stream, block) = read_until(&mut tcp, |kind, _| kind == HEADERS)
        .await
        .expect("stream 7 answered");
    assert_eq!(stream, 7);
    assert_eq!(block.first(), Some(&0x88), ":status 200 (static index 8)");
}

#[tokio::test]
async fn h2_oversize_header_list_gets_431() {
    let mut config = test_config();
    config.server.max_header_bytes = 4096;
    let s = Sluice::start(config).await;
    let mut tcp = h2_connect(s.addr).await;
    let big = "a".repeat(8000);
    tcp.write_all(&frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &request_block("/health", &[("x-padding", &big)]),
    ))
    .await
    .unwrap();
    let (_, flags, stream, block) = read_until(&mut tcp, |kind, _| kind == HEADERS)
        .await
        .expect("a response to the oversize request");
    assert_eq!(stream, 1);
    assert_ne!(flags & END_STREAM, 0, "431 has no body");
    // `:status` as a literal without indexing with the static name index 8 (the table has no
    // 431 entry), value "431" raw: sluice's responses never use Huffman coding or the dynamic
    // table (`vendor/h2-hpack-static.patch`).
    assert!(
        block
            .windows(5)
            .any(|w| w == [0x08, 0x03, b'4', b'3', b'1']),
        "not a 431: {block:02x?}"
    );
    // A normal request on the same connection still works.
    tcp.write_all(&frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        3,
        &request_block("/health", &[]),
    ))
    .await
    .unwrap();
    let (_, _, stream, block) = read_until(&mut tcp, |kind, id| kind == HEADERS && id == 3)
        .await
        .expect("stream 3 answered");
    assert_eq!(stream, 3);
    assert_eq!(block.first(), Some(&0x88));
}

#[tokio::test]
async fn h2_stream_with_its_window_held_shut_releases_its_upstream() {
    let (origin, mut ended) = endless_origin().await;
    let mut config = test_config();
    config.server.send_timeout_secs = 1;
    config.upstream.idle_read_timeout_secs = 60;
    config.upstream.header_timeout_secs = 60;
    let s = Sluice::start(config).await;
    // SETTINGS_INITIAL_WINDOW_SIZE = 0: the server may send no DATA on any stream, while the
    // TCP socket itself stays perfectly writable.
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[0x00, 0x04, 0, 0, 0, 0]));
    let path = format!(
        "/proxy/stream?d={}",
        enc(&format!("http://{origin}/live.ts"))
    );
    hello.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &request_block(&path, &[]),
    ));
    tcp.write_all(&hello).await.unwrap();
    let (_, _, _, block) = read_until(&mut tcp, |kind, id| kind == HEADERS && id == 1)
        .await
        .expect("response head on stream 1");
    assert_eq!(block.first(), Some(&0x88), ":status 200");
    let stopped = Instant::now();
    let (_, err) = tokio::time::timeout(Duration::from_secs(15), ended.recv())
        .await
        .expect("the origin's connection is closed once the stream has stalled")
        .unwrap();
    let took = stopped.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "released too early: {took:?}"
    );
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        "{err}"
    );
    // Only that stream was given up: the connection still serves.
    tcp.write_all(&frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        3,
        &request_block("/health", &[]),
    ))
    .await
    .unwrap();
    let (_, _, _, block) = read_until(&mut tcp, |kind, id| kind == HEADERS && id == 3)
        .await
        .expect("stream 3 answered");
    assert_eq!(block.first(), Some(&0x88));
    assert_eq!(
        metric(&s, "sluice_downstream_send_timeouts_total").await,
        1.0
    );
}

// === IPTV: a frozen viewer beside a healthy one ===

#[tokio::test]
async fn iptv_hub_stops_holding_history_for_a_frozen_viewer() {
    use iptv_support::{read_bytes, ts_datagrams, wait_joined, Gateway, Sender};
    let group = "239.71.0.31";
    let mut cfg = iptv_support::config();
    // A generous ring: without the hub's own check, the frozen viewer would pin up to 32 MiB.
    cfg.buffer_bytes = 32 * 1024 * 1024;
    cfg.burst_bytes = 256 * 1024;
    cfg.slow_subscriber_timeout_ms = 300;
    cfg.no_data_timeout_ms = 10_000;
    cfg.linger_ms = 10_000;
    let gw = Gateway::start(cfg).await;
    let path = format!("/rtp/{group}:46031?iface=lo");
    let sender = Sender::new(group, 46031);
    let fast = gw.spawn_get(&path);
    wait_joined(group, true).await;
    let stream = ts_datagrams(16_000, 0x131, None); // ~21 MB
    sender.send_rtp(&stream[..1], 0);
    let fast = fast.await.unwrap();
    // The frozen viewer: a tiny receive window, and it never reads.
    let sock = TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut frozen = sock.connect(gw.addr).await.unwrap();
    frozen
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    // Let it attach before the stream starts (it then holds from the live edge).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let send = sender.spawn_rtp_paced(stream[1..].to_vec(), 1, 4); // ~4 s
    let fast_read = tokio::spawn(read_bytes(fast, stream.concat().len()));
    // Sample what the hub holds while the stream runs, once the frozen viewer has had time to
    // fill its socket buffers and be declared stalled.
    let mut peak = 0u64;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    while !send.is_finished() {
        let status = gw.status().await;
        peak = peak.max(status["hubs"][0]["buffered_bytes"].as_u64().unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    send.join().unwrap();
    let got = fast_read.await.unwrap();
    let status = gw.status().await;
    // The fast viewer started on the burst, which holds datagram 0, then took everything.
    let want = stream.concat();
    assert_eq!(got.len(), want.len(), "{status}");
    assert_eq!(
        Sha256::digest(&got),
        Sha256::digest(&want),
        "fast viewer unaffected"
    );
    let hub = &status["hubs"][0];
    // The fast viewer has finished and left; the frozen one is still attached, evicted.
    assert_eq!(hub["subscribers"], 1, "{status}");
    assert_eq!(
        hub["clients"][0]["lag_bytes"],
        serde_json::Value::Null,
        "{status}"
    );
    assert_eq!(hub["slow_released"], 1, "{status}");
    // Held: the burst history plus at most one chunk being published, not the frozen lag.
    let bound = 256 * 1024 + 128 * 1024;
    assert!(
        peak > 0 && peak <= bound,
        "peak ring bytes {peak}: {status}"
    );
    assert!(hub["buffered_bytes"].as_u64().unwrap() <= bound, "{status}");
    drop(frozen);
}
