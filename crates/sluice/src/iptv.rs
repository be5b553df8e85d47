//! IPTV gateway front end: `/rtp/` and `/udp/` channels from multicast hubs, `/playlist.m3u`,
//! and the live status page (`/status`, `/status.json`, `/status/events`).
//!
//! # Layout
//! - `url`: channel URL forms (rtp2httpd, udpxy, msd_lite) parsed into a typed request.
//! - `hub`: one per channel; owns the multicast socket and the receive loop.
//! - `fec`: a hub's FEC socket (SMPTE 2022-1 XOR or Reed-Solomon) and the packets it rebuilds
//!   (`?fec=PORT`).
//! - `fcc`: a starting hub's fast channel change session: unicast burst, then the multicast.
//! - `ring`: a hub's shared history of payload chunks; subscribers are positions in it.
//! - `registry`: live hubs, limits, and the subscription guard.
//! - `subscriber`: a subscriber's response body and the slow-subscriber policy.
//! - `playlist`: the M3U, loaded and refreshed, with multicast entries rewritten to this gateway.
//! - `rtsp`: `/rtsp/` sessions (RTSP client, catch-up) feeding hubs like multicast channels.
//! - `hls`: `/hls/` — every channel as live HLS, segmented once per channel from its hub.
//! - `player`: `/player`, the browser page that plays channels through `/hls/` (hls.js embedded).
//! - `timeshift`: the last minutes of chosen channels' segments on disk, for seeking back.
//! - `epg`: the playlist's XMLTV guide, cached and served at `/epg.xml` and `/epg.xml.gz`.
//! - `status`: JSON snapshot, HTML page, server-sent events.
//! - `metrics`: Prometheus families, per hub.

pub mod epg;
pub mod fcc;
pub mod fec;
pub mod hls;
pub mod hub;
pub mod metrics;
pub mod player;
pub mod playlist;
pub mod registry;
pub mod ring;
pub mod rtsp;
pub mod status;
pub mod subscriber;
pub mod timeshift;
pub mod url;

use std::sync::Arc;
use std::time::Duration;

use http::{header, Method, Response, StatusCode};

use crate::body::{self, Body};
use crate::upstream::Upstream;
use hub::{HubKey, HubSettings, Published};
use registry::{Limits, Refusal, Registry};
pub use subscriber::SlowPolicy;

/// `[iptv]` in the config file. Durations are in milliseconds (`_ms`) or seconds (`_secs`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct IptvConfig {
    /// Interface to join on when a request names none (`?iface=`). No default on purpose: a
    /// join must never land on an interface nobody chose.
    pub interface: Option<String>,
    /// Let requests pick the interface with `?iface=` (also `ifname=`, `r2h-ifname=`), among
    /// `interface`, `fcc.interface` and `interfaces`.
    pub allow_iface_param: bool,
    /// More interfaces a request may name with `?iface=` (or `?r2h-ifname-fcc=`); any other
    /// name is refused, so a viewer cannot make the gateway join on an interface nobody chose.
    pub interfaces: Vec<String>,
    /// Multicast control and link-local groups a channel may name: 224.0.0.0/24 and
    /// 224.0.1.0/24 (routing, mDNS, NTP), 239.255.255.250 and .253 (SSDP, SLP), ff01::/16 and
    /// ff02::/16 are refused unless listed here (`["224.0.1.0/24"]`).
    pub allow_groups: Vec<ipnet::IpNet>,
    /// M3U to serve at `/playlist.m3u`: a file path or an `http://` URL.
    pub playlist: Option<String>,
    /// Reload the playlist when the cached copy is older than this.
    pub playlist_refresh_secs: u64,
    /// Base URL written into the playlist (e.g. `https://tv.example`); default is
    /// `http://` plus the request's `Host`.
    pub playlist_base_url: Option<String>,
    /// XMLTV guide to serve at `/epg.xml[.gz]` (http or https, plain or gzip); default is the
    /// playlist's `x-tvg-url`.
    pub epg_url: Option<String>,
    /// Fetch the guide again this often (the source's ETag makes an unchanged guide cheap).
    pub epg_refresh_secs: u64,
    /// Largest guide accepted, decompressed and as downloaded.
    pub epg_max_bytes: usize,
    /// Longest a whole guide fetch may take (connect to last byte); a source that trickles is
    /// cut, and requests waiting for the guide get 504 instead of waiting with it.
    pub epg_fetch_timeout_secs: u64,
    /// Subscribers across all channels (0 = unlimited); beyond it requests get 503.
    pub max_subscribers: usize,
    /// Subscribers of one channel (0 = unlimited); beyond it requests get 429.
    pub max_subscribers_per_channel: usize,
    /// Channels one client IP may watch at once (0 = unlimited); beyond it 429. A household
    /// watches a few; one client opening dozens is joining groups for someone else.
    pub max_subscribers_per_client: usize,
    /// Channels joined at once, lingering ones included (0 = unlimited); beyond it 503.
    pub max_channels: usize,
    /// Stay joined this long after the last subscriber leaves, so flipping back is instant
    /// and preview-happy players do not cause join/leave storms.
    pub linger_ms: u64,
    /// End a channel (and its responses) when no datagram arrives for this long; also how
    /// long a new request waits for the first datagram before a 504.
    pub no_data_timeout_ms: u64,
    /// Leave and re-join every this many seconds (0 = never), for networks whose IGMP
    /// snooping or querier drops memberships after a few minutes.
    pub membership_refresh_secs: u64,
    /// Most history held per channel: how far a subscriber may lag before the slow-subscriber
    /// policy applies. Beyond `burst_bytes` it is held only while a subscriber has it unread.
    /// Both count each held chunk (a wakeup's worth of payloads) as 64 bytes more than its
    /// payload, so they bound the chunks too; with real traffic that is a few percent at most.
    pub buffer_bytes: usize,
    /// History always kept per channel and sent to a new subscriber so playback starts at once
    /// (0 = live only). The start is moved to a TS packet boundary, and to a keyframe when one
    /// is in range.
    pub burst_bytes: usize,
    /// What to do with a subscriber that fell out of the history: `skip` ahead or `disconnect`.
    pub slow_subscriber: SlowPolicy,
    /// A subscriber that takes nothing for this long while data waits for it (it stopped
    /// reading) no longer holds history beyond `burst_bytes`; when it reads again it is
    /// lapped and `slow_subscriber` applies. Enforced by the hub, whether or not the client's
    /// connection is ever polled again.
    pub slow_subscriber_timeout_ms: u64,
    /// Wake subscribers once this many bytes have arrived...
    pub write_batch_bytes: usize,
    /// ...or this long after the first unsent byte, whichever is first.
    pub flush_interval_ms: u64,
    /// Kernel receive buffer per channel socket.
    pub recv_buffer_bytes: usize,
    /// RTP packets held to restore order (0 or 1 = no reordering).
    pub reorder_window: usize,
    /// Largest datagram accepted; larger ones are counted as malformed and dropped.
    pub max_datagram_bytes: usize,
    /// How often `/status/events` pushes a snapshot.
    pub status_interval_ms: u64,
    /// `/rtsp/` sessions: `[iptv.rtsp]`.
    pub rtsp: rtsp::RtspConfig,
    /// Fast channel change sockets: `[iptv.fcc]`.
    pub fcc: fcc::FccConfig,
    /// HLS output of every channel: `[iptv.hls]`.
    pub hls: hls::HlsConfig,
    /// Channels kept on disk for seeking back: `[iptv.timeshift]`.
    pub timeshift: timeshift::TimeshiftConfig,
}

crate::section::config_section!(IptvConfig {
    interface,
    allow_iface_param,
    interfaces,
    allow_groups,
    playlist,
    playlist_refresh_secs,
    playlist_base_url,
    epg_url,
    epg_refresh_secs,
    epg_max_bytes,
    epg_fetch_timeout_secs,
    max_subscribers,
    max_subscribers_per_channel,
    max_subscribers_per_client,
    max_channels,
    linger_ms,
    no_data_timeout_ms,
    membership_refresh_secs,
    buffer_bytes,
    burst_bytes,
    slow_subscriber,
    slow_subscriber_timeout_ms,
    write_batch_bytes,
    flush_interval_ms,
    recv_buffer_bytes,
    reorder_window,
    max_datagram_bytes,
    status_interval_ms,
    rtsp,
    fcc,
    hls,
    timeshift,
});

impl Default for IptvConfig {
    fn default() -> Self {
        Self {
            interface: None,
            allow_iface_param: true,
            interfaces: Vec::new(),
            allow_groups: Vec::new(),
            playlist: None,
            playlist_refresh_secs: 3600,
            playlist_base_url: None,
            epg_url: None,
            epg_refresh_secs: 6 * 3600,
            epg_max_bytes: 64 * 1024 * 1024,
            epg_fetch_timeout_secs: 120,
            max_subscribers: 256,
            max_subscribers_per_channel: 64,
            max_subscribers_per_client: 8,
            max_channels: 64,
            linger_ms: 10_000,
            no_data_timeout_ms: 5_000,
            membership_refresh_secs: 0,
            buffer_bytes: 4 * 1024 * 1024,
            burst_bytes: 1024 * 1024,
            slow_subscriber: SlowPolicy::Skip,
            slow_subscriber_timeout_ms: 5_000,
            write_batch_bytes: 32 * 1024,
            flush_interval_ms: 20,
            recv_buffer_bytes: 4 * 1024 * 1024,
            reorder_window: 32,
            max_datagram_bytes: 1536,
            status_interval_ms: 1000,
            rtsp: rtsp::RtspConfig::default(),
            fcc: fcc::FccConfig::default(),
            hls: hls::HlsConfig::default(),
            timeshift: timeshift::TimeshiftConfig::default(),
        }
    }
}

/// The largest `max_datagram_bytes`: the largest UDP payload (a 16-bit length).
const MAX_DATAGRAM_BYTES: usize = 65_535;
/// The largest `reorder_window`: what `sluice_media::rtp::Reorder` holds.
const MAX_REORDER_WINDOW: usize = 4096;

/// Configuration errors found before anything is joined.
#[derive(Debug, thiserror::Error)]
pub enum IptvError {
    #[error("iptv.{field}: {reason}")]
    Config { field: &'static str, reason: String },
}

impl IptvConfig {
    pub fn validate(&self) -> Result<(), IptvError> {
        let bad = |field, reason: &str| {
            Err(IptvError::Config {
                field,
                reason: reason.into(),
            })
        };
        if self.buffer_bytes < self.burst_bytes {
            return bad("buffer_bytes", "must be at least burst_bytes");
        }
        // Checked: a product that wraps (in a release build) would let any buffer pass.
        match self.write_batch_bytes.checked_mul(4) {
            Some(least) if self.buffer_bytes >= least => {}
            _ => return bad("buffer_bytes", "must be at least 4 × write_batch_bytes"),
        }
        if self.flush_interval_ms == 0 || self.status_interval_ms == 0 {
            return bad("flush_interval_ms", "intervals must be positive");
        }
        if self.epg_refresh_secs == 0 {
            return bad("epg_refresh_secs", "must be positive");
        }
        if self.epg_fetch_timeout_secs == 0 {
            return bad("epg_fetch_timeout_secs", "must be positive");
        }
        if self.epg_max_bytes < 1024 {
            return bad("epg_max_bytes", "must be at least 1024");
        }
        if let Some(url) = &self.epg_url {
            if crate::upstream::fetch::parse_url(url).is_err() {
                return bad("epg_url", "must be an http:// or https:// URL");
            }
        }
        if let Err(reason) = self.rtsp.validate() {
            return Err(IptvError::Config {
                field: "rtsp",
                reason,
            });
        }
        if let Err(reason) = self.fcc.validate() {
            return Err(IptvError::Config {
                field: "fcc",
                reason,
            });
        }
        if let Err(reason) = self.hls.validate() {
            return Err(IptvError::Config {
                field: "hls",
                reason,
            });
        }
        if let Err(reason) = self.timeshift.validate() {
            return Err(IptvError::Config {
                field: "timeshift",
                reason,
            });
        }
        if self.slow_subscriber_timeout_ms < 100 {
            return bad("slow_subscriber_timeout_ms", "must be at least 100");
        }
        if self.max_datagram_bytes < 64 {
            return bad("max_datagram_bytes", "must be at least 64");
        }
        // It sizes each hub's and each receive worker's buffers: past the largest UDP payload
        // nothing more can arrive, only memory go.
        if self.max_datagram_bytes > MAX_DATAGRAM_BYTES {
            return bad(
                "max_datagram_bytes",
                "must be at most 65535 (the largest UDP payload)",
            );
        }
        // The reorder buffer holds at most 4096 packets; a larger window was cut to it unsaid.
        if self.reorder_window > MAX_REORDER_WINDOW {
            return bad("reorder_window", "must be at most 4096 packets");
        }
        if let Some(name) = &self.interface {
            if name.is_empty() || name.len() > 15 {
                return bad("interface", "must be a network interface name");
            }
        }
        Ok(())
    }

    fn hub_settings(&self) -> HubSettings {
        HubSettings {
            ring_bytes: self.buffer_bytes,
            history: self.burst_bytes,
            write_batch: self.write_batch_bytes,
            flush_interval: Duration::from_millis(self.flush_interval_ms),
            linger: Duration::from_millis(self.linger_ms),
            stall_timeout: Duration::from_millis(self.slow_subscriber_timeout_ms),
            no_data_timeout: Duration::from_millis(self.no_data_timeout_ms),
            refresh: (self.membership_refresh_secs > 0)
                .then(|| Duration::from_secs(self.membership_refresh_secs)),
            reorder_window: self.reorder_window,
            recv_buffer: self.recv_buffer_bytes,
            max_datagram: self.max_datagram_bytes,
            rtsp: None,
            fcc_ports: self.fcc.ports(),
        }
    }
}

/// Seals one `/playlist.m3u` entry (its path and query) into the path prefix `/_token_<T>` whose
/// token opens that entry alone; given by the server when a password is configured.
#[derive(Clone)]
pub struct EntrySealer(pub playlist::Seal);

/// The IPTV front end.
#[derive(Debug)]
pub struct Iptv {
    config: IptvConfig,
    registry: Arc<Registry>,
    playlist: Option<Arc<playlist::Playlist>>,
    epg: Arc<epg::Epg>,
    rtsp: Arc<rtsp::Context>,
    hls: hls::Table,
    /// Timeshift recorders of the channels that have one, by hub key.
    recorders: std::sync::Mutex<std::collections::HashMap<HubKey, Arc<timeshift::Recorder>>>,
}

impl Iptv {
    /// The query params the RTSP front end reads as catch-up times, as configured.
    pub fn seek_params(&self) -> &[String] {
        &self.config.rtsp.seek_params
    }

    /// Builds the front end; inside a tokio runtime it also starts the guide's refresh loop
    /// when a guide can exist (a playlist or `epg_url` is configured).
    pub fn new(
        config: IptvConfig,
        upstream: Upstream,
        registry: &mut prometheus_client::registry::Registry,
    ) -> Result<Arc<Self>, IptvError> {
        config.validate()?;
        let playlist = config
            .playlist
            .clone()
            .map(|loc| {
                let refresh = Duration::from_secs(config.playlist_refresh_secs);
                playlist::Playlist::new(loc, refresh, upstream.clone()).map(Arc::new)
            })
            .transpose()
            .map_err(|reason| IptvError::Config {
                field: "playlist",
                reason,
            })?;
        let limits = Limits {
            subscribers: config.max_subscribers,
            per_hub: config.max_subscribers_per_channel,
            hubs: config.max_channels,
            per_client: config.max_subscribers_per_client,
        };
        let metrics = metrics::Metrics::register(registry);
        let rtsp = rtsp::Context::new(config.rtsp.clone(), upstream.clone());
        let settings = HubSettings {
            rtsp: Some(rtsp.clone()),
            ..config.hub_settings()
        };
        let hubs = Registry::new(metrics, settings, limits);
        let epg = Arc::new(epg::Epg::new(
            upstream,
            config.epg_url.clone(),
            Duration::from_secs(config.epg_refresh_secs),
            config.epg_max_bytes,
            Duration::from_secs(config.epg_fetch_timeout_secs),
        ));
        if playlist.is_some() || config.epg_url.is_some() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(epg.clone().refresh_loop(playlist.clone()));
            }
        }
        let iptv = Arc::new(Self {
            config,
            registry: Arc::new(hubs),
            playlist,
            epg,
            rtsp,
            hls: hls::Table::default(),
            recorders: Default::default(),
        });
        if tokio::runtime::Handle::try_current().is_ok() {
            iptv.start_timeshift();
        }
        Ok(iptv)
    }

    /// true for the paths this front end serves: /rtp/, /udp/, /rtsp/, /hls/, /playlist.m3u,
    /// /epg.xml, /epg.xml.gz, /status (and its script and style), /status.json, /status/events
    pub fn serves(path: &str) -> bool {
        path.starts_with("/rtp/")
            || path.starts_with("/hls/")
            || player::serves(path)
            || path.starts_with("/udp/")
            || path.starts_with("/rtsp/")
            || matches!(
                path,
                "/playlist.m3u" | "/epg.xml" | "/epg.xml.gz" | "/status.json" | "/status/events"
            )
            || status::serves_page(path)
    }

    /// HLS channels segmenting now (one per channel, whatever its number of HLS viewers).
    pub fn hls_channels(&self) -> usize {
        self.hls.len()
    }

    /// Auth has already been checked by the server when this is called.
    pub async fn handle(self: &Arc<Self>, req: http::request::Parts) -> Response<Body> {
        if req.method != Method::GET && req.method != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
        }
        match req.uri.path() {
            p if status::serves_page(p) => status::page(&req.method, p),
            "/status.json" => {
                let mut resp = respond(
                    StatusCode::OK,
                    "application/json",
                    status::json(&self.registry),
                );
                // Channel names and client addresses come from outside: read as JSON only.
                resp.headers_mut().insert(
                    header::X_CONTENT_TYPE_OPTIONS,
                    header::HeaderValue::from_static("nosniff"),
                );
                resp
            }
            "/status/events" => self.events(),
            "/playlist.m3u" => self.playlist(&req).await,
            "/epg.xml" => self.guide(&req, false).await,
            "/epg.xml.gz" => self.guide(&req, true).await,
            p if p.starts_with("/rtsp/") => self.rtsp(&req).await,
            p if p.starts_with("/hls/") => self.hls(&req).await,
            p if player::serves(p) => player::handle(&req.method, p, &req.headers),
            _ => self.channel(&req).await,
        }
    }

    fn events(&self) -> Response<Body> {
        let every = Duration::from_millis(self.config.status_interval_ms);
        let stream = status::events(self.registry.clone(), every);
        let mut resp = Response::new(body::boxed(http_body_util::StreamBody::new(stream)));
        let h = resp.headers_mut();
        h.insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
        h.insert(header::CACHE_CONTROL, "no-cache".parse().unwrap());
        resp
    }

    async fn playlist(&self, req: &http::request::Parts) -> Response<Body> {
        let Some(playlist) = &self.playlist else {
            return text(
                StatusCode::NOT_FOUND,
                "no playlist configured (iptv.playlist)\n",
            );
        };
        /// At most one `playlist unavailable` warning a minute; the next says how many were not.
        static PLAYLIST_WARNINGS: crate::logging::WarnLimit =
            crate::logging::WarnLimit::new(60_000);
        let text_in = match playlist.get().await {
            Ok(t) => t,
            Err(e) => {
                // The reason names the playlist's location (a server path, a provider URL);
                // operators read it in the log, clients get no hint of it. Every request while
                // the provider is down gets it, so the warning is one a minute.
                match PLAYLIST_WARNINGS.allow_now() {
                    Some(suppressed) => {
                        tracing::warn!(error = %e, suppressed, "playlist unavailable")
                    }
                    None => tracing::debug!(error = %e, "playlist unavailable"),
                }
                return text(StatusCode::BAD_GATEWAY, "playlist unavailable\n");
            }
        };
        let base = match &self.config.playlist_base_url {
            Some(b) => b.trim_end_matches('/').to_string(),
            None => match req.headers.get(header::HOST).and_then(|h| h.to_str().ok()) {
                Some(host) => format!("http://{host}"),
                None => return text(StatusCode::BAD_REQUEST, "Host header required\n"),
            },
        };
        // Behind a password, entries carry an encrypted token in their path (players cannot add
        // headers, and the password itself must not appear in a URL).
        let seal = req.extensions.get::<EntrySealer>().map(|s| s.0.clone());
        // Players fetch the guide from this gateway (cached, and reachable where the source
        // is not) whenever there is one to serve. Behind a password its token opens that one
        // path: as a plain scope, `/epg.xml.gz` would also open every path below it.
        let epg = self.epg.source(Some(&text_in)).map(|_| match &seal {
            Some(seal) => {
                let scope = crate::auth::token::exact_scope("/epg.xml.gz");
                format!("{base}{}/epg.xml.gz", seal(&scope, &[]))
            }
            None => format!("{base}/epg.xml.gz"),
        });
        let rtsp = &self.config.rtsp;
        let catchup =
            (rtsp.enabled && !rtsp.catchup_query.is_empty()).then_some(rtsp.catchup_query.as_str());
        let out = playlist::rewrite_playlist(
            &String::from_utf8_lossy(&text_in),
            &base,
            epg.as_deref(),
            catchup,
            seal.as_deref(),
            &rtsp.seek_params,
        );
        let as_hls = match query_flag(req.uri.query(), "hls") {
            Some(on) => on,
            None => self.config.hls.playlist,
        };
        let out = if as_hls && self.config.hls.enabled {
            hls::hls_entries(&out, &base)
        } else {
            out
        };
        respond(StatusCode::OK, "audio/x-mpegurl; charset=utf-8", out)
    }

    async fn guide(&self, req: &http::request::Parts, gz_file: bool) -> Response<Body> {
        /// At most one `guide unavailable` warning a minute; the next says how many were not.
        static GUIDE_WARNINGS: crate::logging::WarnLimit = crate::logging::WarnLimit::new(60_000);
        let playlist_text = match &self.playlist {
            Some(p) => p.get().await.ok(),
            None => None,
        };
        let source = self.epg.source(playlist_text.as_deref());
        if source.is_none() {
            return text(
                StatusCode::NOT_FOUND,
                &format!("{}\n", epg::EpgError::NoSource),
            );
        }
        let guide = match self.epg.get(source).await {
            Ok(g) => g,
            Err(e) => {
                // As for the playlist: the reason names the guide's source (its host, what it
                // answered), for the log; clients get one answer per status. Every request
                // while the source is down gets it, so the warning is one a minute.
                match GUIDE_WARNINGS.allow_now() {
                    Some(suppressed) => tracing::warn!(error = %e, suppressed, "guide unavailable"),
                    None => tracing::debug!(error = %e, "guide unavailable"),
                }
                return match e {
                    epg::EpgError::TimedOut(_) => text(
                        StatusCode::GATEWAY_TIMEOUT,
                        "guide unavailable: timed out\n",
                    ),
                    _ => text(StatusCode::BAD_GATEWAY, "guide unavailable\n"),
                };
            }
        };
        let form = epg::Form::choose(gz_file, &req.headers);
        let unchanged = epg::not_modified(&req.headers, &form.etag(&guide), guide.last_modified);
        let (status, headers) = epg::head(form, &guide, unchanged);
        let payload = if unchanged || req.method == Method::HEAD {
            body::empty()
        } else if form == epg::Form::Xml {
            // Inflated as the client reads: a whole copy per request, held as long as a slow
            // client liked, let a few of them hold gigabytes.
            guide.xml_body()
        } else {
            body::full(guide.gz.clone())
        };
        let mut resp = Response::new(payload);
        *resp.status_mut() = status;
        *resp.headers_mut() = headers;
        // A streamed body has no length of its own: the header gives it, for GET as for HEAD.
        if (req.method == Method::HEAD || form == epg::Form::Xml) && !unchanged {
            let len = if form == epg::Form::Xml {
                guide.xml_len
            } else {
                guide.gz.len()
            };
            resp.headers_mut()
                .insert(header::CONTENT_LENGTH, len.into());
        }
        resp
    }

    async fn channel(self: &Arc<Self>, req: &http::request::Parts) -> Response<Body> {
        let (key, fcc) = match self.hub_key(req) {
            Ok(key) => key,
            Err(e) => return self.key_refused(e),
        };
        if req.method == Method::HEAD {
            return stream_response(body::empty());
        }
        let peer = req.extensions.get::<std::net::SocketAddr>().copied();
        let sub = match self.registry.subscribe(key, fcc, peer) {
            Ok(sub) => sub,
            Err(refusal) => return self.refused(refusal),
        };
        let wait = Duration::from_millis(self.config.no_data_timeout_ms);
        let Some(first) = self.first_data_within(&sub.hub, wait).await else {
            self.registry.metrics.refuse("no_data");
            // The channel and the interface it joined on go to the log only: the interface
            // name is configuration, kept from clients as in `key_refused`.
            tracing::info!(
                channel = %sub.hub.key.channel(),
                interface = %sub.hub.key.group.interface,
                wait_ms = self.config.no_data_timeout_ms,
                "channel refused: no data in time"
            );
            let msg = format!(
                "no data from the channel within {} ms\n",
                self.config.no_data_timeout_ms
            );
            return text(StatusCode::GATEWAY_TIMEOUT, &msg);
        };
        self.stream_from(sub, first, false)
    }

    /// The response of a subscriber whose hub has published its first bytes; `from_start`:
    /// from the oldest byte held (a viewer that owns its hub) rather than a burst start point.
    fn stream_from(
        &self,
        sub: registry::Subscription,
        first: Published,
        from_start: bool,
    ) -> Response<Body> {
        // Placed under the ring lock, so the hub cannot release the start point between
        // choosing it and the subscriber starting to hold it.
        let start = {
            let ring = registry::lock(&sub.hub.ring);
            let start = if from_start {
                ring::Position {
                    index: ring.base(),
                    offset: 0,
                }
            } else {
                ring.start(first.end, self.config.burst_bytes)
            };
            sub.client
                .position
                .store(start.index, std::sync::atomic::Ordering::Release);
            start
        };
        let reader = subscriber::Reader::new(
            sub,
            start,
            self.config.slow_subscriber,
            self.config.burst_bytes,
        );
        stream_response(body::boxed(http_body_util::StreamBody::new(
            reader.into_stream(),
        )))
    }

    fn hub_key(
        &self,
        req: &http::request::Parts,
    ) -> Result<(HubKey, Option<fcc::FccTarget>), KeyError> {
        self.hub_key_of(req.uri.path(), req.uri.query())
    }

    /// The answer to a channel request that has no hub key.
    fn key_refused(&self, e: KeyError) -> Response<Body> {
        match e {
            KeyError::Bad(reason) => {
                self.registry.metrics.refuse("bad_request");
                text(StatusCode::BAD_REQUEST, &format!("{reason}\n"))
            }
            KeyError::Unavailable(detail) => {
                tracing::warn!(error = %detail, "channel refused: its interface is missing");
                self.registry.metrics.refuse("interface_unavailable");
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the channel's network interface is unavailable\n",
                )
            }
        }
    }

    /// The hub key of a `/rtp/` or `/udp/` channel path and its query.
    fn hub_key_of(
        &self,
        path: &str,
        query: Option<&str>,
    ) -> Result<(HubKey, Option<fcc::FccTarget>), KeyError> {
        let ch = url::parse_channel(path, query).map_err(|e| e.to_string())?;
        let interface = match (ch.interface, &self.config.interface) {
            (Some(_), _) if !self.config.allow_iface_param => {
                return Err("choosing the interface per request is disabled".into())
            }
            (Some(name), _) if !self.interface_allowed(&name) => {
                return Err(format!(
                    "interface {name:?} is not one this gateway serves: name it in \
                     iptv.interface or iptv.interfaces"
                )
                .into())
            }
            (Some(name), _) => name,
            (None, Some(name)) => name.clone(),
            (None, None) => {
                return Err("no interface: add ?iface=NAME or set iptv.interface".into())
            }
        };
        if url::is_control_group(ch.group)
            && !self
                .config
                .allow_groups
                .iter()
                .any(|n| n.contains(&ch.group))
        {
            return Err(format!(
                "group {} carries the network's own control traffic: list it in \
                 iptv.allow_groups to serve it",
                ch.group
            )
            .into());
        }
        // Only a configured name gets here: one that is missing is the server's fault.
        crate::net::multicast::interface_index(&interface)
            .map_err(|e| KeyError::Unavailable(e.to_string()))?;
        let fcc = match ch.fcc {
            Some((server, flavor)) => {
                let interface = match (ch.fcc_interface, &self.config.fcc.interface) {
                    (Some(_), _) if !self.config.allow_iface_param => {
                        return Err("choosing the interface per request is disabled".into())
                    }
                    (Some(name), _) if !self.interface_allowed(&name) => {
                        return Err(format!(
                            "r2h-ifname-fcc: interface {name:?} is not one this gateway serves"
                        )
                        .into())
                    }
                    (Some(name), _) => Some(name),
                    (None, configured) => configured.clone(),
                };
                if let Some(name) = &interface {
                    crate::net::multicast::interface_index(name)
                        .map_err(|e| KeyError::Unavailable(format!("r2h-ifname-fcc: {e}")))?;
                }
                fcc::check_server(*server.ip(), &self.config.fcc.servers).map_err(|class| {
                    format!(
                        "fcc={server}: a {class} address; list its network in iptv.fcc.servers \
                         to use it"
                    )
                })?;
                Some(fcc::FccTarget {
                    server,
                    flavor,
                    interface,
                    servers: self.config.fcc.servers.clone().into(),
                })
            }
            None => None,
        };
        let key = HubKey {
            rtsp: None,
            // The FCC server is part of the key: its burst is what the hub's first viewers
            // get, so only requests naming the same server may share the hub.
            extras: hub::Extras::new(ch.fec, ch.fcc),
            mode: ch.mode,
            group: crate::net::multicast::Group {
                group: ch.group,
                port: ch.port,
                source: ch.source,
                interface,
            },
        };
        Ok((key, fcc))
    }

    /// Whether a request may name interface `name`: a configured one only.
    fn interface_allowed(&self, name: &str) -> bool {
        let c = &self.config;
        c.interface.as_deref() == Some(name)
            || c.fcc.interface.as_deref() == Some(name)
            || c.interfaces.iter().any(|i| i == name)
    }

    /// Waits for the hub's first published bytes; `None` on timeout or if the hub ended.
    async fn first_data_within(&self, hub: &hub::Hub, wait: Duration) -> Option<Published> {
        let mut rx = hub.published.subscribe();
        let ready = tokio::time::timeout(wait, rx.wait_for(|p| p.end > 0 || p.closed)).await;
        match ready {
            Ok(Ok(p)) if p.end > 0 => Some(*p),
            _ => None,
        }
    }

    fn refused(&self, refusal: Refusal) -> Response<Body> {
        let (status, reason) = match &refusal {
            Refusal::Subscribers(_) => (StatusCode::SERVICE_UNAVAILABLE, "max_subscribers"),
            Refusal::Hubs(_) => (StatusCode::SERVICE_UNAVAILABLE, "max_channels"),
            Refusal::PerHub(_) => (StatusCode::TOO_MANY_REQUESTS, "max_per_channel"),
            Refusal::PerClient(_) => (StatusCode::TOO_MANY_REQUESTS, "max_per_client"),
            Refusal::Join(_) => (StatusCode::BAD_GATEWAY, "join_failed"),
        };
        self.registry.metrics.refuse(reason);
        tracing::debug!(%refusal, "channel request refused");
        let mut resp = text(status, &format!("{refusal}\n"));
        if let Some(secs) = refusal.retry_after() {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
        resp
    }
}

/// Why a channel path has no hub key.
#[derive(Debug)]
enum KeyError {
    /// The request is wrong: a 400 that says why.
    Bad(String),
    /// A configured interface is not there now (a PPPoE link redialling, a VLAN being
    /// recreated): the server's fault, a 503. Its name is configuration: the log has it, the
    /// client does not.
    Unavailable(String),
}

impl From<String> for KeyError {
    fn from(reason: String) -> Self {
        KeyError::Bad(reason)
    }
}

impl From<&str> for KeyError {
    fn from(reason: &str) -> Self {
        KeyError::Bad(reason.to_string())
    }
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyError::Bad(reason) | KeyError::Unavailable(reason) => f.write_str(reason),
        }
    }
}

/// `?name=1` (or `true`, `yes`) → `Some(true)`, `?name=0` (or anything else) → `Some(false)`.
fn query_flag(query: Option<&str>, name: &str) -> Option<bool> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, "1"));
        (k == name).then_some(matches!(v, "1" | "true" | "yes" | ""))
    })
}

fn stream_response(b: Body) -> Response<Body> {
    let mut resp = Response::new(b);
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, "video/mp2t".parse().unwrap());
    h.insert(header::CACHE_CONTROL, "no-cache, no-store".parse().unwrap());
    resp
}

fn respond(
    status: StatusCode,
    content_type: &'static str,
    b: impl Into<bytes::Bytes>,
) -> Response<Body> {
    let mut resp = Response::new(body::full(b));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    resp
}

fn text(status: StatusCode, msg: &str) -> Response<Body> {
    respond(status, "text/plain; charset=utf-8", msg.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_zero_guide_fetch_timeout_is_refused_by_name() {
        let ok = super::IptvConfig::default();
        assert!(ok.validate().is_ok());
        let zero = super::IptvConfig {
            epg_fetch_timeout_secs: 0,
            ..super::IptvConfig::default()
        };
        let err = zero.validate().unwrap_err().to_string();
        assert!(err.contains("epg_fetch_timeout_secs"), "{err}");
    }

    /// Sizes that allocate (`max_datagram_bytes`), a window cut short unsaid (`reorder_window`)
    /// and a product that wraps (`4 × write_batch_bytes`) are refused by name.
    #[test]
    fn sizes_past_what_can_be_used_are_refused_by_name() {
        let with = |f: fn(&mut super::IptvConfig)| {
            let mut c = super::IptvConfig::default();
            f(&mut c);
            c.validate().map_err(|e| e.to_string())
        };
        let err = with(|c| c.max_datagram_bytes = 65_536).unwrap_err();
        assert!(
            err.contains("max_datagram_bytes") && err.contains("65535"),
            "{err}"
        );
        with(|c| c.max_datagram_bytes = 65_535).unwrap();
        let err = with(|c| c.max_datagram_bytes = usize::MAX / 32 + 1).unwrap_err();
        assert!(err.contains("max_datagram_bytes"), "{err}");
        let err = with(|c| c.reorder_window = 4097).unwrap_err();
        assert!(err.contains("reorder_window"), "{err}");
        with(|c| c.reorder_window = 4096).unwrap();
        // 4 × (2^62 + 1) wraps to 4: a 4 MiB buffer passed.
        let err = with(|c| c.write_batch_bytes = (1 << (usize::BITS - 2)) + 1).unwrap_err();
        assert!(err.contains("write_batch_bytes"), "{err}");
    }
}
