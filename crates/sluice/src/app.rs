//! The composition root: builds every service and front end from the config, swaps the route
//! table on reload, and is the handler the server hands each request to. The jobs live in the
//! submodules: `routes` (the table), `dispatch`, `fast` (the HTTP/1.1 fast path's dispatch),
//! `gate` (authorization), `tokens`, `endpoints` (the small built-ins), `metering`, `home` (what
//! the home page says about each job) and `describe` (`check-config`'s notes beside the table).

mod describe;
mod dispatch;
mod endpoints;
#[cfg(feature = "reverse")]
mod fast;
mod gate;
#[cfg(feature = "media")]
mod home;
mod metering;
pub mod reload;
pub mod routes;
mod tokens;

use std::net::SocketAddr;
use std::sync::Arc;

use crate::body::Incoming;
use http::{Request, Response};
use prometheus_client::registry::Registry;

pub use crate::auth::token::TokenScope;
use crate::auth::{Credentials, Keys};
use crate::body::Body;
use crate::config::Config;
#[cfg(feature = "iptv")]
use crate::iptv::Iptv;
#[cfg(feature = "media")]
use crate::media::Media;
use crate::metrics::HttpMetrics;
#[cfg(feature = "reverse")]
use crate::reverse::{metrics::ReverseMetrics, Reverse};
use crate::server::activity::ActivityGuard;
#[cfg(feature = "reverse")]
use crate::server::handler::{FastClient, FastRequest, Served};
use crate::server::Handler;
#[cfg(feature = "reverse")]
use crate::upstream::group::Groups;
#[cfg(feature = "groups")]
use crate::upstream::group::{live::Live, metrics::GroupMetrics};
use crate::upstream::Upstream;
pub use endpoints::json;
use metering::EndpointSeries;
use routes::Routing;

pub use crate::request::RequestContext;

/// What the fast path found for a simple head: the table it was routed by and the route.
#[cfg(feature = "reverse")]
type FastRoute = (Arc<Routing>, Arc<crate::reverse::Route>);

/// Everything the server dispatches to.
pub struct App {
    /// The password, trusted proxies and token keys; a reload swaps them.
    keys: Keys,
    metrics: HttpMetrics,
    /// The server acceptor's families, registered here with the rest.
    accept: crate::server::listener::AcceptMetrics,
    registry: Registry,
    #[cfg(feature = "media")]
    media: Option<Media>,
    #[cfg(feature = "iptv")]
    iptv: Arc<Iptv>,
    /// `/metrics` is open when every listener is loopback.
    metrics_open: bool,
    /// The route table and the reverse proxy behind it; swapped whole by a reload.
    routing: Arc<arc_swap::ArcSwap<Routing>>,
    /// The one set of upstream groups the reverse proxy and the TCP front end share.
    #[cfg(feature = "groups")]
    groups: Arc<Live>,
    #[cfg(feature = "reverse")]
    reverse_metrics: ReverseMetrics,
    /// The slice cache behind `cache = true` routes and the media front end: built the first
    /// time something caches (at start or by a reload) and handed to every rebuilt table, so
    /// reloads keep what it holds.
    #[cfg(feature = "cache")]
    #[cfg_attr(not(feature = "reverse"), allow(dead_code))]
    cache: Arc<crate::cache::CacheSlot>,
    reloader: std::sync::OnceLock<Arc<reload::Reloader>>,
    /// Automatic HTTPS, when `[acme]` asks for it.
    #[cfg(feature = "acme")]
    acme: Option<Arc<crate::acme::Acme>>,
    media_on: bool,
    /// Whether the media front end was built with the cache (`Config::media_caches`).
    media_caches: bool,
    /// `/proxy/*` requests in flight per client IP and per token (`media.max_requests_per_*`).
    #[cfg(feature = "media")]
    in_flight: (
        Arc<crate::media::limit::InFlight<std::net::IpAddr>>,
        Arc<crate::media::limit::InFlight<[u8; 32]>>,
    ),
    /// The `reverse` endpoint's series, looked up once: the proxied requests are the many small
    /// ones, so they skip the per-request family lookups.
    proxy_series: std::sync::OnceLock<EndpointSeries>,
    /// The `reverse` endpoint's count of 200 answers, looked up once for the same reason.
    proxy_ok: std::sync::OnceLock<crate::atomic::Counter>,
    /// What the home page says about the other jobs; a reload replaces it.
    #[cfg(feature = "media")]
    home: Arc<arc_swap::ArcSwap<crate::media::pages::Home>>,
}

impl App {
    /// Builds every service and front end from a validated config.
    pub fn new(config: &Config) -> anyhow::Result<Arc<App>> {
        Self::with_registry(config, Registry::with_prefix("sluice"))
    }

    /// Like [`App::new`], serving `/metrics` from `registry`, where services outside the HTTP
    /// server (the TCP front end, upstream groups) have already registered their families.
    pub fn with_registry(config: &Config, mut registry: Registry) -> anyhow::Result<Arc<App>> {
        let metrics = HttpMetrics::new(&mut registry);
        let accept = crate::server::listener::AcceptMetrics::register(&mut registry);
        // Built even when no front end here fetches over HTTP: it registers the upstream metric
        // families every build's `/metrics` has.
        #[cfg_attr(not(any(feature = "media", feature = "iptv")), allow(unused_variables))]
        let upstream = Upstream::new(&config.upstream, &mut registry)?;
        let keys = Keys::new(&config.auth);
        // Only built when used: its tiers, gauges task and disk index cost nothing otherwise.
        #[cfg(feature = "cache")]
        let cache_slot = crate::cache::CacheSlot::new(keys.load().auth.secret(), &mut registry);
        #[cfg(feature = "cache")]
        cache_slot.share_guesses(metrics.guesses.clone());
        #[cfg(feature = "cache")]
        #[cfg_attr(
            not(any(feature = "media", feature = "reverse")),
            allow(unused_variables)
        )]
        let cache = if config.needs_cache() {
            Some(cache_slot.get_or_create(&config.cache_section())?)
        } else {
            None
        };
        #[cfg(feature = "media")]
        let media = if config.media.enabled {
            // The Acestream engine is an operator-configured host, usually on a private address
            // the public-upstream guard refuses: it gets its own client that may reach it, with
            // its own metric names. It serves the engine API calls sluice makes itself and,
            // through /proxy/hls, only the engine's HLS playback paths (/ace/m/, /ace/c/) while
            // an HLS session is open, redirects included (`Sessions::is_engine`). Every other
            // URL keeps the guarded client.
            let engine = if config.media.acestream.enabled {
                let mut engine_config = config.upstream.clone();
                engine_config.allow_private = true;
                Some(Upstream::new(
                    &engine_config,
                    registry.sub_registry_with_prefix("acestream_engine"),
                )?)
            } else {
                None
            };
            Some(Media::new(
                upstream.clone(),
                keys.clone(),
                &config.media,
                engine,
                cache
                    .clone()
                    .filter(|_| config.media_caches())
                    .map(|c| (c, config.cache.policy())),
                &mut registry,
            )?)
        } else {
            None
        };
        #[cfg(feature = "iptv")]
        let iptv = Iptv::new(config.iptv.clone(), upstream.clone(), &mut registry)?;
        #[cfg(feature = "reverse")]
        let reverse_metrics = ReverseMetrics::new(&mut registry);
        #[cfg(feature = "groups")]
        let groups = Live::start(&config.upstreams, GroupMetrics::register(&mut registry))?;
        #[cfg(feature = "reverse")]
        let routing = build_routing(
            config,
            None,
            &groups.current(),
            &reverse_metrics,
            cache.as_ref(),
        )?;
        #[cfg(not(feature = "reverse"))]
        let routing = build_routing(config)?;
        #[cfg(feature = "acme")]
        let acme =
            crate::acme::Acme::from_config(&config.acme, &config.route_hosts(), &mut registry)?;
        Ok(Arc::new(App {
            #[cfg(feature = "acme")]
            acme,
            #[cfg(feature = "cache")]
            cache: Arc::new(cache_slot),
            #[cfg(feature = "groups")]
            groups,
            routing: Arc::new(arc_swap::ArcSwap::from_pointee(routing)),
            reloader: std::sync::OnceLock::new(),
            proxy_series: std::sync::OnceLock::new(),
            proxy_ok: std::sync::OnceLock::new(),
            #[cfg(feature = "media")]
            home: Arc::new(arc_swap::ArcSwap::from_pointee(home::describe(config))),
            #[cfg(feature = "reverse")]
            reverse_metrics,
            media_on: config.media_enabled(),
            media_caches: config.media_caches(),
            #[cfg(feature = "media")]
            in_flight: (
                crate::media::limit::InFlight::new(config.media.max_requests_per_client),
                crate::media::limit::InFlight::new(config.media.max_requests_per_token),
            ),
            keys,
            #[cfg(feature = "iptv")]
            iptv,
            metrics,
            accept,
            registry,
            #[cfg(feature = "media")]
            media,
            metrics_open: config
                .server
                .all_listen()
                .iter()
                .all(|(_, a)| a.ip().is_loopback()),
        }))
    }

    /// Applies a new config's routes, upstream groups and reverse proxy settings atomically. Requests
    /// in flight finish on the old table; servers a group still lists keep their health and ejection state.
    pub fn reload(&self, config: &Config) -> anyhow::Result<()> {
        let commit = self.prepare_reload(config)?;
        commit();
        Ok(())
    }

    /// Builds the new table from `config` without touching the running one; the returned commit
    /// swaps it in. Sections other than routes, upstreams, reverse and endpoints need a restart.
    pub fn prepare_reload(&self, config: &Config) -> anyhow::Result<reload::Commit> {
        let old = self.routing.load_full();
        let result = (|| {
            if config.media_enabled() != self.media_on {
                anyhow::bail!("media.enabled changed: that needs a restart");
            }
            if config.server.listener_names() != old.listeners() {
                anyhow::bail!("server.listeners changed: that needs a restart");
            }
            if config.media_caches() != self.media_caches {
                anyhow::bail!("media.cache changed: that needs a restart");
            }
            // The first caching route builds the cache (from this file's `[cache]`); after that
            // the one built is kept whatever `[cache]` says. A new cache is only a candidate
            // until the commit stores it: a later part (TLS, TCP) may still refuse the reload,
            // and then it is dropped with its tasks, and `[cache]` stays live.
            #[cfg(feature = "reverse")]
            let cache = if config.routes.iter().any(|r| r.cache) {
                Some(self.cache.candidate(&config.cache_section())?)
            } else {
                self.cache.get().map(crate::cache::slot::Candidate::Running)
            };
            #[cfg(feature = "groups")]
            let groups = self.groups.prepare(&config.upstreams)?;
            #[cfg(feature = "reverse")]
            let routing = build_routing(
                config,
                Some(&old),
                &groups,
                &self.reverse_metrics,
                cache.as_ref().map(crate::cache::slot::Candidate::cache),
            )?;
            #[cfg(not(feature = "reverse"))]
            let routing = build_routing(config)?;
            #[cfg(feature = "reverse")]
            let fresh = match cache {
                Some(crate::cache::slot::Candidate::New(c)) => Some(c),
                _ => None,
            };
            #[cfg(not(feature = "reverse"))]
            #[allow(clippy::let_unit_value)]
            let fresh = ();
            #[cfg(feature = "groups")]
            return Ok((groups, routing, fresh));
            #[cfg(not(feature = "groups"))]
            Ok(((), routing, fresh))
        })();
        #[cfg(feature = "reverse")]
        self.reverse_metrics
            .reloads
            .get_or_create(&crate::reverse::metrics::ReloadLabels {
                result: if result.is_ok() {
                    "prepared"
                } else {
                    "rejected"
                },
            })
            .inc();
        #[cfg_attr(not(feature = "groups"), allow(unused_variables))]
        let (groups, routing, fresh) = result?;
        let swap = self.routing_handle();
        #[cfg(feature = "groups")]
        let live = Arc::clone(&self.groups);
        // `[auth]` applies live: the new password revokes every token sealed under the old one,
        // and the cache's purge check follows both it and `[cache]`'s purge keys. An unchanged
        // password keeps the running token key rather than deriving it again.
        let credentials = Credentials::reloaded(&config.auth, &self.keys.load());
        let keys = self.keys.clone();
        #[cfg(feature = "cache")]
        let purge = (Arc::clone(&self.cache), config.cache.clone());
        #[cfg(feature = "media")]
        let home = (Arc::clone(&self.home), home::describe(config));
        Ok(Box::new(move || {
            #[cfg(feature = "media")]
            home.0.store(Arc::new(home.1));
            // Stored before the purge keys are set, so the new cache gets this reload's.
            #[cfg(feature = "reverse")]
            if let Some(fresh) = fresh {
                // Reloads are serialised (the reloader's lock), so the slot is still empty; were
                // it not, it keeps the cache it has and this table uses its own.
                if !purge.0.install(fresh.clone()).same_as(&fresh) {
                    tracing::warn!("a reload built a second slice cache; the first one is kept");
                }
            }
            #[cfg(not(feature = "reverse"))]
            let () = fresh;
            #[cfg(feature = "cache")]
            purge.0.set_purge(&purge.1, credentials.auth.secret());
            // Groups first: the TCP part's commit, which runs after this one, takes its groups
            // from the generation installed here.
            #[cfg(feature = "groups")]
            live.install(groups);
            swap.store(Arc::new(routing));
            // The credentials last: a request arriving between two stores may see the new table
            // with the old password, never the new credentials with the old table (whose
            // `endpoints.host` pin, say, was set for the old password and lifts the
            // loopback-name rule a password-free server relies on).
            keys.store(credentials);
        }))
    }

    /// The slice cache, if one was built (for the disk flush at shutdown).
    #[cfg(feature = "cache")]
    pub fn cache(&self) -> Option<crate::cache::Cache> {
        self.cache.get()
    }

    /// The ACME service, when `[acme]` asks for it.
    #[cfg(feature = "acme")]
    pub fn acme(&self) -> Option<&Arc<crate::acme::Acme>> {
        self.acme.as_ref()
    }

    /// The certificates ACME keeps, for the TLS settings (`None` without ACME).
    #[cfg(feature = "tls")]
    pub fn managed_certs(&self) -> Option<crate::server::tls::Managed> {
        #[cfg(feature = "acme")]
        return self.acme.as_ref().map(|a| a.certs().clone());
        #[cfg(not(feature = "acme"))]
        None
    }

    /// Whether plain HTTP/1.1 connections offer `/proxy/stream` a splice tap.
    pub fn splices_streams(&self) -> bool {
        #[cfg(feature = "media")]
        return self.media.as_ref().is_some_and(|m| m.splices_streams());
        #[cfg(not(feature = "media"))]
        false
    }

    /// The upstream groups, shared with the TCP front end.
    #[cfg(feature = "groups")]
    pub fn groups(&self) -> &Arc<Live> {
        &self.groups
    }

    fn routing_handle(&self) -> Arc<arc_swap::ArcSwap<Routing>> {
        self.routing.clone()
    }

    /// Gives `POST /admin/reload` the reloader to call.
    pub fn set_reloader(&self, reloader: Arc<reload::Reloader>) {
        let _ = self.reloader.set(reloader);
    }

    /// Keys that are live only in some states (see [`reload::LIVE_KEYS`]): the
    /// `[cache]` policy keys when only reverse routes use them (the media front end took its
    /// lifetimes at start), and all of `[cache]` before a cache was built.
    pub fn live_keys(self: &Arc<Self>) -> reload::LiveKeys {
        let weak = Arc::downgrade(self);
        Box::new(move || {
            #[cfg_attr(not(feature = "cache"), allow(unused_mut))]
            let mut keys = Vec::new();
            #[cfg(feature = "cache")]
            if let Some(app) = weak.upgrade() {
                if !app.media_caches {
                    keys.extend([
                        "cache.heuristic_percent",
                        "cache.heuristic_max_secs",
                        "cache.default_ttl_secs",
                        "cache.grace_secs",
                        "cache.request_directives",
                    ]);
                }
                if app.cache.get().is_none() {
                    keys.push("cache");
                }
            }
            #[cfg(not(feature = "cache"))]
            let _ = &weak;
            keys
        })
    }

    /// The reload part for the route table (see [`reload`]).
    pub fn reload_part(self: &Arc<Self>) -> reload::Prepare {
        let weak = Arc::downgrade(self);
        Box::new(move |config: &Config| match weak.upgrade() {
            Some(app) => app.prepare_reload(config),
            None => anyhow::bail!("the server is shutting down"),
        })
    }

    /// The effective route table, one line per entry in precedence order.
    pub fn describe_routes(&self) -> String {
        self.routing.load().describe()
    }
}

/// The server hands every request (and every fast-path head) to the app.
impl Handler for App {
    fn handle(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
        guard: ActivityGuard,
    ) -> impl std::future::Future<Output = Response<Body>> + Send {
        App::handle(self, req, peer, secure, guard)
    }

    fn connection_accepted(&self) {
        self.metrics.connections.inc();
    }

    fn http_metrics(&self) -> &HttpMetrics {
        &self.metrics
    }

    fn accept_metrics(&self) -> &crate::server::listener::AcceptMetrics {
        &self.accept
    }

    fn splices_streams(&self) -> bool {
        App::splices_streams(self)
    }

    #[cfg(feature = "tls")]
    fn managed_certs(&self) -> Option<crate::server::tls::Managed> {
        App::managed_certs(self)
    }

    #[cfg(feature = "acme")]
    fn acme_acceptor(&self) -> Option<Arc<crate::acme::Acme>> {
        self.acme.clone().filter(|a| a.reads_hellos())
    }

    #[cfg(feature = "reverse")]
    type FastRoute = FastRoute;

    #[cfg(feature = "reverse")]
    fn has_fast_routes(&self) -> bool {
        App::has_fast_routes(self)
    }

    #[cfg(feature = "reverse")]
    fn fast_route(
        &self,
        listener: routes::ListenerId,
        host: &str,
        path: &str,
    ) -> Option<FastRoute> {
        App::fast_route(self, listener, host, path)
    }

    #[cfg(feature = "reverse")]
    fn serve_fast<W: FastClient + Send + Sync>(
        &self,
        route: FastRoute,
        req: FastRequest<'_>,
        path: &str,
        host: &str,
        peer: SocketAddr,
        client: &mut W,
        guard: ActivityGuard,
    ) -> impl std::future::Future<Output = Served> + Send {
        App::serve_fast(self, route, req, path, host, peer, client, guard)
    }
}

/// The effective route table `config` gives, in precedence order (for `sluice check-config`).
pub fn describe_routes(config: &Config) -> anyhow::Result<String> {
    #[cfg(feature = "reverse")]
    {
        let mut quiet = config.clone();
        // Describing must not create the access log file.
        quiet.reverse.access_log.clear();
        // Nor start a cache service: routing does not depend on it.
        for route in &mut quiet.routes {
            route.cache = false;
        }
        let metrics = ReverseMetrics::new(&mut Registry::default());
        // Built only to be described: no health checker runs on these groups.
        let groups = Groups::new(&config.upstreams)?;
        let table = build_routing(&quiet, None, &groups, &metrics, None)?
            .describe_with(&|route| describe::route_cache(config, route));
        Ok(table + &describe::others(config))
    }
    #[cfg(not(feature = "reverse"))]
    Ok(build_routing(config)?.describe() + &describe::others(config))
}

/// The route table of a build without the reverse proxy: the built-ins alone.
#[cfg(not(feature = "reverse"))]
pub fn build_routing(config: &Config) -> anyhow::Result<Routing> {
    Routing::new(
        &config.endpoints,
        config.media_enabled(),
        config.server.listener_names(),
    )
}

/// Builds the route table and reverse proxy from `config` over the upstream generation `groups`,
/// taking the access log over from `previous` when its settings did not change.
#[cfg(feature = "reverse")]
pub fn build_routing(
    config: &Config,
    previous: Option<&Routing>,
    groups: &Groups,
    metrics: &ReverseMetrics,
    cache: Option<&crate::cache::Cache>,
) -> anyhow::Result<Routing> {
    let settings = &config.reverse;
    let old = previous.map(|p| &p.reverse);
    let access_log = match old {
        Some(o)
            if o.settings().access_log == settings.access_log
                && o.settings().access_log_format == settings.access_log_format =>
        {
            o.access_log().cloned()
        }
        _ if settings.access_log.is_empty() => None,
        _ => Some(crate::reverse::access_log::AccessLog::open(
            &settings.access_log,
            settings.access_log_format,
            metrics.access_log_dropped.clone(),
        )?),
    };
    let reverse = Reverse::build(
        &config.routes,
        groups,
        settings,
        metrics.clone(),
        access_log,
        cache.map(|c| (c.clone(), config.cache.policy())),
        crate::runtime::pools(config.server.runtime, config.server.threads),
    )?
    // A reload's bounds count the tunnels open under the old ones.
    .with_tunnels(Arc::new(match old {
        Some(o) => o.tunnels().reloaded(&config.server),
        None => crate::reverse::tunnel::Tunnels::for_server(&config.server),
    }));
    Routing::new(
        reverse,
        &config.endpoints,
        config.media_enabled(),
        config.server.listener_names(),
    )
}
