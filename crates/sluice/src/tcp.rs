//! The TCP (L4) front end: `[[tcp]]` listeners that relay connections to upstream groups with
//! splice, PROXY protocol both ways, SNI routing and optional TLS termination; listeners are
//! applied live (unchanged ones keep their sockets, removed ones drain) and shut down gracefully.
//! A listener renamed, or moved to the address another one held, takes over the running socket
//! on that address: binding it afresh would fail while the old socket holds the port.
//! A change is prepared first (certificates loaded, new sockets bound), which can fail and then
//! changes nothing, and committed after, which cannot fail.
//!
//! # Layout
//! - `config`: the `[[tcp]]` section and its validation.
//! - `listener`: bind and the accept loop with its connection limit.
//! - `share`: the per-address share of a listener's connections.
//! - `session`: one connection from accept to close.
//! - `metrics`: the `tcp_*` families.

pub mod config;
mod listener;
pub mod metrics;
mod session;
mod share;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_util::task::TaskTracker;

pub use config::TcpConfig;
pub use metrics::TcpMetrics;

use crate::net::splice::{self, PipePool};
use crate::upstream::group::Groups;

/// What every connection of one listener reads; swapped whole on reload.
struct Settings {
    name: String,
    config: TcpConfig,
    groups: Arc<Groups>,
    tls: Option<TlsAcceptor>,
    /// Connections held per client address (`max_connections_per_ip`, `per_ip_exempt`): one per
    /// listener, handed from each settings to the next on reload and changed in place, so the
    /// connections open count under the new share.
    per_ip: Arc<share::Share>,
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
    /// `max_connections`, kept across reloads (changed in place) so open connections count.
    limit: Arc<listener::Limit>,
    stop: watch::Sender<bool>,
}

/// A change of the listeners, loaded and bound by [`TcpProxy::prepare`] (which can fail) and
/// installed by [`TcpProxy::commit`] (which cannot).
pub struct Prepared {
    listeners: Vec<Next>,
    /// The TLS identities whose resumption sessions the new listeners keep.
    identities: Vec<String>,
}

/// One listener of a [`Prepared`] change.
struct Next {
    name: String,
    config: TcpConfig,
    tls: Option<TlsAcceptor>,
    socket: Socket,
}

/// Where a [`Next`] listener's socket comes from.
enum Socket {
    /// The running listener of this name takes the new settings and keeps accepting on its
    /// socket: the same listener, or another whose address this one now names (a rename, or
    /// two listeners swapping addresses).
    Running(String),
    /// A socket bound by [`TcpProxy::prepare`], and its bound address.
    Bound(TcpListener, SocketAddr),
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
    /// Set by [`TcpProxy::shutdown`] (under the `running` lock): from then on a change binds and
    /// starts nothing, so a reload that was under way when the process began to drain cannot
    /// start accept loops in a process on its way out.
    closed: AtomicBool,
    /// The TLS session identities of the listeners committed last (under the `running` lock):
    /// a commit lets go of those it no longer has, and only those (another proxy's are its own).
    identities: Mutex<Vec<String>>,
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
            closed: AtomicBool::new(false),
            identities: Mutex::new(Vec::new()),
            tracker: TaskTracker::new(),
            force,
        }
    }

    /// Makes the running listeners match `configs` (validated) over `groups`, without cutting any
    /// established connection: [`TcpProxy::prepare`], then [`TcpProxy::commit`]. All or nothing:
    /// if anything fails to load or bind, nothing changes. Must be called inside a tokio runtime.
    pub fn apply(&self, configs: &[TcpConfig], groups: Arc<Groups>) -> anyhow::Result<()> {
        let prepared = self.prepare(configs)?;
        self.commit(prepared, groups);
        Ok(())
    }

    /// Does everything of a change to `configs` that can fail, touching no running listener: loads
    /// each listener's certificate and binds each new listener (one whose name is new, or whose
    /// address changed). A listener whose name and address stay is marked to keep its socket, and
    /// one that names the exact address another running listener is bound to takes that socket
    /// over (a rename or a swap): the port is taken while it is open. Dropping the result lets go
    /// of the new sockets. Must be called inside a tokio runtime.
    pub fn prepare(&self, configs: &[TcpConfig]) -> anyhow::Result<Prepared> {
        if self.closed.load(Ordering::SeqCst) {
            anyhow::bail!("[[tcp]]: shutting down, so no listener is bound");
        }
        warn_over_descriptor_budget(configs);
        // The certificates are read before the running listeners' lock is taken: a certificate
        // on a hung mount must not hold `shutdown`, which takes that lock on a runtime thread.
        let mut identities = Vec::new();
        let mut acceptors = Vec::with_capacity(configs.len());
        for config in configs {
            let name = config.name();
            acceptors.push(match (&config.tls_cert, &config.tls_key) {
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
                    // Counted as this proxy's at once: a reload that never commits leaves it to
                    // the next commit to let go of (`forget_apart`).
                    let mut mine = self.identities.lock().unwrap_or_else(|e| e.into_inner());
                    if !mine.contains(&identity) {
                        mine.push(identity.clone());
                    }
                    drop(mine);
                    identities.push(identity);
                    Some(TlsAcceptor::from(Arc::new(server)))
                }
                _ => None,
            });
        }
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if self.closed.load(Ordering::SeqCst) {
            anyhow::bail!("[[tcp]]: shutting down, so no listener is bound");
        }
        let mut listeners = Vec::with_capacity(configs.len());
        let keeps = |name: &str, listen: SocketAddr| {
            running.get(name).is_some_and(|r| {
                r.local == listen || (listen.port() == 0 && r.local.ip() == listen.ip())
            })
        };
        // Running sockets spoken for: first those kept under their own name, so none of them is
        // taken over by another listener; then each one taken over.
        let mut claimed: HashSet<String> = configs
            .iter()
            .map(|c| c.name())
            .filter(|name| {
                configs
                    .iter()
                    .any(|c| &c.name() == name && keeps(name, c.listen))
            })
            .collect();
        for (config, tls) in configs.iter().zip(acceptors) {
            let name = config.name();
            // A fixed address another running listener is bound to: its socket, renamed.
            let taken_over = running
                .iter()
                .find(|(from, r)| {
                    config.listen.port() != 0
                        && r.local == config.listen
                        && !claimed.contains(from.as_str())
                })
                .map(|(from, _)| from.clone());
            let socket = if keeps(&name, config.listen) {
                Socket::Running(name.clone())
            } else if let Some(from) = taken_over {
                claimed.insert(from.clone());
                Socket::Running(from)
            } else {
                let cannot = || format!("[[tcp]] {name:?}: cannot listen on {}", config.listen);
                let socket = listener::bind(config.listen).with_context(cannot)?;
                let local = socket.local_addr().with_context(cannot)?;
                Socket::Bound(socket, local)
            };
            listeners.push(Next {
                name,
                config: config.clone(),
                tls,
                socket,
            });
        }
        Ok(Prepared {
            listeners,
            identities,
        })
    }

    /// Installs `prepared` over `groups`: kept listeners take the new settings for new
    /// connections (their connection limit and per-address share changed in place), new ones
    /// start accepting, renamed ones accept on under their new name, removed ones stop accepting
    /// and their connections drain. Cannot fail.
    /// Running listeners must be those `prepared` was made against (live reloads run one at a
    /// time).
    /// After [`TcpProxy::shutdown`] began, it starts nothing: the sockets `prepared` bound close.
    pub fn commit(&self, prepared: Prepared, groups: Arc<Groups>) {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if self.closed.load(Ordering::SeqCst) {
            tracing::info!("tcp: shutting down; the listeners of a late reload are not started");
            return;
        }
        {
            let mut mine = self.identities.lock().unwrap_or_else(|e| e.into_inner());
            let gone: Vec<String> = mine
                .iter()
                .filter(|i| !prepared.identities.contains(i))
                .cloned()
                .collect();
            crate::server::tls::resume::forget_apart(&gone);
            mine.clone_from(&prepared.identities);
        }
        // Every running listener is taken out and put back under the name that keeps its socket;
        // those left over are dropped at the end, which stops them.
        let mut before = std::mem::take(&mut *running);
        for next in prepared.listeners {
            let Next {
                name,
                config,
                tls,
                socket,
            } = next;
            match socket {
                Socket::Running(from) => {
                    let Some(r) = before.remove(&from) else {
                        // Only if the listeners changed between prepare and commit.
                        tracing::warn!(listener = %name, "tcp: listener gone before its reload");
                        continue;
                    };
                    r.limit.set(config.connection_limit());
                    // The per-address share lives in the settings; the new ones take it over.
                    let per_ip = Arc::clone(&r.settings.borrow().per_ip);
                    per_ip.set(config.max_connections_per_ip, config.per_ip_exempt.clone());
                    let _ = r.settings.send(Arc::new(Settings {
                        name: name.clone(),
                        config,
                        groups: Arc::clone(&groups),
                        tls,
                        per_ip,
                    }));
                    if from != name {
                        tracing::info!(listener = %name, was = %from, addr = %r.local, "tcp listener renamed");
                    }
                    running.insert(name, r);
                }
                Socket::Bound(socket, local) => {
                    let limit = listener::Limit::new(config.connection_limit());
                    let per_ip = share::Share::new(
                        config.max_connections_per_ip,
                        config.per_ip_exempt.clone(),
                    );
                    let (settings_tx, settings_rx) = watch::channel(Arc::new(Settings {
                        name: name.clone(),
                        config,
                        groups: Arc::clone(&groups),
                        tls,
                        per_ip,
                    }));
                    let (stop_tx, stop_rx) = watch::channel(false);
                    tokio::spawn(listener::run(
                        socket,
                        settings_rx,
                        Arc::clone(&limit),
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
                            limit,
                            stop: stop_tx,
                        },
                    );
                }
            }
        }
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
    /// No change is applied after it begins ([`TcpProxy::commit`]).
    pub async fn shutdown(&self, grace: Duration) {
        {
            let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            self.closed.store(true, Ordering::SeqCst);
            running.clear();
        }
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

/// Logs one warning when the listeners at their connection limits could hold more descriptors
/// than the open-file limit allows: they would run out (the HTTP side's accept pausing with them)
/// before their `max_connections` stopped them.
fn warn_over_descriptor_budget(configs: &[TcpConfig]) {
    let nofile = crate::server::listener::nofile_limit();
    if let Some(need) = config::over_descriptor_budget(configs, nofile) {
        tracing::warn!(
            descriptors = need,
            limit = nofile,
            "[[tcp]] max_connections over all listeners (x{} descriptors each) exceed the \
             open-file limit (RLIMIT_NOFILE); lower max_connections or raise the limit",
            config::FDS_PER_CONNECTION
        );
    }
}

/// The live-reload part for `[[tcp]]`. Its prepare loads and binds (so a listener that cannot
/// bind or load refuses the whole reload, before any part is applied); its commit switches the
/// listeners over the upstream groups current then: those the routes part (the composition
/// root's `App::prepare_reload`) installs in its commit, which runs before this one.
pub fn reload_part(
    tcp: Arc<TcpProxy>,
    groups: Arc<crate::upstream::group::live::Live>,
) -> crate::section::Prepare<[TcpConfig]> {
    Box::new(move |listeners: &[TcpConfig]| {
        let prepared = tcp.prepare(listeners)?;
        let (tcp, groups) = (Arc::clone(&tcp), Arc::clone(&groups));
        Ok(Box::new(move || tcp.commit(prepared, groups.current())) as crate::section::Commit)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `[[upstreams]]` and `[[tcp]]` sections of a config file (the config module composes
    /// them; a module below it does not use it).
    #[derive(serde::Deserialize)]
    struct Sections {
        upstreams: Vec<crate::upstream::group::GroupConfig>,
        tcp: Vec<TcpConfig>,
    }

    fn listeners(origin: SocketAddr, listen: &[SocketAddr]) -> Sections {
        let mut text = format!("[[upstreams]]\nname = \"g\"\nservers = [\"{origin}\"]\n");
        for l in listen {
            text.push_str(&format!("\n[[tcp]]\nlisten = \"{l}\"\nupstream = \"g\"\n"));
        }
        let sections: Sections = toml::from_str(&text).unwrap();
        config::validate(&sections.tcp, &sections.upstreams).unwrap();
        sections
    }

    /// A reload prepared before shutdown and committed after it (SIGTERM while the reload ran)
    /// starts no listener: it bound `[[tcp]]` listeners afresh, with accept loops, in a process
    /// on its way out. A change prepared after shutdown binds nothing at all.
    #[tokio::test]
    async fn a_change_after_shutdown_starts_no_listener() {
        let origin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let origin = origin.local_addr().unwrap();
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
        };
        let (first, added) = (free(), free());
        let mut registry = prometheus_client::registry::Registry::default();
        let tcp = TcpProxy::new(TcpMetrics::register(&mut registry));
        let config = listeners(origin, &[first]);
        let groups = Arc::new(Groups::new(&config.upstreams).unwrap());
        tcp.apply(&config.tcp, Arc::clone(&groups)).unwrap();
        assert_eq!(tcp.local_addrs().len(), 1);

        let late = tcp
            .prepare(&listeners(origin, &[first, added]).tcp)
            .unwrap();
        tcp.shutdown(Duration::ZERO).await;
        tcp.commit(late, Arc::clone(&groups));
        assert!(
            tcp.local_addrs().is_empty(),
            "a commit after shutdown started {:?}",
            tcp.local_addrs()
        );
        let err = std::net::TcpStream::connect(added).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");

        let err = tcp
            .prepare(&listeners(origin, &[added]).tcp)
            .err()
            .expect("a change prepared after shutdown");
        assert!(format!("{err:#}").contains("shutting down"), "{err:#}");
        let err = std::net::TcpStream::connect(added).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    }
}
