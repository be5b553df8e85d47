//! The upstream HTTP client every front end shares: connection setup (DNS, the address guard,
//! outgoing proxy routes, TLS), and on it the pooled client (keep-alive per origin, HTTP/1.1,
//! HTTP/2 by ALPN when enabled, a time-to-headers deadline, idle-read deadlines on bodies and a
//! total one on bodies read whole, redirects; the `upstream-pool` feature), `raw` (a response
//! head read off a socket of its own for bodies that are spliced) and `fetch` (whole-body GETs
//! for the gateway's playlist and guide).

#[cfg(feature = "upstream-pool")]
pub mod body;
pub mod config;
pub mod connector;
pub mod fetch;
#[cfg(feature = "groups")]
pub mod group;
pub mod guard;
pub(crate) mod h1;
pub mod happy;
#[cfg(feature = "upstream-pool")]
pub mod raw;
#[cfg(feature = "upstream-pool")]
pub mod relay;
pub mod resolve;
pub mod route;
#[cfg(feature = "tls")]
pub mod tls;
pub mod transport_routes;
pub mod tunnel;

#[cfg(feature = "upstream-pool")]
use std::error::Error as _;
use std::time::Duration;

use crate::atomic::Counter;
use http::HeaderValue;
#[cfg(feature = "upstream-pool")]
use http::{header, HeaderMap, Method, Request, StatusCode};
#[cfg(feature = "upstream-pool")]
use hyper_util::client::legacy::Client;
#[cfg(feature = "upstream-pool")]
use hyper_util::rt::{TokioExecutor, TokioTimer};
use prometheus_client::registry::Registry;
#[cfg(feature = "upstream-pool")]
use url::Url;

pub use crate::error::upstream::{ConnectError, UpstreamError};
#[cfg(feature = "upstream-pool")]
pub use body::{CollectError, UpstreamBody, UpstreamBodyError};
pub use config::{RouteConfig, UpstreamConfig};
#[cfg(feature = "upstream-pool")]
use connector::ConnInfo;
use connector::Connector;

/// Request fields that carry credentials: dropped when a redirect leaves the origin they were
/// meant for (by both the pooled client and the gateway's fetches), and from a media child on
/// another origin than its parent's (`media::links`).
pub(crate) const CREDENTIAL_FIELDS: [http::HeaderName; 3] = [
    http::header::AUTHORIZATION,
    http::header::COOKIE,
    http::header::PROXY_AUTHORIZATION,
];

/// A request for an upstream: bodiless (GET or HEAD).
#[cfg(feature = "upstream-pool")]
#[derive(Debug, Clone)]
pub struct UpstreamRequest {
    pub method: Method,
    pub url: Url,
    pub headers: HeaderMap,
}

#[cfg(feature = "upstream-pool")]
impl UpstreamRequest {
    pub fn get(url: Url) -> Self {
        UpstreamRequest {
            method: Method::GET,
            url,
            headers: HeaderMap::new(),
        }
    }
}

/// An upstream response head and its streaming body.
#[cfg(feature = "upstream-pool")]
pub struct UpstreamResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: UpstreamBody,
    /// The URL that answered, after redirects (relative manifest URIs resolve against it).
    pub final_url: Url,
}

/// Counters the client keeps.
#[derive(Clone, Default)]
struct Metrics {
    requests: Counter,
    opened: Counter,
    #[cfg_attr(not(feature = "upstream-pool"), allow(dead_code))]
    reused: Counter,
    bytes: Counter,
}

/// The shared client.
#[derive(Clone)]
pub struct Upstream {
    #[cfg(feature = "upstream-pool")]
    client: Client<connector::PoolConnector, crate::body::Body>,
    /// The client's own connector, for callers that open non-HTTP connections (RTSP) under
    /// the same address guard and resolver.
    connector: Connector,
    header_timeout: Duration,
    idle_timeout: Duration,
    /// The total deadline of a body read whole (`upstream.whole_body_timeout_secs`).
    whole_body_timeout: Duration,
    max_redirects: usize,
    user_agent: HeaderValue,
    metrics: Metrics,
    /// Idle connections of the raw (spliced) path, kept like the pooled client's.
    #[cfg(feature = "upstream-pool")]
    raw_pool: std::sync::Arc<raw::RawPool>,
}

impl Upstream {
    /// Builds the client and registers its metrics under `upstream_`.
    pub fn new(config: &UpstreamConfig, registry: &mut Registry) -> anyhow::Result<Self> {
        Self::build(config, registry, connector::MAX_POOLED_ORIGINS)
    }

    /// [`Upstream::new`] with `pooled_cap` in place of [`connector::MAX_POOLED_ORIGINS`]
    /// (tests use a small one).
    fn build(
        config: &UpstreamConfig,
        registry: &mut Registry,
        #[cfg_attr(not(feature = "upstream-pool"), allow(unused_variables))] pooled_cap: usize,
    ) -> anyhow::Result<Self> {
        let metrics = Metrics::default();
        let sub = registry.sub_registry_with_prefix("upstream");
        sub.register(
            "requests",
            "Requests sent upstream",
            metrics.requests.clone(),
        );
        sub.register(
            "connections_opened",
            "Upstream connections set up",
            metrics.opened.clone(),
        );
        sub.register(
            "connections_reused",
            "Upstream requests that reused a pooled connection",
            metrics.reused.clone(),
        );
        sub.register(
            "received_bytes",
            "Body bytes received from upstreams",
            metrics.bytes.clone(),
        );
        let routes = route::RouteTable::new(&config.route_entries()?, &config.insecure_hosts)?;
        #[cfg(feature = "tls")]
        let extra_roots = match &config.ca_file {
            Some(path) => tls::load_ca_file(path)?,
            None => Vec::new(),
        };
        let connector = Connector::new(
            routes,
            #[cfg(feature = "tls")]
            extra_roots,
            config.allow_private,
            config.http2,
            Duration::from_secs(config.connect_timeout_secs),
            config.max_setups_per_host,
            metrics.opened.clone(),
        );
        #[cfg(feature = "upstream-pool")]
        let mut builder = Client::builder(TokioExecutor::new());
        #[cfg(feature = "upstream-pool")]
        builder
            .pool_idle_timeout(Duration::from_secs(config.pool_idle_secs))
            .pool_max_idle_per_host(config.pool_max_idle_per_host)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            // A fixed read buffer: hyper's adaptive one grows towards ~400 KiB per connection on
            // a fast origin, which is most of the memory of a proxy with many viewers.
            .http1_read_buf_exact_size(config.read_buffer_bytes);
        #[cfg(all(feature = "http2", feature = "upstream-pool"))]
        {
            // Dead HTTP/2 connections are found by pings instead of by the next viewer's timeout.
            let ping = Duration::from_secs(config.http2_keepalive_secs.max(1));
            builder
                .http2_keep_alive_interval(ping)
                .http2_keep_alive_timeout(ping)
                .http2_keep_alive_while_idle(true);
        }
        Ok(Upstream {
            #[cfg(feature = "upstream-pool")]
            client: builder.build(connector::PoolConnector::with_caps(
                connector.clone(),
                pooled_cap,
                connector::MAX_POOLED_CONNECTIONS,
            )),
            connector,
            header_timeout: Duration::from_secs(config.header_timeout_secs),
            idle_timeout: Duration::from_secs(config.idle_read_timeout_secs),
            whole_body_timeout: Duration::from_secs(config.whole_body_timeout_secs),
            max_redirects: config.max_redirects,
            user_agent: HeaderValue::from_str(&config.user_agent)?,
            metrics,
            #[cfg(feature = "upstream-pool")]
            raw_pool: std::sync::Arc::new(raw::RawPool::new(
                config.pool_max_idle_per_host,
                Duration::from_secs(config.pool_idle_secs),
            )),
        })
    }

    /// How long a body read whole may take from its head to its end
    /// (`upstream.whole_body_timeout_secs`), for readers that collect a body themselves.
    pub fn whole_body_timeout(&self) -> Duration {
        self.whole_body_timeout
    }

    /// Whether the address guard lets private addresses through (`upstream.allow_private`).
    pub fn allows_private(&self) -> bool {
        self.connector.allows_private()
    }

    /// Resolves `host` and applies the address guard (`allow_private`), as every HTTP fetch
    /// does; for protocols the pooled client does not speak.
    pub async fn resolve_checked(
        &self,
        host: &str,
        port: u16,
    ) -> Result<Vec<std::net::SocketAddr>, connector::ConnectError> {
        self.connector.resolve_checked(host, port).await
    }

    /// Sends `req`, following redirects, and returns the response head with its streaming body.
    #[cfg(feature = "upstream-pool")]
    pub async fn send(&self, req: UpstreamRequest) -> Result<UpstreamResponse, UpstreamError> {
        self.relay(req, relay::RelayBody::Empty, &|_| true).await
    }

    /// A time-to-headers deadline from now (`upstream.header_timeout_secs`), for an exchange
    /// that may take two tries ([`send_raw`](Self::send_raw), then [`send_by`](Self::send_by)).
    #[cfg(feature = "upstream-pool")]
    pub fn header_deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.header_timeout
    }

    /// [`send`](Self::send) with its response head by `deadline` too: the second try of an
    /// exchange whose first (the spliced path's raw one) got an answer it could not use, which
    /// must not start a header timeout of its own.
    #[cfg(feature = "upstream-pool")]
    pub async fn send_by(
        &self,
        req: UpstreamRequest,
        deadline: tokio::time::Instant,
    ) -> Result<UpstreamResponse, UpstreamError> {
        let host = host_of(&req.url);
        tokio::time::timeout_at(deadline, self.send(req))
            .await
            .map_err(|_| UpstreamError::HeaderTimeout {
                host,
                secs: self.header_timeout.as_secs(),
            })?
    }

    /// One hop of [`relay`](Self::relay): the response head by `deadline`, the request's
    /// time-to-headers deadline (one for all its hops).
    #[cfg(feature = "upstream-pool")]
    async fn send_once(
        &self,
        method: &Method,
        url: &Url,
        headers: &HeaderMap,
        body: crate::body::Body,
        deadline: tokio::time::Instant,
    ) -> Result<http::Response<hyper::body::Incoming>, UpstreamError> {
        let mut builder = Request::builder().method(method.clone()).uri(url.as_str());
        if let Some(h) = builder.headers_mut() {
            h.extend(headers.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        let request = builder.body(body).map_err(|e| UpstreamError::Protocol {
            host: host_of(url),
            detail: e.to_string(),
        })?;
        self.metrics.requests.inc();
        let resp = tokio::time::timeout_at(deadline, self.client.request(request))
            .await
            .map_err(|_| UpstreamError::HeaderTimeout {
                host: host_of(url),
                secs: self.header_timeout.as_secs(),
            })?
            .map_err(|e| classify(url, e))?;
        if let Some(info) = resp.extensions().get::<ConnInfo>() {
            if info.mark_used() {
                self.metrics.reused.inc();
            }
        }
        Ok(resp)
    }

    #[cfg(feature = "upstream-pool")]
    fn redirect_target(
        &self,
        url: &Url,
        resp: &http::Response<hyper::body::Incoming>,
    ) -> Result<Option<Url>, UpstreamError> {
        if !matches!(resp.status().as_u16(), 301 | 302 | 303 | 307 | 308) {
            return Ok(None);
        }
        let Some(location) = resp.headers().get(header::LOCATION) else {
            return Ok(None);
        };
        let bad = || UpstreamError::bad_redirect(host_of(url), location.as_bytes());
        let text = location.to_str().map_err(|_| bad())?;
        let next = url.join(text).map_err(|_| bad())?;
        if !matches!(next.scheme(), "http" | "https") {
            return Err(bad());
        }
        Ok(Some(next))
    }
}

#[cfg(feature = "upstream-pool")]
fn host_of(url: &Url) -> String {
    url.host_str().unwrap_or("").to_string()
}

/// Finds our connector's error inside the pool's error, so the caller can tell refusal from failure.
#[cfg(feature = "upstream-pool")]
fn classify(url: &Url, err: hyper_util::client::legacy::Error) -> UpstreamError {
    let mut source = err.source();
    while let Some(e) = source {
        if let Some(connect) = e.downcast_ref::<ConnectError>() {
            return UpstreamError::Connect(clone_connect(connect));
        }
        source = e.source();
    }
    let mut detail = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        detail.push_str(": ");
        detail.push_str(&e.to_string());
        source = e.source();
    }
    UpstreamError::Protocol {
        host: host_of(url),
        detail,
    }
}

#[cfg(feature = "upstream-pool")]
fn clone_connect(e: &ConnectError) -> ConnectError {
    let io = |s: &std::io::Error| std::io::Error::new(s.kind(), s.to_string());
    match e {
        ConnectError::Refused { host, ip, reason } => ConnectError::Refused {
            host: host.clone(),
            ip: *ip,
            reason,
        },
        ConnectError::Dns { host, source } => ConnectError::Dns {
            host: host.clone(),
            source: io(source),
        },
        ConnectError::Connect { host, port, source } => ConnectError::Connect {
            host: host.clone(),
            port: *port,
            source: io(source),
        },
        ConnectError::Timeout { host, secs } => ConnectError::Timeout {
            host: host.clone(),
            secs: *secs,
        },
        ConnectError::Proxy { host, source } => ConnectError::Proxy {
            host: host.clone(),
            source: io(source),
        },
        ConnectError::Tls { host, source } => ConnectError::Tls {
            host: host.clone(),
            source: io(source),
        },
        ConnectError::NoHost => ConnectError::NoHost,
    }
}
