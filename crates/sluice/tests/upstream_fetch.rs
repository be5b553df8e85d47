//! `Upstream::fetch`, the whole-body client of the playlist and the guide, against scripted
//! HTTP/1.1 origins on loopback sockets: body framings, redirects, bounds, deadlines, the
//! address guard and malformed answers. Built in every feature set (the gateway-only build
//! included).

mod self_signed;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode};
use prometheus_client::registry::Registry;
use sha2::{Digest, Sha256};
use sluice::config::UpstreamConfig;
use sluice::upstream::fetch::FetchError;
use sluice::upstream::{ConnectError, Upstream, UpstreamError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What a scripted origin sends for a path: pieces written one after another (with a short
/// pause between them, so bodies arrive over several reads, and `wait` before the first), then
/// `stall` or close.
#[derive(Clone, Default)]
struct Script {
    pieces: Vec<Vec<u8>>,
    stall: bool,
    wait: Duration,
}

fn script(pieces: &[&[u8]]) -> Script {
    Script {
        pieces: pieces.iter().map(|p| p.to_vec()).collect(),
        ..Script::default()
    }
}

/// A loopback origin answering each request head by its path; keeps every request head.
struct ScriptedOrigin {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
}

impl ScriptedOrigin {
    async fn start(scripts: HashMap<&'static str, Script>) -> ScriptedOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        let scripts = Arc::new(scripts);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let seen = seen.clone();
                let scripts = scripts.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&buf).into_owned();
                    let path = head.split(' ').nth(1).unwrap_or("").to_string();
                    seen.lock().unwrap().push(head);
                    let Some(script) = scripts.get(path.as_str()).cloned() else {
                        let _ = socket
                            .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                            .await;
                        return;
                    };
                    tokio::time::sleep(script.wait).await;
                    for piece in &script.pieces {
                        if socket.write_all(piece).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    if script.stall {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                    }
                });
            }
        });
        ScriptedOrigin { addr, heads }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

fn client(tune: impl FnOnce(&mut UpstreamConfig)) -> Upstream {
    let mut config = UpstreamConfig {
        allow_private: true,
        user_agent: "fetch-test/1".into(),
        ..UpstreamConfig::default()
    };
    tune(&mut config);
    Upstream::new(&config, &mut Registry::default()).unwrap()
}

fn sha256(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

#[tokio::test]
async fn bodies_by_length_chunked_and_close() {
    let body = pattern(50_000);
    let mut chunked = Vec::new();
    for (i, part) in body.chunks(7_000).enumerate() {
        let ext = if i % 2 == 0 { ";x=\"y\"" } else { "" };
        chunked.extend_from_slice(format!("{:X}{ext}\r\n", part.len()).as_bytes());
        chunked.extend_from_slice(part);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\nx-trailer: 1\r\n\r\n");
    let length_head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
    let origin = ScriptedOrigin::start(HashMap::from([
        (
            "/length",
            script(&[length_head.as_bytes(), &body[..100], &body[100..]]),
        ),
        (
            "/chunked",
            script(&[
                b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\nHTTP/1.1 200 OK\r\n\
                  Transfer-Encoding: chunked\r\netag: \"e1\"\r\n\r\n",
                &chunked[..10],
                &chunked[10..],
            ]),
        ),
        (
            "/close",
            script(&[b"HTTP/1.0 200 OK\r\n\r\n", &body[..30_000], &body[30_000..]]),
        ),
        ("/empty", script(&[b"HTTP/1.1 204 No Content\r\n\r\n"])),
    ]))
    .await;
    let up = client(|_| {});
    let want = sha256(&body);
    for path in ["/length", "/chunked", "/close"] {
        let got = up.fetch(&origin.url(path), HeaderMap::new(), 1 << 20).await;
        let got = got.unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(got.status, StatusCode::OK, "{path}");
        assert_eq!(sha256(&got.body), want, "{path}");
    }
    let chunked = up
        .fetch(&origin.url("/chunked"), HeaderMap::new(), 1 << 20)
        .await
        .unwrap();
    assert_eq!(chunked.headers["etag"], "\"e1\"");
    let empty = up
        .fetch(&origin.url("/empty"), HeaderMap::new(), 1 << 20)
        .await
        .unwrap();
    assert_eq!(
        (empty.status, empty.body.len()),
        (StatusCode::NO_CONTENT, 0)
    );
    let mut headers = HeaderMap::new();
    headers.insert("if-none-match", HeaderValue::from_static("\"e0\""));
    up.fetch(&origin.url("/length?a=1&b=%20"), headers, 1 << 20)
        .await
        .unwrap();
    let head = origin.heads().pop().unwrap();
    assert_eq!(
        head,
        format!(
            "GET /length?a=1&b=%20 HTTP/1.1\r\nhost: {}\r\nuser-agent: fetch-test/1\r\n\
             if-none-match: \"e0\"\r\nx-sluice-loop: {}\r\nconnection: close\r\n\r\n",
            origin.addr,
            sluice::upstream::guard::loop_mark().to_str().unwrap()
        )
    );
}

#[tokio::test]
async fn redirects_are_followed_bounded_and_drop_credentials_across_origins() {
    let other = ScriptedOrigin::start(HashMap::from([(
        "/final",
        script(&[b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfinal"]),
    )]))
    .await;
    let to_other = format!(
        "HTTP/1.1 302 Found\r\nlocation: http://{}/final\r\ncontent-length: 0\r\n\r\n",
        other.addr
    );
    let origin = ScriptedOrigin::start(HashMap::from([
        (
            "/a/start",
            script(&[
                b"HTTP/1.1 301 Moved\r\nlocation: ../b/next?x=1\r\ncontent-length: 3\r\n\r\nabc",
            ]),
        ),
        ("/b/next?x=1", script(&[to_other.as_bytes()])),
        (
            "/loop",
            script(&[b"HTTP/1.1 307 Again\r\nlocation: /loop\r\ncontent-length: 0\r\n\r\n"]),
        ),
        (
            "/ftp",
            script(&[b"HTTP/1.1 302 Found\r\nlocation: ftp://h/x\r\ncontent-length: 0\r\n\r\n"]),
        ),
        (
            "/nolocation",
            script(&[b"HTTP/1.1 302 Found\r\ncontent-length: 4\r\n\r\nbody"]),
        ),
    ]))
    .await;
    let up = client(|c| c.max_redirects = 3);
    let mut headers = HeaderMap::new();
    headers.insert("authorization", HeaderValue::from_static("Basic c2VjcmV0"));
    headers.insert("cookie", HeaderValue::from_static("s=1"));
    let got = up
        .fetch(&origin.url("/a/start"), headers, 1024)
        .await
        .unwrap();
    assert_eq!((got.status, &got.body[..]), (StatusCode::OK, &b"final"[..]));
    let heads = origin.heads();
    assert_eq!(heads.len(), 2);
    assert!(
        heads[1].starts_with("GET /b/next?x=1 HTTP/1.1\r\n"),
        "{}",
        heads[1]
    );
    // Same origin: the credentials go along; another origin: they do not.
    assert!(
        heads[1].contains("authorization: Basic c2VjcmV0\r\n"),
        "{}",
        heads[1]
    );
    let final_head = &other.heads()[0];
    assert!(
        final_head.starts_with("GET /final HTTP/1.1\r\n"),
        "{final_head}"
    );
    assert!(
        !final_head.contains("authorization") && !final_head.contains("cookie"),
        "{final_head}"
    );

    let err = up
        .fetch(&origin.url("/loop"), HeaderMap::new(), 1024)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            FetchError::Upstream(UpstreamError::TooManyRedirects { limit: 3, .. })
        ),
        "{err}"
    );
    assert_eq!(
        origin
            .heads()
            .iter()
            .filter(|h| h.starts_with("GET /loop "))
            .count(),
        4
    );
    let err = up
        .fetch(&origin.url("/ftp"), HeaderMap::new(), 1024)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "upstream 127.0.0.1 sent an unusable redirect: ftp://h/x"
    );
    // A redirect status without a location is an answer like any other.
    let got = up
        .fetch(&origin.url("/nolocation"), HeaderMap::new(), 1024)
        .await
        .unwrap();
    assert_eq!((got.status.as_u16(), &got.body[..]), (302, &b"body"[..]));
}

/// The pooled client's redirects (`Upstream::send`): a `Host` the request set (an `h_host`
/// parameter) goes along while the origin stays the same, and a redirect to another origin
/// carries that origin's own `Host`.
#[cfg(feature = "upstream-pool")]
#[tokio::test]
async fn a_cross_origin_redirect_carries_the_new_origin_s_host() {
    let other = ScriptedOrigin::start(HashMap::from([(
        "/final",
        script(&[b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nfinal"]),
    )]))
    .await;
    let to_other = format!(
        "HTTP/1.1 302 Found\r\nlocation: http://{}/final\r\ncontent-length: 0\r\n\
         connection: close\r\n\r\n",
        other.addr
    );
    let origin = ScriptedOrigin::start(HashMap::from([
        (
            "/same",
            script(&[
                b"HTTP/1.1 302 Found\r\nlocation: /start\r\ncontent-length: 0\r\n\
                       connection: close\r\n\r\n",
            ]),
        ),
        ("/start", script(&[to_other.as_bytes()])),
    ]))
    .await;
    let up = client(|_| {});
    let mut req = sluice::upstream::UpstreamRequest::get(origin.url("/same").parse().unwrap());
    req.headers
        .insert("host", HeaderValue::from_static("vhost.example"));
    let resp = up.send(req).await.unwrap();
    assert_eq!(resp.status, StatusCode::OK);
    assert_eq!(resp.final_url.as_str(), other.url("/final"));
    let heads: Vec<String> = origin.heads().iter().map(|h| h.to_lowercase()).collect();
    assert_eq!(heads.len(), 2);
    for head in &heads {
        assert!(head.contains("\r\nhost: vhost.example\r\n"), "{head}");
    }
    let final_head = other.heads()[0].to_lowercase();
    assert!(
        final_head.contains(&format!("\r\nhost: {}\r\n", other.addr)),
        "{final_head}"
    );
    assert!(!final_head.contains("vhost.example"), "{final_head}");
}

/// The whole-body client's redirects (`Upstream::fetch`), the same rule: a `Host` the caller set
/// goes along while the origin stays the same (another path on it), and a redirect to another
/// origin (another port) carries that origin's own `Host`, never the first one's.
#[tokio::test]
async fn fetch_across_origins_carries_the_new_origin_s_host() {
    let other = ScriptedOrigin::start(HashMap::from([(
        "/final",
        script(&[b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfinal"]),
    )]))
    .await;
    let to_other = format!(
        "HTTP/1.1 302 Found\r\nlocation: http://{}/final\r\ncontent-length: 0\r\n\r\n",
        other.addr
    );
    let origin = ScriptedOrigin::start(HashMap::from([
        (
            "/same",
            script(&[b"HTTP/1.1 302 Found\r\nlocation: /start\r\ncontent-length: 0\r\n\r\n"]),
        ),
        ("/start", script(&[to_other.as_bytes()])),
    ]))
    .await;
    assert_ne!(origin.addr.port(), other.addr.port());
    let up = client(|_| {});
    let mut headers = HeaderMap::new();
    headers.insert("host", HeaderValue::from_static("vhost.example"));
    let got = up.fetch(&origin.url("/same"), headers, 1024).await.unwrap();
    assert_eq!((got.status, &got.body[..]), (StatusCode::OK, &b"final"[..]));
    let heads = origin.heads();
    assert_eq!(heads.len(), 2);
    for head in &heads {
        assert!(head.contains("\r\nhost: vhost.example\r\n"), "{head}");
    }
    let final_heads = other.heads();
    assert_eq!(final_heads.len(), 1);
    let final_head = &final_heads[0];
    assert!(
        final_head.starts_with(&format!("GET /final HTTP/1.1\r\nhost: {}\r\n", other.addr)),
        "{final_head}"
    );
    assert!(!final_head.contains("vhost.example"), "{final_head}");
}

#[tokio::test]
async fn bodies_over_the_bound_are_refused() {
    let big = pattern(10_000);
    let mut chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for part in big.chunks(1000) {
        chunked.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        chunked.extend_from_slice(part);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let origin = ScriptedOrigin::start(HashMap::from([
        (
            "/claims",
            Script {
                pieces: vec![b"HTTP/1.1 200 OK\r\ncontent-length: 1000000000\r\n\r\n".to_vec()],
                stall: true,
                ..Script::default()
            },
        ),
        ("/chunked", script(&[&chunked])),
        ("/close", script(&[b"HTTP/1.1 200 OK\r\n\r\n", &big])),
    ]))
    .await;
    let up = client(|_| {});
    for path in ["/claims", "/chunked", "/close"] {
        let err = up
            .fetch(&origin.url(path), HeaderMap::new(), 4096)
            .await
            .unwrap_err();
        assert!(
            matches!(err, FetchError::TooLarge { limit: 4096 }),
            "{path}: {err}"
        );
    }
    // Exactly at the bound is fine.
    let got = up
        .fetch(&origin.url("/chunked"), HeaderMap::new(), 10_000)
        .await
        .unwrap();
    assert_eq!(sha256(&got.body), sha256(&big));
}

#[tokio::test]
async fn malformed_and_stalled_answers_are_errors() {
    let origin = ScriptedOrigin::start(HashMap::from([
        (
            "/badchunk",
            script(&[b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhelloX"]),
        ),
        (
            "/gzip-coded",
            script(&[b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n"]),
        ),
        (
            "/short",
            script(&[b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"]),
        ),
        (
            "/cut-chunked",
            script(&[b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhe"]),
        ),
        ("/garbage", script(&[b"SSH-2.0-OpenSSH\r\n\r\n"])),
        (
            "/silent",
            Script {
                pieces: vec![],
                stall: true,
                ..Script::default()
            },
        ),
        (
            "/stall",
            Script {
                pieces: vec![b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nab".to_vec()],
                stall: true,
                ..Script::default()
            },
        ),
        ("/closed", script(&[])),
    ]))
    .await;
    let up = client(|c| {
        c.header_timeout_secs = 1;
        c.idle_read_timeout_secs = 1;
    });
    let host = "127.0.0.1";
    for (path, want) in [
        (
            "/badchunk",
            format!("upstream {host} body: chunk data is not followed by CRLF"),
        ),
        (
            "/gzip-coded",
            format!("upstream {host} body: transfer coding other than chunked"),
        ),
        (
            "/short",
            format!("upstream {host} body: connection closed after 3 of 10 bytes"),
        ),
        (
            "/cut-chunked",
            format!("upstream {host} body: connection closed inside a chunked body"),
        ),
        (
            "/garbage",
            format!("upstream {host}: malformed response head: invalid HTTP version"),
        ),
        (
            "/silent",
            format!("upstream {host} sent no response head within 1 s"),
        ),
        ("/stall", format!("upstream {host} sent nothing for 1 s")),
        (
            "/closed",
            format!("upstream {host}: connection closed before a response head"),
        ),
    ] {
        let err = tokio::time::timeout(
            Duration::from_secs(10),
            up.fetch(&origin.url(path), HeaderMap::new(), 1024),
        )
        .await
        .expect("bounded by the client's deadlines")
        .unwrap_err();
        assert_eq!(err.to_string(), want, "{path}");
    }
    for bad in [
        "ftp://127.0.0.1/x",
        "127.0.0.1/x",
        "http:///x",
        "http://h b/a",
    ] {
        assert!(matches!(
            up.fetch(bad, HeaderMap::new(), 1024).await,
            Err(FetchError::BadUrl)
        ));
    }
}

#[tokio::test]
async fn the_address_guard_applies() {
    let origin = ScriptedOrigin::start(HashMap::from([(
        "/x",
        script(&[b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nx"]),
    )]))
    .await;
    let guarded = client(|c| c.allow_private = false);
    let err = guarded
        .fetch(&origin.url("/x"), HeaderMap::new(), 1024)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            FetchError::Upstream(UpstreamError::Connect(ConnectError::Refused {
                reason: "loopback",
                ..
            }))
        ),
        "{err}"
    );
    assert!(origin.heads().is_empty());
    // IPv6 loopback too.
    let err = guarded
        .fetch("http://[::1]:9/x", HeaderMap::new(), 1024)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("loopback address"), "{err}");
    #[cfg(not(feature = "tls"))]
    {
        let err = client(|_| {})
            .fetch(
                &format!("https://{}/x", origin.addr),
                HeaderMap::new(),
                1024,
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("no TLS client"), "{err}");
    }
}

/// `https` through the connector's TLS: verified against `upstream.ca_file`, refused without it;
/// the chunked body read through the TLS stream.
#[cfg(feature = "tls")]
#[tokio::test]
async fn https_is_verified_and_read() {
    let self_signed::SelfSigned { cert, key, .. } = self_signed::SelfSigned::new(&["localhost"]);
    let config = sluice::server::tls::server_config(cert.path(), key.path()).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let body = pattern(40_000);
    let mut answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for part in body.chunks(9_000) {
        answer.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        answer.extend_from_slice(part);
        answer.extend_from_slice(b"\r\n");
    }
    answer.extend_from_slice(b"0\r\n\r\n");
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let answer = answer.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(socket).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut chunk = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = tls.write_all(&answer).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    let url = format!("https://localhost:{port}/guide.xml");
    let trusting = client(|c| c.ca_file = Some(cert.path().to_path_buf()));
    let got = trusting
        .fetch(
            &url.replace("localhost", "127.0.0.1"),
            HeaderMap::new(),
            1 << 20,
        )
        .await;
    let err = got.unwrap_err();
    assert!(
        matches!(
            err,
            FetchError::Upstream(UpstreamError::Connect(ConnectError::Tls { .. }))
        ),
        "the certificate does not name 127.0.0.1, so the handshake must fail: {err}"
    );
    let got = trusting.fetch(&url, HeaderMap::new(), 1 << 20).await;
    // `localhost` may resolve to ::1 first, where nothing listens: Happy Eyeballs falls back.
    let got = got.unwrap();
    assert_eq!(sha256(&got.body), sha256(&body));
    let err = client(|_| {})
        .fetch(&url, HeaderMap::new(), 1 << 20)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            FetchError::Upstream(UpstreamError::Connect(ConnectError::Tls { .. }))
        ),
        "{err}"
    );
}

/// The gateway's fetches carry this process's loop mark on every hop, as the pooled client's
/// requests do, so a playlist or guide URL that leads back to this sluice is refused there
/// rather than fetched again; a mark the caller passed (another sluice's) is replaced. Before,
/// they carried none.
#[tokio::test]
async fn fetch_carries_the_loop_mark_on_every_hop() {
    let other = ScriptedOrigin::start(HashMap::from([(
        "/final",
        script(&[b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfinal"]),
    )]))
    .await;
    let to_other = format!(
        "HTTP/1.1 302 Found\r\nlocation: http://{}/final\r\ncontent-length: 0\r\n\r\n",
        other.addr
    );
    let origin =
        ScriptedOrigin::start(HashMap::from([("/start", script(&[to_other.as_bytes()]))])).await;
    let up = client(|_| {});
    let mut headers = HeaderMap::new();
    headers.insert(
        "x-sluice-loop",
        HeaderValue::from_static("0123456789abcdef"),
    );
    let got = up
        .fetch(&origin.url("/start"), headers, 1024)
        .await
        .unwrap();
    assert_eq!((got.status, &got.body[..]), (StatusCode::OK, &b"final"[..]));
    let mark = sluice::upstream::guard::loop_mark().to_str().unwrap();
    let field = format!("\r\n{}: {mark}\r\n", sluice::upstream::guard::LOOP_HEADER);
    let heads = [origin.heads(), other.heads()].concat();
    assert_eq!(heads.len(), 2);
    for head in &heads {
        assert!(head.to_lowercase().contains(&field), "{head}");
        assert!(!head.contains("0123456789abcdef"), "{head}");
    }
}

/// Interim heads before the answer are skipped, 500 of them in one read included (each was a
/// copy of all the bytes after it), and the body after them is read whole; a flood of them past
/// the bound (1,024 per response) is an error, a 502 to whoever asked.
#[tokio::test]
async fn many_interim_heads_are_skipped_and_a_flood_is_refused() {
    let body = pattern(10_000);
    let mut hinted = b"HTTP/1.1 103 Early Hints\r\n\r\n".repeat(500);
    hinted.extend_from_slice(b"HTTP/1.1 200 OK\r\ncontent-length: 10000\r\n\r\n");
    hinted.extend_from_slice(&body);
    let mut flood = b"HTTP/1.1 103 Early Hints\r\n\r\n".repeat(1100);
    flood.extend_from_slice(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
    let origin = ScriptedOrigin::start(HashMap::from([
        ("/hinted", script(&[&hinted])),
        ("/flood", script(&[&flood])),
    ]))
    .await;
    let up = client(|_| {});
    let got = up
        .fetch(&origin.url("/hinted"), HeaderMap::new(), 1 << 20)
        .await
        .unwrap();
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(sha256(&got.body), sha256(&body));
    match up
        .fetch(&origin.url("/flood"), HeaderMap::new(), 1 << 20)
        .await
    {
        Err(FetchError::Upstream(UpstreamError::Protocol { detail, .. })) => {
            assert!(detail.contains("informational responses"), "{detail}")
        }
        other => panic!("a flood of interim heads: {other:?}"),
    }
}

/// The time-to-headers deadline is one for a fetch and all its redirects: an origin that
/// answers each of three redirects after 0.6 of the header timeout fails the fetch (a 504 to
/// whoever asked) at its second hop. Before, each hop had a deadline of its own and the fetch
/// got its answer at the fourth. Fast redirects are still followed.
#[tokio::test]
async fn the_header_deadline_spans_every_redirect() {
    let hops = |wait: Duration| {
        HashMap::from([
            ("/r0", redirect_to("/r1", wait)),
            ("/r1", redirect_to("/r2", wait)),
            ("/r2", redirect_to("/end", wait)),
            (
                "/end",
                Script {
                    wait,
                    ..script(&[b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"])
                },
            ),
        ])
    };
    let up = client(|c| c.header_timeout_secs = 1);
    let slow = ScriptedOrigin::start(hops(Duration::from_millis(600))).await;
    match up.fetch(&slow.url("/r0"), HeaderMap::new(), 1024).await {
        Err(FetchError::Upstream(UpstreamError::HeaderTimeout { .. })) => {}
        other => panic!("slow redirects: {other:?}"),
    }
    assert_eq!(slow.heads().len(), 2, "hops asked");
    let fast = ScriptedOrigin::start(hops(Duration::ZERO)).await;
    let got = up
        .fetch(&fast.url("/r0"), HeaderMap::new(), 1024)
        .await
        .unwrap();
    assert_eq!((got.status, &got.body[..]), (StatusCode::OK, &b"ok"[..]));
    assert_eq!(fast.heads().len(), 4);
}

/// A 302 to `location` sent after `wait`.
fn redirect_to(location: &str, wait: Duration) -> Script {
    let head = format!("HTTP/1.1 302 Found\r\nlocation: {location}\r\ncontent-length: 0\r\n\r\n");
    Script {
        wait,
        ..script(&[head.as_bytes()])
    }
}
