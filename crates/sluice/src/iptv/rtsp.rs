//! `/rtsp/…`: RTSP sessions relayed as MPEG-TS over HTTP through the same hubs as multicast
//! channels. One upstream session per URL is shared by every viewer of it (live); a catch-up
//! request (`playseek`, `tvdr`, `r2h-start`) gets a session of its own, since each viewer
//! wants the recording from its own start.
//!
//! # Layout
//! - `request`: the `/rtsp/` URL and catch-up parameters → upstream URL, `Range`, transport.
//! - `session`: the RTSP client (DESCRIBE, SETUP, PLAY, keep-alive, TEARDOWN, redirects,
//!   Basic/Digest) and its packet sources (TCP-interleaved or UDP).
//! - `pump`: the hub task that runs a session and feeds the hub's pump.

pub mod pump;
pub mod request;
pub mod session;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{header, Method, Response, StatusCode};

use super::hub::{Hub, HubKey};
use super::registry::Refusal;
use super::Iptv;
use crate::body::{self, Body};
use crate::upstream::{ConnectError, Upstream};

/// Placeholder group of an RTSP hub's key: RTSP hubs are told apart by `HubKey::rtsp`.
pub const NO_GROUP: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);

/// How RTP reaches the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportMode {
    /// Interleaved on the RTSP connection: one TCP connection, works through NAT.
    Tcp,
    /// RTP on a pair of UDP ports the gateway binds for the session.
    Udp,
}

/// Where catch-up times go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SeekMode {
    /// RTSP `Range: clock=begin-end` on PLAY; the parameter leaves the URL.
    Range,
    /// The parameter stays in the URL, zone applied and offset added, in its own format.
    Passthrough,
}

/// `[iptv.rtsp]` in the config file.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RtspConfig {
    /// Serve `/rtsp/` at all.
    pub enabled: bool,
    /// Default transport; `?r2h-rtsp-transport=tcp|udp` picks per request.
    pub transport: TransportMode,
    /// RTSP sessions open at once (shared live sessions count once); beyond it 503.
    pub max_sessions: usize,
    /// Longest wait for any one step: connecting, or the answer to one request.
    pub timeout_ms: u64,
    /// Longest the whole setup (redirects, auth, DESCRIBE, SETUP, PLAY) may take.
    pub setup_timeout_ms: u64,
    /// Keep-alive period; 0 = half the session timeout the server announces (60 s if none).
    pub keepalive_secs: u64,
    /// Redirects (3xx with `Location`) followed before giving up.
    pub max_redirects: usize,
    /// Query parameters read as catch-up ranges, in order (`r2h-seek-name` adds one per request).
    pub seek_params: Vec<String>,
    /// `range` (the RTSP way) or `passthrough`; `?r2h-seek-mode=` picks per request.
    pub seek_mode: SeekMode,
    /// `User-Agent` sent to RTSP servers (some IPTV servers only answer set-top boxes).
    pub user_agent: String,
    /// The `catchup-source` query written into `/playlist.m3u` for RTSP entries that have none
    /// (`{base}/rtsp/…?{this}`); players fill in the `${(b)…}`/`${(e)…}` placeholders.
    pub catchup_query: String,
}

crate::section::config_section!(RtspConfig {
    enabled,
    transport,
    max_sessions,
    timeout_ms,
    setup_timeout_ms,
    keepalive_secs,
    max_redirects,
    seek_params,
    seek_mode,
    user_agent,
    catchup_query,
});

impl Default for RtspConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            transport: TransportMode::Tcp,
            max_sessions: 16,
            timeout_ms: 5_000,
            setup_timeout_ms: 15_000,
            keepalive_secs: 0,
            max_redirects: 5,
            seek_params: vec!["playseek".into(), "tvdr".into()],
            seek_mode: SeekMode::Range,
            user_agent: format!("sluice/{}", env!("CARGO_PKG_VERSION")),
            catchup_query: "playseek=${(b)yyyyMMddHHmmss}-${(e)yyyyMMddHHmmss}".into(),
        }
    }
}

impl RtspConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.timeout_ms < 100 || self.setup_timeout_ms < self.timeout_ms {
            return Err(
                "timeout_ms must be at least 100 and setup_timeout_ms at least timeout_ms".into(),
            );
        }
        if self
            .seek_params
            .iter()
            .any(|p| p.is_empty() || p.contains(['&', '=']))
        {
            return Err("seek_params must be query parameter names".into());
        }
        if self.user_agent.is_empty() || self.user_agent.contains(['\r', '\n']) {
            return Err("user_agent must be one non-empty line".into());
        }
        if self.catchup_query.contains(['\r', '\n', '"']) {
            return Err("catchup_query must not contain quotes or line breaks".into());
        }
        Ok(())
    }
}

/// TEARDOWNs in flight at once, for the whole gateway. Each holds a connection (and a task)
/// for up to `timeout_ms` after its session has given its place back, so without a bound a
/// client zapping through the channels of a server that never answers TEARDOWN left one open
/// connection per zap, as many as it could zap. Past the bound the connection is only closed:
/// the server notices and ends the session itself, as it must for any client that vanishes.
/// Sixteen covers any real burst of zapping (one TEARDOWN per channel left, most answered in
/// milliseconds) while bounding what a silent server can hold to sixteen connections.
pub const MAX_TEARDOWNS: usize = 16;

/// Of `MAX_TEARDOWNS`, the most one server (by IP address, IPv6 by /64, whatever its ports)
/// holds: a client zapping through a silent server would otherwise hold them all, and the
/// sessions other clients leave on servers that answer (over UDP, where the server sees no
/// connection close) would never be torn down.
pub const MAX_TEARDOWNS_PER_SERVER: usize = 4;

/// What every RTSP hub of this gateway shares.
pub struct Context {
    pub config: RtspConfig,
    pub upstream: Upstream,
    /// Sessions open now.
    pub sessions: AtomicUsize,
    next_private: AtomicU64,
    /// Places for TEARDOWNs in flight (`MAX_TEARDOWNS`).
    teardowns: tokio::sync::Semaphore,
    /// TEARDOWNs in flight by server (at most `MAX_TEARDOWNS_PER_SERVER` each).
    teardowns_by_server: Mutex<HashMap<std::net::IpAddr, usize>>,
    /// Hubs whose session failed before any data, for the viewers waiting on them. Only
    /// the fact is kept; the reason went to the log, and viewers get [`FAILED`] whatever it was.
    failures: Mutex<Failures>,
}

/// How long a failure is kept for the viewers waiting on its hub (they wait at most
/// `setup_timeout_ms + no_data_timeout_ms` after it, and ask as soon as they wake).
const FAILURE_KEPT: Duration = Duration::from_secs(60);

/// Failures kept at most, whatever their age: past it the oldest leaves. Failures come at the
/// rate clients start setups that fail, which their start rates bound only per client, so a
/// minute of them had no bound (each a map entry and a queue entry). A failure is read by
/// its viewers as soon as they wake, just after it is recorded, so only a burst of 4,096
/// others in between could turn a viewer's `502` into the `504` of no data.
const FAILURES_MAX: usize = 4096;

/// Hubs whose session failed: each by its address and creation time (which tells it apart from
/// a later hub at the same address), and the same in the order they failed, so that those
/// older than `FAILURE_KEPT` leave from the front. Before, each failure looked over every
/// failure of the last minute under the lock: quadratic in the failure rate, which a client
/// sets (any path of a server that refuses it, or of none).
#[derive(Debug, Default)]
struct Failures {
    by_hub: HashMap<usize, tokio::time::Instant>,
    /// `(failed at, hub, created)`, oldest first.
    order: VecDeque<(tokio::time::Instant, usize, tokio::time::Instant)>,
    /// Entries looked at to drop the old ones, over the whole life (the tests' measure of work).
    #[cfg(test)]
    looked_at: u64,
}

impl Failures {
    /// Records the failure at `now` of the hub `id` created at `created`, after dropping the
    /// failures older than `FAILURE_KEPT`, and the oldest past `FAILURES_MAX`: only those,
    /// and the first one kept, are looked at.
    fn record(&mut self, id: usize, created: tokio::time::Instant, now: tokio::time::Instant) {
        while let Some(&(failed, _, _)) = self.order.front() {
            #[cfg(test)]
            {
                self.looked_at += 1;
            }
            let full = self.order.len() >= FAILURES_MAX;
            if !full && now.saturating_duration_since(failed) < FAILURE_KEPT {
                break;
            }
            self.drop_oldest();
        }
        self.by_hub.insert(id, created);
        self.order.push_back((now, id, created));
    }

    /// Drops the oldest failure, and its hub's entry unless a later failure replaced it.
    fn drop_oldest(&mut self) {
        if let Some((_, old, old_created)) = self.order.pop_front() {
            // A later hub at the same address may have failed since: its entry stays.
            if self.by_hub.get(&old) == Some(&old_created) {
                self.by_hub.remove(&old);
            }
        }
    }

    /// Whether the hub `id` created at `created` failed (in the last `FAILURE_KEPT`, or since).
    fn failed(&self, id: usize, created: tokio::time::Instant) -> bool {
        self.by_hub.get(&id) == Some(&created)
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("config", &self.config)
            .field("sessions", &self.sessions)
            .finish_non_exhaustive()
    }
}

/// A TEARDOWN's place: one of the gateway's and one of its server's, given back on drop.
struct TeardownPlace<'a> {
    ctx: &'a Context,
    server: std::net::IpAddr,
    _place: tokio::sync::SemaphorePermit<'a>,
}

impl Drop for TeardownPlace<'_> {
    fn drop(&mut self) {
        let mut by_server = super::registry::lock(&self.ctx.teardowns_by_server);
        if let Some(n) = by_server.get_mut(&self.server) {
            *n -= 1;
            if *n == 0 {
                by_server.remove(&self.server);
            }
        }
    }
}

impl Context {
    /// A place for a TEARDOWN to `server`, when the gateway and that server have one free.
    fn teardown_place(&self, server: std::net::SocketAddr) -> Option<TeardownPlace<'_>> {
        // One host on many ports is one server, and so is one IPv6 /64 (as for every
        // per-address share).
        let server = crate::net::per_ip::network_of(server.ip());
        let place = self.teardowns.try_acquire().ok()?;
        let mut by_server = super::registry::lock(&self.teardowns_by_server);
        let n = by_server.entry(server).or_insert(0);
        if *n >= MAX_TEARDOWNS_PER_SERVER {
            return None;
        }
        *n += 1;
        Some(TeardownPlace {
            ctx: self,
            server,
            _place: place,
        })
    }

    pub fn new(config: RtspConfig, upstream: Upstream) -> Arc<Self> {
        Arc::new(Self {
            config,
            upstream,
            sessions: AtomicUsize::new(0),
            next_private: AtomicU64::new(1),
            teardowns: tokio::sync::Semaphore::new(MAX_TEARDOWNS),
            teardowns_by_server: Mutex::new(HashMap::new()),
            failures: Mutex::new(Failures::default()),
        })
    }

    /// Records that `hub`'s session failed; entries nobody came for are dropped after a
    /// minute. The reason is the caller's to log: a server's words, up to a whole answer's
    /// worth per failure, are not worth a minute of memory when readers only ask whether.
    pub fn fail(&self, hub: &Hub) {
        let mut failures = super::registry::lock(&self.failures);
        // Read under the lock: read before it, a failure that waited for the lock could be
        // queued behind a later one, out of the order `Failures::record` drops them in.
        let now = tokio::time::Instant::now();
        failures.record(hub_id(hub), hub.created, now);
    }

    /// What viewers are told of `hub`'s failure ([`FAILED`]), if its session failed.
    fn failure(&self, hub: &Hub) -> Option<&'static str> {
        let failures = super::registry::lock(&self.failures);
        // The address alone could be a later hub's: the creation time tells them apart.
        failures.failed(hub_id(hub), hub.created).then_some(FAILED)
    }
}

fn hub_id(hub: &Hub) -> usize {
    std::ptr::from_ref(hub) as usize
}

/// The RTSP part of a hub key: equal keys share one session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RtspKey {
    pub target: request::Target,
    /// Non-zero for a session that must not be shared (catch-up).
    pub private: u64,
}

/// Characters of an RTSP path a label keeps; a longer path is cut there and named by a hash.
pub const LABEL_PATH_CHARS: usize = 96;

impl RtspKey {
    /// `rtsp://host:port/path` for logs, labels and the status page (no query: it may carry
    /// an operator's account parameters; no credentials). A metric label escapes it
    /// (`registry`, `metrics::label_value`). A path longer than `LABEL_PATH_CHARS` is cut
    /// there and followed by `...#` and 12 hex digits of its SHA-256: the client chooses the
    /// path, and before, a 60 KiB one was copied into 17 series (each rendered at every
    /// scrape, a new series per path on the operator's Prometheus) and into every log line
    /// of its session. The hash keeps channels apart and a channel's label the same across
    /// restarts; a path that fits is kept as given, so a recording's folder keeps its name.
    pub fn label(&self) -> String {
        let base = self.target.url.split('?').next().unwrap_or_default();
        let base = short_label(base);
        match self.private {
            0 => base,
            n => format!("{base} (catch-up #{n})"),
        }
    }
}

/// `url` (`rtsp://host:port/path`, no query) with its path cut to `LABEL_PATH_CHARS` and marked
/// by a hash of the whole path when longer. The host is a checked name or address (253 bytes
/// at most), so only the path needs cutting.
fn short_label(url: &str) -> String {
    let origin_end = url
        .strip_prefix("rtsp://")
        .and_then(|rest| rest.find('/'))
        .map_or(url.len(), |at| at + "rtsp://".len());
    let (origin, path) = url.split_at(origin_end);
    match path.char_indices().nth(LABEL_PATH_CHARS) {
        None => url.to_string(),
        Some((cut, _)) => {
            use sha2::Digest;
            let digest = sha2::Sha256::digest(path.as_bytes());
            let hash: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
            format!("{origin}{}...#{hash}", &path[..cut])
        }
    }
}

/// What a viewer is told of any RTSP failure before the first packet. The reason (name not
/// found, connection refused or timed out, the server's answer) is logged, never sent: told
/// apart, they made the gateway a port scanner and a map of the internal DNS.
pub(super) const FAILED: &str = "the RTSP server failed";

/// Marks the refusal of a new session beyond `max_sessions`.
#[derive(Debug, thiserror::Error)]
#[error("gateway is at its limit of {0} RTSP sessions")]
pub struct SessionLimit(pub usize);

impl Iptv {
    /// The hub key of an `/rtsp/` path (with the request's query and User-Agent); a catch-up
    /// range gets a private session id. Refused when RTSP is disabled or the URL is bad.
    pub(super) fn rtsp_key(
        &self,
        path: &str,
        req: &http::request::Parts,
    ) -> Result<HubKey, Box<Response<Body>>> {
        let ctx = &self.rtsp;
        if !ctx.config.enabled {
            return Err(Box::new(super::text(
                StatusCode::NOT_FOUND,
                "RTSP is disabled (iptv.rtsp.enabled)\n",
            )));
        }
        let ua = req
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok());
        let target = match request::parse(path, req.uri.query(), ua, &ctx.config) {
            Ok(t) => t,
            Err(e) => {
                self.registry.metrics.refuse("bad_request");
                return Err(Box::new(super::text(
                    StatusCode::BAD_REQUEST,
                    &format!("{e}\n"),
                )));
            }
        };
        let private = if target.seek {
            ctx.next_private.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        Ok(HubKey {
            mode: super::url::Mode::Rtp,
            group: crate::net::multicast::Group {
                group: NO_GROUP,
                port: target.port,
                source: None,
                interface: String::new(),
            },
            extras: None,
            rtsp: Some(RtspKey { target, private }),
        })
    }

    /// Why an RTSP hub's session failed, if it did.
    pub(super) fn rtsp_failure(&self, hub: &Hub) -> Option<&'static str> {
        self.rtsp.failure(hub)
    }

    /// The address guard's refusal of the key's server, answered as the media front end
    /// answers it (403, the class of the address, never the address); `None` when the guard
    /// lets it through or the name does not resolve now (the session finds that and reports
    /// it like any other failure). The session checks again, redirects included.
    async fn guard_refusal(&self, key: &HubKey) -> Option<Response<Body>> {
        let target = &key.rtsp.as_ref()?.target;
        let step = Duration::from_millis(self.rtsp.config.timeout_ms);
        let checked = self
            .rtsp
            .upstream
            .resolve_checked(&target.host, target.port);
        match tokio::time::timeout(step, checked).await {
            Ok(Err(e @ ConnectError::Refused { .. })) => {
                tracing::debug!(error = %e, "RTSP server refused by the address guard");
                self.registry.metrics.refuse("upstream_not_allowed");
                Some(super::text(StatusCode::FORBIDDEN, &format!("{e}\n")))
            }
            _ => None,
        }
    }

    /// `GET /rtsp/…`: auth has been checked by the server.
    pub(super) async fn rtsp(self: &Arc<Self>, req: &http::request::Parts) -> Response<Body> {
        let ctx = &self.rtsp;
        let key = match self.rtsp_key(req.uri.path(), req) {
            Ok(key) => key,
            Err(resp) => return *resp,
        };
        if req.method == Method::HEAD {
            return super::stream_response(body::empty());
        }
        let peer = req.extensions.get::<std::net::SocketAddr>().copied();
        // The client's own bounds (its share, its start rate) first: a request they refuse
        // must not make the gateway resolve a name the client chose, as the guard's check
        // below does. A new channel's start is taken now and kept when the guard refuses: the
        // lookup was made, and before, a refusal cost nothing (a client had names of its
        // choosing resolved at any rate). Let through, it is handed back, for `subscribe` to
        // check and spend again. A request dropped during the lookup keeps it spent too.
        let reserved = match self.registry.reserve_start(&key, peer) {
            Ok(reserved) => reserved,
            Err(refusal) => return self.refused(refusal),
        };
        if let Some(refused) = self.guard_refusal(&key).await {
            return refused;
        }
        if let Some(client) = reserved {
            self.registry.return_start(client);
        }
        let sub = match self.registry.subscribe(key, None, peer) {
            Ok(sub) => sub,
            Err(Refusal::Join(e))
                if e.get_ref().is_some_and(|inner| inner.is::<SessionLimit>()) =>
            {
                self.registry.metrics.refuse("max_rtsp_sessions");
                return super::text(StatusCode::SERVICE_UNAVAILABLE, &format!("{e}\n"));
            }
            Err(refusal) => return self.refused(refusal),
        };
        // Setup (redirects, auth, three requests) comes before the first packet.
        let wait =
            Duration::from_millis(ctx.config.setup_timeout_ms + self.config.no_data_timeout_ms);
        let Some(first) = self.first_data_within(&sub.hub, wait).await else {
            // The session logged its reason.
            return match ctx.failure(&sub.hub) {
                Some(_) => {
                    self.registry.metrics.refuse("rtsp_failed");
                    super::text(StatusCode::BAD_GATEWAY, &format!("{FAILED}\n"))
                }
                None => {
                    self.registry.metrics.refuse("no_data");
                    super::text(
                        StatusCode::GATEWAY_TIMEOUT,
                        "the RTSP server sent no data in time\n",
                    )
                }
            };
        };
        // A catch-up viewer owns its session: it gets the recording from its first byte.
        let private = sub.hub.key.rtsp.as_ref().is_some_and(|k| k.private != 0);
        self.stream_from(sub, first, private)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(path: &str, private: u64) -> RtspKey {
        let config = RtspConfig::default();
        let target = request::parse(
            &format!("/rtsp/u:p@tv.example:554{path}"),
            Some("token=secret"),
            None,
            &config,
        )
        .unwrap();
        RtspKey { target, private }
    }

    /// A client's long path gives a label of bounded length, the same for the same path,
    /// another for another path (even one that differs only past the cut), and never the
    /// credentials or the query. A path that fits is kept whole.
    #[test]
    fn a_long_path_gives_a_short_stable_label() {
        let long: String = (0..60 * 1024)
            .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
            .collect();
        let path = format!("/{long}");
        let label = key(&path, 0).label();
        let origin = "rtsp://tv.example:554";
        assert!(
            label.len() <= origin.len() + LABEL_PATH_CHARS + 16,
            "{} bytes",
            label.len()
        );
        assert!(
            label.starts_with(&format!("{origin}{}...#", &path[..LABEL_PATH_CHARS])),
            "{label}"
        );
        assert!(
            !label.contains("secret") && !label.contains("u:p") && !label.contains('?'),
            "{label}"
        );
        assert_eq!(key(&path, 0).label(), label, "not stable");
        // Differs only in its last character, long past the cut.
        let mut other = path.clone();
        other.pop();
        other.push('Z');
        let other_label = key(&other, 0).label();
        assert_ne!(other_label, label);
        assert_eq!(other_label.len(), label.len());
        // A path that fits is kept whole, up to the last character.
        assert_eq!(key("/a", 0).label(), "rtsp://tv.example:554/a");
        let exact = format!("/{}", "x".repeat(LABEL_PATH_CHARS - 1));
        assert_eq!(key(&exact, 0).label(), format!("{origin}{exact}"));
        // One past the cut: the first 96 characters, then the first 6 bytes of the SHA-256
        // of the whole path (`/` and 96 `x`), as `sha256sum` gives it.
        let over = format!("/{}", "x".repeat(LABEL_PATH_CHARS));
        assert_eq!(
            key(&over, 0).label(),
            format!(
                "{origin}/{}...#ceb5b5a18d1d",
                "x".repeat(LABEL_PATH_CHARS - 1)
            )
        );
        assert_eq!(key(&path, 3).label(), format!("{label} (catch-up #3)"));
    }

    /// Failures at a steady rate, 50 a second for 200 s (under `FAILURES_MAX` a minute): each
    /// looks at the one failure at the front it keeps (and those it drops), never the whole
    /// minute's. Before, each looked over every failure kept (up to 3,000 here): tens of
    /// millions of looks for these 10,000. The list holds the last minute's failures, and a
    /// later hub at a reused address keeps its own failure when the earlier one's leaves.
    #[test]
    fn failures_are_dropped_from_the_front_in_linear_work() {
        let start = tokio::time::Instant::now();
        let step = Duration::from_millis(20);
        let mut failures = Failures::default();
        let n = 10_000u32;
        for i in 0..n {
            failures.record(i as usize, start, start + step * i);
            assert!(
                failures.order.len() <= 3_001,
                "{} kept",
                failures.order.len()
            );
        }
        assert!(
            failures.looked_at <= 2 * u64::from(n),
            "{} entries looked at for {n} failures",
            failures.looked_at
        );
        assert_eq!(failures.order.len(), 3_000);
        assert_eq!(failures.by_hub.len(), 3_000);
        assert!(failures.failed(n as usize - 1, start));
        assert!(failures.failed(n as usize - 3_000, start));
        assert!(
            !failures.failed(n as usize - 3_001, start),
            "older than a minute"
        );
        assert!(!failures.failed(0, start));

        // The address of a hub that failed is reused by a later hub, which fails too.
        let mut failures = Failures::default();
        let (first, second) = (start, start + Duration::from_secs(30));
        failures.record(7, first, first);
        failures.record(7, second, second);
        assert!(failures.failed(7, second) && !failures.failed(7, first));
        // The first failure leaves; the second stays, a minute after its own failure.
        failures.record(8, second, first + FAILURE_KEPT);
        assert!(
            failures.failed(7, second),
            "the later hub's failure was dropped"
        );
        assert!(failures.failed(8, second));
        failures.record(9, second, second + FAILURE_KEPT);
        assert!(!failures.failed(7, second));
        assert!(failures.failed(8, second) && failures.failed(9, second));
        assert_eq!(failures.by_hub.len(), 2);
        assert_eq!(failures.order.len(), 2);
    }

    /// Failures faster than `FAILURES_MAX` a minute (a burst of 10,000 within a second, as
    /// clients failing setups at once can make): at most `FAILURES_MAX` are kept, the oldest
    /// leaving first, in linear work. Before, all 10,000 were kept for their minute. A hub's
    /// entry leaves with its own failure only, never with an earlier hub's at its address.
    #[test]
    fn failures_are_capped_oldest_first() {
        let start = tokio::time::Instant::now();
        let mut failures = Failures::default();
        let later = start + Duration::from_secs(1);
        // The address 7 fails first, then again as a later hub after 4,095 others.
        failures.record(7, start, start);
        for i in 0..FAILURES_MAX - 1 {
            failures.record(100_000 + i, start, start);
        }
        failures.record(7, later, later);
        assert!(
            failures.failed(7, later),
            "the later hub's failure was dropped"
        );
        assert!(!failures.failed(7, start));
        let n = 10_000usize;
        for i in 0..n {
            failures.record(i + 1_000, start, later);
            assert!(
                failures.order.len() <= FAILURES_MAX,
                "{} kept at failure {i}",
                failures.order.len()
            );
            assert!(failures.by_hub.len() <= failures.order.len());
            if i == FAILURES_MAX - 2 {
                // The later hub's failure is the oldest kept now, and the next one drops it.
                assert!(failures.failed(7, later));
            }
        }
        assert!(!failures.failed(7, later), "kept past the bound");
        assert_eq!(failures.order.len(), FAILURES_MAX);
        assert_eq!(failures.by_hub.len(), FAILURES_MAX);
        assert!(failures.failed(n - 1 + 1_000, start));
        assert!(failures.failed(n - FAILURES_MAX + 1_000, start));
        assert!(!failures.failed(n - FAILURES_MAX - 1 + 1_000, start));
        assert!(
            failures.looked_at <= 2 * (n + FAILURES_MAX) as u64,
            "{} entries looked at",
            failures.looked_at
        );
    }

    #[test]
    fn example_defaults_validate() {
        RtspConfig::default().validate().unwrap();
        let bad = RtspConfig {
            seek_params: vec!["a&b".into()],
            ..RtspConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
