//! The upstream client through real sockets: TLS both ways (ALPN h2 when enabled), per-host
//! verification opt-out, HTTP CONNECT and SOCKS5 routes, and the per-host limit applying to setups,
//! not to open streams.

mod self_signed;
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use self_signed::SelfSigned as Cert;
use sluice::config::RouteConfig;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TLS origin answering every request with its HTTP version.
async fn tls_origin(c: &Cert) -> u16 {
    let config = sluice::server::tls::server_config(c.cert.path(), c.key.path()).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let svc = hyper::service::service_fn(|req: http::Request<_>| async move {
                    let v = format!("{:?}", req.version());
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(
                        v,
                    ))))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    port
}

#[tokio::test]
async fn upstream_tls_h2_and_verification_opt_out() {
    let c = Cert::new(&["localhost"]);
    let port = tls_origin(&c).await;
    let d = format!("https://localhost:{port}/x");
    // Verified by default: a self-signed origin fails with a TLS error.
    let s = Sluice::start(test_config()).await;
    let r = get(&s.url(&format!("/proxy/stream?d={}", enc(&d)))).await;
    assert_eq!(r.status, 502);
    let v: serde_json::Value = serde_json::from_slice(&r.body.unwrap()).unwrap();
    assert_eq!(v["kind"], "tls");
    // Opted out for this host: works, over HTTP/1.1 by default (one connection per stream).
    let mut config = test_config();
    config.upstream.insecure_hosts = vec!["localhost".into()];
    let s = Sluice::start(config.clone()).await;
    let r = get(&s.url(&format!("/proxy/stream?d={}", enc(&d)))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), "HTTP/1.1");
    // With HTTP/2 upstreams turned on, ALPN picks HTTP/2.
    config.upstream.http2 = true;
    let s = Sluice::start(config).await;
    let r = get(&s.url(&format!("/proxy/stream?d={}", enc(&d)))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), "HTTP/2.0");
}

#[tokio::test]
async fn downstream_tls_negotiates_h2() {
    let c = Cert::new(&["localhost"]);
    let mut config = test_config();
    config.server.tls_cert = Some(c.cert.path().to_path_buf());
    config.server.tls_key = Some(c.key.path().to_path_buf());
    let s = Sluice::start(config).await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(c.der.clone().into()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(s.addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let resp = send
        .send_request(
            http::Request::get("https://localhost/health")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, r#"{"status":"healthy"}"#);
}

/// A minimal HTTP CONNECT proxy; counts tunnels.
async fn connect_proxy(count: Arc<AtomicUsize>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let count = count.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    head.push(s.read_u8().await.unwrap());
                }
                let line = String::from_utf8(head).unwrap();
                let target = line.split_whitespace().nth(1).unwrap().to_string();
                let mut up = TcpStream::connect(target).await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .unwrap();
                let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
            });
        }
    });
    port
}

/// A minimal SOCKS5 proxy (no auth, IPv4 or domain targets); counts tunnels.
async fn socks_proxy(count: Arc<AtomicUsize>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let count = count.clone();
            tokio::spawn(async move {
                let mut hello = [0u8; 2];
                s.read_exact(&mut hello).await.unwrap();
                let mut methods = vec![0u8; hello[1] as usize];
                s.read_exact(&mut methods).await.unwrap();
                s.write_all(&[5, 0]).await.unwrap();
                let mut req = [0u8; 4];
                s.read_exact(&mut req).await.unwrap();
                let host = match req[3] {
                    1 => {
                        let mut ip = [0u8; 4];
                        s.read_exact(&mut ip).await.unwrap();
                        std::net::Ipv4Addr::from(ip).to_string()
                    }
                    3 => {
                        let n = s.read_u8().await.unwrap() as usize;
                        let mut name = vec![0u8; n];
                        s.read_exact(&mut name).await.unwrap();
                        String::from_utf8(name).unwrap()
                    }
                    other => panic!("address type {other}"),
                };
                let port = s.read_u16().await.unwrap();
                let mut up = TcpStream::connect((host.as_str(), port)).await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                s.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0]).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn routes_through_connect_and_socks5() {
    let origin = Origin::start().await;
    let (http_count, socks_count) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let http_port = connect_proxy(http_count.clone()).await;
    let socks_port = socks_proxy(socks_count.clone()).await;
    let mut config = test_config();
    config.upstream.routes = vec![
        RouteConfig {
            pattern: "all".into(),
            proxy: format!("http://127.0.0.1:{http_port}"),
            verify_tls: true,
        },
        RouteConfig {
            pattern: "localhost".into(),
            proxy: format!("socks5h://127.0.0.1:{socks_port}"),
            verify_tls: true,
        },
    ];
    let s = Sluice::start(config).await;
    // 127.0.0.1 matches only `all`: CONNECT.
    let r = get(&s.url(&format!("/proxy/stream?d={}", enc(&origin.url("/small"))))).await;
    assert_eq!(r.body.unwrap(), "hello");
    assert_eq!(http_count.load(Ordering::SeqCst), 1);
    // localhost matches the exact route: SOCKS5 with the name resolved by the proxy.
    let d = format!("http://localhost:{}/small", origin.addr.port());
    let r = get(&s.url(&format!("/proxy/stream?d={}", enc(&d)))).await;
    assert_eq!(r.body.unwrap(), "hello");
    assert_eq!(socks_count.load(Ordering::SeqCst), 1);
    assert_eq!(http_count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn host_limit_is_on_setups_not_streams() {
    let origin = Origin::start().await;
    let mut config = test_config();
    config.upstream.max_setups_per_host = 1;
    let s = Sluice::start(config).await;
    // Three long streams from one host hold three connections for ~5 s.
    let slow = s.url(&format!("/proxy/stream?d={}", enc(&origin.url("/slow"))));
    let streams: Vec<_> = (0..3)
        .map(|_| {
            let u = slow.clone();
            tokio::spawn(async move { get(&u).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The next viewer of that host does not queue behind them.
    let t = Instant::now();
    let r = get(&s.url(&format!("/proxy/stream?d={}", enc(&origin.url("/small"))))).await;
    assert_eq!(r.body.unwrap(), "hello");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "waited {:?} behind open streams",
        t.elapsed()
    );
    for s in streams {
        assert_eq!(s.await.unwrap().body.unwrap().len(), 12_000);
    }
}

/// On the spliced path too, waiting for a per-host setup slot counts against the time-to-headers
/// deadline: with one slot and an origin that never answers a SYN, the second viewer ends by the
/// header timeout, not after the first viewer's connect attempt and then its own.
#[tokio::test]
async fn spliced_setup_slot_wait_is_bounded_by_the_header_deadline() {
    // A listener with backlog 0 that never accepts: once its queue holds a connection, further
    // SYNs go unanswered, as from a host that drops them.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let silent = sock.listen(0).unwrap();
    let addr = silent.local_addr().unwrap();
    let mut fillers = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr)).await {
            Ok(Ok(s)) => fillers.push(s),
            Ok(Err(e)) => panic!("{e}"),
            Err(_) => break,
        }
        assert!(fillers.len() < 16, "the accept queue never filled");
    }
    let mut config = test_config();
    config.upstream.max_setups_per_host = 1;
    config.upstream.connect_timeout_secs = 4;
    config.upstream.header_timeout_secs = 1;
    let s = Sluice::start(config).await;
    let url = s.url(&format!(
        "/proxy/stream?d={}",
        enc(&format!("http://127.0.0.1:{}/live.ts", addr.port()))
    ));
    let t = Instant::now();
    let viewers: Vec<_> = (0..2)
        .map(|_| {
            let u = url.clone();
            tokio::spawn(async move { (get(&u).await, t.elapsed()) })
        })
        .collect();
    for v in viewers {
        let (r, took) = v.await.unwrap();
        assert_eq!(r.status, 504, "{:?} after {took:?}", r.body);
        assert!(took < Duration::from_millis(1900), "took {took:?}");
    }
    drop((fillers, silent));
}

#[tokio::test]
async fn a_private_ca_in_upstream_ca_file_is_trusted() {
    use std::io::Write;
    // A private CA and a leaf it signed for `localhost`: not in webpki nor the system roots.
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "sluice private test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &rcgen::Issuer::from_params(&ca_params, &ca_key))
        .unwrap();
    let mut cert = tempfile::NamedTempFile::new().unwrap();
    cert.write_all(leaf.pem().as_bytes()).unwrap();
    let mut key = tempfile::NamedTempFile::new().unwrap();
    key.write_all(leaf_key.serialize_pem().as_bytes()).unwrap();
    let mut ca_file = tempfile::NamedTempFile::new().unwrap();
    ca_file.write_all(ca.pem().as_bytes()).unwrap();
    let c = Cert {
        der: leaf.der().to_vec(),
        cert,
        key,
    };
    let port = tls_origin(&c).await;
    let d = enc(&format!("https://localhost:{port}/x"));
    // Without the CA file: a TLS error, as for any unknown issuer.
    let s = Sluice::start(test_config()).await;
    let r = get(&s.url(&format!("/proxy/stream?d={d}"))).await;
    assert_eq!(r.status, 502);
    // With it: verified (no insecure_hosts); HTTP/1.1, the upstream default.
    let mut config = test_config();
    config.upstream.ca_file = Some(ca_file.path().to_path_buf());
    let s = Sluice::start(config).await;
    let r = get(&s.url(&format!("/proxy/stream?d={d}"))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), "HTTP/1.1");
    // A CA file that holds no certificate is refused at start, not on the first request.
    let empty = tempfile::NamedTempFile::new().unwrap();
    let mut config = test_config();
    config.upstream.ca_file = Some(empty.path().to_path_buf());
    let err = sluice::app::App::new(&config).err().unwrap();
    assert!(
        format!("{err:#}").contains("holds no PEM certificate"),
        "{err:#}"
    );
}

/// An origin on a raw socket that answers every request `after` its head came: a 302 from
/// `/hop{n}` to `/hop{n+1}` up to `/hop{last}`, which answers `ok`. Counts the requests it saw.
async fn slow_redirects(after: Duration, last: usize, seen: Arc<AtomicUsize>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                seen.fetch_add(1, Ordering::SeqCst);
                let head = String::from_utf8_lossy(&buf).into_owned();
                let path = head.split(' ').nth(1).unwrap_or("").to_string();
                let n: usize = path
                    .strip_prefix("/hop")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(last);
                tokio::time::sleep(after).await;
                let answer = if n < last {
                    format!(
                        "HTTP/1.1 302 Found\r\nlocation: /hop{}\r\ncontent-length: 0\r\n\
                         connection: close\r\n\r\n",
                        n + 1
                    )
                } else {
                    "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok".into()
                };
                let _ = c.write_all(answer.as_bytes()).await;
                let _ = c.shutdown().await;
            });
        }
    });
    port
}

/// The time-to-headers deadline is one for a request and all its redirects: an origin that
/// answers each of three redirects after 0.6 of the header timeout makes the request a 504 at
/// its second hop. Before, each hop had a deadline of its own (`max_redirects` hops held a
/// request that many header timeouts) and the request got its answer at the fourth. Fast
/// redirects are still followed.
#[tokio::test]
async fn the_header_deadline_spans_every_redirect() {
    let mut config = test_config();
    config.upstream.header_timeout_secs = 1;
    // The streamed path, whose client follows the redirects (a spliced first try that meets a
    // redirect asks again on it).
    config.media.splice_stream = false;
    let s = Sluice::start(config).await;
    let seen = Arc::new(AtomicUsize::new(0));
    let port = slow_redirects(Duration::from_millis(600), 3, seen.clone()).await;
    let d = enc(&format!("http://127.0.0.1:{port}/hop0"));
    let r = get(&s.url(&format!("/proxy/stream?d={d}"))).await;
    assert_eq!(r.status, 504, "{:?}", r.body);
    assert_eq!(seen.load(Ordering::SeqCst), 2, "hops asked");

    let fast = Arc::new(AtomicUsize::new(0));
    let port = slow_redirects(Duration::ZERO, 3, fast.clone()).await;
    let d = enc(&format!("http://127.0.0.1:{port}/hop0"));
    let r = get(&s.url(&format!("/proxy/stream?d={d}"))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), "ok");
    assert_eq!(fast.load(Ordering::SeqCst), 4);
}
