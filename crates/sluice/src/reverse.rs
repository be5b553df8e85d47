//! The HTTP reverse proxy front end: `[[routes]]` (host + path prefix) to upstream groups, with
//! header rewriting, streaming bodies, WebSocket tunnels, retries within a budget, per-route
//! metrics and an optional access log.
//!
//! The table is data built from config ([`Reverse::build`]); a reload builds a new one and swaps it
//! whole, so requests in flight finish on the table they started with.

pub mod access_log;
pub mod body;
pub mod budget;
pub mod cached;
pub mod client;
pub mod config;
mod dial;
pub mod fast;
mod fast_h2;
mod fast_write;
pub mod forward;
pub mod h1pool;
pub mod metrics;
pub mod tunnel;

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use sluice_http::route::HostPattern;

use crate::upstream::group::{Group, Groups};
pub use config::{ReverseConfig, RouteConfig};
use metrics::ReverseMetrics;

/// One compiled route.
pub struct Route {
    pub config: RouteConfig,
    /// `host+path` as configured: the metric label and the name in logs.
    pub name: String,
    pub host: HostPattern,
    pub group: Arc<Group>,
    client: client::RoutePools,
    /// Plain-HTTP routes: owned HTTP/1.1 connections for everything but upgrades.
    h1: client::H1Pools,
    /// Plain-HTTP routes without a cache: the HTTP/1.1 fast path's connections (`fast`).
    fast: fast::FastPools,
    /// For upgrades on `https` routes: ALPN offers HTTP/1.1 only, since Upgrade needs it.
    upgrade_client: client::RoutePools,
    req_add: Vec<(HeaderName, HeaderValue)>,
    req_remove: Vec<HeaderName>,
    resp_add: Vec<(HeaderName, HeaderValue)>,
    resp_remove: Vec<HeaderName>,
    header_timeout: Duration,
    idle_timeout: Duration,
    /// The resolved cache policy when the route has `cache = true`.
    cache_policy: Option<crate::cache::FreshnessPolicy>,
    /// This route's metric series, resolved once.
    meters: metrics::RouteMeters,
    /// Each server's `host:port` as a URI authority (`Group::servers` order), parsed once.
    authorities: Vec<Option<http::uri::Authority>>,
}

impl Route {
    fn new(
        config: &RouteConfig,
        group: Arc<Group>,
        shared: &ReverseConfig,
        cache_defaults: Option<&crate::cache::config::PolicyConfig>,
        pools: usize,
        families: &ReverseMetrics,
    ) -> anyhow::Result<Route> {
        let headers = |m: &std::collections::BTreeMap<String, String>| {
            m.iter()
                .map(|(k, v)| {
                    Ok((
                        HeaderName::from_bytes(k.as_bytes())?,
                        HeaderValue::from_str(v)?,
                    ))
                })
                .collect::<anyhow::Result<Vec<_>>>()
        };
        let names = |v: &[String]| {
            v.iter()
                .map(|k| Ok(HeaderName::from_bytes(k.as_bytes())?))
                .collect::<anyhow::Result<Vec<_>>>()
        };
        let host = HostPattern::parse(config.host.as_deref().unwrap_or(""))?;
        let name = format!("{}{}", host, config.path);
        let servers = group.servers();
        let meters = metrics::RouteMeters::new(families, &name, &group);
        let authorities: Vec<_> = servers.iter().map(|s| s.addr().parse().ok()).collect();
        Ok(Route {
            name,
            host,
            group,
            client: client::RoutePools::build(config, shared, false, pools)?,
            h1: client::H1Pools::build(config, shared, authorities.len(), pools),
            fast: fast::FastPools::build(config, shared, authorities.len(), pools),
            upgrade_client: client::RoutePools::build(config, shared, true, pools)?,
            req_add: headers(&config.request_headers_add)?,
            req_remove: names(&config.request_headers_remove)?,
            resp_add: headers(&config.response_headers_add)?,
            resp_remove: names(&config.response_headers_remove)?,
            header_timeout: Duration::from_secs(config.header_timeout_secs),
            idle_timeout: Duration::from_secs(config.idle_timeout_secs),
            cache_policy: match cache_defaults {
                Some(d) if config.cache => Some(config.cache_policy().resolve(d)),
                _ => None,
            },
            config: config.clone(),
            meters,
            authorities,
        })
    }

    /// Where `server` sits in the route's group, for the per-server tables above.
    fn server_index(&self, server: &Arc<crate::upstream::group::Server>) -> Option<usize> {
        self.group
            .servers()
            .iter()
            .position(|s| Arc::ptr_eq(s, server))
    }
}

/// The reverse proxy as one config built it: routes (each holding its group) and shared settings.
pub struct Reverse {
    routes: Vec<Arc<Route>>,
    settings: ReverseConfig,
    budget: Arc<budget::RetryBudget>,
    access_log: Option<access_log::AccessLog>,
    /// The process's slice cache (one for the process, it outlives reloads).
    cache: Option<crate::cache::Cache>,
    /// The bounds on open tunnels (the server's per-client share and descriptor budget), over
    /// counts a reload keeps ([`tunnel::Tunnels::reloaded`]).
    tunnels: Arc<tunnel::Tunnels>,
}

impl Reverse {
    /// Builds the routes over `groups`, the current generation of upstream groups (shared with the
    /// TCP front end; carrying state over a reload is [`Groups::rebuild`]'s job). A route naming a
    /// group `groups` lacks is an error.
    pub fn build(
        routes: &[RouteConfig],
        groups: &Groups,
        settings: &ReverseConfig,
        metrics: ReverseMetrics,
        access_log: Option<access_log::AccessLog>,
        cache: Option<(crate::cache::Cache, crate::cache::config::PolicyConfig)>,
        pools: usize,
    ) -> anyhow::Result<Reverse> {
        let names: Vec<&str> = groups.names().collect();
        for (i, r) in routes.iter().enumerate() {
            r.validate(i, &names)?;
        }
        let routes = routes
            .iter()
            .map(|r| {
                let group = groups
                    .get(&r.upstream)
                    .cloned()
                    .ok_or_else(|| anyhow::anyhow!("no upstream group {:?}", r.upstream))?;
                if r.cache && cache.is_none() {
                    anyhow::bail!(
                        "route {:?} has cache = true but no cache service is running",
                        r.path
                    );
                }
                Route::new(
                    r,
                    group,
                    settings,
                    cache.as_ref().map(|c| &c.1),
                    pools,
                    &metrics,
                )
                .map(Arc::new)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Reverse {
            routes,
            budget: Arc::new(budget::RetryBudget::new(
                settings.retry_budget_percent,
                settings.retry_min_per_sec,
            )),
            cache: cache.map(|c| c.0),
            settings: settings.clone(),
            access_log,
            tunnels: Arc::new(tunnel::Tunnels::for_server(&Default::default())),
        })
    }

    /// These routes with `tunnels` as the bounds on open tunnels (by default, the server
    /// config's defaults).
    pub fn with_tunnels(mut self, tunnels: Arc<tunnel::Tunnels>) -> Reverse {
        self.tunnels = tunnels;
        self
    }

    /// The bounds on open tunnels.
    pub fn tunnels(&self) -> &Arc<tunnel::Tunnels> {
        &self.tunnels
    }

    /// The compiled routes in declaration order.
    pub fn routes(&self) -> &[Arc<Route>] {
        &self.routes
    }

    pub fn access_log(&self) -> Option<&access_log::AccessLog> {
        self.access_log.as_ref()
    }

    pub fn settings(&self) -> &ReverseConfig {
        &self.settings
    }
}
