//! One cache across several sluice nodes: each key has one owner on a consistent-hash ring, a
//! miss on another node is fetched through the owner (one hop, marked so it is never forwarded
//! again), purges fan out to every node and are kept in a log for nodes that were away. No
//! shared store and no coordinator: the config (or DNS) is the membership.
//!
//! # Layout
//! - `config`: `[cache.cluster]`.
//! - `hop`: the signed hop marker.
//! - `ring`: members, their state, rampup, the owner of a key.
//! - `members`: the member list from the static list or DNS.
//! - `peer`: the keep-alive client (relayed misses, control requests).
//! - `relay`: a miss through its owner, continued elsewhere when the owner fails.
//! - `copy`: local copies on non-owners, filled from the owner.
//! - `control`: the control listener and the active checker (which pulls purge logs).
//! - `purge_log`: purges kept for peers that were away.
//! - `metrics`: `sluice_cache_cluster_*`.

pub mod config;
mod control;
mod copy;
pub mod hop;
mod members;
pub mod metrics;
pub mod peer;
pub mod purge_log;
pub mod relay;
pub mod ring;

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue};
use http::Method;

pub use config::ClusterConfig;
pub use peer::RelayRequest;
pub use ring::{Member, Owner};

use super::{CacheKey, Inner};
use hop::{HopKey, HOP_HEADER};
use metrics::ResultLabels;
use purge_log::{PurgeLog, PurgeOrder};
use ring::Ring;

/// A front end's own fill, run on the owner for a peer: the order (the front end's own encoding,
/// signed in transit) in, the answer out (streaming).
pub type FillHandler = Arc<
    dyn Fn(
            Bytes,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = http::Response<crate::body::Body>> + Send>,
        > + Send
        + Sync,
>;

/// This node's part in a cache cluster.
pub struct Cluster {
    /// Fills front ends run for peers, by name (`POST /cluster/fill/<name>`).
    fills: std::sync::RwLock<std::collections::HashMap<&'static str, FillHandler>>,
    config: ClusterConfig,
    key: HopKey,
    ring: Arc<Ring>,
    log: PurgeLog,
    peer: peer::PeerClient,
    metrics: metrics::ClusterMetrics,
    /// Where the control listener bound (known once bound).
    control: std::sync::OnceLock<SocketAddr>,
    /// The control listener between [`Cluster::bind`] and [`Cluster::start`]: dropped with the
    /// cluster (a refused reload's), its port closes at once.
    bound: std::sync::Mutex<Option<std::net::TcpListener>>,
    /// The tasks [`Cluster::start`] spawned, ended when the cluster is dropped (they hold it
    /// weakly, and a listener that only looked at an incoming connection kept its port open).
    tasks: std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().unwrap_or_else(|e| e.into_inner());
        for task in tasks.drain(..) {
            task.abort();
        }
    }
}

/// Marks `resp` as this node's refusal to run a peer's fill (not an answer from the origin), so
/// the asking node fills on its own instead of passing it on.
pub(crate) fn refused_fill(
    mut resp: http::Response<crate::body::Body>,
) -> http::Response<crate::body::Body> {
    resp.headers_mut()
        .insert(control::CONTROL_ERROR, http::HeaderValue::from_static("1"));
    resp
}

impl Cluster {
    /// The cluster as configured; nothing runs before [`Cluster::start`].
    pub fn new(
        config: &ClusterConfig,
        metrics: metrics::ClusterMetrics,
        origin_timeouts: (Duration, Duration),
    ) -> Result<Cluster, String> {
        // Read again (validated before, but a file can change in between): a secret that is no
        // longer there or too short stops the start. The same key checks the markers that come
        // in, so an empty one would let anyone sign them.
        let secret = config.usable_secret()?;
        let key = HopKey::new(&secret);
        let timeout = Duration::from_millis(config.peer_timeout_ms);
        Ok(Cluster {
            ring: Arc::new(Ring::new(
                &config.self_addr,
                Duration::from_secs(config.rampup_secs),
            )),
            log: PurgeLog::new(config.purge_log_entries),
            peer: peer::PeerClient::new(
                key.clone(),
                if config.self_addr.is_empty() {
                    "node"
                } else {
                    &config.self_addr
                },
                timeout,
                origin_timeouts.0,
                origin_timeouts.1,
            ),
            key,
            metrics,
            config: config.clone(),
            control: std::sync::OnceLock::new(),
            bound: Default::default(),
            tasks: Default::default(),
            fills: Default::default(),
        })
    }

    /// Binds the control listener, which serves nothing until [`Cluster::start`] (a connection
    /// waits in the backlog); [`Cluster::control_addr`] tells where.
    pub(super) fn bind(&self) -> std::io::Result<()> {
        let listener = control::bind(self.config.control_bind())?;
        let _ = self.control.set(listener.local_addr()?);
        *self.bound.lock().unwrap_or_else(|e| e.into_inner()) = Some(listener);
        Ok(())
    }

    /// Serves the control listener [`Cluster::bind`] bound and starts the checker and the DNS
    /// membership task; they end when the cluster is dropped.
    pub(super) fn start(self: &Arc<Self>, cache: Weak<Inner>) -> std::io::Result<()> {
        let bound = self.bound.lock().unwrap_or_else(|e| e.into_inner()).take();
        // `Cache::prepare` binds before any start, and `Cache::start` runs once: an error, not
        // a second bind, should that ever change.
        let Some(listener) = bound else {
            return Err(std::io::Error::other(
                "not bound (the cluster was not prepared, or started twice)",
            ));
        };
        let at = listener.local_addr()?;
        let mut tasks = vec![control::serve(
            listener,
            Arc::downgrade(self),
            cache.clone(),
            control::ControlLimits::default(),
        )?];
        match &self.config.dns {
            #[cfg(feature = "dns")]
            Some(_) => tasks.push(members::spawn_dns(
                &self.config,
                Arc::downgrade(&self.ring),
                self.metrics.dns_resolutions.clone(),
            )),
            #[cfg(not(feature = "dns"))]
            Some(_) => {}
            None => {
                self.ring.set_members(members::static_members(&self.config));
            }
        }
        tasks.push(control::spawn_checker(
            Arc::downgrade(self),
            cache,
            Duration::from_millis(self.config.health_interval_ms),
        ));
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(tasks);
        tracing::info!(node = %self.self_addr(), control = %at, "cache cluster started");
        Ok(())
    }

    /// This node's address on the ring (configured, or found among the members).
    pub fn self_addr(&self) -> String {
        self.ring.self_addr()
    }

    /// Where the control listener bound.
    pub fn control_addr(&self) -> Option<SocketAddr> {
        self.control.get().copied()
    }

    /// The live ring.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    pub fn metrics(&self) -> &metrics::ClusterMetrics {
        &self.metrics
    }

    /// The owner of `key`'s misses now.
    pub fn owner(&self, key: &CacheKey) -> Owner {
        self.ring.owner(&key.0, None)
    }

    /// Takes the hop marker off a request: `None` when there is none or it is not valid (a
    /// client's own, removed and worth nothing); `Some(vouched)` for a peer's request, `vouched`
    /// when the marker also vouches for its forwarding fields (`hop::vouched_target`). A marker
    /// over the request line alone (a node from before fields were covered) or over the
    /// forwarding fields without the other proxies' (`hop::forwarding_target`: a node from
    /// before those were, with a load balancer's `X-Forwarded-Port` present) marks a peer's
    /// request but vouches for nothing: its fields are treated as a client's and the proxies'
    /// stripped, so a replay with one added gains nothing. Neither does a request whose
    /// `Connection` names a covered field (stripped after this check).
    pub fn take_hop(
        &self,
        headers: &mut HeaderMap,
        method: &str,
        authority: &str,
        target: &str,
    ) -> Option<bool> {
        let v = headers.remove(HOP_HEADER)?;
        let vouched = hop::vouched_target(target, headers);
        let found = if self.key.verify(&v, method, authority, &vouched).is_some() {
            Some(!hop::connection_names_covered(headers))
        } else if self.key.verify(&v, method, authority, target).is_some()
            || self
                .key
                .verify(
                    &v,
                    method,
                    authority,
                    &hop::forwarding_target(target, headers),
                )
                .is_some()
        {
            Some(false)
        } else {
            None
        };
        match found {
            Some(_) => {
                self.metrics.hops.inc();
            }
            None => tracing::debug!("a request carried an invalid hop marker; ignored"),
        }
        found
    }

    /// Names this node in the response's `Cache-Status` entry (`node="ip:port"`), so a client
    /// sees which node's cache answered.
    pub fn name_node(&self, headers: &mut HeaderMap) {
        let Some(v) = headers.get("cache-status").and_then(|v| v.to_str().ok()) else {
            return;
        };
        if let Ok(named) = HeaderValue::from_str(&format!("{v}; node=\"{}\"", self.self_addr())) {
            headers.insert("cache-status", named);
        }
    }

    /// Lets peers run `handler` here (a front end whose requests are not routes: the media
    /// front end's fetches); the latest registration of a name wins (a reload).
    pub fn register_fill(&self, name: &'static str, handler: FillHandler) {
        self.fills
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, handler);
    }

    /// Runs fill `name` with `order` on the owner of `key` (then the next node); `None` when
    /// this node owns the key or no owner answered (fill it here).
    pub async fn fill_via_owner(
        &self,
        name: &str,
        key: &CacheKey,
        order: Bytes,
    ) -> Option<http::Response<crate::body::Body>> {
        let mut skip: Option<String> = None;
        for _ in 0..2 {
            let Owner::Peer(owner) = self.ring.owner(&key.0, skip.as_deref()) else {
                return None;
            };
            let target = format!("/cluster/fill/{name}");
            match self
                .peer
                .control_stream(&owner, &target, order.clone())
                .await
            {
                Ok(resp) if !resp.headers().contains_key(control::CONTROL_ERROR) => {
                    owner.state.report_success();
                    self.metrics.peer_fills.inc();
                    return Some(self.peer.relayed(resp, &owner.addr, Duration::ZERO));
                }
                Ok(resp) => {
                    // A peer without that fill (another version) or another secret.
                    tracing::debug!(owner = %owner.addr, status = %resp.status(), "peer fill refused");
                    skip = Some(owner.addr.clone());
                }
                Err(e) => {
                    tracing::debug!(error = %e, "owner unreachable for a fill");
                    self.owner_failed(&owner.state);
                    skip = Some(owner.addr.clone());
                }
            }
        }
        None
    }

    /// Logs a purge this node took from a client and sends it to every other member; the
    /// outcome per member (`Ok(objects purged)` or why it failed). A member that misses it pulls
    /// it from the log when it is back.
    pub async fn fan_out(&self, order: &PurgeOrder) -> Vec<(String, Result<u64, String>)> {
        self.log.append(order.clone());
        let view = self.ring.view();
        let body = Bytes::from(serde_json::to_vec(order).unwrap_or_default());
        let sends = view
            .members
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != view.self_index)
            .map(|(_, m)| {
                let body = body.clone();
                async move {
                    let got = self
                        .peer
                        .control(m, Method::POST, "/cluster/purge", body)
                        .await;
                    let result = match got {
                        Ok((http::StatusCode::OK, b)) => {
                            serde_json::from_slice::<serde_json::Value>(&b)
                                .ok()
                                .and_then(|v| v.get("purged").and_then(|n| n.as_u64()))
                                .ok_or_else(|| "bad answer".to_string())
                        }
                        Ok((status, _)) => Err(format!("status {}", status.as_u16())),
                        Err(e) => Err(e.to_string()),
                    };
                    let label = if result.is_ok() { "ok" } else { "error" };
                    self.metrics
                        .purges_sent
                        .get_or_create(&ResultLabels { result: label })
                        .inc();
                    (m.addr.clone(), result)
                }
            });
        futures_util::future::join_all(sends).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_gone_or_short_since_validation_stops_the_start() {
        // The same key checks the markers peers send: an empty one would let anyone sign them.
        let metrics = crate::cache::metrics::CacheMetrics::new(&mut Default::default()).cluster;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        let mut config = ClusterConfig {
            secret_file: Some(file.clone()),
            ..ClusterConfig::default()
        };
        for content in [None, Some("   \n"), Some("short")] {
            if let Some(c) = content {
                std::fs::write(&file, c).unwrap();
            }
            let made = Cluster::new(
                &config,
                metrics.clone(),
                (Duration::from_secs(1), Duration::from_secs(1)),
            );
            assert!(made.is_err(), "{content:?}");
        }
        std::fs::write(&file, "0123456789abcdef\n").unwrap();
        assert!(Cluster::new(
            &config,
            metrics.clone(),
            (Duration::from_secs(1), Duration::from_secs(1))
        )
        .is_ok());
        config.secret_file = None;
        config.secret = "0123456789abcde".into();
        assert!(Cluster::new(
            &config,
            metrics,
            (Duration::from_secs(1), Duration::from_secs(1))
        )
        .is_err());
    }

    #[test]
    fn a_marker_vouches_for_the_forwarding_fields_it_was_made_with() {
        let metrics = crate::cache::metrics::CacheMetrics::new(&mut Default::default()).cluster;
        let config = ClusterConfig {
            secret: "0123456789abcdef".into(),
            ..ClusterConfig::default()
        };
        let c = Cluster::new(
            &config,
            metrics,
            (Duration::from_secs(1), Duration::from_secs(1)),
        )
        .unwrap();
        let mut fields = HeaderMap::new();
        fields.insert("x-forwarded-for", HeaderValue::from_static("192.0.2.7"));
        let key = HopKey::new("0123456789abcdef");
        let marked = |marker: HeaderValue, fields: &HeaderMap| {
            let mut h = fields.clone();
            h.insert(HOP_HEADER, marker);
            h
        };
        // This version's relay: a peer, its fields vouched for.
        let vouched = hop::vouched_target("/a", &fields);
        let mut h = marked(key.sign("n1", "GET", "shop.test", &vouched), &fields);
        assert_eq!(c.take_hop(&mut h, "GET", "shop.test", "/a"), Some(true));
        assert!(!h.contains_key(HOP_HEADER));
        // A relay from a node before it: a peer, its fields (the client's own) not vouched for.
        let mut h = marked(key.sign("n1", "GET", "shop.test", "/a"), &fields);
        assert_eq!(c.take_hop(&mut h, "GET", "shop.test", "/a"), Some(false));
        // A field changed after the marker was made (on the path, or a replay): no peer at all.
        let mut changed = fields.clone();
        changed.insert("x-forwarded-for", HeaderValue::from_static("6.6.6.6"));
        let mut h = marked(key.sign("n1", "GET", "shop.test", &vouched), &changed);
        assert_eq!(c.take_hop(&mut h, "GET", "shop.test", "/a"), None);
        // A client's made-up marker.
        let mut h = marked(HeaderValue::from_static("n1 1 00"), &fields);
        assert_eq!(c.take_hop(&mut h, "GET", "shop.test", "/a"), None);
    }

    fn marker_test_cluster() -> Cluster {
        let metrics = crate::cache::metrics::CacheMetrics::new(&mut Default::default()).cluster;
        let config = ClusterConfig {
            secret: "0123456789abcdef".into(),
            ..ClusterConfig::default()
        };
        Cluster::new(
            &config,
            metrics,
            (Duration::from_secs(1), Duration::from_secs(1)),
        )
        .unwrap()
    }

    /// During an upgrade, a node from before the other proxies' fields were covered signs the
    /// forwarding fields alone; with a load balancer's `X-Forwarded-Port` present its relay is
    /// still a peer's request (served here, not relayed again), but vouches for no field.
    #[test]
    fn an_older_nodes_marker_with_a_proxy_field_marks_a_peer_but_vouches_for_nothing() {
        let c = marker_test_cluster();
        let key = HopKey::new("0123456789abcdef");
        let mut fields = HeaderMap::new();
        fields.insert("x-forwarded-for", HeaderValue::from_static("192.0.2.7"));
        // Without a proxy field, the older form is this version's.
        assert_eq!(
            hop::forwarding_target("/a", &fields),
            hop::vouched_target("/a", &fields)
        );
        let older = hop::forwarding_target("/a", &fields);
        fields.insert("x-forwarded-port", HeaderValue::from_static("443"));
        fields.insert("x-forwarded-scheme", HeaderValue::from_static("https"));
        assert_ne!(
            hop::forwarding_target("/a", &fields),
            hop::vouched_target("/a", &fields)
        );
        let mut h = fields.clone();
        h.insert(
            HOP_HEADER,
            key.sign(
                "n1",
                "GET",
                "shop.test",
                &hop::forwarding_target("/a", &fields),
            ),
        );
        assert_eq!(c.take_hop(&mut h, "GET", "shop.test", "/a"), Some(false));
        assert!(!h.contains_key(HOP_HEADER));
        // A replay of a marker made without proxy fields, one added: a peer's, nothing vouched.
        let mut h = fields.clone();
        h.insert(HOP_HEADER, key.sign("n1", "GET", "shop.test", &older));
        assert_eq!(c.take_hop(&mut h, "GET", "shop.test", "/a"), Some(false));
        // A forwarding field changed still leaves no peer at all.
        let mut h = fields.clone();
        h.insert(
            HOP_HEADER,
            key.sign(
                "n1",
                "GET",
                "shop.test",
                &hop::forwarding_target("/a", &fields),
            ),
        );
        h.insert("x-forwarded-for", HeaderValue::from_static("6.6.6.6"));
        assert_eq!(c.take_hop(&mut h, "GET", "shop.test", "/a"), None);
    }

    /// A `Connection` field naming a covered field (which the hop-by-hop stripping after the
    /// check removes) leaves the marker vouching for nothing; one naming others does not.
    #[test]
    fn a_marker_vouches_for_nothing_when_connection_names_a_covered_field() {
        let c = marker_test_cluster();
        let key = HopKey::new("0123456789abcdef");
        let mut fields = HeaderMap::new();
        fields.insert("x-forwarded-for", HeaderValue::from_static("192.0.2.7"));
        fields.insert("x-forwarded-scheme", HeaderValue::from_static("https"));
        let marker = key.sign(
            "n1",
            "GET",
            "shop.test",
            &hop::vouched_target("/a", &fields),
        );
        let take = |connection: &'static str| {
            let mut h = fields.clone();
            h.insert(HOP_HEADER, marker.clone());
            h.insert(
                http::header::CONNECTION,
                HeaderValue::from_static(connection),
            );
            c.take_hop(&mut h, "GET", "shop.test", "/a")
        };
        assert_eq!(take("keep-alive"), Some(true));
        assert_eq!(take("keep-alive, x-forwarded-scheme"), Some(false));
        assert_eq!(take("X-Forwarded-For"), Some(false));
        assert_eq!(take("via"), Some(false));
        assert_eq!(take("x-forwarded-port"), Some(false));
    }
}
