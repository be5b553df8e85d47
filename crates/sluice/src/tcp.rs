//! The TCP (L4) front end: `[[tcp]]` listeners that relay connections to upstream groups with
//! splice, PROXY protocol both ways, SNI routing and optional TLS termination; listeners are
//! applied live (unchanged ones keep their sockets, removed ones drain) and shut down gracefully.
//!
//! # Layout
//! - `config`: the `[[tcp]]` section and its validation.
//! - `listener`: bind and the accept loop with its connection limit.
//! - `session`: one connection from accept to close.
//! - `metrics`: the `tcp_*` families.

pub mod config;
mod listener;
pub mod metrics;
mod session;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::{watch, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::task::TaskTracker;

pub use config::TcpConfig;
pub use metrics::TcpMetrics;

use crate::net::per_ip::PerIp;
use crate::net::splice::{self, PipePool};
use crate::upstream::group::Groups;

/// What every connection of one listener reads; swapped whole on reload.
struct Settings {
    name: String,
    config: TcpConfig,
    groups: Arc<Groups>,
    tls: Option<TlsAcceptor>,
    limit: Arc<Semaphore>,
    /// Connections held per client IP (`max_connections_per_ip`).
    per_ip: Arc<PerIp>,
}

/// What all listeners share.
struct Shared {
    metrics: TcpMetrics,
    /// The process's pipe pool ([`splice::shared_pool`]).
    pool: &'static PipePool,
    /// Turns true when the grace period is over: connections still open are closed.
    force: watch::Receiver<bool>,
}

/// One bound listener.
struct Running {
    local: SocketAddr,
    settings: watch::Sender<Arc<Settings>>,
    stop: watch::Sender<bool>,
}

impl Drop for Running {
    fn drop(&mut self) {
        // The accept loop ends and drops the listening socket; its connections drain on their own.
        let _ = self.stop.send(true);
    }
}

/// Every `[[tcp]]` listener; one per process, reconfigured by [`TcpProxy::apply`].
pub struct TcpProxy {
    shared: Arc<Shared>,
    running: Mutex<HashMap<String, Running>>,
    tracker: TaskTracker,
    force: watch::Sender<bool>,
}

impl TcpProxy {
    pub fn new(metrics: TcpMetrics) -> TcpProxy {
        let (force, force_rx) = watch::channel(false);
        TcpProxy {
            shared: Arc::new(Shared {
                metrics,
                pool: splice::shared_pool(),
                force: force_rx,
            }),
            running: Mutex::new(HashMap::new()),
            tracker: TaskTracker::new(),
            force,
        }
    }

    /// Makes the running listeners match `configs` (validated) over `groups`, without cutting any
    /// established connection: a listener whose name and address stay keeps its socket and takes
    /// the new settings for new connections; a removed one stops accepting and its connections
    /// drain; a new one binds. All or nothing: if anything fails to load or bind, nothing changes.
    /// Must be called inside a tokio runtime.
    pub fn apply(&self, configs: &[TcpConfig], groups: Arc<Groups>) -> anyhow::Result<()> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let mut prepared = Vec::with_capacity(configs.len());
        let mut identities = Vec::new();
        for config in configs {
            let name = config.name();
            let tls = match (&config.tls_cert, &config.tls_key) {
                (Some(cert), Some(key)) => {
                    let identity = format!("{name}\0{}\0{}", cert.display(), key.display());
                    let mut server = (*crate::server::tls::server_config(cert, key)
                        .with_context(|| format!("[[tcp]] {name:?}"))?)
                    .clone();
                    // A TCP listener relays whatever protocol comes; it must not claim one by ALPN.
                    server.alpn_protocols.clear();
                    // Its own sessions: one from another listener (another certificate) must not
                    // resume here.
                    crate::server::tls::resume::enable_apart(&mut server, &identity);
                    identities.push(identity);
                    Some(TlsAcceptor::from(Arc::new(server)))
                }
                _ => None,
            };
            let old = running.get(&name).filter(|r| {
                r.local == config.listen
                    || (config.listen.port() == 0 && r.local.ip() == config.listen.ip())
            });
            let limit = match old {
                Some(r) if r.settings.borrow().config.max_connections == config.max_connections => {
                    Arc::clone(&r.settings.borrow().limit)
                }
                _ => Arc::new(Semaphore::new(config.max_connections)),
            };
            // The per-IP counts carry over a reload that keeps the share, so connections already
            // open still count against their addresses.
            let per_ip = match old {
                Some(r)
                    if r.settings.borrow().config.max_connections_per_ip
                        == config.max_connections_per_ip
                        && r.settings.borrow().config.per_ip_exempt == config.per_ip_exempt =>
                {
                    Arc::clone(&r.settings.borrow().per_ip)
                }
                _ => PerIp::new(config.max_connections_per_ip, config.per_ip_exempt.clone()),
            };
            let settings = Arc::new(Settings {
                name: name.clone(),
                config: config.clone(),
                groups: Arc::clone(&groups),
                tls,
                limit,
                per_ip,
            });
            let socket = match old {
                Some(_) => None,
                None => Some(listener::bind(config.listen).with_context(|| {
                    format!("[[tcp]] {name:?}: cannot listen on {}", config.listen)
                })?),
            };
            prepared.push((name, settings, socket));
        }
        // Everything loaded and bound: switch.
        crate::server::tls::resume::keep_apart(&identities);
        let keep: Vec<&String> = prepared.iter().map(|(n, _, _)| n).collect();
        running.retain(|name, _| keep.contains(&name));
        for (name, settings, socket) in prepared {
            match socket {
                None => {
                    if let Some(r) = running.get(&name) {
                        let _ = r.settings.send(settings);
                    }
                }
                Some(socket) => {
                    let local = socket.local_addr()?;
                    let (settings_tx, settings_rx) = watch::channel(settings);
                    let (stop_tx, stop_rx) = watch::channel(false);
                    tokio::spawn(listener::run(
                        socket,
                        settings_rx,
                        Arc::clone(&self.shared),
                        self.tracker.clone(),
                        stop_rx,
                    ));
                    tracing::info!(listener = %name, addr = %local, "tcp listening");
                    running.insert(
                        name,
                        Running {
                            local,
                            settings: settings_tx,
                            stop: stop_tx,
                        },
                    );
                }
            }
        }
        Ok(())
    }

    /// Each listener's name and bound address.
    pub fn local_addrs(&self) -> Vec<(String, SocketAddr)> {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = running.iter().map(|(n, r)| (n.clone(), r.local)).collect();
        out.sort();
        out
    }

    /// The bound address of the listener called `name`.
    pub fn local_addr(&self, name: &str) -> Option<SocketAddr> {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        running.get(name).map(|r| r.local)
    }

    /// Connections being relayed or set up, over all listeners.
    pub fn connections(&self) -> usize {
        self.tracker.len()
    }

    /// Stops accepting everywhere, lets connections finish within `grace`, then closes the rest.
    pub async fn shutdown(&self, grace: Duration) {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = self.tracker.len(),
                "tcp: grace period of {} s over; closing remaining connections",
                grace.as_secs()
            );
            let _ = self.force.send(true);
            self.tracker.wait().await;
        }
    }
}

/// The live-reload part for `[[tcp]]`. The upstream groups are prepared and installed by the
/// routes part (the composition root's `App::prepare_reload`), whose commit runs before this one; the
/// commit here re-applies the listeners over that generation without cutting connections.
pub fn reload_part(
    tcp: Arc<TcpProxy>,
    groups: Arc<crate::upstream::group::live::Live>,
) -> crate::section::Prepare<[TcpConfig]> {
    Box::new(move |listeners: &[TcpConfig]| {
        let listeners = listeners.to_vec();
        let (tcp, groups) = (Arc::clone(&tcp), Arc::clone(&groups));
        Ok(Box::new(move || {
            if let Err(e) = tcp.apply(&listeners, groups.current()) {
                tracing::warn!(error = %format!("{e:#}"), "[[tcp]] reload kept the old listeners");
            }
        }) as crate::section::Commit)
    })
}
