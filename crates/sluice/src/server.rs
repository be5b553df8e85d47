//! The downstream server: listeners, TLS, HTTP/1.1 and HTTP/2 (h2c by prior knowledge, ALPN with TLS),
//! keep-alive idle timeout, header limits, and graceful shutdown.

pub mod activity;
pub mod listener;
pub mod reload;
pub mod routes;
pub mod tls;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_util::task::TaskTracker;

use crate::app::App;
use crate::config::ServerConfig;
use activity::Activity;

/// A bound server, ready to run.
pub struct Server {
    listeners: Vec<TcpListener>,
    tls: TlsHandle,
    config: ServerConfig,
    app: Arc<App>,
}

/// The live TLS settings; a reload swaps the certificates here, each new handshake uses the current
/// ones. `None` when the listeners speak plain HTTP.
pub type TlsHandle = Arc<arc_swap::ArcSwapOption<rustls::ServerConfig>>;

/// The TLS settings a server config asks for (`None`: plain HTTP).
pub fn tls_settings(config: &ServerConfig) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
    let default = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
        _ => None,
    };
    if default.is_none() && config.certificates.is_empty() {
        return Ok(None);
    }
    tls::sni_server_config(default, &config.certificates).map(Some)
}

impl Server {
    /// Binds every configured listener (nothing is served until [`Server::run`]).
    pub fn bind(config: &ServerConfig, app: Arc<App>) -> anyhow::Result<Server> {
        let listeners = config
            .listen
            .iter()
            .map(|addr| {
                listener::bind(*addr).map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Self::from_listeners(listeners, config, app)
    }

    /// Uses listeners bound by the caller (tests bind `127.0.0.1:0`).
    pub fn from_listeners(
        listeners: Vec<TcpListener>,
        config: &ServerConfig,
        app: Arc<App>,
    ) -> anyhow::Result<Server> {
        let tls = Arc::new(arc_swap::ArcSwapOption::new(tls_settings(config)?));
        Ok(Server {
            listeners,
            tls,
            config: config.clone(),
            app,
        })
    }

    /// Where a reload puts new certificates.
    pub fn tls_handle(&self) -> TlsHandle {
        self.tls.clone()
    }

    /// The addresses actually bound.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets in-flight responses finish within
    /// the grace period, and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let builder = Arc::new(http_builder(&self.config));
        let (stop_tx, stop_rx) = watch::channel(false);
        let tracker = TaskTracker::new();
        let idle = Duration::from_secs(self.config.idle_timeout_secs);
        let mut acceptors = Vec::new();
        for listener in self.listeners {
            let conn = Conn {
                builder: builder.clone(),
                app: self.app.clone(),
                tls: self.tls.clone(),
                stop: stop_rx.clone(),
                idle,
            };
            let tracker = tracker.clone();
            acceptors.push(tokio::spawn(async move {
                loop {
                    let (stream, peer) = listener::accept(&listener).await;
                    conn.app.connection_accepted();
                    tracker.spawn(conn.clone().serve(stream, peer));
                }
            }));
        }
        shutdown.await;
        tracing::info!("shutting down: no new connections, finishing in-flight responses");
        for a in &acceptors {
            a.abort();
        }
        let _ = stop_tx.send(true);
        tracker.close();
        let grace = Duration::from_secs(self.config.shutdown_grace_secs);
        if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
            tracing::warn!(
                "grace period of {} s over; closing remaining connections",
                grace.as_secs()
            );
        }
    }
}

fn http_builder(config: &ServerConfig) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(config.header_read_timeout_secs))
        .max_buf_size(config.max_header_bytes.max(8192))
        .max_headers(config.max_headers)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(config.max_header_bytes as u32)
        .max_concurrent_streams(256)
        // RFC 8441 extended CONNECT, so WebSocket works over HTTP/2 too.
        .enable_connect_protocol()
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .adaptive_window(true);
    builder
}

/// What one connection task needs.
#[derive(Clone)]
struct Conn {
    builder: Arc<auto::Builder<TokioExecutor>>,
    app: Arc<App>,
    tls: TlsHandle,
    stop: watch::Receiver<bool>,
    idle: Duration,
}

impl Conn {
    async fn serve(self, stream: tokio::net::TcpStream, peer: SocketAddr) {
        match self.tls.load_full() {
            None => self.drive(stream, peer, false).await,
            Some(settings) => {
                let acceptor = TlsAcceptor::from(settings);
                let handshake = tokio::time::timeout(self.idle, acceptor.accept(stream)).await;
                match handshake {
                    Ok(Ok(tls)) => self.drive(tls, peer, true).await,
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            }
        }
    }

    async fn drive<I>(mut self, io: I, peer: SocketAddr, secure: bool)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let activity = Activity::new();
        let app = self.app.clone();
        let act = activity.clone();
        let service = service_fn(move |req| {
            let app = app.clone();
            let guard = act.begin();
            async move { Ok::<_, Infallible>(app.handle(req, peer, secure, guard).await) }
        });
        let conn = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), service);
        tokio::pin!(conn);
        let mut ticker = tokio::time::interval(Duration::from_secs(1).min(self.idle));
        let mut closing = *self.stop.borrow();
        if closing {
            conn.as_mut().graceful_shutdown();
        }
        loop {
            tokio::select! {
                res = conn.as_mut() => {
                    if let Err(e) = res {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    return;
                }
                changed = self.stop.changed(), if !closing => {
                    if changed.is_err() || *self.stop.borrow() {
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
                _ = ticker.tick(), if !closing => {
                    if activity.idle_for().is_some_and(|d| d >= self.idle) {
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        }
    }
}
