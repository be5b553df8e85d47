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
//! - `net`: socket services: multicast join on a named interface, batched receive.
//!
//! `media` and `iptv` (with `net`) are Cargo features, both on by default; `app` and `config`
//! are the only other places that know which are built.

pub mod app;
pub mod auth;
pub mod body;
pub mod config;
pub mod error;
#[cfg(feature = "iptv")]
pub mod iptv;
pub mod logging;
#[cfg(feature = "media")]
pub mod media;
pub mod metrics;
#[cfg(feature = "iptv")]
pub mod net;
pub mod server;
pub mod upstream;

use std::sync::Arc;

/// Builds the app from `config`, binds, and serves until `shutdown` resolves.
pub async fn serve(
    config: config::Config,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    if let Err(e) = server::listener::raise_nofile_limit() {
        tracing::warn!(error = %e, "cannot read the open-file limit");
    }
    let app: Arc<app::App> = app::App::new(&config)?;
    let server = server::Server::bind(&config.server, app)?;
    for addr in server.local_addrs() {
        tracing::info!(%addr, "listening");
    }
    server.run(shutdown).await;
    Ok(())
}
