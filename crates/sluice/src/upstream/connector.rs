//! Connection setup for the pooled client: DNS, the SSRF guard, the per-host setup limit, outgoing
//! proxy routes, Happy Eyeballs, TLS with ALPN, and a deadline on the setup itself (not on the
//! wait for a setup slot, which the request's time-to-headers deadline bounds). The pooled client
//! keeps connections for reuse to at most [`MAX_POOLED_ORIGINS`] origins and
//! [`MAX_POOLED_CONNECTIONS`] connections at once; a connection past either serves its request
//! and closes rather than wait in the pool.

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
    /// Built on the first `https` connection of each kind (verified or not, `h2` offered or
    /// not; see [`tls_kind`]): most jobs never need them.
    #[cfg(feature = "tls")]
    tls: [OnceLock<TlsConnector>; 4],
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
                tls: Default::default(),
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
        self.inner.connect(uri.clone(), || true).await
    }
}

/// Origins (the pool's key: scheme and authority) to which the pooled client keeps connections
/// for reuse at once; a connection to one more origin serves its request and closes. hyper-util's
/// pool bounds idle connections per origin only, and each `/proxy/stream` URL may name an origin
/// of its own (wildcard DNS, ports), so without it request rate × `upstream.pool_idle_secs` idle
/// sockets stayed open. Origins are counted, not connections: an origin that holds a place keeps
/// every connection to it (hyper-util's `pool_max_idle_per_host` bounds its idle ones), so busy
/// origins' keep-alive never depends on how many streams are open. The same figure as the raw
/// pool's idle sockets (`raw::MAX_IDLE_TOTAL`).
pub const MAX_POOLED_ORIGINS: usize = 1024;

/// Connections the pooled client keeps for reuse at once, over all origins; one set up past it
/// serves its request and closes, whatever its origin. The origin bound alone let each of its
/// 1,024 origins keep `pool_max_idle_per_host` (64) idle sockets, 65,536 in all, which waves of
/// concurrent requests to many names under a wildcard could park for `pool_idle_secs`.
pub const MAX_POOLED_CONNECTIONS: usize = 4096;

/// The pooled client's connector: [`Connector`] with a count of the open connections to each
/// origin, each connection holding its origin's place until it closes.
#[cfg(feature = "upstream-pool")]
#[derive(Clone)]
pub struct PoolConnector {
    connector: Connector,
    live: Arc<Live>,
}

/// The places held, and the bounds on origins and on connections holding places.
#[cfg(feature = "upstream-pool")]
struct Live {
    places: Mutex<Places>,
    cap: usize,
    max_connections: usize,
}

/// The origins holding places, each with its count of open connections (an origin leaves at
/// zero, so the map is no larger than the open connections), and the sum of those counts.
#[cfg(feature = "upstream-pool")]
#[derive(Default)]
struct Places {
    origins: HashMap<String, usize>,
    connections: usize,
}

#[cfg(feature = "upstream-pool")]
impl Live {
    /// Whether a connection to `origin` set up now would be kept: fewer than `max_connections`
    /// hold places, and its origin holds one or there is room for one more. Only a hint (for
    /// offering HTTP/2): [`Live::take`] decides.
    fn has_room(&self, origin: &str) -> bool {
        let places = self.places.lock().expect("origin map poisoned");
        places.has_room(origin, self.cap, self.max_connections)
    }

    /// A place for one more connection to `origin`, or `None` when `max_connections` hold
    /// places or `cap` other origins do. `force`: take one anyway (an HTTP/2 connection, which
    /// cannot be made to close after its response; only a setup that saw room and lost it to
    /// another can ask).
    fn take(self: &Arc<Self>, origin: String, force: bool) -> Option<Place> {
        let mut places = self.places.lock().expect("origin map poisoned");
        if !force && !places.has_room(&origin, self.cap, self.max_connections) {
            return None;
        }
        places.connections += 1;
        *places.origins.entry(origin.clone()).or_insert(0) += 1;
        Some(Place {
            live: self.clone(),
            origin,
        })
    }
}

#[cfg(feature = "upstream-pool")]
impl Places {
    fn has_room(&self, origin: &str, cap: usize, max_connections: usize) -> bool {
        self.connections < max_connections
            && (self.origins.len() < cap || self.origins.contains_key(origin))
    }
}

/// One connection's share of its origin's place, given back when the connection is dropped
/// (closed); the origin's place goes with its last connection.
#[cfg(feature = "upstream-pool")]
struct Place {
    live: Arc<Live>,
    origin: String,
}

#[cfg(feature = "upstream-pool")]
impl Drop for Place {
    fn drop(&mut self) {
        let mut guard = self.live.places.lock().expect("origin map poisoned");
        let places = &mut *guard;
        if let Some(count) = places.origins.get_mut(&self.origin) {
            places.connections -= 1;
            *count -= 1;
            if *count == 0 {
                places.origins.remove(&self.origin);
            }
        }
    }
}

/// The pool's key for `uri`: scheme and authority as hyper-util compares them (case aside), so
/// spellings it pools apart (a port written out, user info) count as origins of their own.
#[cfg(feature = "upstream-pool")]
fn origin_key(uri: &Uri) -> String {
    let scheme = uri.scheme_str().unwrap_or("");
    let authority = uri.authority().map_or("", |a| a.as_str());
    format!("{scheme}://{authority}").to_ascii_lowercase()
}

#[cfg(feature = "upstream-pool")]
impl PoolConnector {
    /// `connector` for the pooled client, keeping connections for reuse to at most `cap`
    /// origins ([`MAX_POOLED_ORIGINS`]) and `max_connections` connections
    /// ([`MAX_POOLED_CONNECTIONS`]); tests use small ones.
    pub(super) fn with_caps(connector: Connector, cap: usize, max_connections: usize) -> Self {
        PoolConnector {
            connector,
            live: Arc::new(Live {
                places: Mutex::new(Places::default()),
                cap,
                max_connections,
            }),
        }
    }
}

#[cfg(feature = "upstream-pool")]
impl tower_service::Service<Uri> for PoolConnector {
    type Response = TokioIo<PooledConn>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ConnectError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let inner = self.connector.inner.clone();
        let live = self.live.clone();
        let origin = origin_key(&uri);
        Box::pin(async move {
            // An HTTP/2 connection is shared and stays in the pool whatever it reports, so one
            // that will not be kept speaks HTTP/1.1, which closes after its response. Asked once
            // the setup slot is held, as late as the choice can be made.
            let h2 = || live.has_room(&origin);
            let conn = inner.connect(uri, h2).await?;
            // The place is taken once the connection exists: a setup that waits for its slot,
            // stalls or fails holds none.
            let place = live.take(origin, conn.is_h2());
            Ok(TokioIo::new(PooledConn { conn, place }))
        })
    }
}

/// A connection of the pooled client, holding its place (`None`: not kept for reuse).
#[cfg(feature = "upstream-pool")]
pub struct PooledConn {
    conn: Conn,
    place: Option<Place>,
}

#[cfg(feature = "upstream-pool")]
impl Connection for PooledConn {
    fn connected(&self) -> Connected {
        let connected = self.conn.connected();
        if self.place.is_none() {
            // Not reused: hyper-util drops it once its response is read, which closes it.
            connected.poison();
        }
        connected
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
        Box::pin(async move { inner.connect(uri, || true).await.map(TokioIo::new) })
    }
}

impl Inner {
    /// `h2`: whether TLS may offer HTTP/2 (when `upstream.http2` is on), asked once the setup
    /// slot is held.
    async fn connect(&self, uri: Uri, h2: impl FnOnce() -> bool) -> Result<Conn, ConnectError> {
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
        let setup = self.establish(&host, port, tls, h2());
        let conn = tokio::time::timeout(self.connect_timeout, setup)
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

    async fn establish(
        &self,
        host: &str,
        port: u16,
        tls: bool,
        h2: bool,
    ) -> Result<Conn, ConnectError> {
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
                let mut s = self.proxy_stream(host, addr).await?;
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
                let mut s = self.proxy_stream(host, addr).await?;
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
                let mut s = self.proxy_stream(host, addr).await?;
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
            let _ = (verify, h2);
            Err(ConnectError::Tls {
                host: host.to_string(),
                source: io::Error::new(
                    io::ErrorKind::Unsupported,
                    "this build has no TLS client (the `tls` feature)",
                ),
            })
        }
        #[cfg(feature = "tls")]
        self.tls_handshake(host, stream, verify, h2).await
    }

    #[cfg(feature = "tls")]
    async fn tls_handshake(
        &self,
        host: &str,
        stream: TcpStream,
        verify: bool,
        h2: bool,
    ) -> Result<Conn, ConnectError> {
        let h2 = h2 && self.http2;
        let connector = self.tls[tls_kind(verify, h2)]
            .get_or_init(|| TlsConnector::from(tls::client_config(verify, h2, &self.extra_roots)));
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

    /// A connection to the proxy at `proxy` (`host:port`) for a request to `host`: its name
    /// through the connector's resolver and its addresses raced (Happy Eyeballs), each attempt
    /// within half the connect budget, as a direct connection's are.
    async fn proxy_stream(&self, host: &str, proxy: &str) -> Result<TcpStream, ConnectError> {
        let (name, port) = happy::split_host_port(proxy).map_err(|e| proxy_err(host, e))?;
        let addrs = self
            .resolver
            .lookup(name, port)
            .await
            .map_err(|e| proxy_err(host, e))?;
        let attempt = (self.connect_timeout / 2).max(happy::STAGGER);
        happy::connect(&addrs, happy::STAGGER, attempt)
            .await
            .map_err(|source| proxy_err(host, source))
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

/// The place in `Inner::tls` of the TLS connector that verifies or not and offers `h2` or not.
#[cfg(feature = "tls")]
fn tls_kind(verify: bool, h2: bool) -> usize {
    usize::from(verify) * 2 + usize::from(h2)
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

impl Conn {
    /// Whether TLS agreed on HTTP/2.
    #[cfg(feature = "upstream-pool")]
    fn is_h2(&self) -> bool {
        #[cfg(feature = "tls")]
        if let Conn::Tls(s) = self {
            return s.get_ref().1.alpn_protocol() == Some(b"h2");
        }
        false
    }
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

#[cfg(feature = "upstream-pool")]
impl AsyncRead for PooledConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().conn).poll_read(cx, buf)
    }
}

#[cfg(feature = "upstream-pool")]
impl AsyncWrite for PooledConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().conn).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().conn).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.conn.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().conn).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().conn).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "upstream-pool")]
    use std::sync::atomic::AtomicUsize;

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

    /// A keep-alive origin answering every request with one byte; `open` counts the connections
    /// it holds (accepted and not yet closed by the client), `accepted` all it accepted. It
    /// answers nothing until `wait_for` connections were accepted (so that concurrent requests
    /// each need a connection of their own).
    #[cfg(feature = "upstream-pool")]
    async fn keep_alive_origin(
        open: Arc<AtomicUsize>,
        accepted: Arc<AtomicUsize>,
        wait_for: usize,
    ) -> u16 {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                open.fetch_add(1, Ordering::SeqCst);
                accepted.fetch_add(1, Ordering::SeqCst);
                let (open, accepted) = (open.clone(), accepted.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    loop {
                        match tokio::io::AsyncReadExt::read(&mut socket, &mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        while accepted.load(Ordering::SeqCst) < wait_for {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nx";
                            if socket.write_all(answer).await.is_err() {
                                break;
                            }
                        }
                    }
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        port
    }

    /// An upstream client whose pool keeps connections to at most `cap` origins.
    #[cfg(feature = "upstream-pool")]
    fn capped_upstream(cap: usize) -> crate::upstream::Upstream {
        let config = crate::upstream::UpstreamConfig {
            allow_private: true,
            ..Default::default()
        };
        let registry = &mut prometheus_client::registry::Registry::default();
        crate::upstream::Upstream::build(&config, registry, cap).unwrap()
    }

    /// A GET of `port`'s `/x`, answered 200 with one byte.
    #[cfg(feature = "upstream-pool")]
    async fn fetch_x(upstream: &crate::upstream::Upstream, port: u16) {
        let url = format!("http://127.0.0.1:{port}/x").parse().unwrap();
        let resp = upstream
            .send(crate::upstream::UpstreamRequest::get(url))
            .await
            .unwrap();
        assert_eq!(resp.status, http::StatusCode::OK);
        let body = resp.body.collect_limited(1024).await.unwrap();
        assert_eq!(&body[..], b"x");
    }

    /// Waits up to two seconds for `open` to come down to `want`, and returns what it is.
    #[cfg(feature = "upstream-pool")]
    async fn settle(open: &AtomicUsize, want: usize) -> usize {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while open.load(Ordering::SeqCst) > want && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        open.load(Ordering::SeqCst)
    }

    /// One request to each of many origins, fewer than the bound on origins but more than the
    /// bound on connections: connections past the latter serve their request and close. Before,
    /// only origins were counted and all 6 stayed (up to 64 an origin over 1,024 origins).
    #[cfg(feature = "upstream-pool")]
    #[tokio::test]
    async fn pooled_connections_are_capped_in_total() {
        use http_body_util::Empty;
        let connector = Connector::new(
            RouteTable::default(),
            #[cfg(feature = "tls")]
            Vec::new(),
            true,
            false,
            Duration::from_secs(2),
            4,
            crate::atomic::Counter::default(),
        );
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(60))
                .pool_timer(hyper_util::rt::TokioTimer::new())
                .build::<_, Empty<bytes::Bytes>>(PoolConnector::with_caps(connector, 8, 3));
        let (open, accepted) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        for _ in 0..6 {
            let port = keep_alive_origin(open.clone(), accepted.clone(), 0).await;
            let uri: Uri = format!("http://127.0.0.1:{port}/x").parse().unwrap();
            let resp = client.get(uri).await.unwrap();
            assert_eq!(resp.status(), http::StatusCode::OK);
            let body = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .unwrap();
            assert_eq!(&body.to_bytes()[..], b"x");
        }
        // Give any connection that would close the time to.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(settle(&open, 3).await, 3);
        assert_eq!(accepted.load(Ordering::SeqCst), 6);
    }

    /// One request to each of many origins (distinct ports, as distinct names under a wildcard
    /// would be): the pooled client keeps connections to at most its bound of origins; those to
    /// origins past it serve their request and close. Before, hyper-util's per-origin bound was
    /// the only one, and every origin's connection stayed for `pool_idle_secs` (12 of 12).
    #[cfg(feature = "upstream-pool")]
    #[tokio::test]
    async fn pooled_connections_are_capped_across_origins() {
        let upstream = capped_upstream(4);
        let (open, accepted) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        for _ in 0..12 {
            let port = keep_alive_origin(open.clone(), accepted.clone(), 0).await;
            fetch_x(&upstream, port).await;
        }
        // Connections past the bound close once their response is read.
        assert_eq!(settle(&open, 4).await, 4);
    }

    /// Many connections at once to one origin, more than the bound on origins: all are kept for
    /// reuse, and a second round of as many requests opens no new one. Before, the bound counted
    /// connections, so those past it closed (2 of 6 stayed) and the second round set up anew.
    #[cfg(feature = "upstream-pool")]
    #[tokio::test]
    async fn connections_to_one_origin_past_the_bound_are_all_kept() {
        let upstream = capped_upstream(2);
        let (open, accepted) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let port = keep_alive_origin(open.clone(), accepted.clone(), 6).await;
        for _round in 0..2 {
            let fetches = (0..6).map(|_| fetch_x(&upstream, port));
            futures_util::future::join_all(fetches).await;
        }
        // Give any connection that would close the time to.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(settle(&open, 0).await, 6);
        assert_eq!(accepted.load(Ordering::SeqCst), 6);
    }
}
