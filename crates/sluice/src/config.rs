//! The TOML configuration: defaults, file, environment and flag overrides, validation, masking.
//!
//! Precedence, lowest first: built-in defaults, the config file, `SLUICE_<SECTION>_<KEY>` environment
//! variables, command-line flags. Everything is validated before anything binds.

pub mod endpoints;
#[cfg(feature = "media")]
pub mod public_ip;
#[cfg(feature = "media")]
pub mod ratelimit;
pub mod section;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use section::config_section;

/// The whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub auth: AuthConfig,
    pub upstream: UpstreamConfig,
    #[cfg(feature = "media")]
    pub media: MediaConfig,
    #[cfg(feature = "iptv")]
    pub iptv: crate::iptv::IptvConfig,
    /// Named upstream groups (`[[upstreams]]`) for the reverse and TCP front ends.
    #[cfg(feature = "groups")]
    pub upstreams: Vec<crate::upstream::group::GroupConfig>,
    /// Reverse proxy routes (`[[routes]]`): host + path prefix to an upstream group.
    #[cfg(feature = "reverse")]
    pub routes: Vec<crate::reverse::RouteConfig>,
    /// Settings shared by every reverse proxy route.
    #[cfg(feature = "reverse")]
    pub reverse: crate::reverse::ReverseConfig,
    /// Where the built-in endpoints are served, or whether at all.
    pub endpoints: endpoints::EndpointsConfig,
    /// TCP (L4) listeners (`[[tcp]]`).
    #[cfg(feature = "tcp")]
    pub tcp: Vec<crate::tcp::TcpConfig>,
    /// The slice cache service (`[cache]`), used by routes with `cache = true`.
    #[cfg(feature = "cache")]
    pub cache: crate::cache::CacheConfig,
    /// Automatic HTTPS (`[acme]`).
    #[cfg(feature = "acme")]
    pub acme: crate::acme::AcmeConfig,
}

/// Listeners and the downstream HTTP server.
#[derive(Debug, Clone, Serialize)]
pub struct ServerConfig {
    /// Addresses to listen on: the main listener (named `main`), which serves the user routes and
    /// the built-ins unless they name another listener.
    pub listen: Vec<SocketAddr>,
    /// More listeners, each with a name that routes (`listener = "..."`) and `[endpoints]`
    /// (`listener = "..."`) use to put themselves there instead: an admin port for `/metrics`.
    pub listeners: Vec<NamedListener>,
    /// PEM certificate chain; with `tls_key`, every listener speaks TLS (HTTP/2 and 1.1 by ALPN).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// More certificates, chosen by the TLS server name (SNI); `tls_cert` serves every other name.
    pub certificates: Vec<crate::server::tls::CertConfig>,
    /// File the process id is written to at startup, for `sluice reload`.
    pub pid_file: Option<PathBuf>,
    /// Seconds a keep-alive connection may sit idle between requests.
    pub idle_timeout_secs: u64,
    /// Seconds a client has to send a complete request head once it has begun one, and to begin
    /// the first one on a new connection.
    pub header_read_timeout_secs: u64,
    /// Largest request head accepted, in bytes.
    pub max_header_bytes: usize,
    /// Most request headers accepted.
    pub max_headers: usize,
    /// Seconds in-flight responses get to finish after SIGTERM/SIGINT.
    pub shutdown_grace_secs: u64,
    /// Client connections open at once across all listeners; at the limit sluice stops accepting
    /// (new clients wait in the kernel backlog) until one closes. 0: derived from the open-file
    /// limit, which sluice raises to its hard limit at start: (limit - 64) / 2.
    pub max_connections: usize,
    /// Connections one client IP may hold open at once (0 = no limit); past it a new
    /// connection from that IP is closed at once, so one client cannot take every slot of
    /// `max_connections` from everyone else.
    pub max_connections_per_ip: usize,
    /// Peers `max_connections_per_ip` does not apply to: by default loopback (a reverse proxy or
    /// load generator on the same host).
    pub per_ip_exempt: Vec<ipnet::IpNet>,
    /// Seconds a client may keep its receive window shut (no byte accepted) while a response is
    /// being sent; then the connection is cut and its upstream fetch and buffers released.
    pub send_timeout_secs: u64,
    /// Seconds a TLS client has to finish its handshake (separate from `idle_timeout_secs`).
    pub tls_handshake_timeout_secs: u64,
    /// HTTP/2: streams a client may have open at once on one connection; more are refused
    /// with `REFUSED_STREAM`.
    pub h2_max_concurrent_streams: u32,
    /// HTTP/2: response bytes buffered per stream ahead of the client's flow-control window;
    /// one connection holds at most this times `h2_max_concurrent_streams`.
    pub h2_max_send_buf_bytes: usize,
    /// The runtime model: `work-stealing` (one multi-threaded runtime) or `per-core` (one
    /// current-thread runtime per thread, each with its own `SO_REUSEPORT` listeners and upstream
    /// pools).
    pub runtime: crate::runtime::RuntimeModel,
    /// Threads serving connections (work-stealing workers, or per-core runtimes); 0 = one per
    /// available core.
    pub threads: usize,
    /// Plain-HTTP connections serve simple GET/HEAD requests for plain-HTTP, uncached reverse
    /// routes on sluice's own HTTP/1.1 path, handing everything else to the general server.
    pub h1_fast_path: bool,
    /// Microseconds a current-thread runtime (one thread, or each per-core runtime) keeps polling
    /// for events after an HTTP request or TCP relay traffic before it sleeps; 0 = sleep at once
    /// (`runtime::busy_poll`).
    pub busy_poll_us: u64,
    /// `[server.http3]`: HTTP/3 (QUIC) on the TLS listeners.
    pub http3: crate::server::quic::Http3Config,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 8888))],
            listeners: Vec::new(),
            tls_cert: None,
            tls_key: None,
            certificates: Vec::new(),
            pid_file: None,
            idle_timeout_secs: 75,
            header_read_timeout_secs: 30,
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            shutdown_grace_secs: 10,
            max_connections: 0,
            max_connections_per_ip: 256,
            per_ip_exempt: vec![
                "127.0.0.0/8".parse().expect("valid net"),
                "::1/128".parse().expect("valid net"),
            ],
            send_timeout_secs: 60,
            tls_handshake_timeout_secs: 10,
            h2_max_concurrent_streams: 100,
            h2_max_send_buf_bytes: 128 * 1024,
            runtime: crate::runtime::RuntimeModel::WorkStealing,
            threads: 0,
            h1_fast_path: true,
            // Off: under an equal CPU budget it cost 1.5–2.4× the CPU per request at steady
            // moderate rates for at most a few ms of p99 (docs/decisions/busy-poll-default.md).
            busy_poll_us: 0,
            http3: Default::default(),
        }
    }
}

config_section!(ServerConfig {
    listen,
    listeners,
    tls_cert,
    tls_key,
    certificates,
    pid_file,
    idle_timeout_secs,
    header_read_timeout_secs,
    max_header_bytes,
    max_headers,
    shutdown_grace_secs,
    max_connections,
    max_connections_per_ip,
    per_ip_exempt,
    send_timeout_secs,
    tls_handshake_timeout_secs,
    h2_max_concurrent_streams,
    h2_max_send_buf_bytes,
    runtime,
    threads,
    h1_fast_path,
    busy_poll_us,
    http3,
});

/// `[[server.listeners]]`: a named listener. It serves only the routes and built-ins that name it,
/// with the server's TLS settings and limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NamedListener {
    /// The name routes and `[endpoints]` refer to (`main` is `server.listen`).
    pub name: String,
    /// Addresses this listener binds.
    pub listen: Vec<SocketAddr>,
}

/// The name of the listener `server.listen` declares.
pub const MAIN_LISTENER: &str = "main";

impl ServerConfig {
    /// Every listener's name, by listener id: `main` (id 0), then `[[server.listeners]]` in order.
    pub fn listener_names(&self) -> Vec<String> {
        std::iter::once(MAIN_LISTENER.to_string())
            .chain(self.listeners.iter().map(|l| l.name.clone()))
            .collect()
    }

    /// Every address to bind with the id of the listener it belongs to.
    pub fn all_listen(&self) -> Vec<(usize, SocketAddr)> {
        let main = self.listen.iter().map(|a| (0, *a));
        let named = self
            .listeners
            .iter()
            .enumerate()
            .flat_map(|(i, l)| l.listen.iter().map(move |a| (i + 1, *a)));
        main.chain(named).collect()
    }

    /// The id of the listener called `name` (empty = `main`).
    pub fn listener_id(&self, name: &str) -> Option<usize> {
        if name.is_empty() {
            return Some(0);
        }
        self.listener_names().iter().position(|n| n == name)
    }
}

/// Who may use the proxy.
#[derive(Debug, Clone, Serialize)]
pub struct AuthConfig {
    /// Shared secret (`api_password` query parameter or header). Empty: no auth, loopback listeners only.
    pub api_password: String,
    /// Peers (IPs or CIDRs) whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Accept MediaFlow-format tokens (from `/generate_url` or MediaFlow's own generators) when their
    /// claims carry the password.
    pub accept_mediaflow_tokens: bool,
    /// Seconds a minted child token (a rewritten manifest's child URL) stays valid, unless the parent
    /// token expires sooner.
    pub child_token_ttl_secs: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            api_password: String::new(),
            trusted_proxies: Vec::new(),
            accept_mediaflow_tokens: true,
            // Long enough for a feature film paused for lunch: VOD players fetch the media
            // playlist once and then only its children.
            child_token_ttl_secs: 12 * 3600,
        }
    }
}

config_section!(AuthConfig {
    api_password,
    trusted_proxies,
    accept_mediaflow_tokens,
    child_token_ttl_secs,
});

/// The pooled upstream HTTP client shared by every front end.
#[derive(Debug, Clone, Serialize)]
pub struct UpstreamConfig {
    /// Seconds to set up a connection (DNS, TCP, proxy, TLS).
    pub connect_timeout_secs: u64,
    /// Seconds from sending a request to receiving its response head.
    pub header_timeout_secs: u64,
    /// Seconds a response body may go without a byte before it is abandoned (no total deadline).
    pub idle_read_timeout_secs: u64,
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
    pub transport_routes: crate::upstream::transport_routes::TransportRoutes,
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

/// The MediaFlow-compatible media proxy front end.
#[cfg(feature = "media")]
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MediaConfig {
    /// Serve `/proxy/*`.
    pub enabled: bool,
    // HLS
    /// Largest HLS playlist fetched for rewriting, in bytes.
    pub max_manifest_bytes: usize,
    /// `EXT-X-START` time offset (seconds) injected into live media playlists (HLS, and DASH
    /// converted to HLS) that have none, unless the request gives `start_offset`; 0 disables it.
    /// MediaFlow's default is -18, which leaves room for prefetching.
    pub live_start_offset: f64,
    /// An HTML page where a playlist was expected becomes an empty, ended playlist (players stop
    /// cleanly) instead of a 502.
    pub graceful_stream_end: bool,
    // DASH and caches
    /// MPDs, `sidx` boxes, init segments and the segments of playlists sluice rewrote go through
    /// the slice cache service (`[cache]`).
    pub cache: bool,
    /// Deprecated (the media front end now uses `[cache]`): 0 means `cache = false`; another
    /// value raises `[cache] memory_bytes` to at least this many bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_bytes: Option<u64>,
    /// Segments fetched ahead of the player after each segment request; 0 turns prefetch off.
    pub prefetch_segments: usize,
    /// Segments of an HLS media playlist fetched into the cache when the playlist is served (the
    /// first ones of a VOD, the newest of a live one); 0 turns it off. Needs `prefetch_segments`.
    pub prebuffer_segments: usize,
    /// Seconds a media segment stays cached when the origin gives no freshness of its own.
    pub segment_ttl_secs: u64,
    /// Seconds an init segment (or `sidx` box) stays cached when the origin gives no freshness.
    pub init_ttl_secs: u64,
    /// Seconds an MPD stays cached when the origin gives no freshness (live MPDs: see below).
    pub mpd_ttl_secs: u64,
    /// Seconds a live MPD stays cached when it names no `minimumUpdatePeriod`; with one, the
    /// shorter of the two.
    pub live_mpd_ttl_secs: u64,
    /// Newest segments a live DASH media playlist lists (more when `start_offset` reaches further back).
    pub mpd_live_playlist_depth: usize,
    /// Largest MPD accepted, in bytes.
    pub max_mpd_bytes: usize,
    /// Largest init or media segment accepted, in bytes (segments are held whole to decrypt them).
    pub max_segment_bytes: usize,
    /// Most segments one HLS media playlist may list; above it the request gets a 400 instead of
    /// unbounded rewriting work. (DASH representations have the MPD parser's own cap.)
    pub max_playlist_segments: usize,
    /// Bytes the prefetch registry (the segment lists of recently served playlists) may hold.
    pub prefetch_registry_bytes: usize,
    /// DASH media playlists point at `/proxy/mpd/segment.ts` (decrypted and remuxed to MPEG-TS)
    /// unless the request says `remux_to_ts=0`; off, they point at fMP4 unless it says `=1`.
    pub remux_to_ts: bool,
    /// `/proxy/stream` moves a plain-HTTP upstream body of known length to a plain HTTP/1.1
    /// client with `splice(2)` instead of through user space (`docs/tcp-proxy.md`). Read at
    /// start, like the rest of `[media]`.
    pub splice_stream: bool,
    /// `/proxy/*` requests one client IP may have in flight at once (streams, manifests,
    /// segments; 0 = no limit); past it 429. Bounds what one client makes sluice hold upstream.
    pub max_requests_per_client: usize,
    /// The same bound for one token, whoever presents it (a leaked link shared widely).
    pub max_requests_per_token: usize,
    // Xtream Codes and Acestream
    /// Largest Xtream Codes API answer (stream lists, M3U) read for rewriting, in bytes.
    pub xtream_max_response_bytes: usize,
    /// `[media.acestream]`: the Acestream engine and its shared sessions.
    pub acestream: AcestreamConfig,
    /// `[media.ratelimit]`: per-host pacing for fragile CDNs.
    pub ratelimit: ratelimit::RateLimitConfig,
    /// `[media.public_ip]`: the echo services behind `/proxy/ip`.
    pub public_ip: public_ip::PublicIpConfig,
    /// `[media.forward]`: the `/proxy/forward` relay.
    pub forward: crate::media::forward::ForwardConfig,
    /// `[media.epg]`: the `/proxy/epg` guide proxy.
    pub epg: crate::media::epg::EpgConfig,
    /// `[media.extractors]`: the commands behind `/extractor/video`.
    pub extractors: crate::media::extractor::ExtractorsConfig,
}

#[cfg(feature = "media")]
impl Default for MediaConfig {
    fn default() -> Self {
        MediaConfig {
            enabled: true,
            // HLS
            max_manifest_bytes: 8 * 1024 * 1024,
            live_start_offset: -18.0,
            graceful_stream_end: false,
            cache: true,
            cache_bytes: None,
            prefetch_segments: 3,
            prebuffer_segments: 3,
            segment_ttl_secs: 60,
            init_ttl_secs: 3600,
            mpd_ttl_secs: 60,
            live_mpd_ttl_secs: 3,
            mpd_live_playlist_depth: 15,
            max_mpd_bytes: 8 * 1024 * 1024,
            max_segment_bytes: 64 * 1024 * 1024,
            max_playlist_segments: 20_000,
            splice_stream: true,
            max_requests_per_client: 64,
            max_requests_per_token: 64,
            prefetch_registry_bytes: 8 * 1024 * 1024,
            remux_to_ts: false,
            xtream_max_response_bytes: 64 * 1024 * 1024,
            acestream: Default::default(),
            ratelimit: Default::default(),
            public_ip: Default::default(),
            forward: Default::default(),
            epg: Default::default(),
            extractors: Default::default(),
        }
    }
}

#[cfg(feature = "media")]
impl MediaConfig {
    /// Checks the values before anything binds.
    fn validate(&self) -> anyhow::Result<()> {
        if self.max_playlist_segments == 0 {
            bail!("media.max_playlist_segments must be at least 1");
        }
        if self.live_mpd_ttl_secs == 0 || self.mpd_ttl_secs == 0 {
            bail!("media.mpd_ttl_secs and media.live_mpd_ttl_secs must be at least 1");
        }
        if self.max_segment_bytes < 1024 || self.max_mpd_bytes < 1024 {
            bail!("media.max_segment_bytes and media.max_mpd_bytes must be at least 1024");
        }
        // HLS
        if self.xtream_max_response_bytes < 1024 {
            bail!("media.xtream_max_response_bytes must be at least 1024");
        }
        self.acestream.validate()?;
        self.ratelimit.validate()?;
        self.public_ip.validate()?;
        self.forward.validate()?;
        self.epg.validate()?;
        self.extractors.validate()?;
        if self.max_manifest_bytes < 1024 {
            bail!("media.max_manifest_bytes must be at least 1024");
        }
        if !self.live_start_offset.is_finite() {
            bail!("media.live_start_offset must be a finite number of seconds (0 disables it)");
        }
        Ok(())
    }
}

/// `[media.acestream]`: where the engine is and how sessions are shared.
#[cfg(feature = "media")]
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AcestreamConfig {
    /// Serve `/proxy/acestream/*`.
    pub enabled: bool,
    /// The engine's HTTP API, `http://host:port` (the engine's default port is 6878).
    pub engine_url: String,
    /// Seconds a session stays open after its last viewer leaves (a zap back is instant).
    pub linger_secs: u64,
    /// Bytes of stream each session buffers for its viewers; a viewer further behind skips ahead.
    pub buffer_bytes: usize,
    /// Engine sessions open at once; more answer 503.
    pub max_sessions: usize,
}

#[cfg(feature = "media")]
impl Default for AcestreamConfig {
    fn default() -> Self {
        AcestreamConfig {
            enabled: true,
            engine_url: "http://127.0.0.1:6878".into(),
            linger_secs: 10,
            buffer_bytes: 4 * 1024 * 1024,
            max_sessions: 16,
        }
    }
}

#[cfg(feature = "media")]
impl AcestreamConfig {
    /// Checks the values before anything binds.
    pub fn validate(&self) -> anyhow::Result<()> {
        let url = url::Url::parse(&self.engine_url)
            .map_err(|e| anyhow::anyhow!("media.acestream.engine_url: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            anyhow::bail!("media.acestream.engine_url must be an http(s) URL with a host");
        }
        if self.buffer_bytes < 64 * 1024 {
            anyhow::bail!("media.acestream.buffer_bytes must be at least 65536");
        }
        if self.max_sessions == 0 {
            anyhow::bail!("media.acestream.max_sessions must be at least 1");
        }
        Ok(())
    }
}

/// Settings given on the command line; each equals a config key.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Vec<SocketAddr>,
    pub api_password: Option<String>,
    pub allow_private_upstreams: bool,
    pub multicast_interface: Option<String>,
}

impl Config {
    /// Whether the media front end caches (`media.cache`; the deprecated `media.cache_bytes = 0`
    /// turns it off too).
    #[cfg(feature = "media")]
    pub fn media_caches(&self) -> bool {
        self.media.enabled && self.media.cache && self.media.cache_bytes != Some(0)
    }

    /// Whether the media front end caches: never in a build without it.
    #[cfg(not(feature = "media"))]
    pub fn media_caches(&self) -> bool {
        false
    }

    /// Whether `/proxy/*` is served (`media.enabled`).
    #[cfg(feature = "media")]
    pub fn media_enabled(&self) -> bool {
        self.media.enabled
    }

    /// Whether `/proxy/*` is served: never in a build without the media front end.
    #[cfg(not(feature = "media"))]
    pub fn media_enabled(&self) -> bool {
        false
    }

    /// Every `[[routes]]` host (what `acme.routes = true` holds certificates for).
    pub fn route_hosts(&self) -> Vec<String> {
        #[cfg(feature = "reverse")]
        return self.routes.iter().filter_map(|r| r.host.clone()).collect();
        #[cfg(not(feature = "reverse"))]
        Vec::new()
    }

    /// Whether any front end uses the slice cache service.
    #[cfg(feature = "cache")]
    pub fn needs_cache(&self) -> bool {
        #[cfg(feature = "reverse")]
        if self.routes.iter().any(|r| r.cache) {
            return true;
        }
        self.media_caches()
    }

    /// The `[cache]` section as it applies: the deprecated `media.cache_bytes` raises
    /// `memory_bytes` to at least its value.
    #[cfg(feature = "cache")]
    pub fn cache_section(&self) -> crate::cache::CacheConfig {
        #[cfg_attr(not(feature = "media"), allow(unused_mut))]
        let mut c = self.cache.clone();
        #[cfg(feature = "media")]
        if let Some(n) = self.media.cache_bytes.filter(|n| *n > 0) {
            c.memory_bytes = c.memory_bytes.max(crate::cache::ByteSize(n));
        }
        c
    }

    /// Loads defaults, then the file (if any), then `SLUICE_*` variables from `env`, then flags;
    /// validates the result.
    pub fn load(
        file: Option<&std::path::Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &Overrides,
    ) -> anyhow::Result<Config> {
        let mut table = toml::Table::try_from(Config::default()).context("encoding defaults")?;
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading config file {}", path.display()))?;
            let parsed = Self::parse_file(&text)
                .with_context(|| format!("in config file {}", path.display()))?;
            merge(&mut table, toml::Table::try_from(parsed)?);
        }
        apply_env(&mut table, env)?;
        apply_flags(&mut table, flags)?;
        // Back through the text parser rather than `Value::try_into`: every config type's
        // `Deserialize` is then compiled for one deserializer, not two (~150 KiB of the router
        // build, docs/decisions/footprint.md).
        let merged = toml::to_string(&table).context("encoding the merged settings")?;
        let config: Config = toml::from_str(&merged)
            .map_err(|e| anyhow::anyhow!("{}", describe_toml_error(&merged, &e)))
            .context("applying environment and flag overrides")?;
        config.validate()?;
        Ok(config)
    }

    /// Parses config text, reporting unknown keys and bad values with their location. A section
    /// of a front end this build leaves out is named with the feature that brings it.
    pub fn parse_file(text: &str) -> anyhow::Result<Config> {
        toml::from_str::<Config>(text).map_err(|e| {
            let table = text.parse::<toml::Table>().unwrap_or_default();
            match left_out()
                .into_iter()
                .find(|(key, _)| table.contains_key(*key))
            {
                Some((key, feature)) => anyhow::anyhow!(
                    "[{key}]: this sluice was built without the `{feature}` feature; remove the \
                     section or use a build that has it (see docs/iptv.md, \"Router build\")"
                ),
                None => anyhow::anyhow!("{}", describe_toml_error(text, &e)),
            }
        })
    }

    /// Checks what types alone cannot.
    pub fn validate(&self) -> anyhow::Result<()> {
        let s = &self.server;
        #[cfg(feature = "acme")]
        self.acme.validate(&self.route_hosts())?;
        if s.listen.is_empty() {
            bail!("server.listen is empty: give at least one address, e.g. \"127.0.0.1:8888\"");
        }
        let mut names = std::collections::HashSet::new();
        for l in &s.listeners {
            if l.name.is_empty() || l.name == MAIN_LISTENER || !names.insert(l.name.as_str()) {
                bail!(
                    "server.listeners: name {:?} is empty, reserved (\"main\" is server.listen) or used twice",
                    l.name
                );
            }
            if l.listen.is_empty() {
                bail!("server.listeners {:?}: listen is empty", l.name);
            }
        }
        if s.listener_id(&self.endpoints.listener).is_none() {
            bail!(
                "endpoints.listener {:?} names no listener (have: {})",
                self.endpoints.listener,
                s.listener_names().join(", ")
            );
        }
        #[cfg(feature = "reverse")]
        for (i, r) in self.routes.iter().enumerate() {
            if let Some(name) = &r.listener {
                if s.listener_id(name).is_none() {
                    bail!("routes[{i}].listener {name:?} names no listener");
                }
            }
        }
        if self.auth.api_password.is_empty() {
            if let Some((_, open)) = s
                .all_listen()
                .into_iter()
                .find(|(_, a)| !a.ip().is_loopback())
            {
                bail!(
                    "listener {open} is reachable from other hosts but no password is set: set \
                     auth.api_password (or --api-password, or SLUICE_AUTH_API_PASSWORD), or listen \
                     on a loopback address such as 127.0.0.1"
                );
            }
        }
        match (&s.tls_cert, &s.tls_key) {
            (Some(_), None) | (None, Some(_)) => {
                bail!("server.tls_cert and server.tls_key must be given together")
            }
            _ => {}
        }
        s.http3
            .validate(s.tls_cert.is_some() || !s.certificates.is_empty())?;
        for (name, value) in [
            ("server.idle_timeout_secs", s.idle_timeout_secs),
            ("server.send_timeout_secs", s.send_timeout_secs),
            (
                "server.tls_handshake_timeout_secs",
                s.tls_handshake_timeout_secs,
            ),
            (
                "server.h2_max_concurrent_streams",
                u64::from(s.h2_max_concurrent_streams),
            ),
            (
                "server.header_read_timeout_secs",
                s.header_read_timeout_secs,
            ),
            (
                "upstream.connect_timeout_secs",
                self.upstream.connect_timeout_secs,
            ),
            (
                "upstream.header_timeout_secs",
                self.upstream.header_timeout_secs,
            ),
            (
                "upstream.idle_read_timeout_secs",
                self.upstream.idle_read_timeout_secs,
            ),
        ] {
            if value == 0 {
                bail!("{name} must be at least 1");
            }
        }
        if s.max_header_bytes < 1024 {
            bail!("server.max_header_bytes must be at least 1024");
        }
        if s.h2_max_send_buf_bytes < 16 * 1024 {
            bail!("server.h2_max_send_buf_bytes must be at least 16384 (one HTTP/2 frame)");
        }
        // Past a second the poll no longer bridges gaps between packets: it only burns the core.
        if s.busy_poll_us > 1_000_000 {
            bail!("server.busy_poll_us must be at most 1000000 (1 s); 0 turns polling off");
        }
        if self.upstream.max_setups_per_host == 0 {
            bail!("upstream.max_setups_per_host must be at least 1");
        }
        if !(4096..=1024 * 1024).contains(&self.upstream.read_buffer_bytes) {
            bail!("upstream.read_buffer_bytes must be between 4096 and 1048576");
        }
        if !cfg!(feature = "http2") && self.upstream.http2 {
            bail!("upstream.http2 needs a build with the `http2` feature");
        }
        if !cfg!(feature = "tls") {
            if s.tls_cert.is_some() || !s.certificates.is_empty() {
                bail!(
                    "server.tls_cert and server.certificates need a build with the `tls` feature"
                );
            }
            if self.upstream.ca_file.is_some() {
                bail!("upstream.ca_file needs a build with the `tls` feature");
            }
        }
        if self.upstream.http2 && self.upstream.http2_keepalive_secs == 0 {
            bail!("upstream.http2_keepalive_secs must be at least 1");
        }
        #[cfg(feature = "groups")]
        crate::upstream::group::Groups::new(&self.upstreams).context("in [[upstreams]]")?;
        #[cfg(feature = "tcp")]
        crate::tcp::config::validate(&self.tcp, &self.upstreams).map_err(anyhow::Error::msg)?;
        #[cfg(feature = "iptv")]
        self.iptv
            .validate()
            .map_err(|e| anyhow::anyhow!("in [iptv]: {e}"))?;
        #[cfg(feature = "cache")]
        self.cache
            .validate()
            .map_err(|e| anyhow::anyhow!("in [cache]: {e}"))?;
        #[cfg(feature = "reverse")]
        if let Some(i) = self.routes.iter().position(|r| r.cache) {
            if self.cache.memory_bytes.0 == 0 {
                bail!("route {i} has cache = true but [cache] memory_bytes is 0");
            }
        }
        let routes = self
            .upstream
            .route_entries()
            .map_err(|e| anyhow::anyhow!("in [upstream]: {e}"))?;
        for route in &routes {
            crate::upstream::route::Route::parse(route)
                .with_context(|| format!("in upstream.routes pattern {:?}", route.pattern))?;
        }
        #[cfg(feature = "reverse")]
        {
            let groups: Vec<&str> = self.upstreams.iter().map(|g| g.name.as_str()).collect();
            for (i, route) in self.routes.iter().enumerate() {
                route.validate(i, &groups).context("in [[routes]]")?;
            }
        }
        sluice_http::route::HostPattern::parse(&self.endpoints.host)
            .map_err(|e| anyhow::anyhow!("endpoints.host: {e}"))?;
        #[cfg(feature = "media")]
        self.media.validate()?;
        Ok(())
    }

    /// The effective settings as TOML with every secret masked.
    pub fn masked(&self) -> String {
        let mut copy = self.clone();
        if !copy.auth.api_password.is_empty() {
            copy.auth.api_password = "********".to_string();
        }
        for route in &mut copy.upstream.routes {
            route.proxy = mask_userinfo(&route.proxy);
        }
        copy.upstream.proxy_url = mask_userinfo(&copy.upstream.proxy_url);
        copy.upstream.transport_routes = copy.upstream.transport_routes.masked();
        #[cfg(feature = "cache")]
        if !copy.cache.purge_key.is_empty() {
            copy.cache.purge_key = "********".to_string();
        }
        #[cfg(feature = "cache")]
        if let Some(c) = copy.cache.cluster.as_mut() {
            c.secret = "********".to_string();
        }
        // Through a table, like `load`: one `Serialize` instantiation per config type, not two.
        toml::Table::try_from(copy)
            .and_then(|table| toml::to_string_pretty(&table))
            .unwrap_or_else(|e| format!("# cannot print: {e}"))
    }
}

pub use crate::redact::mask_userinfo;

/// A TOML error as line, column, key and what is wrong, never quoting the file: the line may hold
/// a password, and this text reaches the log, the `/admin/reload` answer and `check-config`.
pub fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    let message = redact_values(e.message().trim());
    let Some(span) = e.span() else {
        return message;
    };
    let before = &text[..span.start.min(text.len())];
    let line_no = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    let line = text[line_start..].lines().next().unwrap_or("");
    let section = before[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .and_then(|l| l.split(']').next())
        .map(|l| l.trim_start_matches('[').trim().to_string());
    let key = line.split_once('=').map(|(k, _)| k.trim()).filter(|k| {
        !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '"'))
    });
    let place = match (section, key) {
        (Some(s), Some(k)) => format!(", key `{s}.{k}`"),
        (None, Some(k)) => format!(", key `{k}`"),
        (Some(s), None) => format!(", in [{s}]"),
        (None, None) => String::new(),
    };
    format!("TOML error at line {line_no}, column {column}{place}: {message}")
}

/// A deserializer message without the value it complains about (`invalid type: string "pw",
/// expected u64` keeps only what was expected): key names in other messages stay.
fn redact_values(message: &str) -> String {
    if !(message.starts_with("invalid type") || message.starts_with("invalid value")) {
        return message.to_string();
    }
    match message.split_once(", expected") {
        Some((what, expected)) => {
            let kind = what.split(['`', '"']).next().unwrap_or(what).trim_end();
            format!("{kind} (value not shown), expected{expected}")
        }
        None => "invalid value (not shown)".to_string(),
    }
}

/// Top-level sections whose front end or service this build leaves out, with its feature.
pub fn left_out() -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    let mut absent = |built: bool, key, feature| {
        if !built {
            out.push((key, feature));
        }
    };
    absent(cfg!(feature = "media"), "media", "media");
    absent(cfg!(feature = "iptv"), "iptv", "iptv");
    absent(cfg!(feature = "reverse"), "routes", "reverse");
    absent(cfg!(feature = "reverse"), "reverse", "reverse");
    absent(cfg!(feature = "groups"), "upstreams", "reverse");
    absent(cfg!(feature = "tcp"), "tcp", "tcp");
    absent(cfg!(feature = "cache"), "cache", "cache");
    absent(cfg!(feature = "acme"), "acme", "acme");
    out
}

fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Applies `SLUICE_<SECTION>_<KEY>=value`. Values are read as TOML literals when they parse as one
/// (numbers, booleans, arrays), else as strings; a comma list fills an array key.
fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<()> {
    let sections: Vec<String> = table.keys().cloned().collect();
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix("SLUICE_") else {
            continue;
        };
        let rest = rest.to_ascii_lowercase();
        let Some(section) = sections.iter().find(|s| rest.starts_with(&format!("{s}_"))) else {
            bail!(
                "environment variable {name}: no config section matches (sections: {})",
                sections.join(", ")
            );
        };
        let key = &rest[section.len() + 1..];
        let Some(toml::Value::Table(section_table)) = table.get_mut(section.as_str()) else {
            continue;
        };
        let existing = section_table.get(key);
        let value = env_value(&raw, existing);
        section_table.insert(key.to_string(), value);
    }
    Ok(())
}

fn env_value(raw: &str, existing: Option<&toml::Value>) -> toml::Value {
    if let Ok(mut doc) = format!("v = {raw}").parse::<toml::Table>() {
        if let Some(v) = doc.remove("v") {
            let same_kind = existing.is_none_or(|e| e.same_type(&v));
            if same_kind {
                return v;
            }
        }
    }
    if matches!(existing, Some(toml::Value::Array(_))) {
        return toml::Value::Array(
            raw.split(',')
                .map(|s| toml::Value::String(s.trim().to_string()))
                .filter(|v| v.as_str() != Some(""))
                .collect(),
        );
    }
    toml::Value::String(raw.to_string())
}

fn apply_flags(table: &mut toml::Table, flags: &Overrides) -> anyhow::Result<()> {
    let mut set = |section: &str, key: &str, value: toml::Value| {
        if let Some(toml::Value::Table(t)) = table.get_mut(section) {
            t.insert(key.to_string(), value);
        }
    };
    if !flags.listen.is_empty() {
        let list = flags
            .listen
            .iter()
            .map(|a| toml::Value::String(a.to_string()))
            .collect();
        set("server", "listen", toml::Value::Array(list));
    }
    if let Some(pw) = &flags.api_password {
        set("auth", "api_password", toml::Value::String(pw.clone()));
    }
    if let Some(name) = &flags.multicast_interface {
        if !cfg!(feature = "iptv") {
            bail!("--multicast-interface: this sluice was built without the IPTV gateway (the `iptv` feature)");
        }
        set("iptv", "interface", toml::Value::String(name.clone()));
    }
    if flags.allow_private_upstreams {
        set("upstream", "allow_private", toml::Value::Boolean(true));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_loopback_and_valid() {
        let c = Config::load(None, env(&[]), &Overrides::default()).unwrap();
        assert_eq!(c.server.listen, vec!["127.0.0.1:8888".parse().unwrap()]);
        // On where the media front end is built in; never in the gateway-only build.
        assert_eq!(c.media_enabled(), cfg!(feature = "media"));
    }

    #[test]
    fn unknown_key_is_named_with_location() {
        let err = Config::parse_file("[server]\nlisten = [\"127.0.0.1:1\"]\nlistn = 3\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `listn`"), "{err}");
        assert!(err.contains("line 3"), "{err}");
        assert!(err.contains("expected one of"), "{err}");
    }

    /// The sections read by `config_section!` keep serde's errors and locations, and a key
    /// left out keeps its default.
    #[cfg(feature = "iptv")]
    #[test]
    fn sections_keep_defaults_errors_and_locations() {
        let c =
            Config::parse_file("[iptv]\nlinger_ms = 7\n[iptv.rtsp]\nmax_sessions = 3\n").unwrap();
        assert_eq!(c.iptv.linger_ms, 7);
        assert_eq!(c.iptv.rtsp.max_sessions, 3);
        let defaults = Config::default();
        assert_eq!(c.iptv.buffer_bytes, defaults.iptv.buffer_bytes);
        assert_eq!(c.iptv.rtsp.seek_params, defaults.iptv.rtsp.seek_params);
        assert_eq!(c.server.listen, defaults.server.listen);

        let err = |text: &str| Config::parse_file(text).unwrap_err().to_string();
        let nested = err("[iptv.rtsp]\nenabled = true\nbogus = 1\n");
        assert!(nested.contains("line 3, column 1"), "{nested}");
        assert!(
            nested.contains("unknown field `bogus`, expected one of `enabled`"),
            "{nested}"
        );
        let typed = err("[iptv]\nlinger_ms = \"x\"\n");
        assert!(typed.contains("line 2, column 13"), "{typed}");
        // The value itself is never quoted (it may be a secret); the key is named.
        assert!(
            typed.contains(
                "key `iptv.linger_ms`: invalid type: string (value not shown), expected u64"
            ),
            "{typed}"
        );
        assert!(!typed.contains("\"x\""), "{typed}");
        let whole = err("iptv = 3\n");
        assert!(whole.contains("expected struct IptvConfig"), "{whole}");
        let variant = err("[iptv]\nslow_subscriber = \"nope\"\n");
        assert!(variant.contains("unknown variant `nope`"), "{variant}");
    }

    #[test]
    fn busy_poll_is_bounded() {
        let load = |v: &str| {
            Config::load(
                None,
                env(&[("SLUICE_SERVER_BUSY_POLL_US", v)]),
                &Overrides::default(),
            )
        };
        for ok in ["0", "200", "1000000"] {
            load(ok).unwrap();
        }
        for bad in ["1000001", "9223372036854775807"] {
            let err = format!("{:#}", load(bad).unwrap_err());
            assert!(
                err.contains("server.busy_poll_us must be at most 1000000"),
                "{err}"
            );
        }
    }

    #[test]
    fn bad_address_is_reported() {
        let err = Config::parse_file("[server]\nlisten = [\"127.0.0.1\"]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid socket address"), "{err}");
    }

    #[test]
    fn public_listener_needs_password() {
        let flags = Overrides {
            listen: vec!["0.0.0.0:8888".parse().unwrap()],
            ..Overrides::default()
        };
        let err = Config::load(None, env(&[]), &flags)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no password is set"), "{err}");
        assert!(err.contains("--api-password"), "{err}");
        let flags = Overrides {
            api_password: Some("pw".into()),
            ..flags
        };
        Config::load(None, env(&[]), &flags).unwrap();
    }

    #[test]
    fn env_overrides_every_kind() {
        let c = Config::load(
            None,
            env(&[
                ("SLUICE_SERVER_LISTEN", "127.0.0.1:1,127.0.0.2:2"),
                ("SLUICE_UPSTREAM_ALLOW_PRIVATE", "true"),
                ("SLUICE_UPSTREAM_CONNECT_TIMEOUT_SECS", "3"),
                ("SLUICE_AUTH_API_PASSWORD", "12345"),
                ("OTHER", "x"),
            ]),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.server.listen.len(), 2);
        assert!(c.upstream.allow_private);
        assert_eq!(c.upstream.connect_timeout_secs, 3);
        // A numeric-looking password stays a string.
        assert_eq!(c.auth.api_password, "12345");
        let err = Config::load(
            None,
            env(&[("SLUICE_SERVER_LISTN", "x")]),
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("listn"), "{err:#}");
    }

    #[test]
    fn flags_beat_env() {
        let flags = Overrides {
            api_password: Some("flag".into()),
            ..Overrides::default()
        };
        let c = Config::load(None, env(&[("SLUICE_AUTH_API_PASSWORD", "env")]), &flags).unwrap();
        assert_eq!(c.auth.api_password, "flag");
    }

    #[test]
    fn masked_hides_secrets() {
        let mut c = Config::default();
        c.auth.api_password = "hunter2".into();
        #[cfg(feature = "cache")]
        {
            c.cache.purge_key = "purgesecret".into();
        }
        c.upstream.routes.push(RouteConfig {
            pattern: "all".into(),
            proxy: "socks5://u:secret@127.0.0.1:1080".into(),
            verify_tls: true,
        });
        let text = c.masked();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!text.contains("secret"), "{text}");
        assert!(text.contains("********"));
    }

    #[test]
    fn example_file_parses() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../sluice.example.toml");
        let mut text = std::fs::read_to_string(path).unwrap();
        if !left_out().is_empty() {
            // A smaller build parses what is left once the sections it leaves out are removed.
            let mut table: toml::Table = text.parse().unwrap();
            for (key, _) in left_out() {
                table.remove(key);
            }
            text = toml::to_string(&table).unwrap();
        }
        let c = Config::parse_file(&text).unwrap();
        c.validate().unwrap();
        assert_eq!(c.media_caches(), cfg!(feature = "media"));
    }

    #[cfg(all(feature = "cache", feature = "media"))]
    #[test]
    fn deprecated_media_cache_bytes_maps_onto_the_cache_service() {
        let parse = |t: &str| Config::parse_file(t).unwrap();
        let plain = parse("");
        assert_eq!(plain.media_caches(), cfg!(feature = "media"));
        assert_eq!(plain.needs_cache(), cfg!(feature = "media"));
        assert_eq!(plain.cache_section().memory_bytes.0, 256 << 20);
        // 0 turned the old cache off: it turns media caching off.
        let off = parse("[media]\ncache_bytes = 0");
        assert!(!off.media_caches() && !off.needs_cache());
        let off = parse("[media]\ncache = false");
        assert!(!off.media_caches());
        // Another value is a floor for the shared memory tier, never a cut.
        let big = parse("[media]\ncache_bytes = 1073741824");
        assert_eq!(big.cache_section().memory_bytes.0, 1 << 30);
        let small = parse("[media]\ncache_bytes = 1048576\n[cache]\nmemory_bytes = \"64MiB\"");
        assert_eq!(small.cache_section().memory_bytes.0, 64 << 20);
    }

    #[test]
    fn section_of_a_left_out_front_end_names_its_feature() {
        let full = cfg!(all(
            feature = "media",
            feature = "iptv",
            feature = "reverse",
            feature = "tcp",
            feature = "acme"
        ));
        assert_eq!(left_out().is_empty(), full);
        for (key, feature) in left_out() {
            let err = Config::parse_file(&format!("[{key}]\nx = 1\n")).unwrap_err();
            let text = format!("{err:#}");
            assert!(
                text.contains(&format!("[{key}]")) && text.contains(&format!("`{feature}`")),
                "{text}"
            );
        }
    }
}
