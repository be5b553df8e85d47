//! Request dispatch: one place that meters every request, checks auth, and hands the request to the
//! front end that owns its path.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::body::Incoming;
use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body::{Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use sluice_media::query::Query;
use sluice_media::token::split_path_token;
use tokio::time::Instant;

use crate::auth::token;
pub use crate::auth::token::TokenScope;
use crate::auth::{browser, Auth, Credentials, Keys};
use crate::body::{self, Body, BoxError};
use crate::config::Config;
use crate::error::{ErrorMark, ProxyError};
#[cfg(feature = "iptv")]
use crate::iptv::Iptv;
#[cfg(feature = "media")]
use crate::media::Media;
use crate::metrics::{self, EndpointLabels, ErrorLabels, HttpMetrics, RequestLabels};
#[cfg(feature = "reverse")]
use crate::reverse::{forward::Downstream, metrics::ReverseMetrics, Reverse};
use crate::server::activity::ActivityGuard;
use crate::server::routes::{Dispatch, Routing};
#[cfg(feature = "reverse")]
use crate::upstream::group::Groups;
#[cfg(feature = "groups")]
use crate::upstream::group::{live::Live, metrics::GroupMetrics};
use crate::upstream::Upstream;

pub use crate::request::RequestContext;

/// Everything the server dispatches to.
pub struct App {
    /// The password, trusted proxies and token keys; a reload swaps them.
    keys: Keys,
    metrics: HttpMetrics,
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
    reloader: std::sync::OnceLock<Arc<crate::server::reload::Reloader>>,
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
}

/// One endpoint's per-request series (active, time to first byte, total time, bytes sent).
#[derive(Clone)]
struct EndpointSeries {
    active: Gauge,
    first_byte: Histogram,
    total: Histogram,
    sent: Counter,
}

impl EndpointSeries {
    fn of(metrics: &HttpMetrics, labels: &EndpointLabels) -> EndpointSeries {
        EndpointSeries {
            active: metrics.active.get_or_create(labels).clone(),
            first_byte: metrics.first_byte.get_or_create(labels).clone(),
            total: metrics.total.get_or_create(labels).clone(),
            sent: metrics.sent_bytes.get_or_create(labels).clone(),
        }
    }
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
        // Built even when no front end here fetches over HTTP: it registers the upstream metric
        // families every build's `/metrics` has.
        #[cfg_attr(not(any(feature = "media", feature = "iptv")), allow(unused_variables))]
        let upstream = Upstream::new(&config.upstream, &mut registry)?;
        let keys = Keys::new(&config.auth);
        // Only built when used: its tiers, gauges task and disk index cost nothing otherwise.
        #[cfg(feature = "cache")]
        let cache_slot = crate::cache::CacheSlot::new(keys.load().auth.secret(), &mut registry);
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
            // its own metric names. Only engine URLs (forced onto the configured host) use it.
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
        Ok(Arc::new(App {
            #[cfg(feature = "cache")]
            cache: Arc::new(cache_slot),
            #[cfg(feature = "groups")]
            groups,
            routing: Arc::new(arc_swap::ArcSwap::from_pointee(routing)),
            reloader: std::sync::OnceLock::new(),
            proxy_series: std::sync::OnceLock::new(),
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
    pub fn prepare_reload(&self, config: &Config) -> anyhow::Result<crate::server::reload::Commit> {
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
            // the one built is kept whatever `[cache]` says.
            #[cfg(feature = "reverse")]
            let cache = if config.routes.iter().any(|r| r.cache) {
                Some(self.cache.get_or_create(&config.cache_section())?)
            } else {
                self.cache.get()
            };
            #[cfg(feature = "groups")]
            let groups = self.groups.prepare(&config.upstreams)?;
            #[cfg(feature = "reverse")]
            let routing = build_routing(
                config,
                Some(&old),
                &groups,
                &self.reverse_metrics,
                cache.as_ref(),
            )?;
            #[cfg(not(feature = "reverse"))]
            let routing = build_routing(config)?;
            #[cfg(feature = "groups")]
            return Ok((groups, routing));
            #[cfg(not(feature = "groups"))]
            Ok(((), routing))
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
        let (groups, routing) = result?;
        let swap = self.routing_handle();
        #[cfg(feature = "groups")]
        let live = Arc::clone(&self.groups);
        // `[auth]` applies live: the new password revokes every token sealed under the old one,
        // and the cache's purge check follows both it and `[cache]`'s purge keys.
        let credentials = Credentials::new(&config.auth);
        let keys = self.keys.clone();
        #[cfg(feature = "cache")]
        let purge = (Arc::clone(&self.cache), config.cache.clone());
        Ok(Box::new(move || {
            #[cfg(feature = "cache")]
            purge.0.set_purge(&purge.1, credentials.auth.secret());
            keys.store(credentials);
            // Groups first: the TCP part's commit, which runs after this one, takes its groups
            // from the generation installed here.
            #[cfg(feature = "groups")]
            live.install(groups);
            swap.store(Arc::new(routing));
        }))
    }

    /// The slice cache, if one was built (for the disk flush at shutdown).
    #[cfg(feature = "cache")]
    pub fn cache(&self) -> Option<crate::cache::Cache> {
        self.cache.get()
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
    pub fn set_reloader(&self, reloader: Arc<crate::server::reload::Reloader>) {
        let _ = self.reloader.set(reloader);
    }

    /// Keys that are live only in some states (see [`crate::server::reload::LIVE_KEYS`]): the
    /// `[cache]` policy keys when only reverse routes use them (the media front end took its
    /// lifetimes at start), and all of `[cache]` before a cache was built.
    pub fn live_keys(self: &Arc<Self>) -> crate::server::reload::LiveKeys {
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

    /// The reload part for the route table (see [`crate::server::reload`]).
    pub fn reload_part(self: &Arc<Self>) -> crate::server::reload::Prepare {
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

    pub(crate) fn connection_accepted(&self) {
        self.metrics.connections.inc();
    }

    /// The server's connection-level metrics (accept pauses, send and handshake timeouts).
    pub(crate) fn http_metrics(&self) -> &crate::metrics::HttpMetrics {
        &self.metrics
    }

    /// Serves one request and meters it from arrival to the end of its body.
    pub async fn handle(
        self: &Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
        guard: ActivityGuard,
    ) -> Response<Body> {
        let start = Instant::now();
        // In-flight requests keep the table they started with; a reload only affects new ones.
        let routing = self.routing.load_full();
        let dispatch = routing.dispatch(&req);
        let endpoint = match &dispatch {
            #[cfg(feature = "reverse")]
            Dispatch::Proxy(..) => "reverse",
            _ => endpoint_label(effective_path(req.uri().path())),
        };
        let labels = EndpointLabels { endpoint };
        let series = if endpoint == "reverse" {
            self.proxy_series
                .get_or_init(|| EndpointSeries::of(&self.metrics, &labels))
                .clone()
        } else {
            EndpointSeries::of(&self.metrics, &labels)
        };
        let active = series.active;
        active.inc();
        let resp = match dispatch {
            #[cfg(feature = "reverse")]
            Dispatch::Proxy(route, path) => {
                let down = Downstream {
                    peer,
                    client_ip: self.keys.load().auth.client_ip(peer.ip(), req.headers()),
                    trusted: self.keys.load().auth.is_trusted(peer.ip()),
                    secure,
                    host: crate::server::routes::request_host(&req),
                };
                routing.reverse.handle(&route, req, &path, &down).await
            }
            Dispatch::Refused(e) => e.into_response(),
            Dispatch::Builtin(_) => {
                if crate::upstream::guard::is_own_loop(req.headers()) {
                    // An origin sent one of this sluice's own upstream requests back to it.
                    let resp = ProxyError::downstream(
                        StatusCode::LOOP_DETECTED,
                        "loop",
                        "this request came from this sluice itself (an origin redirected it back \
                         here); refused so the chain cannot grow",
                    )
                    .into_response();
                    self.count_response(
                        endpoint,
                        resp.status().as_u16(),
                        resp.extensions().get::<ErrorMark>(),
                    );
                    active.dec();
                    return resp;
                }
                let guarded = self.keys.load().auth.required();
                let cors = guarded && browser::is_player_path(effective_path(req.uri().path()));
                if !guarded && !routing.builtin_host_pinned && !local_host(&req) {
                    // Without a password only this machine may ask, by a loopback name: a page
                    // on another site, or a DNS name rebound to 127.0.0.1, is refused here.
                    misdirected()
                } else if req.method() == http::Method::OPTIONS {
                    preflight(cors)
                } else {
                    let mut resp = self.route(req, peer, secure).await;
                    // Token refusals stay identical whatever the path (no CORS on any of them).
                    let refused_token = resp
                        .extensions()
                        .get::<ErrorMark>()
                        .is_some_and(|m| m.kind == "token");
                    if cors && !refused_token {
                        allow_any_origin(resp.headers_mut());
                    }
                    resp
                }
            }
        };
        series.first_byte.observe(start.elapsed().as_secs_f64());
        self.count_response(
            endpoint,
            resp.status().as_u16(),
            resp.extensions().get::<ErrorMark>(),
        );
        let finish = Finish {
            start,
            total: series.total,
            active,
            _guard: guard,
        };
        let sent = series.sent;
        resp.map(|inner| {
            body::boxed(Metered {
                inner,
                sent,
                finish: Some(finish),
            })
        })
    }

    /// Counts one response head: requests by endpoint and status, errors by side and kind.
    fn count_response(&self, endpoint: &'static str, status: u16, mark: Option<&ErrorMark>) {
        self.metrics
            .requests
            .get_or_create(&RequestLabels { endpoint, status })
            .inc();
        if let Some(mark) = mark {
            self.metrics
                .errors
                .get_or_create(&ErrorLabels {
                    side: mark.side.label(),
                    kind: mark.kind,
                })
                .inc();
        }
    }

    /// The fast path's routing (`server::h1fast`): the route table a plain HTTP/1.1 GET or HEAD
    /// for `host` and the normalised `path` on `listener` reaches, when that is a reverse route the
    /// fast path serves (plain HTTP/1.1 upstream and no cache, or a caching route; see
    /// `Reverse::serves_fast`). `None`: the request goes to hyper.
    #[cfg(feature = "reverse")]
    pub(crate) fn fast_route(
        &self,
        listener: crate::server::routes::ListenerId,
        host: &str,
        path: &str,
    ) -> Option<(Arc<Routing>, Arc<crate::reverse::Route>)> {
        let routing = self.routing.load_full();
        match routing.lookup(listener, Some(host), path) {
            Some(crate::server::routes::Target::Proxy(route))
                if routing.reverse.serves_fast(route) =>
            {
                let route = route.clone();
                Some((routing, route))
            }
            _ => None,
        }
    }

    /// Whether any route of the current table is one the fast path serves.
    #[cfg(feature = "reverse")]
    pub(crate) fn has_fast_routes(&self) -> bool {
        let routing = self.routing.load();
        routing
            .reverse
            .routes()
            .iter()
            .any(|r| routing.reverse.serves_fast(r))
    }

    /// Serves one fast-path request on `route` and meters it exactly as [`App::handle`] meters a
    /// proxied request: the `reverse` endpoint's active gauge, first-byte and total histograms,
    /// bytes sent, requests by status and errors by side and kind.
    #[cfg(feature = "reverse")]
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn serve_fast<W: crate::reverse::fast::FastClient>(
        &self,
        routing: &Routing,
        route: &Arc<crate::reverse::Route>,
        req: crate::reverse::fast::FastRequest<'_>,
        path: &str,
        host: &str,
        peer: SocketAddr,
        client: &mut W,
        guard: ActivityGuard,
    ) -> crate::reverse::fast::Served {
        let start = Instant::now();
        let labels = EndpointLabels {
            endpoint: "reverse",
        };
        let series = self
            .proxy_series
            .get_or_init(|| EndpointSeries::of(&self.metrics, &labels));
        series.active.inc();
        // Dropped with the request, also when a send timeout cuts it.
        let finish = Finish {
            start,
            total: series.total.clone(),
            active: series.active.clone(),
            _guard: guard,
        };
        let down = Downstream {
            peer,
            client_ip: self.keys.load().auth.client_ip(peer.ip(), &req.headers),
            trusted: self.keys.load().auth.is_trusted(peer.ip()),
            secure: false,
            host: Some(host.to_string()),
        };
        let on_head = |status: u16, mark: Option<ErrorMark>| {
            series.first_byte.observe(start.elapsed().as_secs_f64());
            self.count_response("reverse", status, mark.as_ref());
        };
        let served = routing
            .reverse
            .serve_fast(route, req, path, &down, client, (on_head, &series.sent))
            .await;
        drop(finish);
        served
    }

    async fn route(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
    ) -> Response<Body> {
        let ctx = match self.context(&req, peer, secure) {
            Ok(ctx) => ctx,
            Err(why) => {
                tracing::debug!(reason = %why, "token refused");
                let mut resp = token::refusal();
                resp.extensions_mut().insert(ErrorMark {
                    side: crate::error::Side::Downstream,
                    kind: "token",
                });
                return resp;
            }
        };
        if browser::is_page(&ctx.path) {
            let creds = self.keys.load();
            let offered = Auth::offered(ctx.query.get("api_password"), req.headers());
            if creds.auth.required() && ctx.token.is_none() && !creds.auth.check(offered.as_deref())
            {
                return page_login();
            }
        }
        let result = match ctx.path.as_str() {
            "/health" => Ok(json(StatusCode::OK, r#"{"status":"healthy"}"#)),
            "/admin/reload" => self.admin_reload(&req).await,
            "/metrics" => self.serve_metrics(&req, &ctx),
            #[cfg(feature = "media")]
            p if Media::serves_open(p) && self.media.is_some() => match &self.media {
                Some(media) => media.handle_open(req, &ctx).await,
                None => Err(not_found(p)),
            },
            #[cfg(feature = "media")]
            p if Media::serves_page(p) && self.media.is_some() => match &self.media {
                Some(media) => media.handle_page(&req, &ctx),
                None => Err(not_found(p)),
            },
            #[cfg(feature = "media")]
            crate::media::playlist::PLAYLIST_PATH => match &self.media {
                Some(media) => match self.authorize(&req, &ctx) {
                    Ok(()) => media.handle_playlist(req, &ctx).await,
                    Err(e) => Err(e),
                },
                None => Err(not_found(&ctx.path)),
            },
            #[cfg(feature = "media")]
            crate::media::playlist::LINK_PATH => match &self.media {
                // Minting needs the password itself, in a header: never a token (a token holder
                // may not widen what it holds) nor a query parameter (which ends up in logs).
                Some(media)
                    if ctx.token.is_none()
                        && self
                            .keys
                            .load()
                            .auth
                            .check(Auth::offered_in_header(req.headers())) =>
                {
                    media.handle_playlist_link(req, &ctx).await
                }
                Some(_) => Err(ProxyError::downstream(
                    StatusCode::FORBIDDEN,
                    "auth",
                    "minting a playlist URL needs the password in the api_password header",
                )),
                None => Err(not_found(&ctx.path)),
            },
            #[cfg(feature = "iptv")]
            p if Iptv::serves(p) => match self.authorize(&req, &ctx) {
                Ok(()) if is_channel_path(p) => Ok(sandboxed(
                    self.iptv.handle(self.iptv_parts(req, &ctx)).await,
                )),
                Ok(()) => Ok(self.iptv.handle(self.iptv_parts(req, &ctx)).await),
                Err(e) => Err(e),
            },
            #[cfg(feature = "media")]
            p if p.starts_with("/proxy/") => match &self.media {
                Some(media) => match self
                    .authorize(&req, &ctx)
                    .and_then(|()| self.media_places(&req, &ctx))
                {
                    Ok(places) => media
                        .handle(req, &ctx)
                        .await
                        .map(|r| crate::media::limit::hold(sandboxed(r), places)),
                    Err(e) => Err(e),
                },
                None => Err(not_found(p)),
            },
            #[cfg(feature = "media")]
            p if crate::media::xtream::Xtream::serves(p) => match &self.media {
                // XC players cannot add `api_password`: the credential rides in the username.
                Some(media) => {
                    // Only a MediaFlow token (which carries the password) stands for it here: a
                    // sealed token is scoped to other paths (a playlist link's token opens
                    // `/playlist/playlist`, which the short form `/{user}/{pass}/{id}` also parses).
                    let password_ok = |offered: Option<&str>| {
                        ctx.token.as_ref().is_some_and(|t| t.paths.is_none())
                            || self.keys.load().auth.check(offered)
                    };
                    match self.media_places(&req, &ctx) {
                        Ok(places) => media
                            .handle_xtream(req, &ctx, &password_ok)
                            .await
                            .map(|r| crate::media::limit::hold(sandboxed(r), places)),
                        Err(e) => Err(e),
                    }
                }
                None => Err(not_found(p)),
            },
            p => Err(not_found(p)),
        };
        result.unwrap_or_else(ProxyError::into_response)
    }

    /// Places for one media request in its client's and its token's in-flight counts, or a 429
    /// naming the bound: one client (or one leaked link) cannot make sluice hold unbounded
    /// upstream fetches.
    #[cfg(feature = "media")]
    fn media_places(
        &self,
        req: &Request<Incoming>,
        ctx: &RequestContext,
    ) -> Result<Vec<crate::media::limit::Place>, ProxyError> {
        let busy = |what: &str| {
            ProxyError::downstream(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_requests",
                format!("{what} (media.max_requests_per_client / media.max_requests_per_token)"),
            )
        };
        let mut places = Vec::with_capacity(2);
        places.push(
            self.in_flight
                .0
                .take(ctx.client_ip)
                .ok_or_else(|| busy("this client has too many requests in flight"))?,
        );
        if ctx.token.is_some() {
            let raw = split_path_token(req.uri().path())
                .map(|(t, _)| t.to_string())
                .or_else(|| {
                    Query::parse(req.uri().query().unwrap_or(""))
                        .get("token")
                        .map(str::to_string)
                })
                .unwrap_or_default();
            let key: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(raw.as_bytes()).into();
            places.push(
                self.in_flight
                    .1
                    .take(key)
                    .ok_or_else(|| busy("this token has too many requests in flight"))?,
            );
        }
        Ok(places)
    }

    /// Works out the client IP, the routing path and the effective query. A token (in the path as
    /// `/_token_<T>/...` or as `?token=`) is opened and its scope enforced here, before any front
    /// end sees the request; every token failure gets the same [`token::refusal`].
    fn context(
        &self,
        req: &Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
    ) -> Result<RequestContext, token::TokenRefusal> {
        let client_ip = self.keys.load().auth.client_ip(peer.ip(), req.headers());
        let raw_path = req.uri().path();
        let mut query = Query::parse(req.uri().query().unwrap_or(""));
        let (token, path) = match split_path_token(raw_path) {
            Some((token, rest)) => (Some(token.to_string()), rest.to_string()),
            None => (query.get("token").map(str::to_string), raw_path.to_string()),
        };
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri().authority().map(|a| a.as_str()))
            .filter(|h| h.bytes().all(|b| b.is_ascii_graphic()))
            .map(str::to_string);
        let mut scope = None;
        if let Some(token) = token {
            let opened = self
                .keys
                .tokens()
                .ok_or(token::TokenRefusal::NoKey)
                .and_then(|gate| gate.open(&token, client_ip, token::now()))
                .and_then(|opened| {
                    let q = token::scoped_query(&opened, &path, &query)?;
                    Ok((opened.scope, q))
                });
            match opened {
                Ok((s, q)) => {
                    query = q;
                    scope = Some(s);
                }
                Err(why) => return Err(why),
            }
        }
        Ok(RequestContext {
            peer,
            client_ip,
            query,
            path,
            host,
            secure,
            token: scope,
        })
    }

    fn authorize(&self, req: &Request<Incoming>, ctx: &RequestContext) -> Result<(), ProxyError> {
        if ctx.token.is_some() {
            // Authenticated and scoped in `context`: a sealed token only reaches the paths it was
            // minted for, a MediaFlow token carries the password.
            return Ok(());
        }
        let offered = Auth::offered(ctx.query.get("api_password"), req.headers());
        if self.keys.load().auth.check(offered.as_deref()) {
            return Ok(());
        }
        let message = if offered.is_some() {
            "wrong api_password"
        } else {
            "missing api_password: pass it as the api_password query parameter or header"
        };
        Err(ProxyError::downstream(
            StatusCode::FORBIDDEN,
            "auth",
            message,
        ))
    }

    /// The request head as the IPTV front end sees it: the token prefix stripped from the path, and
    /// the prefix playlist entries need when a password is configured.
    #[cfg(feature = "iptv")]
    fn iptv_parts(&self, req: Request<Incoming>, ctx: &RequestContext) -> http::request::Parts {
        let (mut parts, _) = req.into_parts();
        parts
            .extensions
            .insert(SocketAddr::new(ctx.client_ip, ctx.peer.port()));
        // A token's request runs with the query the token fixes (plus what its holder may add).
        let query = match &ctx.token {
            Some(_) => Some(ctx.query.encode()).filter(|q| !q.is_empty()),
            None => parts.uri.query().map(str::to_string),
        };
        let pq = match query {
            Some(q) => format!("{}?{q}", ctx.path),
            None => ctx.path.clone(),
        };
        if let Ok(uri) = pq.parse() {
            parts.uri = uri;
        }
        if let Some(gate) = self.keys.tokens() {
            // Each entry's token opens that channel alone (its path, its query fixed), with no
            // expiry of its own: a saved playlist keeps working, and cannot open other groups.
            let parent = ctx.token.clone();
            let seal = move |path: &str, params: &[(String, String)]| {
                let token = gate.mint(params, &[path], parent.as_ref(), false, token::now());
                format!("/_token_{token}")
            };
            parts
                .extensions
                .insert(crate::iptv::EntrySealer(Arc::new(seal)));
        }
        parts
    }

    /// `POST /admin/reload`: only with the password in the `api_password` header (never a token or
    /// a query parameter, which end up in logs).
    async fn admin_reload(&self, req: &Request<Incoming>) -> Result<Response<Body>, ProxyError> {
        if req.method() != http::Method::POST {
            return Err(ProxyError::downstream(
                StatusCode::METHOD_NOT_ALLOWED,
                "method",
                "use POST",
            ));
        }
        if !self
            .keys
            .load()
            .auth
            .check(Auth::offered_in_header(req.headers()))
        {
            return Err(ProxyError::downstream(
                StatusCode::FORBIDDEN,
                "auth",
                "the admin endpoint needs the password in the api_password header",
            ));
        }
        let Some(reloader) = self.reloader.get().cloned() else {
            return Err(ProxyError::downstream(
                StatusCode::NOT_FOUND,
                "not_found",
                "live reload is not set up for this server",
            ));
        };
        let outcome = tokio::task::spawn_blocking(move || reloader.reload_logged("admin endpoint"))
            .await
            .map_err(|e| ProxyError::internal(e.to_string()))?;
        match outcome {
            Ok(applied) => {
                let body = serde_json::json!({"reloaded": true, "changed": applied.changed});
                let mut resp = Response::new(body::full(body.to_string()));
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                Ok(resp)
            }
            Err(e) => {
                let body = serde_json::json!({"reloaded": false, "error": format!("{e:#}")});
                let mut resp = Response::new(body::full(body.to_string()));
                *resp.status_mut() = StatusCode::UNPROCESSABLE_ENTITY;
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                Ok(resp)
            }
        }
    }

    fn serve_metrics(
        &self,
        req: &Request<Incoming>,
        ctx: &RequestContext,
    ) -> Result<Response<Body>, ProxyError> {
        if !self.metrics_open {
            self.authorize(req, ctx)?;
        }
        let accept = req
            .headers()
            .get(header::ACCEPT)
            .and_then(|a| a.to_str().ok());
        let format = metrics::Format::negotiate(accept);
        let mut resp = Response::new(body::full(metrics::exposition(&self.registry, format)));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(format.content_type()),
        );
        Ok(resp)
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
        Ok(build_routing(&quiet, None, &groups, &metrics, None)?.describe())
    }
    #[cfg(not(feature = "reverse"))]
    Ok(build_routing(config)?.describe())
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
    )?;
    Routing::new(
        reverse,
        &config.endpoints,
        config.media_enabled(),
        config.server.listener_names(),
    )
}

fn not_found(path: &str) -> ProxyError {
    let shown: String = path.chars().take(200).collect();
    ProxyError::downstream(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no endpoint at {shown}"),
    )
}

/// The IPTV gateway's channel paths (bodies from a multicast group or an RTSP server).
#[cfg(feature = "iptv")]
fn is_channel_path(p: &str) -> bool {
    token::CHANNEL_SCOPE
        .iter()
        .any(|prefix| p.starts_with(prefix))
}

/// Every body piped from an origin (or a multicast group) may be an attacker's HTML: a sandbox
/// policy gives such a page an opaque origin and no scripts, and `nosniff` keeps the browser to
/// the declared type. Set last, so no `r_*` parameter or origin header overrides them.
fn sandboxed(mut resp: Response<Body>) -> Response<Body> {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// Browser players (hls.js, shaka-player) on other origins fetch manifests and segments with CORS;
/// responses carry no credentials, so any origin may read them.
fn allow_any_origin(headers: &mut http::HeaderMap) {
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("Content-Length, Content-Range, Accept-Ranges"),
    );
}

/// Whether a password-free server's built-in may answer `req`: a loopback `Host` (or none, which
/// no browser sends).
fn local_host<B>(req: &Request<B>) -> bool {
    match crate::server::routes::request_host(req) {
        Some(host) => browser::is_loopback_host(&host),
        None => true,
    }
}

/// 421 for a `Host` a password-free server does not answer to.
fn misdirected() -> Response<Body> {
    ProxyError::downstream(
        StatusCode::MISDIRECTED_REQUEST,
        "host",
        "this sluice has no password, so it answers only to loopback names (localhost, \
         127.0.0.1, [::1]); set auth.api_password or endpoints.host to serve another name",
    )
    .into_response()
}

/// The answer to a CORS preflight: for a player path behind a password, GET and HEAD with Range
/// and the password header allowed from any origin; elsewhere no grant at all (the operator's
/// endpoints are not for other origins).
fn preflight(cors: bool) -> Response<Body> {
    let mut resp = Response::new(body::empty());
    *resp.status_mut() = StatusCode::NO_CONTENT;
    if !cors {
        return resp;
    }
    allow_any_origin(resp.headers_mut());
    let h = resp.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, HEAD, POST, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("Range, If-Range, Content-Type, api_password"),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("86400"),
    );
    resp
}

/// 401 asking a browser for the password (HTTP Basic; any user name).
fn page_login() -> Response<Body> {
    let mut resp = Response::new(body::full(
        "this page needs the password: sign in with any user name and the api_password\n",
    ));
    *resp.status_mut() = StatusCode::UNAUTHORIZED;
    let h = resp.headers_mut();
    h.insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"sluice\", charset=\"UTF-8\""),
    );
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp.extensions_mut().insert(ErrorMark {
        side: crate::error::Side::Downstream,
        kind: "auth",
    });
    resp
}

/// A small JSON response.
pub fn json(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut resp = Response::new(body::full(text));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// The path without a `/_token_<T>` prefix.
fn effective_path(path: &str) -> &str {
    split_path_token(path).map_or(path, |(_, rest)| rest)
}

/// Metric label for a path; a fixed set so label cardinality stays bounded.
fn endpoint_label(path: &str) -> &'static str {
    match path {
        "/health" => "health",
        "/metrics" => "metrics",
        p if p == "/proxy/stream" || p.starts_with("/proxy/stream/") => "stream",
        p if p.starts_with("/proxy/hls/") => "hls",
        p if p.starts_with("/proxy/mpd/") => "mpd",
        p if p.starts_with("/proxy/acestream/") => "acestream",
        p if p.starts_with("/playlist/") => "playlist",
        #[cfg(feature = "media")]
        p if crate::media::xtream::Xtream::serves(p) => "xtream",
        _ => "other",
    }
}

/// Records the total time and releases the connection's in-flight mark once the body is done or
/// dropped (a client that goes away counts too).
struct Finish {
    start: Instant,
    total: Histogram,
    active: Gauge,
    _guard: ActivityGuard,
}

impl Drop for Finish {
    fn drop(&mut self) {
        self.total.observe(self.start.elapsed().as_secs_f64());
        self.active.dec();
    }
}

pin_project_lite::pin_project! {
    struct Metered {
        #[pin]
        inner: Body,
        sent: Counter,
        finish: Option<Finish>,
    }
}

impl http_body::Body for Metered {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let poll = this.inner.poll_frame(cx);
        match &poll {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.sent.inc_by(data.len() as u64);
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                this.finish.take();
            }
            Poll::Pending => {}
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
