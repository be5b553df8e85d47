//! Connection setup for the pooled client: DNS, the SSRF guard, the per-host setup limit, outgoing
//! proxy routes, Happy Eyeballs, TLS with ALPN, and a deadline on the setup itself (not on the
//! wait for a setup slot, which the request's time-to-headers deadline bounds).

use std::collections::HashMap;
#[cfg(feature = "upstream-pool")]
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
#[cfg(feature = "upstream-pool")]
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
#[cfg(feature = "upstream-pool")]
use hyper_util::client::legacy::connect::{Connected, Connection};
#[cfg(feature = "upstream-pool")]
use hyper_util::rt::TokioIo;
#[cfg(feature = "tls")]
use std::sync::OnceLock;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
#[cfg(feature = "tls")]
use tokio_rustls::{client::TlsStream, TlsConnector};

pub use crate::error::upstream::ConnectError;
use crate::error::upstream::OWN_LISTENER;

use super::guard::non_public_reason;
use super::happy;
use super::resolve::Resolver;
use super::route::{RouteTable, Via};
#[cfg(feature = "tls")]
use super::tls;
use super::tunnel;

/// Per-connection facts attached to every response it carries.
#[cfg(feature = "upstream-pool")]
#[derive(Debug, Clone)]
pub struct ConnInfo {
    uses: Arc<AtomicU64>,
}

#[cfg(feature = "upstream-pool")]
impl ConnInfo {
    /// Counts one more response on this connection; `true` if the connection was used before.
    pub fn mark_used(&self) -> bool {
        self.uses.fetch_add(1, Ordering::Relaxed) > 0
    }
}

/// The connector handed to the pool.
#[derive(Clone)]
pub struct Connector {
    inner: Arc<Inner>,
}

struct Inner {
    routes: RouteTable,
    /// `upstream.ca_file`, trusted beside the webpki and system roots.
    #[cfg(feature = "tls")]
    extra_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
    resolver: Resolver,
    allow_private: bool,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    http2: bool,
    connect_timeout: Duration,
    max_setups: usize,
    setups: Mutex<HashMap<String, Arc<Semaphore>>>,
    /// Built on the first `https` connection of each kind: most jobs never need them.
    #[cfg(feature = "tls")]
    verified: OnceLock<TlsConnector>,
    #[cfg(feature = "tls")]
    unverified: OnceLock<TlsConnector>,
    opened: crate::atomic::Counter,
}

impl Connector {
    pub fn new(
        routes: RouteTable,
        #[cfg(feature = "tls")] extra_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
        allow_private: bool,
        http2: bool,
        connect_timeout: Duration,
        max_setups: usize,
        opened: crate::atomic::Counter,
    ) -> Self {
        Connector {
            inner: Arc::new(Inner {
                routes,
                #[cfg(feature = "tls")]
                extra_roots,
                resolver: Resolver::from_system(),
                allow_private,
                http2,
                connect_timeout,
                max_setups,
                setups: Mutex::new(HashMap::new()),
                #[cfg(feature = "tls")]
                verified: OnceLock::new(),
                #[cfg(feature = "tls")]
                unverified: OnceLock::new(),
                opened,
            }),
        }
    }
}

impl Connector {
    /// Whether the address guard lets private addresses through (`upstream.allow_private`).
    pub fn allows_private(&self) -> bool {
        self.inner.allow_private
    }

    /// DNS plus the address guard, without connecting.
    pub async fn resolve_checked(
        &self,
        host: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, ConnectError> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        self.inner.resolve_checked(host, port).await
    }

    /// A connection to `uri`'s origin (TLS for `https`), set up as for pooled requests.
    pub async fn open(&self, uri: &Uri) -> Result<Conn, ConnectError> {
        self.inner.connect(uri.clone()).await
    }
}

#[cfg(feature = "upstream-pool")]
impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Conn>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ConnectError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move { inner.connect(uri).await.map(TokioIo::new) })
    }
}

impl Inner {
    async fn connect(&self, uri: Uri) -> Result<Conn, ConnectError> {
        let host = uri
            .host()
            .ok_or(ConnectError::NoHost)?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let tls = uri.scheme_str() == Some("https");
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        // Only setups are limited: the permit is released as soon as the connection exists. Waiting
        // for it is queueing behind other viewers' setups, not a slow origin, so the connect
        // deadline starts once the permit is held.
        let gate = self.setup_gate(&host, port);
        let secs = self.connect_timeout.as_secs();
        let _permit = gate.acquire().await.expect("semaphore never closed");
        let conn = tokio::time::timeout(self.connect_timeout, self.establish(&host, port, tls))
            .await
            .map_err(|_| ConnectError::Timeout {
                host: host.clone(),
                secs,
            })??;
        self.opened.inc();
        Ok(conn)
    }

    fn setup_gate(&self, host: &str, port: u16) -> Arc<Semaphore> {
        let mut map = self.setups.lock().expect("setup map poisoned");
        if map.len() > 4096 {
            // Forget idle gates of hosts no longer in use.
            map.retain(|_, s| Arc::strong_count(s) > 1);
        }
        // Keyed as routes match hosts: `a.example.` and `a.example` share one gate.
        let host = super::route::match_form(host);
        map.entry(format!("{host}:{port}"))
            .or_insert_with(|| Arc::new(Semaphore::new(self.max_setups)))
            .clone()
    }

    async fn establish(&self, host: &str, port: u16, tls: bool) -> Result<Conn, ConnectError> {
        let (via, verify) = self.routes.lookup_for(host, port, tls);
        let stream = match &via {
            Via::Direct => {
                let addrs = self.resolve_checked(host, port).await?;
                // Each attempt may use half the budget, so a second family still gets its turn.
                let attempt = (self.connect_timeout / 2).max(happy::STAGGER);
                happy::connect(&addrs, happy::STAGGER, attempt)
                    .await
                    .map_err(|source| ConnectError::Connect {
                        host: host.to_string(),
                        port,
                        source,
                    })?
            }
            Via::HttpConnect { addr, auth } => {
                let target_ip = self.check_via_proxy(host, port).await?;
                let mut s = proxy_stream(host, addr).await?;
                let target = target_ip.map(|ip| ip.to_string());
                tunnel::http_connect(
                    &mut s,
                    target.as_deref().unwrap_or(host),
                    port,
                    auth.as_ref(),
                )
                .await
                .map_err(|source| proxy_err(host, source))?;
                s
            }
            Via::Socks5 {
                addr,
                auth,
                remote_dns,
            } => {
                let ip = match remote_dns {
                    true => self.check_name_for_proxy(host)?,
                    false => self.resolve_for_proxy(host, port).await?,
                };
                let mut s = proxy_stream(host, addr).await?;
                tunnel::socks5(&mut s, host, ip, port, auth.as_ref())
                    .await
                    .map_err(|source| proxy_err(host, source))?;
                s
            }
            Via::Socks4 {
                addr,
                user,
                remote_dns,
            } => {
                let ip = match remote_dns {
                    true => self.check_name_for_proxy(host)?,
                    false => self.resolve_for_proxy(host, port).await?,
                };
                let mut s = proxy_stream(host, addr).await?;
                tunnel::socks4(&mut s, host, ip, port, user.as_deref())
                    .await
                    .map_err(|source| proxy_err(host, source))?;
                s
            }
        };
        let _ = stream.set_nodelay(true);
        if !tls {
            return Ok(Conn::Plain(stream));
        }
        #[cfg(not(feature = "tls"))]
        {
            let _ = verify;
            Err(ConnectError::Tls {
                host: host.to_string(),
                source: io::Error::new(
                    io::ErrorKind::Unsupported,
                    "this build has no TLS client (the `tls` feature)",
                ),
            })
        }
        #[cfg(feature = "tls")]
        self.tls_handshake(host, stream, verify).await
    }

    #[cfg(feature = "tls")]
    async fn tls_handshake(
        &self,
        host: &str,
        stream: TcpStream,
        verify: bool,
    ) -> Result<Conn, ConnectError> {
        let connector = if verify {
            &self.verified
        } else {
            &self.unverified
        }
        .get_or_init(|| {
            TlsConnector::from(tls::client_config(verify, self.http2, &self.extra_roots))
        });
        let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| {
            ConnectError::Tls {
                host: host.to_string(),
                source: io::Error::new(io::ErrorKind::InvalidInput, e),
            }
        })?;
        let stream = connector
            .connect(name, stream)
            .await
            .map_err(|source| ConnectError::Tls {
                host: host.to_string(),
                source,
            })?;
        Ok(Conn::Tls(Box::new(stream)))
    }

    /// Resolves `host` and refuses non-public addresses unless allowed. The addresses checked are the
    /// ones connected to, so a second lookup cannot swap in a private address.
    async fn resolve_checked(
        &self,
        host: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, ConnectError> {
        let addrs = self
            .resolver
            .lookup(host, port)
            .await
            .map_err(|source| ConnectError::Dns {
                host: host.to_string(),
                source,
            })?;
        // Never this sluice itself, whatever `allow_private` says: each fetch would come back
        // as a new request and fetch again.
        if let Some(addr) = addrs.iter().find(|a| super::guard::is_own_listener(**a)) {
            tracing::debug!(host, ip = %addr.ip(), "upstream address is this sluice's own listener");
            return Err(ConnectError::Refused {
                host: host.to_string(),
                ip: addr.ip(),
                reason: OWN_LISTENER,
            });
        }
        if !self.allow_private {
            for addr in &addrs {
                if let Some(reason) = non_public_reason(addr.ip()) {
                    tracing::debug!(host, ip = %addr.ip(), reason, "upstream address refused");
                    return Err(ConnectError::Refused {
                        host: host.to_string(),
                        ip: addr.ip(),
                        reason,
                    });
                }
            }
        }
        Ok(addrs)
    }

    /// Through a proxy the proxy connects, so the name is checked here and the checked address is what
    /// the proxy is asked for (unless the guard is off).
    async fn check_via_proxy(&self, host: &str, port: u16) -> Result<Option<IpAddr>, ConnectError> {
        if self.allow_private && host.parse::<IpAddr>().is_err() {
            return Ok(None);
        }
        let addrs = self.resolve_checked(host, port).await?;
        Ok(addrs.first().map(|a| a.ip()))
    }
}

impl Inner {
    /// For a proxy that is given addresses (socks5, socks4): the name resolved here, whether or
    /// not the guard is on, as those schemes promise. An IPv4 address is preferred: the proxy
    /// gets one address and cannot fall back from one family to the other, and SOCKS4 has no
    /// IPv6.
    async fn resolve_for_proxy(
        &self,
        host: &str,
        port: u16,
    ) -> Result<Option<IpAddr>, ConnectError> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(self.check_via_proxy(host, port).await?.or(Some(ip)));
        }
        let addrs = self.resolve_checked(host, port).await?;
        let v4 = addrs.iter().find(|a| a.is_ipv4()).or(addrs.first());
        Ok(v4.map(|a| a.ip()))
    }

    /// For a proxy that resolves names itself (socks5h, socks4a): the name is not resolved here
    /// (in a container behind a VPN the local resolver may not know it, and asking it would leak
    /// the name), so the address guard applies to what can be judged without DNS: an address
    /// literal is checked and sent as an address, and `localhost` names are refused. What a name
    /// resolves to on the proxy's side is the proxy's network.
    fn check_name_for_proxy(&self, host: &str) -> Result<Option<IpAddr>, ConnectError> {
        let refused = |ip: IpAddr, reason: &'static str| ConnectError::Refused {
            host: host.to_string(),
            ip,
            reason,
        };
        match host.parse::<IpAddr>() {
            Ok(ip) => {
                if let Some(reason) = non_public_reason(ip).filter(|_| !self.allow_private) {
                    return Err(refused(ip, reason));
                }
                Ok(Some(ip))
            }
            Err(_) => {
                let name = host.trim_end_matches('.').to_ascii_lowercase();
                let local = name == "localhost" || name.ends_with(".localhost");
                if local && !self.allow_private {
                    return Err(refused(IpAddr::from([127, 0, 0, 1]), "loopback"));
                }
                Ok(None)
            }
        }
    }
}

async fn proxy_stream(host: &str, proxy: &str) -> Result<TcpStream, ConnectError> {
    TcpStream::connect(proxy)
        .await
        .map_err(|source| proxy_err(host, source))
}

fn proxy_err(host: &str, source: io::Error) -> ConnectError {
    ConnectError::Proxy {
        host: host.to_string(),
        source,
    }
}

/// A plain or TLS upstream connection.
pub enum Conn {
    Plain(TcpStream),
    #[cfg(feature = "tls")]
    Tls(Box<TlsStream<TcpStream>>),
}

#[cfg(feature = "upstream-pool")]
impl Connection for Conn {
    fn connected(&self) -> Connected {
        let info = ConnInfo {
            uses: Arc::new(AtomicU64::new(0)),
        };
        let connected = Connected::new().extra(info);
        match self {
            #[cfg(feature = "tls")]
            Conn::Tls(s) if s.get_ref().1.alpn_protocol() == Some(b"h2") => {
                connected.negotiated_h2()
            }
            _ => connected,
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            #[cfg(feature = "tls")]
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            #[cfg(feature = "tls")]
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            #[cfg(feature = "tls")]
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            #[cfg(feature = "tls")]
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            #[cfg(feature = "tls")]
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            #[cfg(feature = "tls")]
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `a.example.` and `A.example` are one host: they queue for one set of setup slots.
    #[tokio::test]
    async fn spellings_of_one_host_share_a_setup_gate() {
        let connector = Connector::new(
            RouteTable::default(),
            #[cfg(feature = "tls")]
            Vec::new(),
            false,
            false,
            Duration::from_secs(1),
            1,
            crate::atomic::Counter::default(),
        );
        let inner = &connector.inner;
        let gate = inner.setup_gate("a.example", 80);
        assert!(Arc::ptr_eq(&gate, &inner.setup_gate("a.example.", 80)));
        assert!(Arc::ptr_eq(&gate, &inner.setup_gate("A.Example.", 80)));
        assert!(!Arc::ptr_eq(&gate, &inner.setup_gate("a.example", 81)));
        assert!(!Arc::ptr_eq(&gate, &inner.setup_gate("b.example", 80)));
    }
}
