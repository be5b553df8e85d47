//! The downstream server: listeners, TLS, HTTP/1.1 and HTTP/2 (h2c by prior knowledge, ALPN with TLS),
//! keep-alive idle timeout, send timeout for clients that stop reading, TLS handshake timeout,
//! header and HTTP/2 stream limits, the connection limit, and graceful shutdown.

pub mod activity;
mod clock;
pub mod config;
pub mod date;
pub mod field_maps;
#[cfg(feature = "reverse")]
mod h1fast;
pub mod handler;
#[cfg(feature = "http2")]
mod http2;
#[cfg(feature = "http2")]
pub(crate) use http2::tunnel as h2_tunnel;
pub mod listener;
pub mod notify;
pub mod quic;
pub mod screen;
pub mod spliced;
pub mod stall;
mod task;
pub mod ticks;
pub mod tls;
pub mod upgrade;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

#[cfg(feature = "http2")]
use crate::runtime::recent::FreshExecutor;
use crate::runtime::recent::{recent, Fresh};
use activity::{Activity, Watched};
pub use config::{EndpointsConfig, ServerConfig};
pub use handler::{Handler, ListenerId};

/// On shutdown or hand-over, how long a keep-alive connection with nothing in flight stays open:
/// a client that sends its next request in that moment gets an answer (with `Connection: close`)
/// instead of a connection closed under it.
pub const DRAIN_IDLE: Duration = Duration::from_secs(1);

/// A bound server, ready to run, handing its requests to `H`.
pub struct Server<H> {
    listeners: Listeners,
    #[cfg(feature = "tls")]
    tls: TlsHandle,
    config: ServerConfig,
    handler: Arc<H>,
    /// HTTP/3's UDP sockets (`server.http3.enabled` with TLS).
    #[cfg(feature = "http3")]
    quic: Option<quic::Bound>,
}

/// The sockets a server accepts on, by runtime model.
enum Listeners {
    /// Work-stealing: every listener accepts on the one multi-threaded runtime.
    Shared(Vec<(ListenerId, TcpListener)>),
    /// Per-core: for each core, its own `SO_REUSEPORT` socket for every address.
    PerCore(Vec<Vec<(ListenerId, std::net::TcpListener)>>),
}

/// The live TLS settings; a reload swaps the certificates here, each new handshake uses the current
/// ones. `None` when the listeners speak plain HTTP.
#[cfg(feature = "tls")]
pub type TlsHandle = Arc<arc_swap::ArcSwapOption<rustls::ServerConfig>>;

/// The TLS settings a server config asks for (`None`: plain HTTP), with what to tell ACME when
/// they go live ([`tls::Publish`]).
#[cfg(feature = "tls")]
pub fn tls_settings(
    config: &ServerConfig,
    acme: Option<tls::Managed>,
) -> anyhow::Result<(Option<Arc<rustls::ServerConfig>>, tls::Publish)> {
    let default = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
        _ => None,
    };
    if default.is_none() && config.certificates.is_empty() && acme.is_none() {
        return Ok((None, Box::new(|| {})));
    }
    let (settings, publish) = tls::sni_server_config_with(default, &config.certificates, acme)?;
    if !config.tls_own_record_layer {
        return Ok((Some(settings), publish));
    }
    let mut settings = Arc::unwrap_or_clone(settings);
    tls::own_record_layer(&mut settings);
    Ok((Some(Arc::new(settings)), publish))
}

/// The live-reload hook for `[server]`'s certificates: new certificates for new handshakes
/// (with the handler's ACME certificates, `acme`). Turning TLS on or off needs a restart.
#[cfg(feature = "tls")]
pub fn tls_reload(
    handle: TlsHandle,
    acme: Option<tls::Managed>,
) -> crate::section::Prepare<ServerConfig> {
    Box::new(move |config: &ServerConfig| {
        let (new, publish) = tls_settings(config, acme.clone())?;
        if new.is_some() != handle.load().is_some() {
            anyhow::bail!("turning TLS on or off needs a restart");
        }
        let handle = handle.clone();
        Ok(Box::new(move || {
            publish();
            handle.store(new)
        }) as crate::section::Commit)
    })
}

/// The live TLS settings for a server config (with the handler's ACME certificates); in a build
/// without `tls`, a config that asks for TLS is refused instead of served in plain text.
#[cfg(feature = "tls")]
fn tls_handle(config: &ServerConfig, acme: Option<tls::Managed>) -> anyhow::Result<TlsHandle> {
    let (settings, publish) = tls_settings(config, acme)?;
    publish();
    Ok(Arc::new(arc_swap::ArcSwapOption::new(settings)))
}

#[cfg(not(feature = "tls"))]
fn refuse_tls(config: &ServerConfig) -> anyhow::Result<()> {
    if config.tls_cert.is_some() || !config.certificates.is_empty() {
        anyhow::bail!("TLS on the listeners needs a build with the `tls` feature");
    }
    Ok(())
}

impl<H: Handler> Server<H> {
    /// Binds every configured listener (nothing is served until [`Server::run`]). Under
    /// `server.runtime = "per-core"` each address is bound once per core with `SO_REUSEPORT`.
    pub fn bind(config: &ServerConfig, handler: Arc<H>) -> anyhow::Result<Server<H>> {
        #[cfg(not(feature = "tls"))]
        refuse_tls(config)?;
        let failed =
            |addr: &SocketAddr, e: std::io::Error| anyhow::anyhow!("cannot listen on {addr}: {e}");
        if config.runtime == crate::runtime::RuntimeModel::PerCore {
            let cores = crate::runtime::threads(config.threads);
            let mut per_core: Vec<Vec<(ListenerId, std::net::TcpListener)>> =
                (0..cores).map(|_| Vec::new()).collect();
            for (id, addr) in config.all_listen() {
                // The first socket settles the port (`:0` in tests); the others join it.
                let first = listener::bind_reuseport(addr).map_err(|e| failed(&addr, e))?;
                let bound = first.local_addr()?;
                per_core[0].push((ListenerId(id), first));
                for core in per_core.iter_mut().skip(1) {
                    let socket = listener::bind_reuseport(bound).map_err(|e| failed(&bound, e))?;
                    core.push((ListenerId(id), socket));
                }
            }
            return Server {
                listeners: Listeners::PerCore(per_core),
                #[cfg(feature = "tls")]
                tls: tls_handle(config, handler.managed_certs())?,
                config: config.clone(),
                handler,
                #[cfg(feature = "http3")]
                quic: None,
            }
            .with_http3();
        }
        let listeners = config
            .all_listen()
            .into_iter()
            .map(|(id, addr)| {
                listener::bind(addr)
                    .map(|l| (ListenerId(id), l))
                    .map_err(|e| failed(&addr, e))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Server {
            listeners: Listeners::Shared(listeners),
            #[cfg(feature = "tls")]
            tls: tls_handle(config, handler.managed_certs())?,
            config: config.clone(),
            handler,
            #[cfg(feature = "http3")]
            quic: None,
        }
        .with_http3()
    }

    /// Uses listeners bound by the caller (tests bind `127.0.0.1:0`), all of them the `main`
    /// listener, served by the caller's runtime whatever `server.runtime` says (named listeners and
    /// per-core need [`Server::bind`]).
    pub fn from_listeners(
        listeners: Vec<TcpListener>,
        config: &ServerConfig,
        handler: Arc<H>,
    ) -> anyhow::Result<Server<H>> {
        #[cfg(not(feature = "tls"))]
        refuse_tls(config)?;
        Server {
            listeners: Listeners::Shared(
                listeners
                    .into_iter()
                    .map(|l| (ListenerId::default(), l))
                    .collect(),
            ),
            #[cfg(feature = "tls")]
            tls: tls_handle(config, handler.managed_certs())?,
            config: config.clone(),
            handler,
            #[cfg(feature = "http3")]
            quic: None,
        }
        .with_http3()
    }

    /// Binds HTTP/3's UDP sockets beside the TLS listeners, when asked for.
    fn with_http3(self) -> anyhow::Result<Server<H>> {
        #[cfg(feature = "http3")]
        if self.config.http3.enabled && self.tls.load().is_some() {
            let names = self.config.listener_names();
            let addrs: Vec<_> = self
                .bound()
                .into_iter()
                .map(|(name, addr)| {
                    let id = names.iter().position(|n| *n == name).unwrap_or(0);
                    (ListenerId(id), addr)
                })
                .collect();
            let quic = Some(quic::bind(&addrs)?);
            return Ok(Server { quic, ..self });
        }
        Ok(self)
    }

    /// Whether HTTP/3 is served beside the TLS listeners.
    fn serves_http3(&self) -> bool {
        #[cfg(feature = "http3")]
        return self.quic.is_some();
        #[cfg(not(feature = "http3"))]
        false
    }

    /// Where a reload puts new certificates.
    #[cfg(feature = "tls")]
    pub fn tls_handle(&self) -> TlsHandle {
        self.tls.clone()
    }

    /// The addresses actually bound (`main` first, then the named listeners in order).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.bound().into_iter().map(|(_, a)| a).collect()
    }

    /// The addresses actually bound, each with the name of its listener.
    pub fn bound(&self) -> Vec<(String, SocketAddr)> {
        let names = self.config.listener_names();
        let name = |id: &ListenerId| names.get(id.0).cloned().unwrap_or_default();
        match &self.listeners {
            Listeners::Shared(ls) => ls
                .iter()
                .filter_map(|(id, l)| Some((name(id), l.local_addr().ok()?)))
                .collect(),
            Listeners::PerCore(cores) => cores
                .first()
                .map(|ls| {
                    ls.iter()
                        .filter_map(|(id, l)| Some((name(id), l.local_addr().ok()?)))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets in-flight responses finish within
    /// the grace period, and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        // While it serves, an upstream fetch to one of these addresses is refused (a loop).
        let _own = crate::upstream::guard::OwnListeners::register(self.local_addrs());
        let builder = Arc::new(http_builder(&self.config));
        let (stop_tx, stop_rx) = watch::channel(false);
        let tracker = TaskTracker::new();
        let max = match self.config.max_connections {
            0 => listener::connections_for_fd_limit(listener::nofile_limit()),
            n => n,
        };
        tracing::info!(max_connections = max, "client connection limit");
        let acceptor = listener::Acceptor::new(max, self.handler.accept_metrics().clone()).per_ip(
            listener::client_share(
                self.config.max_connections_per_ip,
                self.config.per_ip_exempt.clone(),
            ),
        );
        let timeouts = Timeouts {
            idle: Duration::from_secs(self.config.idle_timeout_secs),
            send: Duration::from_secs(self.config.send_timeout_secs),
            tls_handshake: Duration::from_secs(self.config.tls_handshake_timeout_secs),
            header_read: Duration::from_secs(self.config.header_read_timeout_secs),
        };
        let conn = Conn {
            builder,
            handler: self.handler.clone(),
            #[cfg(feature = "tls")]
            tls: self.tls.clone(),
            stop: stop_rx.clone(),
            timeouts,
            head_limits: (self.config.max_header_bytes, self.config.max_headers),
            listener: ListenerId::default(),
            splice: self.handler.splices_streams(),
            fast_path: self.config.h1_fast_path,
            alt_svc: None,
            #[cfg(feature = "http2")]
            h2_own: self.config.h2_own_server.then(|| http2::Limits {
                max_concurrent_streams: self.config.h2_max_concurrent_streams,
                max_header_list_size: u32::try_from(self.config.max_header_bytes)
                    .unwrap_or(u32::MAX),
                window: self.config.h2_recv_window_bytes,
            }),
            clock: clock::Clock::start(stop_rx.clone()),
        };
        // The `Alt-Svc` value of the TLS listener on an address (`None`: not advertised).
        let http3 = self.serves_http3();
        let alt_svc = |addr: std::io::Result<SocketAddr>| -> Option<http::HeaderValue> {
            #[cfg(feature = "http3")]
            if http3 {
                return self.config.http3.alt_svc(addr.ok()?.port());
            }
            let _ = (http3, addr);
            None
        };
        #[cfg(feature = "http3")]
        let quic = match self.quic {
            Some(bound) => match bound.serve(
                &self.config,
                self.tls.clone(),
                self.handler.clone(),
                stop_rx.clone(),
                tracker.clone(),
                acceptor.clone(),
            ) {
                Ok(endpoints) => Some(endpoints),
                Err(e) => {
                    tracing::error!(error = %e, "HTTP/3 not served");
                    None
                }
            },
            None => None,
        };
        let grace = Duration::from_secs(self.config.shutdown_grace_secs);
        let mut acceptors = Vec::new();
        let mut cores = Vec::new();
        match self.listeners {
            Listeners::Shared(listeners) => {
                for (id, listener) in listeners {
                    let alt_svc = alt_svc(listener.local_addr());
                    acceptors.push(tokio::spawn(accept_loop(
                        listener,
                        Conn {
                            listener: id,
                            alt_svc,
                            ..conn.clone()
                        },
                        acceptor.clone(),
                        tracker.clone(),
                    )));
                }
            }
            Listeners::PerCore(per_core) => {
                for (index, listeners) in per_core.into_iter().enumerate() {
                    let core = Core {
                        index,
                        alt_svc: listeners
                            .iter()
                            .map(|(_, l)| alt_svc(l.local_addr()))
                            .collect(),
                        listeners,
                        conn: conn.clone(),
                        acceptor: acceptor.clone(),
                        tracker: tracker.clone(),
                        grace,
                        busy_poll: Duration::from_micros(self.config.busy_poll_us),
                    };
                    match core.start() {
                        Ok(done) => cores.push(done),
                        Err(e) => {
                            tracing::error!(core = index, error = %e, "cannot start a per-core runtime")
                        }
                    }
                }
                tracing::info!(runtimes = cores.len(), "per-core runtimes serving");
            }
        }
        shutdown.await;
        tracing::info!("shutting down: no new connections, finishing in-flight responses");
        for a in &acceptors {
            a.abort();
        }
        #[cfg(feature = "http3")]
        if let Some(q) = &quic {
            q.stop_accepting();
        }
        let _ = stop_tx.send(true);
        tracker.close();
        if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
            tracing::warn!(
                "grace period of {} s over; closing remaining connections",
                grace.as_secs()
            );
        }
        #[cfg(feature = "http3")]
        if let Some(q) = quic {
            q.close().await;
        }
        // Each per-core runtime stops on its own once its connections are done or the grace
        // period is over.
        for done in cores {
            let _ = tokio::time::timeout(grace + Duration::from_secs(2), done).await;
        }
    }
}

/// Accepts on one listener until aborted, each connection a tracked task of the calling runtime.
async fn accept_loop<H: Handler>(
    listener: TcpListener,
    conn: Conn<H>,
    acceptor: listener::Acceptor,
    tracker: TaskTracker,
) {
    // Shared by the listener's connections: a connection task holds a pointer, not a copy.
    let conn = Arc::new(conn);
    loop {
        let (stream, peer, slot) = acceptor.accept(&listener).await;
        conn.handler.connection_accepted();
        tracker.spawn(Fresh::new(Conn::serve(conn.clone(), stream, peer, slot)));
    }
}

/// One per-core runtime: a thread running a current-thread runtime that accepts on its own
/// sockets and serves those connections (and the upstream requests they make) itself.
struct Core<H> {
    index: usize,
    listeners: Vec<(ListenerId, std::net::TcpListener)>,
    /// Each listener's `Alt-Svc` value, in the order of `listeners`.
    alt_svc: Vec<Option<http::HeaderValue>>,
    conn: Conn<H>,
    acceptor: listener::Acceptor,
    tracker: TaskTracker,
    grace: Duration,
    /// `server.busy_poll_us`.
    busy_poll: Duration,
}

impl<H: Handler> Core<H> {
    /// Starts the thread; the receiver resolves when its runtime has stopped.
    fn start(self) -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name(format!("sluice-core-{}", self.index))
            .spawn(move || {
                crate::runtime::enter_worker(self.index);
                if let Some(poller) = crate::runtime::busy_poll::install(self.busy_poll) {
                    runtime.spawn(poller);
                }
                runtime.block_on(self.serve());
                // Whatever outlived the grace period (and blocking work) is given a moment only.
                runtime.shutdown_timeout(Duration::from_secs(1));
                let _ = done_tx.send(());
            })?;
        Ok(done_rx)
    }

    async fn serve(self) {
        let mut stop = self.conn.stop.clone();
        let mut loops = Vec::new();
        // This runtime's own clock for its connections' deadlines.
        let base = Conn {
            clock: clock::Clock::start(stop.clone()),
            ..self.conn.clone()
        };
        for ((id, std_listener), alt_svc) in self.listeners.into_iter().zip(self.alt_svc) {
            match TcpListener::from_std(std_listener) {
                Ok(l) => loops.push(tokio::spawn(accept_loop(
                    l,
                    Conn {
                        listener: id,
                        alt_svc,
                        ..base.clone()
                    },
                    self.acceptor.clone(),
                    self.tracker.clone(),
                ))),
                Err(e) => {
                    tracing::error!(core = self.index, error = %e, "cannot register a listener")
                }
            }
        }
        let _ = stop.wait_for(|s| *s).await;
        for l in &loops {
            l.abort();
        }
        // This runtime drives its own connections: keep running until they are done (the main
        // runtime closes the tracker on shutdown) or the grace period is over.
        let _ = tokio::time::timeout(self.grace, self.tracker.wait()).await;
    }
}

/// HTTP/1.1 and HTTP/2 (h2c by prior knowledge, h2 by ALPN); HTTP/1.1 alone without `http2`.
#[cfg(feature = "http2")]
type HttpBuilder = hyper_util::server::conn::auto::Builder<FreshExecutor>;
#[cfg(not(feature = "http2"))]
type HttpBuilder = hyper::server::conn::http1::Builder;

/// The HTTP/1.1 settings, applied to hyper's own builder or to the auto builder's HTTP/1 half
/// (two types with the same methods).
///
/// hyper's own header read timeout is off: it boxed a fresh timer and put it on the timer wheel
/// at every wait for a head, i.e. once per request. The request screen under hyper holds every
/// incomplete HTTP/1 head with the same deadline (`screen`), and the connection's watchdog closes
/// a connection whose first head has not begun within it (`Conn::drive`), so the limit holds
/// without a per-request timer.
macro_rules! http1_settings {
    ($builder:expr, $config:expr) => {
        $builder
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            .max_buf_size($config.max_header_bytes.max(8192))
            .keep_alive(true)
    };
}

/// hyper's HTTP/1 request head field limit when none is set.
const HYPER_MAX_HEADERS: usize = 100;

/// Adds the listener's `Alt-Svc` offer unless the response has an `Alt-Svc` of its own: as one more
/// HPACK line when its fields go to h2 as lines (`h2::ext::EncodedFields`, from the HTTP/2 fast
/// path, which leaves a server's `Alt-Svc` in the map), else in its map.
fn offer_alt_svc<B>(resp: &mut http::Response<B>, value: http::HeaderValue) {
    if resp.headers().contains_key(http::header::ALT_SVC) {
        return;
    }
    #[cfg(feature = "http2")]
    if let Some(lines) = resp.extensions_mut().get_mut::<h2::ext::EncodedFields>() {
        sluice_http::plain_head::hpack_field(&mut lines.0, b"alt-svc", value.as_bytes());
        return;
    }
    resp.headers_mut().insert(http::header::ALT_SVC, value);
}

/// Gives an HTTP/2 response a `Date` unless it has one, as hyper's server would (its own dating is
/// off: it cannot see the HTTP/2 fast path's HPACK lines, which always carry one).
fn date_h2<B>(resp: &mut http::Response<B>) {
    #[cfg(feature = "http2")]
    if resp.extensions().get::<h2::ext::EncodedFields>().is_some() {
        return;
    }
    if !resp.headers().contains_key(http::header::DATE) {
        resp.headers_mut().insert(http::header::DATE, date::value());
    }
}

#[cfg(feature = "http2")]
fn http_builder(config: &ServerConfig) -> HttpBuilder {
    let mut builder = HttpBuilder::new(FreshExecutor);
    http1_settings!(builder.http1(), config);
    // hyper's own limit is 100 fields, kept on the stack; an explicit limit (even 100) makes it
    // allocate and fill two field arrays per request head, so set it only when it differs.
    if config.max_headers != HYPER_MAX_HEADERS {
        builder.http1().max_headers(config.max_headers);
    }
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(config.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(config.h2_max_concurrent_streams)
        .max_send_buf_size(config.h2_max_send_buf_bytes)
        // RFC 8441 extended CONNECT, so WebSocket works over HTTP/2 too.
        .enable_connect_protocol()
        // The service dates each response (`date_h2`): a fast-path answer carries its `Date` in
        // its HPACK lines, where hyper would not see it.
        .auto_date_header(false)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .adaptive_window(true);
    builder
}

#[cfg(not(feature = "http2"))]
fn http_builder(config: &ServerConfig) -> HttpBuilder {
    let mut builder = HttpBuilder::new();
    http1_settings!(builder, config);
    if config.max_headers != HYPER_MAX_HEADERS {
        builder.max_headers(config.max_headers);
    }
    builder
}

/// How an HTTP/2 connection by prior knowledge (h2c) begins (RFC 9113 section 3.4).
pub(in crate::server) const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What one connection task needs.
struct Conn<H> {
    builder: Arc<HttpBuilder>,
    handler: Arc<H>,
    #[cfg(feature = "tls")]
    tls: TlsHandle,
    stop: watch::Receiver<bool>,
    timeouts: Timeouts,
    /// `server.max_header_bytes` and `server.max_headers`, for the request screen.
    head_limits: (usize, usize),
    /// The listener that accepted the connection; routing sees it in each request's extensions.
    listener: ListenerId,
    /// Plain HTTP/1.1 connections offer handlers a splice tap (`spliced`).
    splice: bool,
    /// `server.h1_fast_path`: plain connections start on the HTTP/1.1 fast path (`h1fast`).
    #[cfg_attr(not(feature = "reverse"), allow(dead_code))]
    fast_path: bool,
    /// `Alt-Svc` for this listener's TLS responses: HTTP/3 on the same port.
    alt_svc: Option<http::HeaderValue>,
    /// HTTP/2 connections go to sluice's own server (`http2`) with these limits; `None`: hyper's.
    #[cfg(feature = "http2")]
    h2_own: Option<http2::Limits>,
    /// The runtime's clock for its connections' deadlines (`clock`).
    clock: Arc<clock::Clock>,
}

impl<H> Clone for Conn<H> {
    fn clone(&self) -> Self {
        Conn {
            builder: self.builder.clone(),
            handler: self.handler.clone(),
            #[cfg(feature = "tls")]
            tls: self.tls.clone(),
            stop: self.stop.clone(),
            timeouts: self.timeouts,
            head_limits: self.head_limits,
            listener: self.listener,
            splice: self.splice,
            fast_path: self.fast_path,
            alt_svc: self.alt_svc.clone(),
            #[cfg(feature = "http2")]
            h2_own: self.h2_own,
            clock: self.clock.clone(),
        }
    }
}

/// Tells a client that stopped reading from one that reads slowly: writes blocked for the whole
/// send timeout *and* the socket's unacknowledged bytes not shrinking meanwhile.
///
/// A stall is judged only from a second look within it: a first look finds no earlier count to
/// compare with, and a look that came late (a busy thread, a late timer) could otherwise cut a
/// client whose window shut just after the look before and which has been reading since.
struct SendWatch {
    activity: Arc<Activity>,
    fd: std::os::fd::RawFd,
    /// The last look found writes blocked.
    looked: bool,
    unacked: Option<u64>,
}

impl SendWatch {
    fn of(stream: &Watched<tokio::net::TcpStream>) -> SendWatch {
        SendWatch {
            activity: stream.activity().clone(),
            // Kept to read the send queue; valid while the connection (which owns it) is alive.
            fd: std::os::fd::AsRawFd::as_raw_fd(stream.get_ref()),
            looked: false,
            unacked: None,
        }
    }

    fn stalled(&mut self, limit: Duration) -> bool {
        if self.activity.send_stalled_for().is_none() {
            self.looked = false;
            self.unacked = None;
            return false;
        }
        let now = activity::unacked_bytes(self.fd);
        if let (Some(now), Some(before)) = (now, self.unacked) {
            if now < before {
                self.activity.drained();
            }
        }
        self.unacked = now;
        let second = std::mem::replace(&mut self.looked, true);
        second && self.activity.send_stalled_for().is_some_and(|d| d >= limit)
    }
}

/// The connection-level clocks.
#[derive(Clone, Copy, Debug)]
struct Timeouts {
    /// Keep-alive: nothing in flight for this long.
    idle: Duration,
    /// A response being sent while the client accepts no byte for this long.
    send: Duration,
    /// TLS handshake not finished in this long.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    tls_handshake: Duration,
    /// A request head not finished in this long: the screen's clock for a head begun, the
    /// watchdog's for a connection that never sent one.
    header_read: Duration,
}

impl<H: Handler> Conn<H> {
    /// The task of one accepted connection (`task`).
    fn serve(
        self: Arc<Self>,
        stream: tokio::net::TcpStream,
        peer: SocketAddr,
        slot: listener::Slot,
    ) -> task::Connection<H> {
        // The watch sits under TLS so it measures bytes the client actually accepts.
        let stream = Watched::new(stream, Activity::new());
        #[cfg(feature = "tls")]
        if let Some(settings) = self.tls.load_full() {
            let tls = Box::pin(self.clone().serve_tls(stream, peer, settings));
            return task::Connection::other(self, peer, slot, tls);
        }
        #[cfg(feature = "reverse")]
        if self.fast_path && self.handler.has_fast_routes() {
            return task::Connection::fast(self, stream, peer, slot);
        }
        #[cfg(feature = "http2")]
        if self.h2_own.is_some() {
            // h2c by prior knowledge goes to sluice's own HTTP/2 server here too: its first bytes
            // decide (hyper's server would take the preface itself).
            return task::Connection::sniffing(self, stream, peer, slot);
        }
        let hyper = self.clone().hand_to_hyper(stream, peer, Vec::new());
        task::Connection::other(self, peer, slot, hyper)
    }

    /// Reads a plain connection's first bytes until they either are the HTTP/2 preface or cannot
    /// be; the connection and those bytes then go to [`Conn::hand_to_hyper`], which sends h2c to
    /// sluice's own HTTP/2 server (`None`: closed). The wait has the first head's limit from the
    /// accept (`header_read_timeout_secs`), cut to `DRAIN_IDLE` by a drain, as the watchdog has
    /// it under hyper.
    #[cfg(feature = "http2")]
    async fn sniff(
        self: Arc<Self>,
        stream: Watched<tokio::net::TcpStream>,
    ) -> Option<(Watched<tokio::net::TcpStream>, Vec<u8>)> {
        let deadline =
            tokio::time::sleep_until(recent() + self.timeouts.header_read.min(self.timeouts.idle));
        tokio::pin!(deadline);
        let mut stop = self.stop.clone();
        let mut draining = false;
        let mut first: Vec<u8> = Vec::new();
        loop {
            tokio::select! {
                // The socket first: a client whose bytes are there costs no timer.
                biased;
                ready = stream.get_ref().readable() => ready.ok()?,
                _ = stop.wait_for(|stopping| *stopping), if !draining => {
                    draining = true;
                    let cut = recent() + DRAIN_IDLE;
                    if cut < deadline.deadline() {
                        deadline.as_mut().reset(cut);
                    }
                    continue;
                }
                _ = &mut deadline => return None,
            }
            if first.capacity() == 0 {
                // Room for a whole first head most of the time: it is handed on, not read again.
                first.reserve(4096);
            }
            match stream.get_ref().try_read_buf(&mut first) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => return None,
            }
            let n = first.len().min(H2_PREFACE.len());
            if first[..n] != H2_PREFACE[..n] || n == H2_PREFACE.len() {
                return Some((stream, first));
            }
        }
    }

    /// Hands a plain connection to hyper under the request screen, `replayed` first; boxed.
    /// Bytes that open with the HTTP/2 preface (h2c by prior knowledge) make an HTTP/2
    /// connection for good: no splice tap (it serves HTTP/1.1 requests only), screen off.
    fn hand_to_hyper(
        self: Arc<Self>,
        stream: Watched<tokio::net::TcpStream>,
        peer: SocketAddr,
        replayed: Vec<u8>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let watch = SendWatch::of(&stream);
        let h2c = replayed.starts_with(H2_PREFACE);
        #[cfg(feature = "http2")]
        if let Some(limits) = self.h2_own.filter(|_| h2c) {
            // The preface was read: what came after it is replayed to the HTTP/2 server.
            let mut io = self.screened(spliced::Tapped::new(stream, None), true);
            io.replay(replayed[H2_PREFACE.len()..].to_vec());
            return Box::pin(self.drive_h2(io, watch, peer, false, true, limits));
        }
        let tap = (self.splice && !h2c).then(|| Arc::new(spliced::Tap::default()));
        let mut stream = self.screened(spliced::Tapped::new(stream, tap.clone()), h2c);
        stream.replay(replayed);
        let upgrades = stream.upgrades();
        Box::pin(self.drive(stream, watch, peer, false, tap, upgrades))
    }

    /// A TLS connection: the handshake within `server.tls_handshake_timeout_secs`, then the
    /// HTTP/1.1 fast path (`h1fast`) as for a plain connection, or hyper (HTTP/2 by ALPN).
    #[cfg(feature = "tls")]
    async fn serve_tls(
        self: Arc<Self>,
        stream: Watched<tokio::net::TcpStream>,
        peer: SocketAddr,
        settings: Arc<rustls::ServerConfig>,
    ) {
        let watch = SendWatch::of(&stream);
        #[cfg(feature = "http2")]
        let accepted = recent();
        let limit = self.timeouts.tls_handshake;
        #[cfg(feature = "acme")]
        let acme = self.handler.acme_acceptor();
        let handshake = async move {
            let stream = tls::Framed::new(stream);
            // Automatic HTTPS reads the ClientHello first: it may order a certificate on demand,
            // or take up another node's TLS-ALPN-01 challenge.
            #[cfg(feature = "acme")]
            if let Some(acme) = acme {
                return acme.accept(stream, settings).await;
            }
            tokio_rustls::TlsAcceptor::from(settings)
                .accept(stream)
                .await
        };
        match tokio::time::timeout(limit, tls::capture(handshake)).await {
            Ok((Ok(tls), secrets)) => {
                let alpn = tls.get_ref().1.alpn_protocol();
                // A TLS-ALPN-01 validation: the handshake was all of it (RFC 8737 section 3).
                #[cfg(feature = "acme")]
                if alpn == Some(crate::acme::ACME_TLS_ALPN) {
                    return;
                }
                let h2 = alpn == Some(b"h2");
                let tls = match tls::ServerTls::take_over(tls, secrets) {
                    Ok(tls) => tls,
                    Err(e) => return tracing::debug!(%peer, error = %e, "TLS takeover failed"),
                };
                #[cfg(feature = "reverse")]
                if !h2 && self.fast_path && self.handler.has_fast_routes() {
                    return self.serve_tls_fast(tls, peer).await;
                }
                #[cfg(feature = "http2")]
                if let Some(limits) = self.h2_own.filter(|_| h2) {
                    return self.drive_h2(tls, watch, peer, true, false, limits).await;
                }
                if h2 {
                    let tls = self.screened(tls, true);
                    let upgrades = tls.upgrades();
                    return self
                        .clone()
                        .drive(tls, watch, peer, true, None, upgrades)
                        .await;
                }
                // Not `h2` by ALPN: the first bytes tell whether the client speaks HTTP/2 anyway
                // (by prior knowledge, as nginx and HAProxy take it), for sluice's own server.
                #[cfg(feature = "http2")]
                let (tls, first) = match self.h2_own {
                    Some(_) => {
                        let mut tls = tls;
                        match self.first_bytes(&mut tls, accepted).await {
                            Some(first) => (tls, first),
                            None => return,
                        }
                    }
                    None => (tls, Vec::new()),
                };
                #[cfg(not(feature = "http2"))]
                let first = Vec::new();
                self.tls_to_hyper(tls, watch, peer, first).await
            }
            Ok((Err(e), _)) => {
                self.handler.http_metrics().tls_handshake_errors.inc();
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
            }
            Err(_) => {
                self.handler.http_metrics().tls_handshake_timeouts.inc();
                tracing::debug!(%peer, "TLS handshake timed out");
            }
        }
    }

    /// Serves a TLS connection that did not choose `h2` by ALPN with hyper under the request
    /// screen, `replayed` (bytes read from it already) first; one whose bytes open with the
    /// HTTP/2 preface (prior knowledge) goes to sluice's own HTTP/2 server, as over plain TCP,
    /// not to hyper's. Boxed, as [`Conn::hand_to_hyper`] is: the caller's state keeps a pointer,
    /// not a second place for the connection beside the server's.
    #[cfg(feature = "tls")]
    pub(in crate::server) fn tls_to_hyper(
        self: Arc<Self>,
        tls: tls::ServerTls<Watched<tokio::net::TcpStream>>,
        watch: SendWatch,
        peer: SocketAddr,
        replayed: Vec<u8>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        #[cfg(feature = "http2")]
        if let Some(limits) = self.h2_own.filter(|_| replayed.starts_with(H2_PREFACE)) {
            let mut io = self.screened(tls, true);
            io.replay(replayed[H2_PREFACE.len()..].to_vec());
            return Box::pin(self.drive_h2(io, watch, peer, true, true, limits));
        }
        let mut tls = self.screened(tls, false);
        tls.replay(replayed);
        let upgrades = tls.upgrades();
        Box::pin(self.drive(tls, watch, peer, true, None, upgrades))
    }

    /// Reads a TLS connection's first bytes until they either are the HTTP/2 preface or cannot
    /// be, as [`Conn::sniff`] does for a plain one, with the same limits from `accepted` (the
    /// first head's limit from the accept, the handshake included; cut to `DRAIN_IDLE` by a
    /// drain); `None`: closed, or nothing came in time.
    #[cfg(all(feature = "tls", feature = "http2"))]
    async fn first_bytes<I: AsyncRead + Unpin>(
        &self,
        io: &mut I,
        accepted: tokio::time::Instant,
    ) -> Option<Vec<u8>> {
        use tokio::io::AsyncReadExt;
        let deadline =
            tokio::time::sleep_until(accepted + self.timeouts.header_read.min(self.timeouts.idle));
        tokio::pin!(deadline);
        let mut stop = self.stop.clone();
        let mut draining = false;
        // Room for a whole first head most of the time: it is handed on, not read again.
        let mut first: Vec<u8> = Vec::with_capacity(4096);
        loop {
            tokio::select! {
                biased;
                n = io.read_buf(&mut first) => match n {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                },
                _ = stop.wait_for(|stopping| *stopping), if !draining => {
                    draining = true;
                    let cut = recent() + DRAIN_IDLE;
                    if cut < deadline.deadline() {
                        deadline.as_mut().reset(cut);
                    }
                    continue;
                }
                _ = &mut deadline => return None,
            }
            let n = first.len().min(H2_PREFACE.len());
            if first[..n] != H2_PREFACE[..n] || n == H2_PREFACE.len() {
                return Some(first);
            }
        }
    }

    /// Puts the HTTP/1.1 request screen (`screen`) under hyper.
    fn screened<I>(&self, io: I, http2: bool) -> screen::Screened<I> {
        let (bytes, fields) = self.head_limits;
        let refused = self.handler.http_metrics().smuggling_refused.clone();
        screen::Screened::new(io, bytes, fields, http2, refused, self.timeouts.header_read)
    }

    /// Serves `io` with hyper until it ends. Holds the connection's settings by pointer: this
    /// future is what an idle HTTP/2 connection keeps, boxed, for as long as it is open.
    /// `upgrades`: where the screen under `io` learns how upgrade requests were answered.
    async fn drive<I>(
        self: Arc<Self>,
        io: I,
        watch: SendWatch,
        peer: SocketAddr,
        secure: bool,
        tap: Option<Arc<spliced::Tap>>,
        upgrades: Arc<screen::Upgrades>,
    ) where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let watch = Watch::new(watch);
        let respond = Responder::new(&self, &watch, peer, secure, tap);
        let service = service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
            if req.version() == http::Version::HTTP_2 {
                // Cookie crumbs made one field, as the own HTTP/2 server does.
                sluice_http::hop::join_cookies(req.headers_mut());
            }
            // An upgrade request's answer tells the screen whether the connection is still
            // HTTP/1.1 after it.
            let asks = screen::Upgrades::asks(&req)
                .then(|| (upgrades.clone(), req.method() == http::Method::CONNECT));
            futures_util::FutureExt::map(
                respond.call(req.map(crate::body::Incoming::Hyper)),
                move |resp| {
                    if let Some((upgrades, connect)) = asks {
                        upgrades.answered(resp.status(), connect);
                    }
                    Ok::<_, Infallible>(resp)
                },
            )
        });
        // An HTTP/1.1 upgrade hands the socket to the tunnel's task and hyper's connection ends
        // at the switch; this task (the connection's slot and per-IP place, the drain's count)
        // lasts until the socket closes (`task::Held`).
        let (io, closed) = task::Held::new(io);
        // Pinned where it is built: `tokio::pin!` moves it into a second binding, and an
        // unoptimised build kept both 1.5 KiB copies in every idle HTTP/2 connection's state.
        // In an `Option`, so it can be dropped (with the socket, unless it was handed over)
        // before the wait for the socket to close.
        #[cfg(feature = "http2")]
        let mut conn = std::pin::pin!(Some(
            self.builder
                .serve_connection_with_upgrades(TokioIo::new(io), service)
        ));
        #[cfg(not(feature = "http2"))]
        let mut conn = std::pin::pin!(Some(
            self.builder
                .serve_connection(TokioIo::new(io), service)
                .with_upgrades()
        ));
        let Some(running) = conn.as_mut().as_pin_mut() else {
            return;
        };
        self.watch_over(
            running,
            watch,
            peer,
            false,
            |c| c.graceful_shutdown(),
            |_| None,
            // hyper's HTTP/2 server keeps a chunk parked on a shut window out of reach: only its
            // body is released (`stall`), the chunk stays until the connection ends.
            |_, _| 0,
        )
        .await;
        conn.set(None);
        closed.await;
    }

    /// Serves `io` with the HTTP/2 server of sluice's own (`http2`) until it ends; `prefaced`:
    /// the client's preface was read already.
    #[cfg(feature = "http2")]
    async fn drive_h2<I>(
        self: Arc<Self>,
        io: I,
        watch: SendWatch,
        peer: SocketAddr,
        secure: bool,
        prefaced: bool,
        limits: http2::Limits,
    ) where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let watch = Watch::new(watch);
        let respond = Responder::new(&self, &watch, peer, secure, None);
        let refused = self.handler.http_metrics().smuggling_refused.clone();
        let conn = std::pin::pin!(http2::Connection::new(
            io,
            move |req| respond.call(req),
            limits,
            prefaced
        )
        .count_framing_refusals(refused));
        // A drain says GOAWAY at once (once a request has begun): the client opens no new
        // stream here and the open ones finish, however busy the connection is.
        self.watch_over(
            conn,
            watch,
            peer,
            true,
            |c| c.get_mut().graceful_shutdown(),
            |c| Some(c.stuck_for()),
            |c, limit| c.get_mut().reset_parked(limit),
        )
        .await
    }

    /// Runs a connection's server to its end under the connection's clocks: the idle and header
    /// timeouts, the send watch, stalled HTTP/2 streams, and draining on shutdown. On a drain,
    /// `at_once`: `shut_down` as soon as a request has begun (an HTTP/2 server's GOAWAY); in any
    /// case once the connection has been idle for `DRAIN_IDLE` (an HTTP/1 connection's responses
    /// say `Connection: close` in the meantime, and hyper's automatic server does not say which
    /// protocol it serves). `stuck`: how long the connection's server has written nothing while
    /// it still holds a stream (zero with none held; `None`: the server cannot tell); once the
    /// server's close has begun, a connection with nothing in flight that has been stuck for the
    /// send timeout is dropped (a client can keep a stream from ending by never opening its
    /// window; its body was released by the send watch). `reset_parked`: resets the streams whose
    /// response has waited for a flow-control window for the given time, dropping what they hold
    /// (returns how many; 0 when the server cannot tell).
    // The closures are what each server can do; a struct of them would only move the list.
    #[allow(clippy::too_many_arguments)]
    async fn watch_over<C, E>(
        &self,
        mut conn: Pin<&mut C>,
        watch: Watch,
        peer: SocketAddr,
        at_once: bool,
        shut_down: impl Fn(Pin<&mut C>),
        stuck: impl Fn(Pin<&mut C>) -> Option<Duration>,
        reset_parked: impl Fn(Pin<&mut C>, Duration) -> usize,
    ) where
        C: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let Watch {
            mut send,
            activity,
            bodies,
            ticks: stream_ticks,
        } = watch;
        let mut stop = self.stop.clone();
        let t = &self.timeouts;
        let tick = Duration::from_secs(1).min(t.idle).min(t.send);
        // The checks below run on the runtime's clock: once a tick while a response is under
        // way or writes are blocked, otherwise once, when the idle limit is reached; an idle
        // connection is not woken every second.
        let mut alarm = clock::Alarm::new(self.clock.clone());
        // Ticks fall on a grid from the connection's start, as an `Interval`'s did: the send
        // watch compares the bytes the client acknowledged from one tick to the next, and a gap
        // longer than the send timeout could cut a client that reads slowly.
        let start = recent();
        let tick_ns = tick.as_nanos().max(1);
        let after = |now: Instant| {
            let n = now.saturating_duration_since(start).as_nanos() / tick_ns + 1;
            start + Duration::from_nanos(u64::try_from(n * tick_ns).unwrap_or(u64::MAX))
        };
        // The next tick, while one is due.
        let mut next_tick: Option<Instant> = None;
        // Draining: responses say `Connection: close`, and a connection with nothing in flight
        // is closed once it has been idle for `DRAIN_IDLE`.
        let mut draining = *stop.borrow();
        // When the server's close began (`shut_down`).
        let mut closing: Option<Instant> = None;
        // After the close began, when to look next at whether the server is stuck (`stuck`): first
        // `t.send` after it, then as often as it takes; a connection that has written nothing
        // for `t.send` while a stream is open and nothing is in flight is dropped then.
        let mut look_stuck: Option<Instant> = None;
        loop {
            // `at_once`, once the client is past its preface (a request has begun; until then a
            // drain waits for `DRAIN_IDLE` of idleness as for any connection, so a connection
            // accepted as the drain began is not dropped unanswered). A first request that
            // begins during the drain brings the loop round at once (the branch after `conn`).
            if at_once && draining && closing.is_none() && activity.began() {
                let now = recent();
                closing = Some(now);
                shut_down(conn.as_mut());
                look_stuck = stuck(conn.as_mut()).map(|_| now + t.send);
            }
            // A connection that has not sent a first request has the header read timeout (an
            // incomplete head is the screen's); between requests, the idle timeout.
            let limit = if draining {
                DRAIN_IDLE
            } else if activity.began() {
                t.idle
            } else {
                t.header_read.min(t.idle)
            };
            // Looked at each time the task wakes (after hyper, which may just have begun a
            // request), so a tick is due as soon as a response is under way.
            let checked = std::future::poll_fn(|cx| {
                let now = recent();
                let due = match activity.idle_for() {
                    Some(idle) if activity.send_stalled_for().is_none() => {
                        // Busy until now: the streams' list gives its room back.
                        if next_tick.take().is_some() {
                            stream_ticks.settle();
                        }
                        match (closing, look_stuck) {
                            // Only the server's own close is left to wait for, and a look at
                            // whether it is stuck (`stuck`) now and then.
                            (Some(_), Some(at)) => at,
                            (Some(_), None) => return Poll::Pending,
                            (None, _) => now + limit.saturating_sub(idle),
                        }
                    }
                    _ => *next_tick.get_or_insert_with(|| after(now)),
                };
                if now >= due {
                    next_tick = None;
                    return Poll::Ready(());
                }
                alarm.wake_by(due, cx.waker());
                Poll::Pending
            });
            tokio::select! {
                biased;
                res = conn.as_mut() => {
                    if let Err(e) = res {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    return;
                }
                // A first request began during the drain (in the poll just above): round again,
                // to the GOAWAY at the top of the loop.
                _ = std::future::poll_fn(|_| {
                    if activity.began() { Poll::Ready(()) } else { Poll::Pending }
                }), if at_once && draining && closing.is_none() => {}
                changed = stop.changed(), if !draining => {
                    if changed.is_err() || *stop.borrow() {
                        draining = true;
                    }
                }
                _ = checked => {
                    let now = recent();
                    if closing.is_some() && look_stuck.is_some_and(|at| now >= at) {
                        // Nothing in flight, yet a stream not ended and nothing written for the
                        // send timeout: dropped. A stream still being written (a slow reader of
                        // a whole body) is looked at again later.
                        let idle = activity.idle_for().is_some()
                            && activity.send_stalled_for().is_none();
                        look_stuck = match stuck(conn.as_mut()) {
                            Some(d) if d >= t.send && idle => {
                                tracing::debug!(%peer, "a stream the client keeps from ending after the server's close: connection dropped");
                                return;
                            }
                            // Busy (the ticks bring it round), or not stuck that long yet.
                            Some(d) => Some(now + t.send.saturating_sub(d)),
                            None => None,
                        };
                    }
                    stream_ticks.tick();
                    if send.stalled(t.send) {
                        // Dropping the connection drops its response bodies, and with them the
                        // upstream fetches and everything they buffer.
                        self.handler.http_metrics().send_timeouts.inc();
                        tracing::debug!(%peer, "client stopped reading: send timeout, closing");
                        return;
                    }
                    if activity.send_stalled_for().is_none() {
                        // The socket takes bytes, yet some response is not being pulled: an
                        // HTTP/2 client holding its flow-control window shut on that stream. The
                        // own server resets such a stream first, dropping the data it already
                        // took from the body (the reset goes out on the next round); the rest
                        // (hyper's server) have their bodies released.
                        let released = reset_parked(conn.as_mut(), t.send)
                            + bodies.release_stalled(t.send);
                        if released > 0 {
                            self.handler.http_metrics().send_timeouts.inc_by(released as u64);
                            tracing::debug!(%peer, released, "streams not read: send timeout");
                        }
                    }
                    if closing.is_none() && activity.idle_for().is_some_and(|d| d >= limit) {
                        closing = Some(recent());
                        shut_down(conn.as_mut());
                        look_stuck = stuck(conn.as_mut()).map(|_| now + t.send);
                    }
                }
            }
        }
    }
}

/// What every request on a connection goes through before and after the handler, for
/// hyper's server and the HTTP/2 one of sluice's own alike: the protocol's metrics, the
/// listener, the splice tap, the in-flight guard, `Connection: close` while draining, `Alt-Svc`,
/// `Date`, and the stall guard on HTTP/2 bodies.
struct Responder<H> {
    /// The connection's settings (handler, listener, stop flag, `Alt-Svc`, metrics) through one
    /// pointer: the server keeps this for the connection's whole life, idle or not, and copies of
    /// each came to ~140 bytes per connection.
    settings: Arc<Conn<H>>,
    activity: Arc<Activity>,
    bodies: Arc<stall::Watchlist>,
    ticks: Arc<ticks::Ticks>,
    peer: SocketAddr,
    secure: bool,
    tap: Option<Arc<spliced::Tap>>,
}

impl<H: Handler> Responder<H> {
    fn new(
        settings: &Arc<Conn<H>>,
        watch: &Watch,
        peer: SocketAddr,
        secure: bool,
        tap: Option<Arc<spliced::Tap>>,
    ) -> Self {
        Responder {
            settings: settings.clone(),
            activity: watch.activity.clone(),
            bodies: watch.bodies.clone(),
            ticks: watch.ticks.clone(),
            peer,
            secure,
            tap,
        }
    }

    fn call(
        &self,
        mut req: http::Request<crate::body::Incoming>,
    ) -> impl Future<Output = http::Response<stall::Outgoing>> + Send + 'static {
        crate::runtime::busy_poll::stamp();
        let settings = &self.settings;
        let handler = settings.handler.clone();
        handler
            .http_metrics()
            .protocol
            .requests(req.version())
            .inc();
        // Routing takes a request without one for the main listener's: inserting it costs the
        // extensions map and a box per request (two allocations).
        if settings.listener != ListenerId::default() {
            req.extensions_mut().insert(settings.listener);
        }
        if let Some(tap) = self
            .tap
            .as_ref()
            .filter(|_| req.version() == http::Version::HTTP_11)
        {
            req.extensions_mut().insert(spliced::SpliceTap(tap.clone()));
        }
        let guard = self.activity.begin();
        // Draining: this is the connection's last HTTP/1 response.
        let last = req.version() < http::Version::HTTP_2 && *settings.stop.borrow();
        let h2 = req.version() == http::Version::HTTP_2;
        // Only an HTTP/2 stream can sit unpulled on a writable socket; an HTTP/1 body is pulled
        // whenever the socket takes bytes, which the send watch already covers.
        let watched = h2.then(|| self.bodies.clone());
        // An HTTP/1 response is polled in this connection's own task, which ticks; an HTTP/2
        // stream is woken by the tick through `ticks`.
        let ticked = h2.then(|| self.ticks.clone());
        let alt_svc = settings.alt_svc.as_ref().filter(|_| self.secure).cloned();
        let (peer, secure) = (self.peer, self.secure);
        async move {
            // Boxed: the handler's future is tens of KiB (every front end's state), and hyper
            // moves this one into each HTTP/2 stream's task and again when it spawns it; behind a
            // pointer those moves copy a few words instead.
            let mut resp = ticks::Ticked::new(
                ticked,
                boxed_in_place(|| handler.handle(req, peer, secure, guard)),
            )
            .await;
            // (Not on a protocol switch: its `Connection: upgrade` must stand.)
            if last && resp.status() != http::StatusCode::SWITCHING_PROTOCOLS {
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            if let Some(value) = alt_svc {
                offer_alt_svc(&mut resp, value);
            }
            if h2 {
                date_h2(&mut resp);
            }
            match watched {
                Some(list) => resp.map(|b| list.guard(b)),
                None => resp.map(stall::Outgoing::Plain),
            }
        }
    }
}

/// The clocks' view of one connection: its send watch, in-flight record, HTTP/2 bodies to watch
/// for stalls, and the ticks that wake stream tasks.
struct Watch {
    send: SendWatch,
    activity: Arc<Activity>,
    bodies: Arc<stall::Watchlist>,
    ticks: Arc<ticks::Ticks>,
}

impl Watch {
    fn new(send: SendWatch) -> Watch {
        Watch {
            activity: send.activity.clone(),
            send,
            bodies: stall::Watchlist::new(),
            ticks: ticks::Ticks::new(),
        }
    }
}

/// The future `make` returns, in a box of its own, built where it stays: `Box::pin(make())`
/// builds it on the stack first and then copies it (tens of KiB for the handler's future) into
/// the box. The box is allocated first and handed to a function that is not inlined, as the
/// place its result goes: the compiler then writes `make`'s result straight into the box.
/// (Returning the future from that function instead left the copy to an optimisation that fat
/// LTO did not make: the release build copied the 28 KiB handler future once per HTTP/2 stream.)
pub(crate) fn boxed_in_place<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    #[inline(never)]
    fn build<F>(make: impl FnOnce() -> F, slot: &mut std::mem::MaybeUninit<F>) {
        slot.write(make());
    }
    let mut slot = Box::<F>::new_uninit();
    build(make, &mut slot);
    // SAFETY: `build` initialised the box just above.
    Box::into_pin(unsafe { slot.assume_init() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every open connection is one task holding a `task::Connection` for as long as it lives,
    /// idle keep-alive connections included: hyper's connection, TLS and everything a request
    /// needs are boxed, so what an idle connection keeps is the fast path's wait for its next
    /// request (the socket, two instants and its place on the runtime's clock). It was 3,000
    /// bytes with TLS and hyper's state laid out inline, then 1,368 with the fast path's read
    /// loop and a per-connection timer inline.
    /// A handler that is never called: the connection task's size does not depend on it.
    struct Unused;

    impl Handler for Unused {
        async fn handle(
            &self,
            _: http::Request<crate::body::Incoming>,
            _: SocketAddr,
            _: bool,
            _: activity::ActivityGuard,
        ) -> http::Response<crate::body::Body> {
            unreachable!()
        }
        fn connection_accepted(&self) {}
        fn http_metrics(&self) -> &crate::metrics::HttpMetrics {
            unreachable!()
        }
        fn accept_metrics(&self) -> &listener::AcceptMetrics {
            unreachable!()
        }
        fn splices_streams(&self) -> bool {
            false
        }
        #[cfg(feature = "reverse")]
        type FastRoute = ();
        #[cfg(feature = "reverse")]
        fn has_fast_routes(&self) -> bool {
            true
        }
        #[cfg(feature = "reverse")]
        fn fast_route(&self, _: ListenerId, _: &str, _: &str) -> Option<()> {
            None
        }
        #[cfg(feature = "reverse")]
        async fn serve_fast<W: handler::FastClient + Send + Sync>(
            &self,
            _: (),
            _: handler::FastRequest<'_>,
            _: &str,
            _: &str,
            _: SocketAddr,
            _: &mut W,
            _: activity::ActivityGuard,
        ) -> handler::Served {
            unreachable!()
        }
    }

    /// tokio lays a task out in a 128-byte-aligned cell: its header and trailer (96 bytes), the
    /// future (here with the task tracker's token, 8 bytes) and its stage. At 152 bytes or less
    /// the connection fits a 256-byte cell; it was 208 (a 384-byte cell).
    #[test]
    fn an_idle_connection_task_stays_small() {
        let size = std::mem::size_of::<crate::runtime::recent::Fresh<task::Connection<Unused>>>();
        assert!(size <= 152, "a connection's task grew to {size} bytes");
    }
}
