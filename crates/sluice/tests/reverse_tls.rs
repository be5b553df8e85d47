//! TLS on both sides of the reverse proxy: downstream certificates chosen by SNI (and swapped by a
//! reload), upstream TLS with SNI, verification against a configured CA, and ALPN h2; HTTP/1.1
//! over TLS on the fast path (the hyper path's bytes, the hand-off, the same refusals as plain).

mod reverse_support;
mod self_signed;

use std::sync::Arc;

use bytes::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use reverse_support::*;
use rustls::pki_types::{CertificateDer, ServerName};
use self_signed::SelfSigned as Cert;

/// Connects with TLS to `addr` as `name` and returns the certificate the server presented.
async fn presented(addr: std::net::SocketAddr, name: &str, trust: &[&Cert]) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    for c in trust {
        roots.add(CertificateDer::from(c.der.clone())).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = connector
        .connect(ServerName::try_from(name.to_string()).unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

#[tokio::test]
async fn downstream_certificates_by_sni_and_reload() {
    let default = Cert::new(&["default.test"]);
    let a = Cert::new(&["a.test"]);
    let wild = Cert::new(&["*.wild.test"]);
    let o = echo("o").await;
    let text = |a_cert: &Cert| {
        format!(
            r#"
[server]
tls_cert = "{}"
tls_key = "{}"
[[server.certificates]]
names = ["a.test"]
cert = "{}"
key = "{}"
[[server.certificates]]
names = ["*.wild.test"]
cert = "{}"
key = "{}"
[[upstreams]]
name = "app"
servers = ["{o}"]
[[routes]]
upstream = "app"
"#,
            default.cert.path().display(),
            default.key.path().display(),
            a_cert.cert.path().display(),
            a_cert.key.path().display(),
            wild.cert.path().display(),
            wild.key.path().display(),
        )
    };
    let c = config(&text(&a));
    let p = Proxy::start(c).await;
    let all = [&default, &a, &wild];
    assert_eq!(presented(p.addr, "a.test", &all).await, a.der);
    assert_eq!(presented(p.addr, "x.wild.test", &all).await, wild.der);
    assert_eq!(
        presented(p.addr, "default.test", &[&default]).await,
        default.der
    );

    // A reload swaps the certificates for new handshakes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = config(&text(&a));
    let app = sluice::app::App::new(&cfg).unwrap();
    let server = sluice::server::Server::from_listeners(vec![listener], &cfg.server, app).unwrap();
    let handle = server.tls_handle();
    tokio::spawn(server.run(std::future::pending()));
    assert_eq!(presented(addr, "a.test", &all).await, a.der);
    let a2 = Cert::new(&["a.test"]);
    let prepare = sluice::app::reload::tls_part(handle);
    let commit = prepare(&config(&text(&a2))).unwrap();
    commit();
    assert_eq!(presented(addr, "a.test", &[&a2]).await, a2.der);
}

/// A TLS origin (self-signed for `origin.test`) answering with its HTTP version and the SNI it saw.
async fn tls_origin(c: &Cert) -> std::net::SocketAddr {
    let config = sluice::server::tls::server_config(c.cert.path(), c.key.path()).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let sni = tls.get_ref().1.server_name().unwrap_or("").to_string();
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let sni = sni.clone();
                        async move {
                            let body = format!(
                                "{:?} {sni} {}",
                                req.version(),
                                req.headers()["host"].to_str().unwrap()
                            );
                            Ok::<_, std::convert::Infallible>(http::Response::new(full(body)))
                        }
                    });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn upstream_tls_with_sni_verification_and_h2() {
    let c = Cert::new(&["origin.test"]);
    let o = tls_origin(&c).await;
    let text = |ca: &str| {
        format!(
            r#"
[[upstreams]]
name = "app"
servers = ["{o}"]
[[routes]]
upstream = "app"
upstream_protocol = "https"
tls_sni = "origin.test"
{ca}
"#
        )
    };
    let p = Proxy::start(config(&text(&format!(
        "tls_ca = \"{}\"",
        c.cert.path().display()
    ))))
    .await;
    let r = get(&p.url("/"), &[("host", "site.test")]).await;
    assert_eq!(
        r.body.unwrap(),
        Bytes::from("HTTP/2.0 origin.test site.test")
    );
    // Without the CA the self-signed origin is refused: a 502, never an unverified exchange.
    let p = Proxy::start(config(&text(""))).await;
    let r = get(&p.url("/"), &[("host", "site.test")]).await;
    assert_eq!(r.status, http::StatusCode::BAD_GATEWAY);
}

/// One TLS connection to `addr` with `config`: a `GET /size/1000` read to the end (so the
/// session tickets sent after the handshake arrive), returning whether the handshake resumed a
/// session, the cipher suite and the response's bytes.
async fn fetch_over_tls(
    addr: std::net::SocketAddr,
    config: &Arc<rustls::ClientConfig>,
) -> (bool, rustls::CipherSuite, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let connector = tokio_rustls::TlsConnector::from(config.clone());
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = connector
        .connect(ServerName::try_from("site.test").unwrap(), tcp)
        .await
        .unwrap();
    let resumed = tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
    let suite = tls.get_ref().1.negotiated_cipher_suite().unwrap().suite();
    tls.write_all(b"GET /size/1000 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let _ = tls.read_to_end(&mut got).await;
    (resumed, suite, got)
}

/// Clients resume their TLS sessions: TLS 1.3 by ticket, TLS 1.2 by ticket and by session ID
/// alone, and a reload (which builds new server settings) keeps the sessions clients hold. The
/// server picks AES-128-GCM even for clients that list AES-256 first (rustls does).
#[tokio::test]
async fn downstream_sessions_resume_across_a_reload() {
    let cert = Cert::new(&["site.test"]);
    let o = echo("o").await;
    let text = format!(
        "[server]\ntls_cert = \"{}\"\ntls_key = \"{}\"\n[[upstreams]]\nname = \"app\"\n\
         servers = [\"{o}\"]\n[[routes]]\nupstream = \"app\"\n",
        cert.cert.path().display(),
        cert.key.path().display(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = config(&text);
    let app = sluice::app::App::new(&cfg).unwrap();
    let server = sluice::server::Server::from_listeners(vec![listener], &cfg.server, app).unwrap();
    let handle = server.tls_handle();
    tokio::spawn(server.run(std::future::pending()));

    let client = |versions: &[&'static rustls::SupportedProtocolVersion],
                  tls12: rustls::client::Tls12Resumption| {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from(cert.der.clone())).unwrap();
        let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        c.resumption = rustls::client::Resumption::in_memory_sessions(8).tls12_resumption(tls12);
        Arc::new(c)
    };
    use rustls::client::Tls12Resumption::{SessionIdOnly, SessionIdOrTickets};
    let clients = [
        (
            "TLS 1.3",
            client(&[&rustls::version::TLS13], SessionIdOrTickets),
        ),
        (
            "TLS 1.2, tickets",
            client(&[&rustls::version::TLS12], SessionIdOrTickets),
        ),
        (
            "TLS 1.2, session IDs",
            client(&[&rustls::version::TLS12], SessionIdOnly),
        ),
    ];
    let want = pattern(1000);
    let ends_with_body = |got: &[u8]| got.starts_with(b"HTTP/1.1 200") && got.ends_with(&want[..]);
    for (name, c) in &clients {
        let (resumed, suite, got) = fetch_over_tls(addr, c).await;
        assert!(!resumed && ends_with_body(&got), "{name}: first connection");
        let want_suite = if name.starts_with("TLS 1.3") {
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
        } else {
            rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        };
        assert_eq!(suite, want_suite, "{name}");
        let (resumed, _, got) = fetch_over_tls(addr, c).await;
        assert!(resumed, "{name}: the second connection did not resume");
        assert!(ends_with_body(&got), "{name}: resumed connection's answer");
    }

    // A reload builds new server settings; the sessions clients hold still resume.
    let prepare = sluice::app::reload::tls_part(handle);
    let commit = prepare(&config(&text)).unwrap();
    commit();
    for (name, c) in &clients {
        let (resumed, _, got) = fetch_over_tls(addr, c).await;
        assert!(resumed, "{name}: no resumption after a reload");
        assert!(ends_with_body(&got), "{name}: answer after a reload");
    }
}

// === HTTP/1.1 over TLS on the fast path ===

/// A reverse proxy in front of `origin` with `h1_fast_path = fast`, over TLS with `cert` when
/// given (else plain), the head limits small enough to reach in a test.
fn fast_config(
    origin: std::net::SocketAddr,
    fast: bool,
    cert: Option<&Cert>,
) -> sluice::config::Config {
    let tls = cert.map_or(String::new(), |c| {
        format!(
            "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
            c.cert.path().display(),
            c.key.path().display()
        )
    });
    config(&format!(
        "[server]\nh1_fast_path = {fast}\nheader_read_timeout_secs = 1\nmax_header_bytes = 4096\n\
         {tls}[reverse]\nforwarded = true\n[[upstreams]]\nname = \"app\"\nservers = [\"{origin}\"]\n\
         [[routes]]\npath = \"/api\"\nupstream = \"app\"\nstrip_prefix = true\n"
    ))
}

/// A client connection, TLS (ALPN `http/1.1`, trusting `cert`) or plain, and what it read past
/// the last response.
struct Conn {
    io: Box<dyn Io>,
    buf: Vec<u8>,
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

impl Conn {
    async fn to(addr: std::net::SocketAddr, cert: Option<&Cert>) -> Conn {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let Some(cert) = cert else {
            return Conn {
                io: Box::new(tcp),
                buf: Vec::new(),
            };
        };
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from(cert.der.clone())).unwrap();
        let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        let tls = tokio_rustls::TlsConnector::from(Arc::new(c))
            .connect(ServerName::try_from("site.test").unwrap(), tcp)
            .await
            .unwrap();
        Conn {
            io: Box::new(tls),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.io.write_all(bytes).await.unwrap();
        self.io.flush().await.unwrap();
    }

    /// Reads one response with a `Content-Length` body (none to a HEAD): its head with the
    /// `date` line taken out, and its body.
    async fn response(&mut self, head_request: bool) -> (String, Vec<u8>) {
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            assert!(self.read().await > 0, "closed inside a head");
        };
        let head = String::from_utf8(self.buf.drain(..end).collect()).unwrap();
        let length: usize = match head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().unwrap())
        }) {
            Some(n) if !head_request => n,
            _ => 0,
        };
        while self.buf.len() < length {
            assert!(self.read().await > 0, "closed inside a body");
        }
        let body = self.buf.drain(..length).collect();
        (without_date(&head), body)
    }

    /// Everything until the server closes the connection (within 5 s), without `date` lines.
    async fn rest(&mut self) -> String {
        while self.read().await > 0 {}
        let all = std::mem::take(&mut self.buf);
        without_date(&String::from_utf8_lossy(&all))
    }

    async fn read(&mut self) -> usize {
        use tokio::io::AsyncReadExt;
        self.buf.reserve(16384);
        match tokio::time::timeout(
            std::time::Duration::from_secs(5),
            self.io.read_buf(&mut self.buf),
        )
        .await
        {
            Ok(Ok(n)) => n,
            // A TLS peer that closes without `close_notify`, or a reset: the end too.
            Ok(Err(_)) => 0,
            Err(_) => panic!(
                "no byte and no close for 5 s after {:?}",
                String::from_utf8_lossy(&self.buf)
            ),
        }
    }
}

fn without_date(text: &str) -> String {
    text.split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("date:"))
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// A metric's value as the proxy's `/metrics` says it, asked over `cert`'s TLS or plain.
async fn metric(addr: std::net::SocketAddr, cert: Option<&Cert>, series: &str) -> f64 {
    let mut c = Conn::to(addr, cert).await;
    c.send(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await;
    let (_, body) = c.response(false).await;
    String::from_utf8(body)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

const FAST_TLS: &str = "sluice_h1_fast_path_requests_total{transport=\"tls\"} ";

/// Keep-alive and pipelined HTTP/1.1 requests over TLS are served by the fast path (its counter
/// says so), with exactly the bytes the hyper path sends for them: the same response heads and
/// bodies, the same upstream request (`https` in the forwarding fields). A request the fast path
/// does not serve hands the connection to hyper, which keeps answering on it.
#[tokio::test]
async fn tls_http1_takes_the_fast_path_with_the_hyper_paths_bytes() {
    let cert = Cert::new(&["site.test"]);
    let o = echo("o").await;
    let mut by_path = Vec::new();
    for fast in [true, false] {
        let p = Proxy::start(fast_config(o, fast, Some(&cert))).await;
        let mut c = Conn::to(p.addr, Some(&cert)).await;
        let mut got = Vec::new();
        // Two pipelined in one write, then one at a time.
        c.send(
            b"GET /api/echo?q=1 HTTP/1.1\r\nHost: site.test\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n\
                 HEAD /api/size/1000 HTTP/1.1\r\nHost: site.test\r\n\r\n",
        )
        .await;
        got.push(c.response(false).await);
        got.push(c.response(true).await);
        c.send(b"GET /api/size/70000 HTTP/1.1\r\nHost: site.test\r\n\r\n")
            .await;
        got.push(c.response(false).await);
        let served_fast = metric(p.addr, Some(&cert), FAST_TLS).await;
        assert_eq!(served_fast, if fast { 3.0 } else { 0.0 }, "fast {fast}");
        // A POST is not the fast path's: hyper takes the connection and answers the rest.
        c.send(
            b"POST /api/echo HTTP/1.1\r\nHost: site.test\r\nContent-Length: 3\r\n\r\nabc\
                 GET /api/size/10 HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n",
        )
        .await;
        got.push(c.response(false).await);
        got.push(c.response(false).await);
        assert_eq!(c.rest().await, "", "fast {fast}");
        // The /metrics request and the three before it: hyper served the last two.
        let after = metric(p.addr, Some(&cert), FAST_TLS).await;
        assert_eq!(after, served_fast, "fast {fast}");
        by_path.push(got);
    }
    let (fast, hyper) = (&by_path[0], &by_path[1]);
    for (i, (f, h)) in fast.iter().zip(hyper).enumerate() {
        assert_eq!(f.0, h.0, "response {i}: heads differ");
        assert_eq!(sha256(&f.1), sha256(&h.1), "response {i}: bodies differ");
    }
    assert!(
        fast[0].0.starts_with("HTTP/1.1 200 OK\r\n"),
        "{}",
        fast[0].0
    );
    let seen: serde_json::Value = serde_json::from_slice(&fast[0].1).unwrap();
    let field = |name: &str| {
        seen["headers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p[0] == name)
            .map(|p| p[1].as_str().unwrap().to_string())
    };
    assert_eq!(field("x-forwarded-proto").as_deref(), Some("https"));
    assert!(
        field("forwarded").unwrap().contains("proto=https"),
        "{seen}"
    );
    assert_eq!(sha256(&fast[2].1), sha256(&pattern(70_000)));
    assert_eq!(fast[1].1, b"");
    assert!(
        fast[1].0.contains("\r\ncontent-length: 1000\r\n"),
        "{}",
        fast[1].0
    );
    assert_eq!(sha256(&fast[4].1), sha256(&pattern(10)));
    assert!(
        fast[4].0.contains("\r\nconnection: close\r\n"),
        "{}",
        fast[4].0
    );
}

/// What the fast path hands to hyper over a plain connection it hands over TLS, and the answer
/// is the same: ambiguous framing (the request screen's 400, counted), a bad `Host`, a second
/// `Host`, a head over `server.max_header_bytes`, a bad request line, HTTP/1.0, a tokened path;
/// a head that never ends is cut after the header read timeout on both.
#[tokio::test]
async fn tls_http1_is_refused_as_plain_is() {
    let cert = Cert::new(&["site.test"]);
    let o = echo("o").await;
    let plain = Proxy::start(fast_config(o, true, None)).await;
    let tls = Proxy::start(fast_config(o, true, Some(&cert))).await;
    let big = format!(
        "GET /api/x HTTP/1.1\r\nHost: site.test\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
        "a".repeat(20_000)
    );
    let cases: Vec<Vec<u8>> = vec![
        b"GET /api/x HTTP/1.1\r\nHost: site.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(),
        b"GET /api/x HTTP/1.1\r\nHost: a|b\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /api/x HTTP/1.1\r\nHost: site.test\r\nHost: other.test\r\nConnection: close\r\n\r\n".to_vec(),
        big.into_bytes(),
        b"GET /api/x HTTP/1.1 x\r\nHost: site.test\r\n\r\n".to_vec(),
        b"GET /api/size/5 HTTP/1.0\r\nHost: site.test\r\n\r\n".to_vec(),
        b"GET /_token_abc/api/x HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n".to_vec(),
    ];
    for case in &cases {
        let mut answers = Vec::new();
        for (addr, cert) in [(plain.addr, None), (tls.addr, Some(&cert))] {
            let mut c = Conn::to(addr, cert).await;
            c.send(case).await;
            answers.push(c.rest().await);
        }
        let what = String::from_utf8_lossy(&case[..case.len().min(60)]).into_owned();
        assert_eq!(answers[0], answers[1], "{what:?}");
        assert!(
            answers[0].starts_with("HTTP/1."),
            "{what:?}: {}",
            answers[0]
        );
    }
    // Plain HTTP on the TLS listener: the handshake fails at once, and is counted.
    let before = metric(
        tls.addr,
        Some(&cert),
        "sluice_downstream_tls_handshake_errors_total ",
    )
    .await;
    let mut c = tokio::net::TcpStream::connect(tls.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut c, b"GET /api/x HTTP/1.1\r\nHost: site.test\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_to_end(&mut c, &mut rest),
    )
    .await;
    let after = metric(
        tls.addr,
        Some(&cert),
        "sluice_downstream_tls_handshake_errors_total ",
    )
    .await;
    assert_eq!(after, before + 1.0, "{read:?} {rest:?}");
    // At once, not at the handshake timeout (the record layer waited for a length read from
    // the text: ` /` is 8,239 bytes).
    assert!(read.is_ok(), "not closed within 5 s");
    for (addr, cert) in [(plain.addr, None), (tls.addr, Some(&cert))] {
        let refused = metric(addr, cert, "sluice_downstream_smuggling_refused_total ").await;
        assert_eq!(refused, 1.0, "tls {}", cert.is_some());
        assert_eq!(metric(addr, cert, FAST_TLS).await, 0.0);
        // A head begun and never finished: closed without an answer, as hyper's path does.
        let mut c = Conn::to(addr, cert).await;
        c.send(b"GET /api/x HTTP/1.1\r\nHost: site").await;
        let started = std::time::Instant::now();
        assert_eq!(c.rest().await, "", "tls {}", cert.is_some());
        assert!(started.elapsed() >= std::time::Duration::from_millis(900));
    }
}

/// A client that speaks HTTP/2 over TLS without choosing `h2` by ALPN (prior knowledge) is
/// served by sluice's own HTTP/2 server, as an h2c client is over plain TCP, on the fast path's
/// hand-off and without the fast path: requests are answered, and a body shorter than its
/// `content-length` is refused and counted as the own server counts it. Before, hyper's HTTP/2
/// server took such a connection (without the own server's window setting, stuck-stream close
/// and counting), and the count stayed 0.
#[tokio::test]
async fn http2_by_prior_knowledge_over_tls_goes_to_sluices_own_server() {
    let cert = Cert::new(&["site.test"]);
    let o = echo("o").await;
    for fast in [true, false] {
        let p = Proxy::start(fast_config(o, fast, Some(&cert))).await;
        let tls = connect_tls(p.addr, &cert).await;
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
        let (mut client, conn) = h2::client::handshake(tls).await.unwrap();
        tokio::spawn(conn);
        let get = http::Request::get("https://site.test/api/size/10")
            .body(())
            .unwrap();
        let (resp, _) = client.send_request(get, true).unwrap();
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), 200, "fast {fast}");
        let mut body = resp.into_body();
        let mut got = Vec::new();
        while let Some(chunk) = body.data().await {
            got.extend_from_slice(&chunk.unwrap());
        }
        assert_eq!(got.len(), 10, "fast {fast}");
        let short = http::Request::post("https://site.test/api/x")
            .header("content-length", "5")
            .body(())
            .unwrap();
        let (resp, mut send) = client.send_request(short, false).unwrap();
        send.send_data(bytes::Bytes::from_static(b"abc"), true)
            .unwrap();
        assert!(resp.await.is_err(), "fast {fast}: a short body answered");
        let refused = metric(
            p.addr,
            Some(&cert),
            "sluice_downstream_smuggling_refused_total ",
        )
        .await;
        assert_eq!(refused, 1.0, "fast {fast}");

        // The preface split over two TLS records: the fast path waits for the rest of it (its
        // parser would refuse `HTTP/2.0` at once, and the part alone went to hyper's server).
        use tokio::io::AsyncWriteExt;
        let mut tls = connect_tls(p.addr, &cert).await;
        tls.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
        tls.flush().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        // The rest, an empty SETTINGS, then a POST saying `content-length: 5` (HPACK: static
        // `:method POST`, `:scheme https`, literal `:path` and `:authority`, literal
        // `content-length`) whose body is 3 bytes.
        let mut rest = b"\r\nSM\r\n\r\n".to_vec();
        rest.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        let mut block = vec![0x83, 0x87];
        // Literal without indexing, name by static index (4 bits, then 7-bit continuation).
        for (index, value) in [
            (&[4u8][..], "/api/x"),
            (&[1], "site.test"),
            (&[15, 13], "5"),
        ] {
            block.extend_from_slice(index);
            block.push(value.len() as u8);
            block.extend_from_slice(value.as_bytes());
        }
        rest.extend_from_slice(&[0, 0, block.len() as u8, 1, 4, 0, 0, 0, 1]);
        rest.extend_from_slice(&block);
        rest.extend_from_slice(&[0, 0, 3, 0, 1, 0, 0, 0, 1]);
        rest.extend_from_slice(b"abc");
        tls.write_all(&rest).await.unwrap();
        tls.flush().await.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let series = "sluice_downstream_smuggling_refused_total ";
        while metric(p.addr, Some(&cert), series).await < 2.0 {
            assert!(
                std::time::Instant::now() < deadline,
                "fast {fast}: the split preface's short body was not counted"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        drop(tls);
    }
}

/// The HTTP/2 preface after an HTTP/1.1 request on the same connection (RFC 9113 §3.4: it
/// opens a connection) closes the connection, plain and over TLS, instead of switching it to
/// HTTP/2 (it did on the fast path's hand-off: the server's SETTINGS came back).
#[tokio::test]
async fn an_http2_preface_after_http1_requests_closes_the_connection() {
    let cert = Cert::new(&["site.test"]);
    let o = echo("o").await;
    let plain = Proxy::start(fast_config(o, true, None)).await;
    let tls = Proxy::start(fast_config(o, true, Some(&cert))).await;
    for (addr, cert) in [(plain.addr, None), (tls.addr, Some(&cert))] {
        let mut c = Conn::to(addr, cert).await;
        c.send(b"GET /api/size/10 HTTP/1.1\r\nHost: site.test\r\n\r\n")
            .await;
        let (head, body) = c.response(false).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(body.len(), 10);
        let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        preface.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        c.send(&preface).await;
        assert_eq!(c.rest().await, "", "tls {}", cert.is_some());
    }
}

/// A TLS 1.3 client of the running server whose records the test writes itself.
async fn raw_tls(
    addr: std::net::SocketAddr,
    cert: &Cert,
) -> (tokio::net::TcpStream, rustls::ClientConnection) {
    connect_tls(addr, cert).await.into_inner()
}

/// The TLS 1.3 record layer's refusals, against the running server: a forged record, a record
/// longer than TLS allows, a plaintext record after the handshake and a flood of key updates
/// each end their own connection with the alert RFC 8446 names, and a client served between
/// them sees nothing of it; a client's key update (asking for one back) is followed, on the
/// fast path and after the hand-off to hyper.
#[tokio::test]
async fn tls_record_attacks_end_only_their_own_connection() {
    use std::io::Write;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cert = Cert::new(&["site.test"]);
    let o = echo("o").await;
    let p = Proxy::start(fast_config(o, true, Some(&cert))).await;
    let request = b"GET /api/size/10 HTTP/1.1\r\nHost: site.test\r\n\r\n";
    type Tamper = fn(&mut rustls::ClientConnection, Vec<u8>) -> Vec<u8>;
    let cases: [(&str, Tamper, rustls::AlertDescription); 4] = [
        (
            "forged",
            |_, mut w| {
                let last = w.len() - 1;
                w[last] ^= 0x80;
                w
            },
            rustls::AlertDescription::BadRecordMac,
        ),
        (
            "overlong",
            |_, _| vec![23, 3, 3, 0x48, 0x00],
            rustls::AlertDescription::RecordOverflow,
        ),
        (
            "plaintext",
            |_, _| vec![21, 3, 3, 0, 2, 1, 0],
            rustls::AlertDescription::UnexpectedMessage,
        ),
        (
            "key update flood",
            |conn, mut w| {
                for _ in 0..100 {
                    conn.refresh_traffic_keys().unwrap();
                    conn.write_tls(&mut w).unwrap();
                }
                w
            },
            rustls::AlertDescription::UnexpectedMessage,
        ),
    ];
    for (name, tamper, expected) in cases {
        let (mut tcp, mut conn) = raw_tls(p.addr, &cert).await;
        conn.writer().write_all(request).unwrap();
        let mut wire = Vec::new();
        conn.write_tls(&mut wire).unwrap();
        let wire = tamper(&mut conn, wire);
        tcp.write_all(&wire).await.unwrap();
        let mut back = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tcp.read_to_end(&mut back),
        )
        .await
        .unwrap_or_else(|_| panic!("{name}: the connection stays open"))
        .ok();
        conn.read_tls(&mut &back[..]).unwrap();
        match conn.process_new_packets() {
            Err(rustls::Error::AlertReceived(a)) => assert_eq!(a, expected, "{name}"),
            other => panic!("{name}: no alert but {other:?}"),
        }
        let mut c = Conn::to(p.addr, Some(&cert)).await;
        c.send(request).await;
        let (head, body) = c.response(false).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{name}: {head}");
        assert_eq!(body.len(), 10);
    }
    // Key updates followed: on the fast path, then over hyper after a POST hands it over.
    let mut tls = connect_tls(p.addr, &cert).await;
    let mut buf = Vec::new();
    for round in 0..6 {
        tls.get_mut().1.refresh_traffic_keys().unwrap();
        if round == 3 {
            tls.write_all(
                b"POST /api/echo HTTP/1.1\r\nHost: site.test\r\nContent-Length: 3\r\n\r\nabc",
            )
            .await
            .unwrap();
            let (head, _) = read_response(&mut tls, &mut buf).await;
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            tls.get_mut().1.refresh_traffic_keys().unwrap();
        }
        tls.write_all(request).await.unwrap();
        let (head, body) = read_response(&mut tls, &mut buf).await;
        assert!(head.starts_with("HTTP/1.1 200"), "round {round}: {head}");
        assert_eq!(body.len(), 10, "round {round}");
    }
}

async fn connect_tls(
    addr: std::net::SocketAddr,
    cert: &Cert,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(cert.der.clone())).unwrap();
    let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(c))
        .connect(ServerName::try_from("site.test").unwrap(), tcp)
        .await
        .unwrap()
}

/// One response with a `Content-Length` body from `io` (within 5 s): its head and its body.
async fn read_response<R: tokio::io::AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut Vec<u8>,
) -> (String, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let deadline = std::time::Duration::from_secs(5);
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tokio::time::timeout(deadline, io.read_buf(buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed inside a head");
    };
    let head = String::from_utf8(buf.drain(..end).collect()).unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    while buf.len() < length {
        let n = tokio::time::timeout(deadline, io.read_buf(buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed inside a body");
    }
    (head, buf.drain(..length).collect())
}

/// What a slow origin saw of one request: its connection closed before it answered, or it
/// answered.
#[derive(Debug, PartialEq)]
enum Seen {
    Cancelled,
    Answered,
}

/// A plain origin that answers `GET /wait/<ms>` with `ok` after that many milliseconds, unless
/// its connection is closed first; it reports each request's fate.
async fn slow_origin() -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<Seen>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let tx = tx.clone();
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
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end);
                    let ms: u64 = head
                        .split(' ')
                        .nth(1)
                        .and_then(|t| t.strip_prefix("/wait/"))
                        .and_then(|ms| ms.parse().ok())
                        .unwrap_or(0);
                    let mut probe = [0u8; 1];
                    tokio::select! {
                        // The proxy sends nothing more before the answer: this is its close.
                        _ = s.read(&mut probe) => {
                            let _ = tx.send(Seen::Cancelled);
                            return;
                        }
                        _ = tokio::time::sleep(std::time::Duration::from_millis(ms)) => {}
                    }
                    let _ = tx.send(Seen::Answered);
                    if s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (addr, rx)
}

/// Over TLS, a client that leaves while the origin works on its fast-path request (its
/// `close_notify` and its FIN wait unread) cancels the request, as a plain client's FIN does:
/// the origin sees its connection closed (it answers after 15 s without the cancel; the route's
/// header timeout is 60 s). A client that pipelines a second request in a record of its own
/// after the first was taken, then shuts its side, is no leaver: both are answered (its record
/// in the kernel with the FIN behind it was taken for a `close_notify`, and the first request
/// cancelled).
#[tokio::test]
async fn a_tls_client_that_leaves_cancels_its_fast_path_request_and_one_that_pipelines_does_not() {
    use tokio::io::AsyncWriteExt;
    let cert = Cert::new(&["site.test"]);
    let (origin, mut seen) = slow_origin().await;
    let text = format!(
        "[server]\nh1_fast_path = true\nheader_read_timeout_secs = 1\n\
         tls_cert = \"{}\"\ntls_key = \"{}\"\n[[upstreams]]\nname = \"app\"\n\
         servers = [\"{origin}\"]\n[[routes]]\npath = \"/api\"\nupstream = \"app\"\n\
         strip_prefix = true\nheader_timeout_secs = 60\n",
        cert.cert.path().display(),
        cert.key.path().display()
    );
    let p = Proxy::start(config(&text)).await;
    let wait = std::time::Duration::from_secs(20);

    // `close_notify`, then the FIN (what `shutdown` of a TLS stream sends).
    let mut tls = connect_tls(p.addr, &cert).await;
    tls.write_all(b"GET /api/wait/15000 HTTP/1.1\r\nHost: site.test\r\n\r\n")
        .await
        .unwrap();
    // The request reached the origin (it is the only way to an answer).
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    tls.shutdown().await.unwrap();
    let fate = tokio::time::timeout(wait, seen.recv()).await;
    assert_eq!(
        fate.ok().flatten(),
        Some(Seen::Cancelled),
        "the origin request outlived its TLS client"
    );
    drop(tls);

    // A second request in a record of its own, sent while the first is served, then the FIN
    // (no `close_notify`): both answered.
    let mut tls = connect_tls(p.addr, &cert).await;
    tls.write_all(b"GET /api/wait/2500 HTTP/1.1\r\nHost: site.test\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    tls.write_all(b"GET /api/wait/0 HTTP/1.1\r\nHost: site.test\r\n\r\n")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    tls.get_mut().0.shutdown().await.unwrap();
    let mut buf = Vec::new();
    for i in 0..2 {
        let (head, body) = read_response(&mut tls, &mut buf).await;
        assert!(head.starts_with("HTTP/1.1 200"), "answer {i}: {head}");
        assert_eq!(body, b"ok", "answer {i}");
    }
    for i in 0..2 {
        assert_eq!(seen.recv().await, Some(Seen::Answered), "request {i}");
    }
}
