//! sluice: one binary for five streaming proxy jobs.
//!
//! # Layout
//! - `config`: TOML config with env and flag overrides, validated before anything binds.
//! - `server`: listeners, TLS, HTTP/1.1 + HTTP/2, idle timeout, graceful shutdown.
//! - `app`: dispatch: metering, auth, and the front end that owns a path.
//! - `media`: the MediaFlow-compatible `/proxy/*` front end.
//! - `upstream`: the pooled upstream HTTP client every front end shares.
//! - `auth`: password check and trusted-proxy client IP.
//! - `metrics`: the server's metric families and the Prometheus text rendering.
//! - `error`: the proxy error that knows which side failed.
//! - `logging`: the log filter read from `RUST_LOG`.
//! - `body`: the response body type every front end returns.
//! - `iptv`: the IPTV gateway front end: multicast hubs to HTTP, playlist, status.
//! - `net`: socket services: multicast join on a named interface, batched receive, splice relay.
//! - `tcp`: the TCP (L4) front end: `[[tcp]]` listeners relayed to upstream groups.

pub mod app;
pub mod auth;
pub mod body;
pub mod config;
pub mod error;
pub mod iptv;
pub mod logging;
pub mod media;
pub mod metrics;
pub mod net;
pub mod server;
pub mod tcp;
pub mod upstream;

use std::sync::Arc;

/// Builds the app, the upstream groups and the TCP listeners from `config`, binds, and serves until
/// `shutdown` resolves; then HTTP and TCP drain side by side within `server.shutdown_grace_secs`.
pub async fn serve(
    config: config::Config,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut registry = prometheus_client::registry::Registry::with_prefix("sluice");
    let tcp_metrics = tcp::TcpMetrics::register(&mut registry);
    let group_metrics = upstream::group::metrics::GroupMetrics::register(&mut registry);
    let app: Arc<app::App> = app::App::with_registry(&config, registry)?;
    let groups = Arc::new(upstream::group::Groups::new(&config.upstreams)?);
    group_metrics.track(&groups);
    let _health = upstream::group::health::spawn(&groups);
    let tcp = tcp::TcpProxy::new(tcp_metrics);
    tcp.apply(&config.tcp, Arc::clone(&groups))?;
    let server = server::Server::bind(&config.server, app)?;
    for addr in server.local_addrs() {
        tracing::info!(%addr, "listening");
    }
    let grace = std::time::Duration::from_secs(config.server.shutdown_grace_secs);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    tokio::join!(
        async {
            shutdown.await;
            let _ = stop_tx.send(true);
        },
        server.run(stopped(stop_rx.clone())),
        async {
            stopped(stop_rx.clone()).await;
            tcp.shutdown(grace).await;
        },
    );
    Ok(())
}
