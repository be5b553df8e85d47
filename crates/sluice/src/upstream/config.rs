//! `[upstream]`: the shared upstream client's timeouts, pool, TLS and outgoing proxy routes, with
//! their defaults and checks.

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::section::config_section;

/// The pooled upstream HTTP client shared by every front end.
#[derive(Debug, Clone, Serialize)]
pub struct UpstreamConfig {
    /// Seconds to set up a connection (DNS, TCP, proxy, TLS).
    pub connect_timeout_secs: u64,
    /// Seconds from sending a request to receiving its response head.
    pub header_timeout_secs: u64,
    /// Seconds a response body may go without a byte before it is abandoned (a streamed body has
    /// no total deadline).
    pub idle_read_timeout_secs: u64,
    /// Seconds to read a body sluice holds whole (playlists, MPDs, keys, init segments, segments
    /// it caches, the gateway's playlist and guide), counted from its head; streamed bodies have
    /// no total deadline. The idle deadline alone let an origin sending a byte a minute hold the
    /// request and its buffer for days. A guide fetch is bounded by this and by its own
    /// `epg_fetch_timeout_secs`/`fetch_timeout_secs` (both 120 by default): raise both together.
    /// The same bound applies to a client's `/proxy/forward` request body read ahead whole
    /// (up to 64 KiB): past it, `408` booked to the client.
    pub whole_body_timeout_secs: u64,
    /// Connection setups in flight per host at once (never a limit on open streams).
    pub max_setups_per_host: usize,
    /// Redirects followed before giving up.
    pub max_redirects: usize,
    /// Allow upstreams that resolve to non-public addresses (every class of `upstream::guard`).
    pub allow_private: bool,
    /// Seconds an idle pooled connection is kept.
    pub pool_idle_secs: u64,
    /// Idle pooled connections kept per origin.
    pub pool_max_idle_per_host: usize,
    /// User-Agent sent when the request names none.
    pub user_agent: String,
    /// Hosts (exact, or `*.domain`) whose TLS certificates are not verified.
    pub insecure_hosts: Vec<String>,
    /// PEM file of extra CA certificates trusted for upstream TLS (a private CA), beside the
    /// bundled webpki roots and the system's roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// Outgoing proxy routes; the most specific matching pattern wins.
    pub routes: Vec<RouteConfig>,
    /// MediaFlow's spelling of routes, added to `routes` (`upstream::transport_routes`): the
    /// proxy of `proxy = true` entries without their own, and of `all_proxy`.
    pub proxy_url: String,
    /// MediaFlow's `all_proxy`: hosts no route names go through `proxy_url`.
    pub all_proxy: bool,
    /// MediaFlow's `transport_routes`: a table per pattern, or the JSON object its environment
    /// variable holds.
    pub transport_routes: super::transport_routes::TransportRoutes,
    /// Offer HTTP/2 (ALPN `h2`) to TLS upstreams. Off: every request gets its own HTTP/1.1
    /// connection, so an origin's `MAX_CONCURRENT_STREAMS` cannot cap viewers and one stalled
    /// viewer cannot hold back the others' shared connection window.
    pub http2: bool,
    /// Seconds between HTTP/2 keep-alive pings (only with `http2`); a connection whose ping goes
    /// unanswered for as long is closed.
    pub http2_keepalive_secs: u64,
    /// Read buffer of each upstream HTTP/1 connection, in bytes (fixed, not grown adaptively).
    pub read_buffer_bytes: usize,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            connect_timeout_secs: 10,
            header_timeout_secs: 30,
            idle_read_timeout_secs: 60,
            // Twice the idle deadline: an 8 MiB playlist takes seconds on any working link, and
            // the guide fetches have 120 s for the whole exchange anyway.
            whole_body_timeout_secs: 120,
            max_setups_per_host: 10,
            max_redirects: 5,
            allow_private: false,
            pool_idle_secs: 90,
            pool_max_idle_per_host: 64,
            user_agent: "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) \
                         Chrome/136.0.0.0 Safari/537.36"
                .to_string(),
            insecure_hosts: Vec::new(),
            ca_file: None,
            routes: Vec::new(),
            proxy_url: String::new(),
            all_proxy: false,
            transport_routes: Default::default(),
            http2: false,
            http2_keepalive_secs: 30,
            read_buffer_bytes: 96 * 1024,
        }
    }
}

config_section!(UpstreamConfig {
    connect_timeout_secs,
    header_timeout_secs,
    idle_read_timeout_secs,
    whole_body_timeout_secs,
    max_setups_per_host,
    max_redirects,
    allow_private,
    pool_idle_secs,
    pool_max_idle_per_host,
    user_agent,
    insecure_hosts,
    ca_file,
    routes,
    proxy_url,
    all_proxy,
    transport_routes,
    http2,
    http2_keepalive_secs,
    read_buffer_bytes,
});

/// One outgoing proxy route.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// `all`, `example.com` (exact host) or `*.example.com` (the domain and its subdomains), or
    /// MediaFlow's `all://*.example.com`, `https://example.com`, `http://example.com:8080`.
    pub pattern: String,
    /// `http://[user:pass@]host:port` (CONNECT), `socks5[h]://[user:pass@]host:port` or
    /// `socks4[a]://[user@]host:port` (`h`/`a`: the proxy resolves names); empty = direct.
    #[serde(default)]
    pub proxy: String,
    /// Verify TLS certificates for hosts on this route.
    #[serde(default = "yes")]
    pub verify_tls: bool,
}

fn yes() -> bool {
    true
}

impl UpstreamConfig {
    /// Checks what the types alone cannot, within `[upstream]`.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (name, value) in [
            ("upstream.connect_timeout_secs", self.connect_timeout_secs),
            ("upstream.header_timeout_secs", self.header_timeout_secs),
            (
                "upstream.idle_read_timeout_secs",
                self.idle_read_timeout_secs,
            ),
            (
                "upstream.whole_body_timeout_secs",
                self.whole_body_timeout_secs,
            ),
        ] {
            if value == 0 {
                bail!("{name} must be at least 1");
            }
        }
        if self.max_setups_per_host == 0 {
            bail!("upstream.max_setups_per_host must be at least 1");
        }
        if !(4096..=1024 * 1024).contains(&self.read_buffer_bytes) {
            bail!("upstream.read_buffer_bytes must be between 4096 and 1048576");
        }
        if !cfg!(feature = "http2") && self.http2 {
            bail!("upstream.http2 needs a build with the `http2` feature");
        }
        if !cfg!(feature = "tls") && self.ca_file.is_some() {
            bail!("upstream.ca_file needs a build with the `tls` feature");
        }
        if self.http2 && self.http2_keepalive_secs == 0 {
            bail!("upstream.http2_keepalive_secs must be at least 1");
        }
        let routes = self
            .route_entries()
            .map_err(|e| anyhow::anyhow!("in [upstream]: {e}"))?;
        for route in &routes {
            super::route::Route::parse(route)
                .with_context(|| format!("in upstream.routes pattern {:?}", route.pattern))?;
        }
        Ok(())
    }
}
