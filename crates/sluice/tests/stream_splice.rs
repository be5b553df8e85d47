//! `/proxy/stream` bodies spliced socket to socket: bytes by SHA-256, keep-alive after a spliced
//! body, an upstream cut or gone silent mid-body, a client gone mid-body, and the requests that
//! must not be spliced (HEAD, Range, the switch off).

mod support;

use std::time::Duration;

use sluice_http::response_head::{self, BodyLength, ResponseHead};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn stream_path(d: &str) -> String {
    format!("/proxy/stream?d={}", enc(d))
}

/// Sends one request on `conn` (kept open).
async fn send(conn: &mut TcpStream, method: &str, path: &str, extra: &str) {
    let req = format!("{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n{extra}\r\n");
    conn.write_all(req.as_bytes()).await.unwrap();
}

/// Reads one response from `conn`: the head, and the body (`Err(bytes got)` when the connection
/// ended first). `pending` carries bytes read past the previous response.
async fn read_response(
    conn: &mut TcpStream,
    pending: &mut Vec<u8>,
    head_request: bool,
) -> (ResponseHead, Result<Vec<u8>, usize>) {
    let head = loop {
        if let Some(h) = response_head::parse(pending).unwrap() {
            pending.drain(..h.len);
            break h;
        }
        let mut chunk = [0u8; 16 * 1024];
        let n = conn.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed before a response head");
        pending.extend_from_slice(&chunk[..n]);
    };
    let len = match head.body_length(head_request).unwrap() {
        BodyLength::Exact(n) => n as usize,
        BodyLength::Empty => 0,
        other => panic!("unexpected framing {other:?}"),
    };
    let mut body = std::mem::take(pending);
    if body.len() > len {
        *pending = body.split_off(len);
    }
    while body.len() < len {
        let mut chunk = vec![0u8; 256 * 1024];
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return (head, Err(body.len())),
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    if body.len() > len {
        *pending = body.split_off(len);
    }
    (head, Ok(body))
}

async fn spliced_count(s: &Sluice) -> u64 {
    let text = get(&s.url("/metrics")).await.body.unwrap();
    let text = String::from_utf8_lossy(&text).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("sluice_media_spliced_bodies_total "))
        .expect("metric present")
        .trim()
        .parse()
        .unwrap()
}

/// True once the peer has closed `conn` (EOF or reset) within `limit`.
async fn closes_within(conn: &mut TcpStream, limit: Duration) -> bool {
    let mut sink = vec![0u8; 256 * 1024];
    tokio::time::timeout(limit, async {
        loop {
            match conn.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn spliced_bodies_are_exact_and_the_connection_stays_alive() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    let mut conn = TcpStream::connect(s.addr).await.unwrap();
    let mut pending = Vec::new();
    let big = stream_path(&origin.url("/big"));
    for round in 0..2 {
        send(&mut conn, "GET", &big, "").await;
        let (head, body) = read_response(&mut conn, &mut pending, false).await;
        assert_eq!(head.status, 200, "round {round}");
        assert_eq!(head.headers["content-length"], BIG_LEN.to_string());
        assert_eq!(head.headers["content-type"], "video/mp4");
        assert_eq!(head.headers["x-content-type-options"], "nosniff");
        assert!(head.headers.get("connection").is_none());
        assert_eq!(sha256(&body.unwrap()), sha256(&origin.big), "round {round}");
    }
    // A small answer (all of it arrives with the head) on the same connection, then pipelined
    // requests: the spliced body must not swallow or reorder what follows it.
    let small = stream_path(&origin.url("/small"));
    send(&mut conn, "GET", &small, "").await;
    let (head, body) = read_response(&mut conn, &mut pending, false).await;
    assert_eq!(head.status, 200);
    assert_eq!(body.unwrap(), b"hello");
    let pipelined =
        format!("GET {big} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\nGET {small} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n");
    conn.write_all(pipelined.as_bytes()).await.unwrap();
    let (_, body) = read_response(&mut conn, &mut pending, false).await;
    assert_eq!(sha256(&body.unwrap()), sha256(&origin.big));
    let (_, body) = read_response(&mut conn, &mut pending, false).await;
    assert_eq!(body.unwrap(), b"hello");
    assert_eq!(spliced_count(&s).await, 3);
    let seen = origin.seen_path("/big");
    assert_eq!(seen.len(), 3);
    // Every spliced body was read to its end, so one upstream connection carried all five.
    let text = String::from_utf8(get(&s.url("/metrics")).await.body.unwrap().to_vec()).unwrap();
    assert!(
        text.contains("sluice_upstream_connections_opened_total 1\n"),
        "{text}"
    );
    assert!(
        text.contains("sluice_upstream_connections_reused_total 4\n"),
        "{text}"
    );
}

/// No pipe to be had (a descriptor limit; here the pool made to refuse on this thread, where the
/// in-process server runs): the body is streamed whole from the same upstream connection, not
/// cut short. Before, the pipe was taken at the first body byte, after the 200 and its
/// Content-Length were committed, so every such answer was a truncated 200.
#[tokio::test]
async fn without_a_pipe_the_body_is_streamed_whole() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    let mut conn = TcpStream::connect(s.addr).await.unwrap();
    let mut pending = Vec::new();
    let big = stream_path(&origin.url("/big"));
    sluice::net::splice::refuse_pipes_on_this_thread(true);
    for round in 0..2 {
        send(&mut conn, "GET", &big, "").await;
        let (head, body) = tokio::time::timeout(
            Duration::from_secs(20),
            read_response(&mut conn, &mut pending, false),
        )
        .await
        .expect("an answer");
        assert_eq!(head.status, 200, "round {round}");
        assert_eq!(head.headers["content-length"], BIG_LEN.to_string());
        let body = body.unwrap_or_else(|got| panic!("round {round}: cut after {got} bytes"));
        assert_eq!(sha256(&body), sha256(&origin.big), "round {round}");
    }
    sluice::net::splice::refuse_pipes_on_this_thread(false);
    assert_eq!(spliced_count(&s).await, 0);
    // Each body was read to its end, so the upstream connection served both.
    let text = String::from_utf8(get(&s.url("/metrics")).await.body.unwrap().to_vec()).unwrap();
    assert!(
        text.contains("sluice_upstream_connections_opened_total 1\n"),
        "{text}"
    );
    // And with pipes again, the same connection splices.
    send(&mut conn, "GET", &big, "").await;
    let (_, body) = read_response(&mut conn, &mut pending, false).await;
    assert_eq!(sha256(&body.unwrap()), sha256(&origin.big));
    assert_eq!(spliced_count(&s).await, 1);
}

#[tokio::test]
async fn head_range_and_transforms_are_not_spliced() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    let url = s.url(&stream_path(&origin.url("/big")));
    let head = request("HEAD", &url, &[]).await;
    assert_eq!(head.status, 200);
    assert_eq!(head.headers["content-length"], BIG_LEN.to_string());
    assert!(head.body.unwrap().is_empty());
    let ranged = request("GET", &url, &[("range", "bytes=1000-2000999")]).await;
    assert_eq!(ranged.status, 206);
    assert_eq!(
        sha256(&ranged.body.unwrap()),
        sha256(&origin.big[1000..=2_000_999])
    );
    assert_eq!(spliced_count(&s).await, 0);
}

#[tokio::test]
async fn switched_off_streams_the_same_bytes() {
    let origin = Origin::start().await;
    let mut config = test_config();
    config.media.splice_stream = false;
    let s = Sluice::start(config).await;
    let r = get(&s.url(&stream_path(&origin.url("/big")))).await;
    assert_eq!(sha256(&r.body.unwrap()), sha256(&origin.big));
    assert_eq!(spliced_count(&s).await, 0);
}

#[tokio::test]
async fn upstream_cut_mid_body_closes_the_client_connection() {
    let origin = Origin::start().await;
    let s = Sluice::start(test_config()).await;
    let mut conn = TcpStream::connect(s.addr).await.unwrap();
    let mut pending = Vec::new();
    // Promises 1 MiB, sends 64 KiB, then the origin's connection is cut.
    send(&mut conn, "GET", &stream_path(&origin.url("/reset")), "").await;
    let (head, body) = tokio::time::timeout(
        Duration::from_secs(10),
        read_response(&mut conn, &mut pending, false),
    )
    .await
    .expect("the cut must close the connection, not hang it");
    assert_eq!(head.status, 200);
    assert_eq!(head.headers["content-length"], (1024 * 1024).to_string());
    assert_eq!(body.unwrap_err(), 64 * 1024);
    assert_eq!(spliced_count(&s).await, 1);
}

/// An origin on a raw socket: answers one request with `Content-Length: len`, writes `send`
/// bytes of `fill`, then keeps the connection open and silent; reports when it sees the
/// connection closed by sluice.
async fn raw_origin(len: u64, send: usize) -> (String, tokio::sync::oneshot::Receiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/raw", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut req = Vec::new();
        let mut buf = [0u8; 4096];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0);
            req.extend_from_slice(&buf[..n]);
        }
        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n");
        s.write_all(head.as_bytes()).await.unwrap();
        let chunk = vec![0x5au8; 64 * 1024];
        let mut left = send;
        while left > 0 {
            let n = left.min(chunk.len());
            if s.write_all(&chunk[..n]).await.is_err() {
                let _ = tx.send(());
                return;
            }
            left -= n;
        }
        // Silent from here; sluice closing the connection shows as EOF or a reset.
        let _ = s.read(&mut buf).await;
        let _ = tx.send(());
    });
    (url, rx)
}

#[tokio::test]
async fn silent_upstream_hits_the_idle_read_timeout() {
    let (url, origin_closed) = raw_origin(10 * 1024 * 1024, 1000).await;
    let s = Sluice::start(test_config()).await;
    let mut conn = TcpStream::connect(s.addr).await.unwrap();
    let mut pending = Vec::new();
    send(&mut conn, "GET", &stream_path(&url), "").await;
    // idle_read_timeout_secs = 2 in the test config.
    let (head, body) = tokio::time::timeout(
        Duration::from_secs(8),
        read_response(&mut conn, &mut pending, false),
    )
    .await
    .expect("an idle upstream must end the response");
    assert_eq!(head.status, 200);
    assert_eq!(body.unwrap_err(), 1000);
    tokio::time::timeout(Duration::from_secs(5), origin_closed)
        .await
        .expect("the upstream connection is closed too")
        .unwrap();
}

#[tokio::test]
async fn client_gone_mid_body_closes_the_upstream() {
    // More than the client reads and the socket buffers between can hold.
    let (url, origin_closed) = raw_origin(256 * 1024 * 1024, 256 * 1024 * 1024).await;
    let s = Sluice::start(test_config()).await;
    let mut conn = TcpStream::connect(s.addr).await.unwrap();
    send(&mut conn, "GET", &stream_path(&url), "").await;
    let mut got = vec![0u8; 1024 * 1024];
    conn.read_exact(&mut got).await.unwrap();
    assert!(got.starts_with(b"HTTP/1.1 200 OK\r\n"));
    drop(conn);
    tokio::time::timeout(Duration::from_secs(10), origin_closed)
        .await
        .expect("the upstream connection must close when the client goes")
        .unwrap();
    assert_eq!(spliced_count(&s).await, 1);
    // The server still answers (and the connection slot was released).
    let mut again = TcpStream::connect(s.addr).await.unwrap();
    let origin = Origin::start().await;
    send(&mut again, "GET", &stream_path(&origin.url("/small")), "").await;
    let (_, body) = read_response(&mut again, &mut Vec::new(), false).await;
    assert_eq!(body.unwrap(), b"hello");
    assert!(!closes_within(&mut again, Duration::from_millis(200)).await);
}

#[tokio::test]
async fn a_body_until_close_is_read_from_the_same_connection() {
    // No Content-Length, HTTP/1.0 style: the body ends when the origin closes.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/live.ts", listener.local_addr().unwrap());
    let body = pattern(3 * 1024 * 1024 + 17);
    let sent = body.clone();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let sent = sent.clone();
            tokio::spawn(async move {
                let mut req = [0u8; 4096];
                let _ = s.read(&mut req).await;
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: video/mp2t\r\nconnection: close\r\n\r\n",
                    )
                    .await;
                let _ = s.write_all(&sent).await;
            });
        }
    });
    let s = Sluice::start(test_config()).await;
    let r = get(&s.url(&stream_path(&url))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "video/mp2t");
    assert_eq!(sha256(&r.body.unwrap()), sha256(&body));
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(spliced_count(&s).await, 0);
}

/// An origin on raw sockets (keep-alive): `/a` is a 302 to `/b`, `/b` a 2-byte 200; its first
/// answer comes after `first`, every later one after `then`. The paths asked, in order.
async fn redirecting_origin(
    first: Duration,
    then: Duration,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = asked.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut pending = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => pending.extend_from_slice(&buf[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&pending[..end]).into_owned();
                    pending.drain(..end + 4);
                    let path = head.split(' ').nth(1).unwrap_or("").to_string();
                    let wait = {
                        let mut seen = seen.lock().unwrap();
                        seen.push(path.clone());
                        if seen.len() == 1 {
                            first
                        } else {
                            then
                        }
                    };
                    tokio::time::sleep(wait).await;
                    let answer: &[u8] = if path == "/a" {
                        b"HTTP/1.1 302 Found\r\nlocation: /b\r\ncontent-length: 0\r\n\r\n"
                    } else {
                        b"HTTP/1.1 200 OK\r\ncontent-type: video/mp4\r\ncontent-length: 2\r\n\r\nok"
                    };
                    if s.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (base, asked)
}

/// A redirect on the spliced path is followed by the streamed one within the same
/// time-to-headers deadline: the fallback started a header timeout of its own, so a viewer
/// waited up to twice `header_timeout_secs` (here 1 s for the raw try's 302, then 0.7 s for
/// each hop of the streamed one: 2.4 s in all, past the 2 s deadline, was a 200).
#[tokio::test]
async fn a_redirect_on_the_spliced_path_keeps_the_header_deadline() {
    // header_timeout_secs = 2 in the test config.
    let s = Sluice::start(test_config()).await;
    let (fast, asked) = redirecting_origin(Duration::ZERO, Duration::ZERO).await;
    let mut conn = TcpStream::connect(s.addr).await.unwrap();
    send(&mut conn, "GET", &stream_path(&format!("{fast}/a")), "").await;
    let (head, body) = read_response(&mut conn, &mut Vec::new(), false).await;
    assert_eq!(head.status, 200);
    assert_eq!(body.unwrap(), b"ok");
    assert_eq!(*asked.lock().unwrap(), ["/a", "/a", "/b"]);

    let (slow, asked) =
        redirecting_origin(Duration::from_millis(1000), Duration::from_millis(700)).await;
    let mut conn = TcpStream::connect(s.addr).await.unwrap();
    send(&mut conn, "GET", &stream_path(&format!("{slow}/a")), "").await;
    let (head, _) = tokio::time::timeout(
        Duration::from_secs(10),
        read_response(&mut conn, &mut Vec::new(), false),
    )
    .await
    .expect("an answer");
    assert_eq!(head.status, 504, "a second header timeout for the fallback");
    assert_eq!(asked.lock().unwrap()[..2], ["/a", "/a"], "the fallback ran");
    assert_eq!(spliced_count(&s).await, 0);
}
