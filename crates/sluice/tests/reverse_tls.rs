//! TLS on both sides of the reverse proxy: downstream certificates chosen by SNI (and swapped by a
//! reload), upstream TLS with SNI, verification against a configured CA, and ALPN h2.

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
