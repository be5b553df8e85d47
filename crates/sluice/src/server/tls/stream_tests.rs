//! The takeover and the own record layer against rustls's client over an in-memory socket: data
//! both ways checked byte for byte, key updates both ways, `close_notify`, and one attack per
//! record rule, each answered with its alert.

use std::io::{Read, Write};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::super::{capture, own_record_layer, suites, Framed};
use super::ServerTls;

type Client = tokio_rustls::client::TlsStream<DuplexStream>;

fn configs(suite: rustls::CipherSuite) -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
    configs_for(suite, &rustls::version::TLS13)
}

fn configs_for(
    suite: rustls::CipherSuite,
    version: &'static rustls::SupportedProtocolVersion,
) -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["own.test".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let der: CertificateDer<'static> = cert.der().clone();
    let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(suites::provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![der.clone()],
            PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    own_record_layer(&mut server);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der).unwrap();
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.retain(|s| s.suite() == suite);
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (Arc::new(server), Arc::new(client))
}

/// A handshake over an in-memory socket, the server's side taken over.
async fn pair(suite: rustls::CipherSuite) -> (ServerTls<DuplexStream>, Client) {
    let (server, client) = handshake(configs(suite)).await;
    assert!(server.is_own(), "TLS 1.3 continues on the own record layer");
    (server, client)
}

async fn handshake(
    (server_config, client_config): (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>),
) -> (ServerTls<DuplexStream>, Client) {
    let (a, b) = tokio::io::duplex(1 << 20);
    let accept = tokio::spawn(async move {
        let (tls, secrets) =
            capture(tokio_rustls::TlsAcceptor::from(server_config).accept(Framed::new(b))).await;
        ServerTls::take_over(tls.unwrap(), secrets).unwrap()
    });
    let client = tokio_rustls::TlsConnector::from(client_config)
        .connect(ServerName::try_from("own.test").unwrap(), a)
        .await
        .unwrap();
    let server = accept.await.unwrap();
    (server, client)
}

/// TLS 1.2 stays with rustls, its reads passed straight through.
#[tokio::test]
async fn tls12_stays_with_rustls() {
    let configs = configs_for(
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        &rustls::version::TLS12,
    );
    let (mut server, mut client) = handshake(configs).await;
    assert!(!server.is_own());
    let up = pattern(100_000, 3);
    let sent = up.clone();
    let writer = tokio::spawn(async move {
        client.write_all(&sent).await.unwrap();
        client.flush().await.unwrap();
        client
    });
    let mut got = vec![0; up.len()];
    server.read_exact(&mut got).await.unwrap();
    assert!(got == up);
    let mut client = writer.await.unwrap();
    server.write_all(&pattern(70_000, 4)).await.unwrap();
    server.flush().await.unwrap();
    let mut back = vec![0; 70_000];
    client.read_exact(&mut back).await.unwrap();
    assert!(back == pattern(70_000, 4));
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// Every TLS 1.3 suite: large transfers both ways, a vectored write, then `close_notify` both
/// ways.
#[tokio::test]
async fn data_both_ways_then_close_notify() {
    for suite in [
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256,
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384,
        rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
    ] {
        let (mut server, mut client) = pair(suite).await;
        let up = pattern(300_000, 1);
        let sent = up.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&sent).await.unwrap();
            client.flush().await.unwrap();
            client
        });
        let mut got = vec![0; up.len()];
        server.read_exact(&mut got).await.unwrap();
        assert!(got == up, "{suite:?}: the upload arrives intact");
        let mut client = writer.await.unwrap();

        let down = pattern(500_000, 2);
        let (head, body) = down.split_at(1000);
        let reader = tokio::spawn(async move {
            let mut got = vec![0; 500_000];
            client.read_exact(&mut got).await.unwrap();
            (client, got)
        });
        let mut slices = [std::io::IoSlice::new(head), std::io::IoSlice::new(body)];
        let mut slices = &mut slices[..];
        while !slices.is_empty() {
            let n = server.write_vectored(slices).await.unwrap();
            std::io::IoSlice::advance_slices(&mut slices, n);
        }
        server.flush().await.unwrap();
        let (mut client, got) = reader.await.unwrap();
        assert!(got == down, "{suite:?}: the download arrives intact");

        client.shutdown().await.unwrap();
        let mut rest = Vec::new();
        assert_eq!(server.read_to_end(&mut rest).await.unwrap(), 0);
        server.shutdown().await.unwrap();
        assert_eq!(
            client.read_to_end(&mut rest).await.unwrap(),
            0,
            "a clean end"
        );
    }
}

/// A key update and a request sent with the client's Finished, before the server reads it:
/// rustls stops at the Finished and the takeover starts from the keys the handshake made.
#[tokio::test]
async fn a_key_update_right_after_the_handshake() {
    let (server_config, client_config) = configs(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    let (a, b) = tokio::io::duplex(1 << 20);
    let accept = tokio::spawn(async move {
        let (tls, secrets) =
            capture(tokio_rustls::TlsAcceptor::from(server_config).accept(Framed::new(b))).await;
        ServerTls::take_over(tls.unwrap(), secrets)
    });
    let mut client = tokio_rustls::TlsConnector::from(client_config)
        .connect(ServerName::try_from("own.test").unwrap(), a)
        .await
        .unwrap();
    client.get_mut().1.refresh_traffic_keys().unwrap();
    client.write_all(b"first").await.unwrap();
    client.flush().await.unwrap();
    let mut server = accept.await.unwrap().unwrap();
    assert!(server.is_own());
    let mut got = [0; 5];
    server.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"first");
    server.write_all(b"answer").await.unwrap();
    server.flush().await.unwrap();
    let mut back = [0; 6];
    client.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"answer");
}

/// A client's key update (which asks for one back) is followed both ways.
#[tokio::test]
async fn follows_key_updates() {
    let (mut server, mut client) = pair(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256).await;
    for round in 0..3u8 {
        client.get_mut().1.refresh_traffic_keys().unwrap();
        client.write_all(&[round; 100]).await.unwrap();
        client.flush().await.unwrap();
        let mut got = [0; 100];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [round; 100]);
        server.write_all(&pattern(20_000, round)).await.unwrap();
        server.flush().await.unwrap();
        let mut back = vec![0; 20_000];
        client.read_exact(&mut back).await.unwrap();
        assert!(back == pattern(20_000, round));
    }
}

/// At the record limit of its key the server changes keys on its own; the client follows.
#[tokio::test]
async fn changes_keys_at_the_record_limit() {
    let (mut server, mut client) = pair(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256).await;
    let ServerTls::Own(own) = &mut server else {
        unreachable!()
    };
    own.set_tx_limit(3);
    for i in 0..20u8 {
        server.write_all(&[i; 50]).await.unwrap();
        server.flush().await.unwrap();
        let mut got = [0; 50];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [i; 50]);
    }
}

/// A client that reads slowly holds the server's write buffer at its bound, however much is
/// written: what was sent does not stay in it.
#[tokio::test]
async fn a_slow_reader_holds_a_bounded_write_buffer() {
    let (server, client) = pair(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256).await;
    let ServerTls::Own(mut own) = server else {
        unreachable!()
    };
    let (mut raw, _conn) = client.into_inner();
    let reader = tokio::spawn(async move {
        let mut sink = [0u8; 1500];
        let mut total = 0;
        while total < 4_000_000 {
            match raw.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
            tokio::task::yield_now().await;
        }
        total
    });
    let chunk = pattern(10_000, 5);
    let mut most = 0;
    for _ in 0..300 {
        own.write_all(&chunk).await.unwrap();
        most = most.max(own.write_buffer_capacity());
    }
    own.flush().await.unwrap();
    assert!(most < 2 * 64 * 1024 + 40_000, "write buffer grew to {most}");
    drop(own);
    assert!(reader.await.unwrap() > 3_000_000);
}

/// Records that arrive a byte at a time are read as they complete.
#[tokio::test]
async fn records_in_pieces() {
    let (mut server, client) = pair(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256).await;
    let (mut raw, mut conn) = client.into_inner();
    conn.writer().write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut wire = Vec::new();
    conn.write_tls(&mut wire).unwrap();
    let feeder = tokio::spawn(async move {
        for b in wire {
            raw.write_all(&[b]).await.unwrap();
            tokio::task::yield_now().await;
        }
        raw
    });
    let mut got = [0; 18];
    server.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"GET / HTTP/1.1\r\n\r\n");
    feeder.await.unwrap();
}

/// Sends `wire` as the client and returns the server's read error and the alert the client
/// then receives.
async fn attack(
    server: &mut ServerTls<DuplexStream>,
    raw: &mut DuplexStream,
    conn: &mut rustls::ClientConnection,
    wire: &[u8],
) -> (std::io::Error, Option<rustls::AlertDescription>) {
    raw.write_all(wire).await.unwrap();
    let mut buf = [0; 64];
    let err = server.read(&mut buf).await.unwrap_err();
    let _ = server.flush().await;
    let mut back = vec![0; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), raw.read(&mut back))
        .await
        .unwrap()
        .unwrap();
    conn.read_tls(&mut &back[..n]).unwrap();
    let alert = match conn.process_new_packets() {
        Err(rustls::Error::AlertReceived(a)) => Some(a),
        _ => None,
    };
    // The connection stays failed.
    assert!(server.read(&mut buf).await.is_err());
    assert!(server.write_all(b"x").await.is_err());
    (err, alert)
}

async fn raw_pair() -> (
    ServerTls<DuplexStream>,
    DuplexStream,
    rustls::ClientConnection,
) {
    let (server, client) = pair(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256).await;
    let (raw, conn) = client.into_inner();
    (server, raw, conn)
}

fn sealed(conn: &mut rustls::ClientConnection, data: &[u8]) -> Vec<u8> {
    conn.writer().write_all(data).unwrap();
    let mut wire = Vec::new();
    conn.write_tls(&mut wire).unwrap();
    wire
}

#[tokio::test]
async fn a_forged_record_is_refused() {
    let (mut server, mut raw, mut conn) = raw_pair().await;
    let mut wire = sealed(&mut conn, b"GET / HTTP/1.1\r\n\r\n");
    let last = wire.len() - 1;
    wire[last] ^= 1;
    let (err, alert) = attack(&mut server, &mut raw, &mut conn, &wire).await;
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    assert_eq!(alert, Some(rustls::AlertDescription::BadRecordMac));
}

#[tokio::test]
async fn an_overlong_record_is_refused() {
    let (mut server, mut raw, mut conn) = raw_pair().await;
    let (err, alert) = attack(&mut server, &mut raw, &mut conn, &[23, 3, 3, 0x41, 0x01]).await;
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    assert_eq!(alert, Some(rustls::AlertDescription::RecordOverflow));
}

#[tokio::test]
async fn a_plaintext_record_after_the_handshake_is_refused() {
    for wire in [
        &[20u8, 3, 3, 0, 1, 1][..],
        &[21, 3, 3, 0, 2, 2, 40],
        &[22, 3, 3, 0, 1, 0],
    ] {
        let (mut server, mut raw, mut conn) = raw_pair().await;
        let (_, alert) = attack(&mut server, &mut raw, &mut conn, wire).await;
        assert_eq!(alert, Some(rustls::AlertDescription::UnexpectedMessage));
    }
}

#[tokio::test]
async fn a_record_too_short_for_its_tag_is_refused() {
    let (mut server, mut raw, mut conn) = raw_pair().await;
    let (_, alert) = attack(&mut server, &mut raw, &mut conn, &[23, 3, 3, 0, 3, 1, 2, 3]).await;
    assert_eq!(alert, Some(rustls::AlertDescription::BadRecordMac));
}

/// The same flood behind a request, in pieces: the request is answered (after the key update
/// the client asked for), then the flood ends the connection.
#[tokio::test]
async fn a_flood_of_key_updates_after_a_request_is_refused() {
    let (mut server, mut raw, mut conn) = raw_pair().await;
    let mut wire = sealed(&mut conn, b"GET / HTTP/1.1\r\n\r\n");
    for _ in 0..100 {
        conn.refresh_traffic_keys().unwrap();
        conn.write_tls(&mut wire).unwrap();
    }
    let feeder = tokio::spawn(async move {
        for piece in wire.chunks(7) {
            raw.write_all(piece).await.unwrap();
            tokio::task::yield_now().await;
        }
        raw
    });
    let mut buf = [0; 64];
    let mut got = Vec::new();
    let err = loop {
        match server.read(&mut buf).await {
            Ok(n) => {
                assert!(n > 0);
                got.extend_from_slice(&buf[..n]);
                // Refused once the flood has been read.
                if server.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.is_ok() {
                    server.flush().await.unwrap();
                }
            }
            Err(e) => break e,
        }
    };
    assert!(err.to_string().contains("key updates"), "{err}");
    let _ = server.flush().await;
    let mut raw = feeder.await.unwrap();
    let mut back = vec![0; 65536];
    let n = raw.read(&mut back).await.unwrap();
    conn.read_tls(&mut &back[..n]).unwrap();
    assert_eq!(
        conn.process_new_packets().map(|_| ()),
        Err(rustls::Error::AlertReceived(
            rustls::AlertDescription::UnexpectedMessage
        ))
    );
    // The request itself was read, whether the flood came with it or after.
    assert_eq!(got, b"GET / HTTP/1.1\r\n\r\n");
}

#[tokio::test]
async fn a_flood_of_key_updates_is_refused() {
    let (mut server, mut raw, mut conn) = raw_pair().await;
    let mut wire = Vec::new();
    for _ in 0..40 {
        conn.refresh_traffic_keys().unwrap();
        conn.write_tls(&mut wire).unwrap();
    }
    let (err, alert) = attack(&mut server, &mut raw, &mut conn, &wire).await;
    assert!(err.to_string().contains("key updates"), "{err}");
    assert_eq!(alert, Some(rustls::AlertDescription::UnexpectedMessage));
}

/// A fatal alert from the client ends the connection without an alert back.
#[tokio::test]
async fn a_client_alert_ends_the_connection() {
    let (mut server, mut raw, mut conn) = raw_pair().await;
    conn.send_close_notify();
    let mut wire = Vec::new();
    conn.write_tls(&mut wire).unwrap();
    raw.write_all(&wire).await.unwrap();
    let mut buf = [0; 16];
    assert_eq!(
        server.read(&mut buf).await.unwrap(),
        0,
        "close_notify is a clean end"
    );
    let _ = (&mut raw, std::io::empty().read(&mut buf));
}
