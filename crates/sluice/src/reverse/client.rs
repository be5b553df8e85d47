//! The reverse proxy's upstream client: one keep-alive pool per route, keyed by server inside it;
//! the connector dials exactly the server the group picked (connect deadline, TCP_NODELAY), with
//! optional TLS (SNI, verification, ALPN h2) or HTTP/2 by prior knowledge (h2c).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use super::config::{ReverseConfig, RouteConfig, UpstreamProtocol};
use super::h1pool::H1Pool;
use crate::body::Body;
use crate::upstream::connector::Conn;

/// Why a connection to one server could not be set up; always safe to try another server.
#[derive(Debug, thiserror::Error)]
pub enum ConnectFailure {
    #[error("cannot resolve {addr}: {source}")]
    Resolve { addr: String, source: io::Error },
    #[error("connection to {addr} refused or failed: {source}")]
    Refused { addr: String, source: io::Error },
    #[error("connecting to {addr} took longer than {secs} s")]
    Timeout { addr: String, secs: u64 },
    #[error("TLS with {addr} failed: {source}")]
    Tls { addr: String, source: io::Error },
    #[error("server address {0:?} is not host:port")]
    BadAddr(String),
}

/// Dials the server named by the request URI's authority.
#[derive(Clone)]
pub struct ServerConnector {
    timeout: Duration,
    tls: Option<(TlsConnector, Option<ServerName<'static>>)>,
}

/// The pooled client one route uses.
pub type RouteClient = Client<ServerConnector, Body>;

/// A route's pools: one client per per-core runtime (`server.runtime = "per-core"`), so a worker
/// only reuses connections its own runtime drives; a single shared one under work-stealing.
pub struct RoutePools(Vec<RouteClient>);

impl RoutePools {
    /// `count` independent pools for one route.
    pub fn build(
        route: &RouteConfig,
        shared: &ReverseConfig,
        h1_only: bool,
        count: usize,
    ) -> anyhow::Result<RoutePools> {
        (0..count.max(1))
            .map(|_| build(route, shared, h1_only))
            .collect::<anyhow::Result<Vec<_>>>()
            .map(RoutePools)
    }

    /// The calling worker's pool.
    pub fn get(&self) -> &RouteClient {
        &self.0[crate::runtime::worker() % self.0.len()]
    }
}

/// A plain-HTTP route's owned HTTP/1.1 connections ([`H1Pool`]), one pool per per-core runtime
/// like [`RoutePools`]; empty for `h2c` and `https` routes, which use the pooled client.
pub struct H1Pools(Vec<Arc<H1Pool>>);

impl H1Pools {
    /// `count` pools for a route over `servers` servers.
    pub fn build(
        route: &RouteConfig,
        shared: &ReverseConfig,
        servers: usize,
        count: usize,
    ) -> H1Pools {
        if route.upstream_protocol != UpstreamProtocol::Http1 {
            return H1Pools(Vec::new());
        }
        H1Pools(
            (0..count.max(1))
                .map(|_| {
                    H1Pool::new(
                        servers,
                        shared.pool_max_idle_per_server,
                        Duration::from_secs(shared.pool_idle_secs),
                        Duration::from_secs(route.connect_timeout_secs),
                    )
                })
                .collect(),
        )
    }

    /// The calling worker's pool; `None` on a route that does not own its connections.
    pub fn get(&self) -> Option<&Arc<H1Pool>> {
        if self.0.is_empty() {
            return None;
        }
        self.0.get(crate::runtime::worker() % self.0.len())
    }
}

/// Builds the client for a route.
pub fn build(
    route: &RouteConfig,
    shared: &ReverseConfig,
    h1_only: bool,
) -> anyhow::Result<RouteClient> {
    let tls = match route.upstream_protocol {
        UpstreamProtocol::Https => {
            let sni = match &route.tls_sni {
                Some(name) => Some(ServerName::try_from(name.clone())?),
                None => None,
            };
            Some((TlsConnector::from(tls_config(route, h1_only)?), sni))
        }
        _ => None,
    };
    let connector = ServerConnector {
        timeout: Duration::from_secs(route.connect_timeout_secs),
        tls,
    };
    let mut builder = Client::builder(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(shared.pool_idle_secs))
        .pool_max_idle_per_host(shared.pool_max_idle_per_server)
        // The Host header is the route's decision (preserve_host), not the pool key's.
        .set_host(false)
        .http2_adaptive_window(true);
    if route.upstream_protocol == UpstreamProtocol::H2c && !h1_only {
        builder.http2_only(true);
    }
    Ok(builder.build(connector))
}

fn tls_config(route: &RouteConfig, h1_only: bool) -> anyhow::Result<Arc<ClientConfig>> {
    let alpn: Vec<Vec<u8>> = if h1_only {
        vec![b"http/1.1".to_vec()]
    } else {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    };
    if !route.tls_verify {
        let mut config = (*crate::upstream::tls::client_config(false, false, &[])).clone();
        config.alpn_protocols = alpn;
        return Ok(Arc::new(config));
    }
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = &route.tls_ca {
        use rustls::pki_types::pem::PemObject;
        let certs = rustls::pki_types::CertificateDer::pem_file_iter(path)
            .map_err(|e| anyhow::anyhow!("cannot read tls_ca {}: {e}", path.display()))?;
        for cert in certs {
            roots.add(cert.map_err(|e| anyhow::anyhow!("tls_ca {}: {e}", path.display()))?)?;
        }
    }
    let provider = Arc::new(crate::crypto::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn;
    Ok(Arc::new(config))
}

impl tower_service::Service<Uri> for ServerConnector {
    type Response = TokioIo<Conn>;
    type Error = ConnectFailure;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ConnectFailure>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ConnectFailure>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.connect(uri).await.map(TokioIo::new) })
    }
}

impl ServerConnector {
    async fn connect(self, uri: Uri) -> Result<Conn, ConnectFailure> {
        let addr = uri
            .authority()
            .map(|a| a.as_str().to_string())
            .ok_or_else(|| ConnectFailure::BadAddr(uri.to_string()))?;
        let secs = self.timeout.as_secs();
        let work = async {
            let tcp = super::dial::dial(&addr).await?.tcp;
            match &self.tls {
                None => Ok(Conn::Plain(tcp)),
                Some((connector, sni)) => {
                    let name = match sni {
                        Some(n) => n.clone(),
                        None => {
                            let host = uri
                                .host()
                                .unwrap_or("")
                                .trim_matches(|c| c == '[' || c == ']');
                            ServerName::try_from(host.to_string())
                                .map_err(|_| ConnectFailure::BadAddr(addr.clone()))?
                        }
                    };
                    let tls = connector.connect(name, tcp).await.map_err(|source| {
                        ConnectFailure::Tls {
                            addr: addr.clone(),
                            source,
                        }
                    })?;
                    Ok(Conn::Tls(Box::new(tls)))
                }
            }
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(ConnectFailure::Timeout { addr, secs }),
        }
    }
}
