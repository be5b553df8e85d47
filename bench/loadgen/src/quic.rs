//! HTTP/3 to the proxy under test: one QUIC connection (quinn + h3) that several request
//! streams share, and one GET on it read to the end.

use anyhow::{Context, Result};
use bytes::{Buf, Bytes};
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::tls::TlsClient;

/// An open HTTP/3 connection; clones share it (one per request stream of a pool slot).
#[derive(Clone)]
pub struct H3Conn {
    quic: quinn::Connection,
    send: h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    /// Kept so the endpoint (its UDP socket and driver) lives as long as the connection.
    _endpoint: quinn::Endpoint,
}

/// The HTTP/3 connection that several `Conn`s (its request streams) share.
pub type SharedH3 = Arc<tokio::sync::Mutex<Option<H3Conn>>>;

/// What one GET brought back: status, body length, time to the response head, body digest.
pub struct Got {
    pub status: u16,
    pub bytes: u64,
    pub ttfb: Duration,
    pub digest: Option<[u8; 32]>,
}

impl H3Conn {
    /// A QUIC handshake to `addr` (its own UDP socket), then HTTP/3's control streams.
    pub async fn connect(addr: SocketAddr, tls: &TlsClient) -> Result<H3Conn> {
        let local: SocketAddr = if addr.is_ipv6() {
            "[::1]:0".parse()?
        } else {
            "127.0.0.1:0".parse()?
        };
        let endpoint = quinn::Endpoint::client(local)?;
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls.config_for_connection())
            .context("TLS settings unfit for QUIC")?;
        let config = quinn::ClientConfig::new(Arc::new(crypto));
        let name = match &tls.server_name {
            rustls::pki_types::ServerName::DnsName(d) => d.as_ref().to_string(),
            rustls::pki_types::ServerName::IpAddress(ip) => std::net::IpAddr::from(*ip).to_string(),
            _ => "localhost".to_string(),
        };
        let quic = endpoint.connect_with(config, addr, &name)?.await?;
        let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(quic.clone())).await?;
        tokio::spawn(async move {
            // Runs the control stream (SETTINGS, GOAWAY) until the connection closes.
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        Ok(H3Conn {
            quic,
            send,
            _endpoint: endpoint,
        })
    }

    /// Closed by either side (an idle timeout, a GOAWAY followed by the close, an error).
    pub fn is_closed(&self) -> bool {
        self.quic.close_reason().is_some()
    }

    /// One GET of `uri` with `headers`, read to the end (hashed when `hash`); an error names
    /// the step that failed (`send`, `body`).
    pub async fn get(
        &mut self,
        uri: &str,
        headers: &[(http::HeaderName, http::HeaderValue)],
        hash: bool,
        start: Instant,
    ) -> std::result::Result<Got, &'static str> {
        let mut builder =
            http::Request::get(uri).header(http::header::USER_AGENT, "sluice-loadgen");
        for (name, value) in headers {
            builder = builder.header(name, value);
        }
        let req = builder.body(()).map_err(|_| "request")?;
        let mut stream = self.send.send_request(req).await.map_err(|_| "send")?;
        stream.finish().await.map_err(|_| "send")?;
        let resp = stream.recv_response().await.map_err(|_| "send")?;
        let ttfb = start.elapsed();
        let mut hasher = hash.then(Sha256::new);
        let mut bytes = 0u64;
        while let Some(mut chunk) = stream.recv_data().await.map_err(|_| "body")? {
            while chunk.has_remaining() {
                let part = chunk.chunk();
                bytes += part.len() as u64;
                if let Some(h) = hasher.as_mut() {
                    h.update(part);
                }
                let n = part.len();
                chunk.advance(n);
            }
        }
        Ok(Got {
            status: resp.status().as_u16(),
            bytes,
            ttfb,
            digest: hasher.map(|h| h.finalize().into()),
        })
    }
}
