//! `/hls/<channel>/index.m3u8` and its segments: every channel the gateway serves, as live HLS.
//!
//! One HLS channel per hub key, whatever the number of HLS viewers: it is a single subscriber
//! of the channel's hub (so raw-TS and HLS viewers share one join and one history), feeding one
//! [`Segmenter`] that cuts the stream at keyframes. Finished segments are kept in a short window
//! (`window` listed in the playlist, one more for players that loaded the previous playlist),
//! shared by every viewer without a copy. The channel has no connection to hold it: it stays
//! while requests come, and leaves its hub `linger_ms` plus three target durations after the
//! last one, after which the hub lingers as it does for any subscriber.
//!
//! # Layout
//! - `parts`: low-latency HLS (partial segments, blocking reloads).
//! - `fmp4`: the segments as fragmented MP4, for players that ask for it.
//! - `viewers`: HLS viewers, counted against `max_subscribers_per_channel`.
//! - `catchup`: the memory of catch-up channels and ended channels, within
//!   `catchup_total_bytes`.
//! - `render`: the playlist, written outside the window's lock, once per change (large ones
//!   on the blocking pool).
//! - `kept`: what all channels keep of their playlists, within `MAX_KEPT_TOTAL`, and the
//!   places for large writes.
//! - `sent`: what playlists of `CHARGED_BYTES` or more hold while their answers are sent,
//!   within `MAX_SENT_TOTAL` (a quarter of it per client) when no channel keeps them.

mod catchup;
mod fmp4;
mod kept;
mod parts;
mod render;
mod sent;
mod viewers;

pub use fmp4::Container;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use http::{header, Method, Response, StatusCode};
use sluice_media::segmenter::playlist::{self, Entry, Kind};
use sluice_media::segmenter::{Part, Segment, Segmenter, Settings, CLOCK};
use tokio::sync::watch;
use tokio::time::Instant;

use super::hub::{Hub, HubKey};
use super::registry::{self, Subscription};
use super::timeshift::{self, Recorder};
use super::{subscriber, Iptv, SlowPolicy};
use crate::body::{self, Body};

/// `[iptv.hls]` in the config file.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HlsConfig {
    /// Serve `/hls/` at all.
    pub enabled: bool,
    /// Segment target duration, in seconds: segments are cut at the keyframes that keep them
    /// within it (at a plain picture when a GOP is longer).
    pub target_duration_secs: u64,
    /// Segments listed in the playlist.
    pub window: usize,
    /// `/playlist.m3u` lists HLS URLs (`/hls/…/index.m3u8`) instead of raw TS ones;
    /// `?hls=1` or `?hls=0` on the request overrides it.
    pub playlist: bool,
    /// Low-latency HLS: partial segments of at most this many milliseconds, preload hints
    /// and blocking reloads; 0 turns it off.
    pub part_target_ms: u64,
    /// An RTSP catch-up session keeps every segment (an EVENT playlist, then VOD once the
    /// programme has been received) up to this many bytes; beyond it the oldest go and the
    /// playlist slides like a live one.
    pub catchup_max_bytes: u64,
    /// All catch-up channels, and all channels whose source ended (kept while their viewers
    /// ask), together hold at most this many bytes of segments (TS and fMP4): past it the
    /// ended ones idle longest are dropped first, then a programme still arriving loses its
    /// oldest segments (as with `catchup_max_bytes`).
    pub catchup_total_bytes: u64,
    /// A running live channel's window (the segments its playlist lists and one more, with
    /// their fMP4 rewrites) holds at most this many bytes: past it the oldest go, and the
    /// playlist lists fewer. A sender without usable timestamps gets segments of up to 32 MiB
    /// each; without this bound that was 160 MiB per channel and more with fMP4.
    pub live_window_max_bytes: u64,
    /// Segments as `ts` (MPEG-TS, as the channel carries it) or `fmp4` (fragmented MP4 with
    /// an init segment); `?container=ts` or `?container=fmp4` on the playlist overrides it.
    pub container: Container,
}

crate::section::config_section!(HlsConfig {
    enabled,
    target_duration_secs,
    window,
    playlist,
    part_target_ms,
    catchup_max_bytes,
    catchup_total_bytes,
    live_window_max_bytes,
    container,
});

impl Default for HlsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            target_duration_secs: 4,
            window: 4,
            playlist: false,
            part_target_ms: 0,
            catchup_max_bytes: 256 << 20,
            catchup_total_bytes: 512 << 20,
            live_window_max_bytes: 128 << 20,
            container: Container::Ts,
        }
    }
}

impl HlsConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=30).contains(&self.target_duration_secs) {
            return Err("target_duration_secs must be 1 to 30".into());
        }
        if !(2..=30).contains(&self.window) {
            return Err("window must be 2 to 30".into());
        }
        if self.live_window_max_bytes < 1 << 20 {
            return Err("live_window_max_bytes must be at least 1048576 (1 MiB)".into());
        }
        let part = self.part_target_ms;
        if part != 0 && !(100..self.target_duration_secs * 1000).contains(&part) {
            return Err(
                "part_target_ms must be 0 (off) or from 100 to below target_duration_secs".into(),
            );
        }
        Ok(())
    }
}

/// A catch-up programme stays this long after its last request (a player may pause).
const CATCHUP_IDLE: Duration = Duration::from_secs(300);

/// A segment bigger than this (a stream without usable timestamps) is cut as a gap.
const MAX_SEGMENT_BYTES: usize = 32 << 20;

/// Most segments a catch-up window keeps, whatever their size: a source jumping its timestamps
/// all the time gets a segment at each jump, and every playlist request lists them all. 20,000
/// is 22 hours of 4-second segments (any programme), and a playlist of about 2 MB plus the
/// query on each line (at most [`MAX_QUERY_BYTES`]).
const CATCHUP_MAX_SEGMENTS: usize = 20_000;

/// Longest query an HLS request may carry once the player's directives are taken out: it is
/// written on every segment line (a channel's options and a token take a few hundred bytes).
const MAX_QUERY_BYTES: usize = 2048;

/// Why an HLS channel could not start.
#[derive(Debug, Clone)]
struct Failure {
    status: StatusCode,
    reason: String,
}

/// When a request for an ended channel starts it again rather than showing it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restart {
    /// Never: a segment request is answered from the ended channel's last segments.
    Never,
    /// A playlist request: a live channel (not a catch-up session) ended longer ago than it
    /// would have stayed without a request (`linger_ms` plus three target durations) starts
    /// again. Polled more often than that, an ended channel was shown ended to every viewer
    /// for as long as anyone polled, even once its source sent again.
    Stale,
    /// At once (the timeshift supervisor).
    Ended,
}

/// The segments of one channel, as the playlist shows them.
#[derive(Debug, Default)]
struct Window {
    segments: VecDeque<(u64, Segment)>,
    /// Sequence number the next segment gets.
    next: u64,
    /// Discontinuities that have left the window.
    discontinuities_gone: u64,
    ended: bool,
    /// When the channel ended: a live one ended longer ago is started again on a playlist
    /// request ([`Restart::Stale`]).
    ended_at: Option<Instant>,
    failure: Option<Failure>,
    /// The first segment follows a break in the timeshift recording (a restarted channel).
    restarted: bool,
    /// Low-latency HLS: parts and wall clock.
    held: parts::Held,
    /// Bytes of the segments held, and the length (90 kHz) of those that left the window.
    bytes: u64,
    gone_ticks: u64,
    /// A catch-up window lost its oldest segments (to `catchup_max_bytes`).
    trimmed: bool,
    /// Bumped at every change of what the playlist shows.
    version: u64,
    /// What the playlist of this version lists, once a request took it.
    listing: Option<render::KeptListing>,
}

impl Window {
    /// Segment `n`, when held. By binary search (sequences ascend): a catch-up window holds up
    /// to `CATCHUP_MAX_SEGMENTS`, and its lock is held meanwhile (the segmenter storing the
    /// next segment waits on it).
    fn segment(&self, n: u64) -> Option<&Segment> {
        let i = self
            .segments
            .binary_search_by(|(seq, _)| {
                #[cfg(test)]
                tests::PROBES.with(|p| p.set(p.get() + 1));
                seq.cmp(&n)
            })
            .ok()?;
        self.segments.get(i).map(|(_, s)| s)
    }
}

/// One channel's segmenter output, shared by its HLS viewers.
#[derive(Debug)]
pub struct Channel {
    key: HubKey,
    window: Mutex<Window>,
    /// Bumped whenever the window changes, for requests that wait for a segment.
    changed: watch::Sender<u64>,
    touched: Mutex<Instant>,
    /// Present for a timeshift channel: its disk window.
    recorder: Option<Arc<Recorder>>,
    /// An RTSP catch-up session: where its range begins (Unix ms).
    catchup: Option<i64>,
    /// The channel's hub, and the HLS viewers counted on it. `None` once the channel ended:
    /// its last segments are all an ended channel needs, and the hub's ring goes with the hub.
    hub: Mutex<Option<Arc<Hub>>>,
    viewers: viewers::Viewers,
    /// Its segments as fMP4, once a viewer asks for them (shared with an fMP4 playlist
    /// written on the blocking pool).
    fmp4: Arc<fmp4::Converted>,
    /// Its last playlist (TS or fMP4).
    rendered: render::Rendered,
    /// A timeshift channel's last whole-window playlist.
    timeshift: render::TimeshiftMemo,
    /// A timeshift channel: the beginnings (Unix ms) of the catch-up ranges it answered from
    /// the window, the last [`RANGES_KEPT`]: a player reloads such a range after its start has
    /// left the window, and gets the rest of it (a range never answered, however recent its
    /// start, is still refused when it begins before the window).
    ranges: Mutex<VecDeque<i64>>,
}

/// Catch-up range beginnings a timeshift channel remembers ([`Channel::ranges`]): 8 bytes each.
const RANGES_KEPT: usize = 256;

impl Channel {
    fn touch(&self) {
        *registry::lock(&self.touched) = Instant::now();
    }

    fn idle(&self) -> Duration {
        registry::lock(&self.touched).elapsed()
    }

    /// Bytes of the segments held (TS and fMP4), and whether the channel has ended.
    fn held(&self) -> (u64, bool) {
        // Neither lock is held long: the fMP4 bytes are read without the fMP4 state's lock
        // (its rewrite runs outside it, on the blocking pool).
        let (bytes, ended) = {
            let w = registry::lock(&self.window);
            (w.bytes, w.ended)
        };
        (bytes + self.fmp4.bytes(), ended)
    }

    /// The channel's hub, while the channel runs.
    fn hub(&self) -> Option<Arc<Hub>> {
        registry::lock(&self.hub).clone()
    }

    /// Starts rewriting the channel's segments as fMP4 (once), beginning with those held.
    fn want_fmp4(&self) {
        self.fmp4.want(|| {
            let w = registry::lock(&self.window);
            let oldest = w.segments.front().map_or(0, |(seq, _)| *seq);
            (w.segments.iter().cloned().collect(), oldest)
        });
    }

    /// Adds finished parts and segments to the window (`anchor`: the newest timestamp and
    /// when it arrived); returns the segments with their sequence numbers.
    fn store(
        &self,
        parts: Vec<Part>,
        segments: Vec<Segment>,
        (keep, max_bytes): (usize, u64),
        anchor: Option<(u64, i64)>,
    ) -> Vec<(u64, Segment)> {
        if segments.is_empty() && parts.is_empty() {
            return Vec::new();
        }
        // Segments rewritten as fMP4 are held twice: each TS byte counts for two (an fMP4
        // fragment is about the size of its TS segment, a little less without packet headers).
        let weight = if self.fmp4.wanted() { 2 } else { 1 };
        let mut w = registry::lock(&self.window);
        w.held.add(parts);
        let mut stored = Vec::with_capacity(segments.len());
        for mut s in segments {
            let seq = w.next;
            w.next += 1;
            w.held.complete(s.number, seq, wall_start(&s, anchor), keep);
            s.discontinuity |= std::mem::take(&mut w.restarted);
            stored.push((seq, s.clone()));
            w.bytes += s.data.len() as u64;
            w.segments.push_back((seq, s));
        }
        while w.segments.len() > keep
            || (w.bytes.saturating_mul(weight) > max_bytes && w.segments.len() > 1)
        {
            // A catch-up window no longer starts where its programme does (a live one's
            // `trimmed` is never read).
            w.trimmed = true;
            if let Some((_, gone)) = w.segments.pop_front() {
                w.discontinuities_gone += u64::from(gone.discontinuity);
                w.bytes -= gone.data.len() as u64;
                w.gone_ticks += gone.duration;
            }
        }
        let oldest = w.segments.front().map_or(0, |(seq, _)| *seq);
        // What the window holds per segment goes with its segment.
        w.held.forget_before(oldest);
        w.changed();
        drop(w);
        self.fmp4.add(&stored, oldest);
        // Parts change the playlist too: every change wakes the requests waiting for one.
        self.changed.send_modify(|n| *n += 1);
        stored
    }

    fn end(&self, failure: Option<Failure>) {
        let mut w = registry::lock(&self.window);
        w.ended = true;
        w.ended_at.get_or_insert_with(Instant::now);
        if w.failure.is_none() {
            w.failure = failure;
        }
        w.changed();
        drop(w);
        self.changed.send_modify(|n| *n += 0);
    }
}

/// Live HLS channels by hub key.
#[derive(Debug, Default)]
pub struct Table {
    channels: Mutex<HashMap<HubKey, Arc<Channel>>>,
    /// What every channel's playlists share (`kept::MAX_KEPT_TOTAL`, the large writes).
    render: Arc<kept::Shared>,
    /// What the playlists answers send hold (`sent::MAX_SENT_TOTAL`).
    sent: Arc<sent::Sent>,
}

impl Table {
    /// HLS channels running now.
    pub fn len(&self) -> usize {
        registry::lock(&self.channels).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What an `/hls/` path asks for.
#[derive(Debug, PartialEq, Eq)]
enum File {
    Playlist,
    Segment(u64),
    /// Part `.1` of segment `.0` (low-latency HLS).
    Part(u64, u32),
    /// Segment `.0` as fMP4 (`<n>.m4s`).
    Fragment(u64),
    /// fMP4 init segment number `.0` (`init-<n>.mp4`).
    Init(u64),
}

/// Splits `/hls/<channel path>/<file>` into the channel's own path and the file.
fn split(path: &str) -> Option<(&str, File)> {
    let rest = path.strip_prefix("/hls")?;
    let (channel, file) = rest.rsplit_once('/')?;
    let file = match file {
        "index.m3u8" => File::Playlist,
        f if f.ends_with(".m4s") => File::Fragment(f.strip_suffix(".m4s")?.parse().ok()?),
        f if f.starts_with("init-") => File::Init(
            f.strip_prefix("init-")?
                .strip_suffix(".mp4")?
                .parse()
                .ok()?,
        ),
        f => {
            let name = f.strip_suffix(".ts")?;
            match name.split_once('.') {
                Some((seq, part)) => File::Part(seq.parse().ok()?, part.parse().ok()?),
                None => File::Segment(name.parse().ok()?),
            }
        }
    };
    (channel.len() > 1).then_some((channel, file))
}

impl Iptv {
    /// `GET /hls/…`: auth has been checked by the server.
    pub(super) async fn hls(self: &Arc<Self>, req: &http::request::Parts) -> Response<Body> {
        let config = &self.config.hls;
        if !config.enabled {
            return super::text(
                StatusCode::NOT_FOUND,
                "HLS is disabled (iptv.hls.enabled)\n",
            );
        }
        let Some((channel_path, file)) = split(req.uri.path()) else {
            return super::text(
                StatusCode::NOT_FOUND,
                "HLS paths are /hls/<channel>/index.m3u8, /hls/<channel>/<n>.ts, <n>.m4s and init-<n>.mp4\n",
            );
        };
        // The delivery directives are the player's, not the channel's: the hub key, the
        // RTSP URL and the segment URIs are made without them.
        // So is the container: TS and fMP4 viewers share the channel.
        let directives = parts::directives(req.uri.query().unwrap_or(""))
            .and_then(|(query, block)| Ok((fmp4::container(&query, config.container)?, block)));
        let ((query, container), block) = match directives {
            Ok(d) => d,
            Err(reason) => return super::text(StatusCode::BAD_REQUEST, &format!("{reason}\n")),
        };
        // The query is written on every segment line of the playlist (a catch-up window lists
        // up to 20,000): a 60 KB one made a playlist of over a gigabyte.
        if query.len() > MAX_QUERY_BYTES {
            return super::text(
                StatusCode::BAD_REQUEST,
                &format!("the query is longer than {MAX_QUERY_BYTES} bytes\n"),
            );
        }
        let stripped;
        let req = if query.len() == req.uri.query().unwrap_or("").len() {
            req
        } else {
            stripped = with_query(req, &query);
            &stripped
        };
        let block = block.filter(|_| config.part_target_ms > 0 && container == Container::Ts);
        let key = match self.key_for(channel_path, req) {
            Ok(key) => key,
            Err(resp) => return *resp,
        };
        if req.method == Method::HEAD && file == File::Playlist {
            return playlist_response(String::new());
        }
        let restart = match file {
            File::Playlist => Restart::Stale,
            _ => Restart::Never,
        };
        let channel = match self.hls_channel(key.0, key.1, req, restart) {
            Ok(c) => c,
            Err(resp) => return *resp,
        };
        let peer = req.extensions.get::<std::net::SocketAddr>().map(|p| p.ip());
        let limit = self.registry.limits.per_hub;
        // An ended channel has no hub, and no viewer to count on it.
        if let (Some(ip), Some(hub)) = (peer.filter(|_| limit > 0), channel.hub()) {
            if !channel.viewers.admit(&hub, ip, limit) {
                return self.refused(registry::Refusal::PerHub(limit));
            }
        }
        channel.touch();
        let fmp4 =
            container == Container::Fmp4 || matches!(file, File::Fragment(_) | File::Init(_));
        if fmp4 && channel.recorder.is_some() {
            return super::text(
                StatusCode::BAD_REQUEST,
                "a timeshift channel's window is kept as TS: its playlist has no fMP4 form (container=ts)\n",
            );
        }
        let target = Duration::from_secs(config.target_duration_secs);
        let resp = match file {
            File::Playlist => {
                let wait = self.start_wait(&channel.key) + 2 * target;
                match block {
                    Some(block) => self.blocking_playlist(&channel, block, wait, req).await,
                    None => self.playlist_of(&channel, wait, req, container).await,
                }
            }
            File::Fragment(n) => {
                let resp = fragment_of(&channel, n, 2 * target + Duration::from_secs(1)).await;
                head_only(req, resp)
            }
            File::Init(id) => head_only(req, init_of(&channel, id)),
            File::Part(n, i) => {
                let resp = part_of(&channel, n, i, 2 * target + Duration::from_secs(1)).await;
                if req.method == Method::HEAD {
                    let (parts, _) = resp.into_parts();
                    Response::from_parts(parts, body::empty())
                } else {
                    resp
                }
            }
            File::Segment(n) => {
                let resp = segment_of(&channel, n, 2 * target + Duration::from_secs(1)).await;
                if req.method == Method::HEAD {
                    let (parts, _) = resp.into_parts();
                    Response::from_parts(parts, body::empty())
                } else {
                    resp
                }
            }
        };
        // A viewer is there until its last answer, not its last question.
        channel.touch();
        if fmp4 && channel.held().1 {
            // An ended channel's segments rewritten as fMP4 just now hold more memory.
            self.bound_ended();
        }
        resp
    }

    /// The hub key (and FCC server) of a channel path, as its raw-TS request would have it.
    fn key_for(
        &self,
        channel_path: &str,
        req: &http::request::Parts,
    ) -> Result<(HubKey, Option<super::fcc::FccTarget>), Box<Response<Body>>> {
        if channel_path.starts_with("/rtsp/") {
            return self.rtsp_key(channel_path, req).map(|key| (key, None));
        }
        self.hub_key_of(channel_path, req.uri.query())
            .map_err(|e| Box::new(self.key_refused(e)))
    }

    /// How long a new channel may take to publish its first bytes.
    fn start_wait(&self, key: &HubKey) -> Duration {
        let setup = if key.rtsp.is_some() {
            self.config.rtsp.setup_timeout_ms
        } else {
            0
        };
        Duration::from_millis(self.config.no_data_timeout_ms + setup)
    }

    /// The running HLS channel for `key`, or a new one subscribed to the channel's hub.
    fn hls_channel(
        self: &Arc<Self>,
        key: HubKey,
        fcc: Option<super::fcc::FccTarget>,
        req: &http::request::Parts,
        restart: Restart,
    ) -> Result<Arc<Channel>, Box<Response<Body>>> {
        // A catch-up session is private to its viewer; its HLS channel is shared by the
        // requests of that one URL instead, so the table keys it without its private id.
        let mut shared = key.clone();
        if let Some(rtsp) = shared.rtsp.as_mut() {
            rtsp.private = 0;
        }
        let mut table = registry::lock(&self.hls.channels);
        // A channel started again numbers its segments after the ended one's (whose URIs
        // players may still hold), after a discontinuity.
        // Its discontinuity sequence goes on from the ended one's too (RFC 8216 6.2.2: it
        // never goes back): every discontinuity of the ended window has left the new one.
        let (mut carried, mut carried_gone) = (0, 0);
        // And the catch-up ranges it answered (a timeshift channel started again).
        let mut ranges = VecDeque::new();
        if let Some(c) = table.get(&shared) {
            // One that never started is tried again; one that ended is shown ended to its
            // viewers (`#EXT-X-ENDLIST`) until they go, unless the caller restarts it.
            let w = registry::lock(&c.window);
            let again = match restart {
                Restart::Never => false,
                Restart::Stale => {
                    c.catchup.is_none()
                        && w.ended_at
                            .is_some_and(|at| at.elapsed() >= self.idle_after())
                }
                Restart::Ended => w.ended,
            };
            if w.failure.is_none() && !again {
                return Ok(c.clone());
            }
            carried = w.next;
            carried_gone = w.discontinuities_gone
                + w.segments
                    .iter()
                    .map(|(_, s)| u64::from(s.discontinuity))
                    .sum::<u64>();
            drop(w);
            ranges = registry::lock(&c.ranges).clone();
        }
        let peer = req.extensions.get::<std::net::SocketAddr>().copied();
        let sub = self
            .registry
            .subscribe(key, fcc, peer)
            .map_err(|refusal| Box::new(self.refused(refusal)))?;
        let recorder = registry::lock(&self.recorders).get(&shared).cloned();
        let window = Window {
            next: recorder.as_ref().map_or(carried, |r| r.next_sequence()),
            restarted: carried > 0 || recorder.as_ref().is_some_and(|r| r.has_history()),
            discontinuities_gone: carried_gone,
            ..Window::default()
        };
        sub.hub.hls_segmenters.fetch_add(1, Ordering::AcqRel);
        let catchup = match (&shared.rtsp, self.seek_of(req)) {
            (Some(_), Ok(Some(seek))) => Some(seek.begin.unix * 1000),
            _ => None,
        };
        let channel = Arc::new(Channel {
            key: shared.clone(),
            window: Mutex::new(window),
            changed: watch::Sender::new(0),
            touched: Mutex::new(Instant::now()),
            recorder,
            catchup,
            hub: Mutex::new(Some(sub.hub.clone())),
            viewers: viewers::Viewers::default(),
            fmp4: Arc::default(),
            rendered: render::Rendered::new(self.hls.render.clone()),
            timeshift: render::TimeshiftMemo::default(),
            ranges: Mutex::new(ranges),
        });
        if let Some(replaced) = table.insert(shared, channel.clone()) {
            // Its fMP4 rewrite stops: the new channel serves the key. Its init numbers go on
            // in the new one (an init named as one of the ended channel's would be taken for
            // that one), taken once it is closed, so a turn of its rewrite still under way
            // numbers nothing more (its result is dropped).
            replaced.fmp4.close();
            channel.fmp4.carry_inits(&replaced.fmp4);
        }
        drop(table);
        tokio::spawn(self.clone().segment(channel.clone(), sub));
        Ok(channel)
    }

    /// The channel's one reader: hub history in, segments out, until the hub ends or no
    /// viewer has asked for anything for a while.
    async fn segment(self: Arc<Self>, channel: Arc<Channel>, sub: Subscription) {
        let config = &self.config.hls;
        let target = Duration::from_secs(config.target_duration_secs);
        let mut idle_after = self.idle_after();
        if channel.catchup.is_some() {
            // A paused player does not ask for a complete (VOD) playlist again.
            idle_after = idle_after.max(CATCHUP_IDLE);
        }
        let keep = keep(config, channel.catchup.is_some());
        let hub = sub.hub.clone();
        let label = sub.hub.key.channel();
        let wait = self.start_wait(&sub.hub.key);
        let failure = 'run: {
            let Some(_first) = self.first_data_within(&sub.hub, wait).await else {
                // The session logged why it failed; viewers get one answer for every reason.
                let (status, reason) = match self.rtsp_failure(&sub.hub) {
                    Some(_) => (StatusCode::BAD_GATEWAY, super::rtsp::FAILED.to_string()),
                    None => (
                        StatusCode::GATEWAY_TIMEOUT,
                        format!("no data from {label} within {} ms", wait.as_millis()),
                    ),
                };
                // The subscription goes now, not with the ended channel: a group that starts
                // sending later would fill its hub's ring with nobody reading.
                drop(sub);
                break 'run Some(Failure { status, reason });
            };
            // From the oldest byte held: the segmenter needs the PAT and PMT in front of the
            // keyframe a new viewer would start at, and the whole history gives players
            // segments at once (a catch-up session's history is its recording's start).
            let start = {
                let ring = registry::lock(&sub.hub.ring);
                let start = super::ring::Position {
                    index: ring.base(),
                    offset: 0,
                };
                sub.client.position.store(start.index, Ordering::Release);
                start
            };
            let client = sub.client.clone();
            let reader =
                subscriber::Reader::new(sub, start, SlowPolicy::Skip, self.config.burst_bytes);
            let mut stream = std::pin::pin!(reader.into_stream());
            let mut segmenter = Segmenter::new(Settings {
                target: config.target_duration_secs * CLOCK,
                max_bytes: MAX_SEGMENT_BYTES,
                part: config.part_target_ms * CLOCK / 1000,
            });
            let mut skips = 0;
            let mut check = tokio::time::interval(Duration::from_millis(250));
            tracing::info!(channel = %label, "HLS segmenter started");
            loop {
                tokio::select! {
                    item = stream.next() => {
                        let Some(Ok(frame)) = item else {
                            segmenter.finish();
                            let anchor = segmenter.latest().map(|dts| (dts, unix_ms()));
                            let stored = self.store(&channel, &mut segmenter, keep, anchor);
                            if let Some(recorder) = &channel.recorder {
                                for (seq, seg) in &stored {
                                    recorder.keep(*seq, seg, wall_start(seg, anchor)).await;
                                }
                            }
                            break 'run None;
                        };
                        let now = client.skips.load(Ordering::Relaxed);
                        if now != skips {
                            skips = now;
                            segmenter.gap();
                        }
                        if let Ok(data) = frame.into_data() {
                            segmenter.push(&data);
                        }
                        // What arrives now is live: the newest timestamp is now.
                        let anchor = segmenter.latest().map(|dts| (dts, unix_ms()));
                        let stored = self.store(&channel, &mut segmenter, keep, anchor);
                        if let Some(recorder) = &channel.recorder {
                            for (seq, seg) in &stored {
                                recorder.keep(*seq, seg, wall_start(seg, anchor)).await;
                            }
                        }
                    }
                    _ = check.tick() => {
                        // A player asks at least once a target duration.
                        channel.viewers.prune(&hub, 3 * target);
                        // A timeshift channel records whether anyone watches or not.
                        if channel.recorder.is_none() && channel.idle() >= idle_after {
                            tracing::info!(channel = %label, "HLS segmenter stopped: no viewer");
                            self.forget(&channel);
                            break 'run None;
                        }
                    }
                }
            }
        };
        hub.hls_segmenters.fetch_sub(1, Ordering::AcqRel);
        channel.viewers.clear(&hub);
        // The channel no longer holds its hub (nor the hub's ring, once the hub is gone).
        *registry::lock(&channel.hub) = None;
        drop(hub);
        if !self.listed(&channel) {
            return;
        }
        // Ended (or never started): viewers get the last segments and the end of the list,
        // or the reason, until they stop asking.
        channel.end(failure);
        tracing::info!(channel = %label, "HLS channel ended");
        // Its segments now count with the other ended channels' against `catchup_total_bytes`.
        self.bound_ended();
        // Until its viewers stop asking, or `catchup_total_bytes` needs its memory.
        while channel.idle() < idle_after && self.listed(&channel) {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        self.forget(&channel);
    }

    /// How long a live channel stays without a request: `linger_ms` plus three target
    /// durations (a player asks at least once a target duration).
    fn idle_after(&self) -> Duration {
        Duration::from_millis(self.config.linger_ms)
            + 3 * Duration::from_secs(self.config.hls.target_duration_secs)
    }

    /// Whether `channel` is still the one the table serves for its key.
    fn listed(&self, channel: &Arc<Channel>) -> bool {
        registry::lock(&self.hls.channels)
            .get(&channel.key)
            .is_some_and(|c| Arc::ptr_eq(c, channel))
    }

    /// Moves the segmenter's finished parts and segments into `channel`'s window; a
    /// catch-up channel's within what `catchup_total_bytes` leaves it.
    fn store(
        &self,
        channel: &Arc<Channel>,
        segmenter: &mut Segmenter,
        (keep, max_bytes): (usize, u64),
        anchor: Option<(u64, i64)>,
    ) -> Vec<(u64, Segment)> {
        let (parts, segments) = (segmenter.take_parts(), segmenter.take());
        if channel.catchup.is_none() || segments.is_empty() {
            return channel.store(parts, segments, (keep, max_bytes), anchor);
        }
        let incoming = segments.iter().map(|s| s.data.len() as u64).sum();
        let max_bytes = max_bytes.min(self.catchup_room(channel, incoming));
        let stored = channel.store(parts, segments, (keep, max_bytes), anchor);
        self.count_catchup();
        stored
    }

    fn forget(&self, channel: &Arc<Channel>) {
        let mut table = registry::lock(&self.hls.channels);
        if table
            .get(&channel.key)
            .is_some_and(|c| Arc::ptr_eq(c, channel))
        {
            table.remove(&channel.key);
            // A request still holding the channel may read what it holds, uncounted: its fMP4
            // rewrite adds nothing more.
            channel.fmp4.close();
        }
        drop(table);
        self.count_catchup();
    }

    async fn playlist_of(
        &self,
        channel: &Channel,
        wait: Duration,
        req: &http::request::Parts,
        container: Container,
    ) -> Response<Body> {
        let query = req.uri.query().unwrap_or("");
        if let Some(recorder) = &channel.recorder {
            // The disk window answers at once, whatever the live channel is doing now.
            if recorder.has_history() {
                return self.timeshift_playlist(channel, recorder, req).await;
            }
        } else if channel.key.rtsp.is_none() && matches!(self.seek_of(req), Ok(Some(_))) {
            return super::text(
                StatusCode::NOT_FOUND,
                "this channel keeps no timeshift window (iptv.timeshift.channels)\n",
            );
        }
        let mut rx = channel.changed.subscribe();
        let timed_out = tokio::time::timeout(
            wait,
            rx.wait_for(|_| {
                let w = registry::lock(&channel.window);
                !w.segments.is_empty() || w.ended
            }),
        )
        .await
        .is_err();
        if container == Container::Fmp4 {
            channel.want_fmp4();
        }
        // The playlist is written once the window is let go (and the fMP4 state is locked
        // after it: `want_fmp4` takes them the other way round).
        let listing = {
            let mut w = registry::lock(&channel.window);
            if let Some(f) = &w.failure {
                return super::text(f.status, &format!("{}\n", f.reason));
            }
            // A timeshift channel's disk window answers (once the window is let go).
            if let Some(recorder) = &channel.recorder {
                Err(recorder)
            } else if timed_out || w.segments.is_empty() {
                return super::text(
                    StatusCode::GATEWAY_TIMEOUT,
                    &format!("no segment of {} yet\n", channel.key.channel()),
                );
            } else {
                Ok(w.listing(&self.config.hls, channel.catchup, &channel.rendered))
            }
        };
        let listing = match listing {
            Ok(listing) => listing,
            Err(recorder) => return self.timeshift_playlist(channel, recorder, req).await,
        };
        if container == Container::Fmp4 {
            // The segments it lists are rewritten on the blocking pool: a first fMP4 request
            // on a catch-up channel waits for the whole window (without holding a worker).
            let newest = listing.entries.last().map(|e| e.sequence);
            if let Some(newest) = newest {
                let settled = channel.fmp4.settle(newest, wait).await;
                if !settled && (listing.ended || channel.fmp4.done().is_none()) {
                    let mut resp = super::text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &format!(
                            "the fMP4 segments of {} are still being written\n",
                            channel.key.channel()
                        ),
                    );
                    resp.headers_mut()
                        .insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
                    return resp;
                }
            }
            // Written once per version as the TS one is (and as large, on the blocking pool).
            let text = channel
                .rendered
                .get_fmp4(&self.config.hls, &listing, query, &channel.fmp4)
                .await;
            return match text {
                Some(playlist) => self.playlist_answer(&playlist, req),
                None => {
                    let why = channel.fmp4.error().unwrap_or_default();
                    super::text(
                        StatusCode::NOT_ACCEPTABLE,
                        &format!(
                            "{} has no fMP4 form ({why}; fMP4 segments carry H.264 video and AAC \
                             audio); its TS playlist is index.m3u8?container=ts\n",
                            channel.key.channel()
                        ),
                    )
                }
            };
        }
        let playlist = channel
            .rendered
            .get(&self.config.hls, &listing, query)
            .await;
        self.playlist_answer(&playlist, req)
    }

    /// A blocking reload (low-latency HLS): the live playlist once it lists segment `msn` (or
    /// its part), 400 when that is too far ahead, 503 when it does not come within three
    /// target durations.
    async fn blocking_playlist(
        &self,
        channel: &Channel,
        block: parts::Block,
        wait: Duration,
        req: &http::request::Parts,
    ) -> Response<Body> {
        // A timeshift window has no parts; nothing yet: the first playlist, when it comes,
        // answers.
        let (empty, next) = {
            let w = registry::lock(&channel.window);
            (w.segments.is_empty() && !w.ended, w.next)
        };
        if channel.recorder.is_some() || empty {
            return self.playlist_of(channel, wait, req, Container::Ts).await;
        }
        if block.too_far(next) {
            return super::text(
                StatusCode::BAD_REQUEST,
                &format!(
                    "_HLS_msn={} is more than two segments past the last one ({})\n",
                    block.msn,
                    next.saturating_sub(1)
                ),
            );
        }
        let hold = Duration::from_secs(3 * self.config.hls.target_duration_secs);
        let mut rx = channel.changed.subscribe();
        let timed_out = tokio::time::timeout(
            hold,
            rx.wait_for(|_| {
                let w = registry::lock(&channel.window);
                w.ended || w.failure.is_some() || block.ready(w.next, w.held.building())
            }),
        )
        .await
        .is_err();
        let listing = {
            let mut w = registry::lock(&channel.window);
            if let Some(f) = &w.failure {
                return super::text(f.status, &format!("{}\n", f.reason));
            }
            if timed_out {
                return super::text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!(
                        "segment {} of {} did not come within {} s\n",
                        block.msn,
                        channel.key.channel(),
                        hold.as_secs()
                    ),
                );
            }
            w.listing(&self.config.hls, channel.catchup, &channel.rendered)
        };
        let query = req.uri.query().unwrap_or("");
        let playlist = channel
            .rendered
            .get(&self.config.hls, &listing, query)
            .await;
        self.playlist_answer(&playlist, req)
    }

    /// A timeshift channel's playlist: the whole disk window (players seek inside it), or, with
    /// a catch-up range (`playseek=`), the segments covering it, starting where it begins.
    async fn timeshift_playlist(
        &self,
        channel: &Channel,
        recorder: &Recorder,
        req: &http::request::Parts,
    ) -> Response<Body> {
        let query = req.uri.query().unwrap_or("");
        let seek = match self.seek_of(req) {
            Ok(seek) => seek,
            Err(reason) => return super::text(StatusCode::BAD_REQUEST, &format!("{reason}\n")),
        };
        let target = self.config.hls.target_duration_secs;
        let Some(seek) = seek else {
            let memo = &channel.timeshift;
            let written = timeshift_window(memo, recorder, target, query, &self.hls.render).await;
            return match written {
                None => super::text(StatusCode::GATEWAY_TIMEOUT, "no segment recorded yet\n"),
                Some(Ok(playlist)) => self.playlist_answer(&playlist, req),
                Some(Err(estimate)) => memory_refused(&self.registry.metrics, estimate),
            };
        };
        // The window's records (at most `timeshift::MAX_SEGMENTS` of a few dozen bytes) go
        // before the write waits for anything.
        let listing = {
            let (segments, gone) = recorder.segments();
            let (Some(first), Some(last)) = (segments.first(), segments.last()) else {
                return super::text(StatusCode::GATEWAY_TIMEOUT, "no segment recorded yet\n");
            };
            let begin = seek.begin.unix * 1000;
            let end = seek.end.map(|e| e.unix * 1000);
            let complete = end.is_some_and(|e| last.end_ms() >= e);
            match timeshift::range(&segments, begin, end) {
                Some((picked, offset)) => {
                    // The discontinuity sequence counts from the recording's start, as the
                    // whole window's does: the same on every reload of the range, before and
                    // after its first segments leave the window.
                    let mut answered = registry::lock(&channel.ranges);
                    if !answered.contains(&begin) {
                        if answered.len() == RANGES_KEPT {
                            answered.pop_front();
                        }
                        answered.push_back(begin);
                    }
                    drop(answered);
                    let from = picked.first().map_or(0, |r| r.sequence);
                    let before = segments
                        .iter()
                        .take_while(|r| r.sequence < from)
                        .filter(|r| r.discontinuity)
                        .count() as u64;
                    TimeshiftListing {
                        entries: picked.iter().map(timeshift_entry).collect(),
                        target,
                        gone: gone + before,
                        shown: Shown::Range { complete, offset },
                    }
                }
                // A player reloading the EVENT playlist of a range answered before, whose first
                // segment has left the window since (it was answered 404, and playback
                // stopped): the rest of the range, as a live window that slides.
                None if begin < first.wall_ms
                    && registry::lock(&channel.ranges).contains(&begin)
                    && end.is_none_or(|e| e > first.wall_ms) =>
                {
                    TimeshiftListing {
                        entries: segments
                            .iter()
                            .take_while(|r| end.is_none_or(|e| r.wall_ms < e))
                            .map(timeshift_entry)
                            .collect(),
                        target,
                        gone,
                        shown: Shown::Slid { complete },
                    }
                }
                None => return outside_window(&segments, begin),
            }
        };
        let wait = Duration::from_secs(target);
        match write_timeshift(listing, query, &self.hls.render, wait).await {
            Ok(text) => self.playlist_answer(&sent::Playlist::new(text), req),
            Err(estimate) => memory_refused(&self.registry.metrics, estimate),
        }
    }

    /// The answer with `playlist`, charged to what playlist answers hold for the request's
    /// client ([`sent`]); refused (503) past it.
    fn playlist_answer(
        &self,
        playlist: &Arc<sent::Playlist>,
        req: &http::request::Parts,
    ) -> Response<Body> {
        let client = req
            .extensions
            .get::<std::net::SocketAddr>()
            .map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |p| p.ip());
        answer(&self.hls.sent, &self.registry.metrics, playlist, client)
    }

    /// The catch-up range of the request (`playseek=`, `tvdr=`, the names in
    /// `iptv.rtsp.seek_params`), times without a zone read in the client's (`TZ/UTC+8` in its
    /// User-Agent) or UTC.
    fn seek_of(
        &self,
        req: &http::request::Parts,
    ) -> Result<Option<sluice_media::rtsp::catchup::Seek>, String> {
        let Some(query) = req.uri.query() else {
            return Ok(None);
        };
        let zone = req
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(sluice_media::rtsp::catchup::user_agent_zone)
            .unwrap_or(0);
        for pair in query.split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if self.config.rtsp.seek_params.iter().any(|p| p == name) {
                let value = percent_encoding::percent_decode_str(value).decode_utf8_lossy();
                return sluice_media::rtsp::catchup::parse_seek(&value, zone)
                    .map(Some)
                    .map_err(|e| format!("{name}: {e}"));
            }
        }
        Ok(None)
    }

    /// Starts every `[iptv.timeshift]` channel and keeps it running: each is recorded from now
    /// on, watched or not, and started again if its source stops and comes back.
    pub(super) fn start_timeshift(self: &Arc<Self>) {
        let config = &self.config.timeshift;
        let Some(dir) = config.dir.as_deref() else {
            return;
        };
        // The configuration is checked without `[iptv.hls]` (`TimeshiftConfig::validate`):
        // a window needing more segments than any keeps is told here.
        if let Err(reason) = config.check_segments(self.config.hls.target_duration_secs) {
            tracing::warn!("timeshift: {reason}");
        }
        for channel in &config.channels {
            let (path, query) = channel.split_once('?').unwrap_or((channel, ""));
            let (key, fcc) = match self.hub_key_of(path, Some(query)) {
                Ok(k) => k,
                Err(e) => {
                    tracing::warn!(%channel, error = %e, "timeshift: channel not recorded");
                    continue;
                }
            };
            let name = timeshift::dir_name(&format!(
                "{}@{}",
                key.recorded_channel(),
                key.group.interface
            ));
            let recorder = match Recorder::open(
                std::path::Path::new(dir).join(name),
                config.minutes,
                config.max_bytes,
                self.config.hls.target_duration_secs,
            ) {
                Ok(r) => Arc::new(r),
                Err(e) => {
                    tracing::warn!(%channel, error = %e, "timeshift: channel not recorded");
                    continue;
                }
            };
            registry::lock(&self.recorders).insert(key.clone(), recorder);
            let parts = match http::Request::get(channel.as_str()).body(()) {
                Ok(r) => r.into_parts().0,
                Err(_) => continue,
            };
            let weak = Arc::downgrade(self);
            tokio::spawn(async move {
                while let Some(iptv) = weak.upgrade() {
                    let started =
                        iptv.hls_channel(key.clone(), fcc.clone(), &parts, Restart::Ended);
                    if let Err(resp) = started {
                        tracing::debug!(status = %resp.status(), "timeshift: channel not started");
                    }
                    drop(iptv);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            });
        }
    }
}

/// Largest timeshift playlist written: one client's share of what playlist answers may hold
/// ([`sent::MAX_SENT_TOTAL`] / 4), past which no answer could send it. A full window
/// (`timeshift::MAX_SEGMENTS`) with the longest query stays under it; a window without that
/// bound made playlists of gigabytes, written whole before `sent` refused them.
const MAX_TIMESHIFT_PLAYLIST: usize = (sent::MAX_SENT_TOTAL / 4) as usize;

// A full window with the longest query is a playlist an answer may send.
const _: () = assert!(
    timeshift::MAX_SEGMENTS * (MAX_QUERY_BYTES + TIMESHIFT_LINE_BYTES) <= MAX_TIMESHIFT_PLAYLIST
);

/// A timeshift playlist estimated at least this large is written on the blocking pool (as the
/// live channels' large playlists are).
const TIMESHIFT_INLINE_BYTES: usize = 256 << 10;

/// About the bytes a timeshift playlist entry takes besides its query: `#EXTINF`,
/// `#EXT-X-PROGRAM-DATE-TIME` and the URI.
const TIMESHIFT_LINE_BYTES: usize = 96;

/// What a timeshift playlist lists (owned: a large one is written on the blocking pool).
#[derive(Debug)]
struct TimeshiftListing {
    entries: Vec<Entry>,
    target: u64,
    /// Discontinuities before the first entry.
    gone: u64,
    shown: Shown,
}

/// What a timeshift playlist shows of the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shown {
    /// All of it (live).
    Window,
    /// A catch-up range the window holds from its start on: EVENT (it only grows) until the
    /// window holds all of it, then VOD; `offset` is where its start is in the first segment
    /// (ms).
    Range { complete: bool, offset: u64 },
    /// A catch-up range whose first segments have left the window since it was first asked
    /// for: the rest, as a live playlist (no playlist type: an EVENT one never loses a
    /// segment), its media sequence moving with the window, ended once the window holds the
    /// whole range.
    Slid { complete: bool },
}

impl TimeshiftListing {
    /// About how many bytes its playlist takes with `query` (each line carries the query).
    fn estimate(&self, query: &str) -> usize {
        self.entries
            .len()
            .saturating_mul(query.len().saturating_add(TIMESHIFT_LINE_BYTES))
    }

    fn write(&self, query: &str) -> String {
        let (ended, kind, start_ms) = match self.shown {
            Shown::Window => (false, Kind::Live, None),
            Shown::Range {
                complete: true,
                offset,
            } => (true, Kind::Vod, Some(offset)),
            Shown::Range {
                complete: false,
                offset,
            } => (false, Kind::Event, Some(offset)),
            Shown::Slid { complete } => (complete, Kind::Live, None),
        };
        let window = playlist::Window {
            target: self.target,
            discontinuity_sequence: self.gone,
            ended,
            query,
            kind,
            start_ms,
            low_latency: None,
        };
        playlist::media(window, &self.entries)
    }
}

/// Writes a timeshift playlist: refused (with its estimated size) when it would be larger than
/// [`MAX_TIMESHIFT_PLAYLIST`], before it is written; a large one on the blocking pool, in one
/// of `shared`'s places (those the channels' large playlists share), queued for one as the live and
/// catch-up writes are, but refused too when none comes within `wait` (the target duration):
/// only trying for one, any queued write took the place freed before it (503 on every
/// reload), and waiting without bound queued requests behind a few large writes, each holding
/// its listing. At most [`TIMESHIFT_WAITING`] wait at once over all channels; past them it is
/// refused at once (each waiter holds its listing, up to ~1.2 MB, and stands in the queue
/// ahead of later live playlist writes).
async fn write_timeshift(
    listing: TimeshiftListing,
    query: &str,
    shared: &kept::Shared,
    wait: Duration,
) -> Result<String, usize> {
    let estimate = listing.estimate(query);
    if estimate > MAX_TIMESHIFT_PLAYLIST {
        return Err(estimate);
    }
    if estimate < TIMESHIFT_INLINE_BYTES {
        return Ok(listing.write(query));
    }
    let Some(_waiting) = Waiting::join(&shared.timeshift_waiting) else {
        return Err(estimate);
    };
    let place = match tokio::time::timeout(wait, shared.blocking.clone().acquire_owned()).await {
        Ok(Ok(place)) => place,
        Err(_elapsed) => return Err(estimate),
        // The places are never closed; were they, the playlist is written here.
        Ok(Err(_closed)) => return Ok(listing.write(query)),
    };
    let (listing, owned) = (Arc::new(listing), query.to_owned());
    let job = listing.clone();
    let written = tokio::task::spawn_blocking(move || {
        let _place = place;
        job.write(&owned)
    })
    .await;
    // Only a panic or a runtime shutting down ends a blocking job early: it is written here.
    Ok(written.unwrap_or_else(|_| listing.write(query)))
}

/// Timeshift playlist writes waiting for a blocking place, over all channels: see
/// [`write_timeshift`].
const TIMESHIFT_WAITING: usize = 8;

/// One of the [`TIMESHIFT_WAITING`] places to wait in, given back when dropped (the write
/// done, refused or its request gone).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn join(count: &'a AtomicUsize) -> Option<Waiting<'a>> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < TIMESHIFT_WAITING).then_some(n + 1)
            })
            .ok()
            .map(|_| Waiting(count))
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A timeshift channel's whole-window playlist for `query`: written once per version of the
/// window and query, shared by its viewers (`memo`), kept within `shared`'s bound and written
/// in one of its places; `None` while nothing is recorded, `Err` as [`write_timeshift`].
async fn timeshift_window(
    memo: &render::TimeshiftMemo,
    recorder: &Recorder,
    target: u64,
    query: &str,
    shared: &Arc<kept::Shared>,
) -> Option<Result<Arc<sent::Playlist>, usize>> {
    let now = recorder.version()?;
    // The window's records are copied only for a write, and go before it waits for anything.
    let take = || {
        let (segments, gone) = recorder.segments();
        let version = match (segments.first(), segments.last()) {
            (Some(a), Some(b)) => (a.sequence, b.sequence, gone),
            _ => now,
        };
        let listing = TimeshiftListing {
            entries: segments.iter().map(timeshift_entry).collect(),
            target,
            gone,
            shown: Shown::Window,
        };
        (version, listing)
    };
    let wait = Duration::from_secs(target);
    let write = |listing| write_timeshift(listing, query, shared, wait);
    Some(memo.get(now, query, shared, take, write).await)
}

fn timeshift_entry(r: &timeshift::Recorded) -> Entry {
    Entry {
        sequence: r.sequence,
        duration: r.duration,
        discontinuity: r.discontinuity,
        wall_ms: Some(r.wall_ms),
    }
}

/// 404 for a catch-up range beginning at `begin` (Unix ms), outside the window of `segments`.
fn outside_window(segments: &[timeshift::Recorded], begin: i64) -> Response<Body> {
    let held = match (segments.first(), segments.last()) {
        (Some(a), Some(b)) => format!(
            "{} to {}",
            playlist::iso8601(a.wall_ms),
            playlist::iso8601(b.end_ms())
        ),
        _ => "nothing yet".into(),
    };
    super::text(
        StatusCode::NOT_FOUND,
        &format!(
            "{} is outside the timeshift window ({held})\n",
            playlist::iso8601(begin)
        ),
    )
}

/// Segments a channel's window keeps, and their most bytes: a live channel its playlist's
/// window and one more, within `live_window_max_bytes`; a catch-up session its whole
/// programme, within its byte budget and `CATCHUP_MAX_SEGMENTS`.
fn keep(config: &HlsConfig, catchup: bool) -> (usize, u64) {
    if catchup {
        (CATCHUP_MAX_SEGMENTS, config.catchup_max_bytes)
    } else {
        (config.window + 1, config.live_window_max_bytes)
    }
}

/// Unix time in milliseconds.
fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Wall-clock start of a segment, from the anchor (the newest timestamp, and when it arrived):
/// the segment began as long before that as its timestamp is older.
fn wall_start(seg: &Segment, anchor: Option<(u64, i64)>) -> i64 {
    let now = unix_ms();
    let fallback = now - (seg.duration * 1000 / CLOCK) as i64;
    let Some((latest, at)) = anchor else {
        return fallback;
    };
    let behind = latest.wrapping_sub(seg.start) & ((1 << 33) - 1);
    if behind > 3600 * CLOCK {
        // Another timeline (the segment ended at a break): it ended about now.
        return fallback;
    }
    at - (behind * 1000 / CLOCK) as i64
}

/// Segment `n`: at once when held, after a wait when it is the next one, from the timeshift
/// window on disk when older, else 404.
async fn segment_of(channel: &Channel, n: u64, wait: Duration) -> Response<Body> {
    if let Some(recorder) = &channel.recorder {
        let held = registry::lock(&channel.window).segment(n).is_some();
        if !held {
            if let Some((body, len)) = recorder.read(n).await {
                return segment_headers(Response::new(body), len);
            }
        }
    }
    wait_for_segment(channel, n, wait).await;
    let w = registry::lock(&channel.window);
    match w.segment(n) {
        Some(s) => segment_response(s.data.clone()),
        None => super::text(
            StatusCode::NOT_FOUND,
            &format!("segment {n} is not in the window\n"),
        ),
    }
}

/// Waits (at most `wait`) until segment `n` is cut, the channel ended, or `n` is beyond the next
/// one (it will not come soon).
async fn wait_for_segment(channel: &Channel, n: u64, wait: Duration) {
    let mut rx = channel.changed.subscribe();
    let _ = tokio::time::timeout(
        wait,
        rx.wait_for(|_| {
            let w = registry::lock(&channel.window);
            w.next > n || w.ended || n > w.next + 1
        }),
    )
    .await;
}

/// Segment `n` as fMP4: at once when held, after a wait when it is the next one, else 404.
async fn fragment_of(channel: &Channel, n: u64, wait: Duration) -> Response<Body> {
    channel.want_fmp4();
    wait_for_segment(channel, n, wait).await;
    channel.fmp4.settle(n, wait).await;
    match channel.fmp4.fragment(n) {
        Some(Some(f)) => mp4_response(f.media),
        Some(None) => super::text(
            StatusCode::NOT_FOUND,
            &format!("segment {n} has no fMP4 form\n"),
        ),
        None => super::text(
            StatusCode::NOT_FOUND,
            &format!("segment {n} is not in the window\n"),
        ),
    }
}

/// fMP4 init segment `id`, while a segment in the window needs it.
fn init_of(channel: &Channel, id: u64) -> Response<Body> {
    channel.want_fmp4();
    match channel.fmp4.init(id) {
        Some(init) => mp4_response(init),
        None => super::text(
            StatusCode::NOT_FOUND,
            &format!("no segment in the window uses init segment {id}\n"),
        ),
    }
}

/// A HEAD request gets the answer's head only.
fn head_only(req: &http::request::Parts, resp: Response<Body>) -> Response<Body> {
    if req.method == Method::HEAD {
        let (parts, _) = resp.into_parts();
        Response::from_parts(parts, body::empty())
    } else {
        resp
    }
}

fn mp4_response(data: bytes::Bytes) -> Response<Body> {
    let mut resp = segment_response(data);
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, "video/mp4".parse().unwrap());
    resp
}

/// Part `i` of segment `n` (low-latency HLS): at once when held, after a wait when it is yet
/// to come (a preload hint names the next part before it exists), else 404.
async fn part_of(channel: &Channel, n: u64, i: u32, wait: Duration) -> Response<Body> {
    let mut rx = channel.changed.subscribe();
    let _ = tokio::time::timeout(
        wait,
        rx.wait_for(|_| {
            let w = registry::lock(&channel.window);
            // Held, or never going to be: its segment is complete (or gone), or the request
            // is for a segment after the next.
            w.ended || w.held.get(n, i, w.next).is_some() || w.next > n || n > w.next + 1
        }),
    )
    .await;
    let w = registry::lock(&channel.window);
    match w.held.get(n, i, w.next) {
        Some(data) => segment_response(data),
        None => super::text(
            StatusCode::NOT_FOUND,
            &format!("part {n}.{i} is not in the window\n"),
        ),
    }
}

/// The request with another query (the same path, method, headers and extensions).
fn with_query(req: &http::request::Parts, query: &str) -> http::request::Parts {
    let mut parts = req.clone();
    let path = req.uri.path();
    let pq = if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{query}")
    };
    let mut uri = http::uri::Parts::from(req.uri.clone());
    uri.path_and_query = pq.parse().ok();
    if let Ok(u) = http::Uri::from_parts(uri) {
        parts.uri = u;
    }
    parts
}

fn segment_response(data: bytes::Bytes) -> Response<Body> {
    let len = data.len() as u64;
    segment_headers(Response::new(body::full(data)), len)
}

/// A segment's answer: its body, `len` bytes, with the headers every segment gets.
fn segment_headers(mut resp: Response<Body>, len: u64) -> Response<Body> {
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, "video/mp2t".parse().unwrap());
    h.insert(header::CONTENT_LENGTH, len.into());
    h.insert(header::CACHE_CONTROL, "max-age=60".parse().unwrap());
    resp
}

fn playlist_response(text: impl Into<bytes::Bytes>) -> Response<Body> {
    playlist_headers(Response::new(body::full(text)))
}

/// `playlist`'s answer to `client`, its bytes charged to `sent` while they are sent; when they
/// do not fit, a 503 to try again shortly, counted as `refused{reason="hls_memory"}` and booked
/// to sluice (`side="internal"`).
fn answer(
    sent: &Arc<sent::Sent>,
    metrics: &super::metrics::Metrics,
    playlist: &Arc<sent::Playlist>,
    client: std::net::IpAddr,
) -> Response<Body> {
    if let Some(body) = playlist.body(sent, client) {
        return playlist_headers(Response::new(body));
    }
    memory_refused(metrics, playlist.text.len())
}

/// The answer to a playlist of `bytes` that what answers may hold has no room for (503).
fn memory_refused(metrics: &super::metrics::Metrics, bytes: usize) -> Response<Body> {
    metrics.refuse("hls_memory");
    tracing::debug!(bytes, "HLS playlist refused: answers hold their memory");
    let mut resp = super::text(
        StatusCode::SERVICE_UNAVAILABLE,
        "the HLS playlists being sent now hold all the memory set aside for them; try again shortly\n",
    );
    resp.headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from(1));
    resp.extensions_mut().insert(crate::error::ErrorMark {
        side: crate::error::Side::Internal,
        kind: "hls_memory",
    });
    resp
}

/// A playlist's headers on `resp`.
fn playlist_headers(mut resp: Response<Body>) -> Response<Body> {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        "application/vnd.apple.mpegurl".parse().unwrap(),
    );
    h.insert(header::CACHE_CONTROL, "no-cache".parse().unwrap());
    resp
}

/// `/playlist.m3u` entries of this gateway's channels turned into their HLS form:
/// `{base}/rtp/G:P?q` becomes `{base}/hls/rtp/G:P/index.m3u8?q` (attributes are left alone).
pub fn hls_entries(playlist: &str, base: &str) -> String {
    let mut out = String::with_capacity(playlist.len() + 1024);
    for line in playlist.lines() {
        let converted = line.strip_prefix(base).and_then(|rest| {
            ["/rtp/", "/udp/", "/rtsp/"]
                .iter()
                .any(|p| rest.starts_with(p))
                .then(|| {
                    let (path, query) = match rest.split_once('?') {
                        Some((p, q)) => (p, Some(q)),
                        None => (rest, None),
                    };
                    let path = path.trim_end_matches('/');
                    match query {
                        Some(q) => format!("{base}/hls{path}/index.m3u8?{q}"),
                        None => format!("{base}/hls{path}/index.m3u8"),
                    }
                })
        });
        out.push_str(converted.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A live window bound under a megabyte (0, or a few bytes: every segment dropped as it
    /// comes) is refused at load; a megabyte is the least taken.
    #[test]
    fn a_live_window_bound_under_a_megabyte_is_refused() {
        for (bytes, ok) in [
            (0, false),
            ((1 << 20) - 1, false),
            (1 << 20, true),
            (u64::MAX, true),
        ] {
            let c = HlsConfig {
                live_window_max_bytes: bytes,
                ..HlsConfig::default()
            };
            assert_eq!(c.validate().is_ok(), ok, "{bytes}");
        }
    }

    /// A timeshift listing of `n` 40 ms segments with wall-clock times.
    fn timeshift_listing(n: usize) -> TimeshiftListing {
        TimeshiftListing {
            entries: (0..n as u64)
                .map(|i| Entry {
                    sequence: i,
                    duration: CLOCK / 25,
                    discontinuity: false,
                    wall_ms: Some(1_700_000_000_000 + i as i64 * 40),
                })
                .collect(),
            target: 4,
            gone: 0,
            shown: Shown::Window,
        }
    }

    thread_local! {
        /// Segments `Window::segment` looked at, on this thread.
        pub(super) static PROBES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    #[test]
    fn paths_split_into_channel_and_file() {
        assert_eq!(
            split("/hls/rtp/239.1.1.1:5000/index.m3u8"),
            Some(("/rtp/239.1.1.1:5000", File::Playlist))
        );
        assert_eq!(
            split("/hls/rtsp/10.0.0.1:554/live/ch1/17.ts"),
            Some(("/rtsp/10.0.0.1:554/live/ch1", File::Segment(17)))
        );
        assert_eq!(split("/hls/index.m3u8"), None);
        assert_eq!(split("/hls/rtp/239.1.1.1:5000/x.ts"), None);
        assert_eq!(split("/hls/rtp/239.1.1.1:5000/1.mp4"), None);
        assert_eq!(
            split("/hls/rtp/239.1.1.1:5000/17.m4s"),
            Some(("/rtp/239.1.1.1:5000", File::Fragment(17)))
        );
        assert_eq!(
            split("/hls/rtp/239.1.1.1:5000/init-2.mp4"),
            Some(("/rtp/239.1.1.1:5000", File::Init(2)))
        );
        assert_eq!(split("/hls/rtp/239.1.1.1:5000/init-x.mp4"), None);
    }

    /// A channel fed by hand, with no hub.
    fn bare(catchup: Option<i64>) -> Channel {
        bare_in(catchup, Arc::default())
    }

    /// A channel fed by hand, its playlists kept with others' in `shared`.
    fn bare_in(catchup: Option<i64>, shared: Arc<kept::Shared>) -> Channel {
        Channel {
            key: HubKey {
                mode: super::super::url::Mode::Rtp,
                group: crate::net::multicast::Group {
                    group: [239, 1, 1, 1].into(),
                    port: 5000,
                    source: None,
                    interface: "lo".into(),
                },
                extras: None,
                rtsp: None,
            },
            window: Mutex::new(Window::default()),
            changed: watch::Sender::new(0),
            touched: Mutex::new(Instant::now()),
            recorder: None,
            catchup,
            hub: Mutex::new(None),
            viewers: viewers::Viewers::default(),
            fmp4: Arc::default(),
            rendered: render::Rendered::new(shared),
            timeshift: render::TimeshiftMemo::default(),
            ranges: Mutex::default(),
        }
    }

    /// The TS playlist of `c` as a request with `query` gets it.
    async fn render(c: &Channel, config: &HlsConfig, query: &str) -> bytes::Bytes {
        // Written from the listing taken out of the window, the lock let go.
        let listing = registry::lock(&c.window).listing(config, c.catchup, &c.rendered);
        c.rendered.get(config, &listing, query).await.text.clone()
    }

    /// `count` segments of one packet each, the same bytes shared (`tiny` without the copies).
    fn packets(c: &Channel, count: u64, config: &HlsConfig) {
        static PACKET: [u8; 188] = [0x47; 188];
        let segments = (0..count)
            .map(|n| Segment {
                data: bytes::Bytes::from_static(&PACKET),
                ..tiny(n)
            })
            .collect();
        c.store(Vec::new(), segments, keep(config, true), None);
    }

    fn tiny(number: u64) -> Segment {
        Segment {
            data: bytes::Bytes::from(vec![0x47; 752]),
            duration: 90,
            keyframe: true,
            discontinuity: true,
            start: number * 90_000,
            number,
        }
    }

    /// TS from a sender whose timestamps hardly advance: PAT, PMT (H.264 on 0x100), then
    /// `pictures` keyframes a tick apart (no segment ever reaches the target duration).
    fn stuck_clock(pictures: usize) -> Vec<u8> {
        let mut cc = [0u8; 3];
        let mut packet = |slot: usize, pid: u16, start: bool, payload: &[u8]| {
            let mut p = vec![
                0x47,
                (pid >> 8) as u8 | if start { 0x40 } else { 0 },
                pid as u8,
            ];
            let take = payload.len().min(184);
            if take < 184 {
                p.push(0x30 | cc[slot]);
                p.push((183 - take) as u8);
                if take < 183 {
                    p.push(0);
                    p.resize(p.len() + 182 - take, 0xff);
                }
            } else {
                p.push(0x10 | cc[slot]);
            }
            cc[slot] = (cc[slot] + 1) & 0x0f;
            p.extend_from_slice(&payload[..take]);
            assert_eq!(p.len(), 188);
            p
        };
        let pat = [
            0, 0x00, 0xb0, 13, 0, 1, 0xc1, 0, 0, 0, 1, 0xf0, 0x00, 0, 0, 0, 0,
        ];
        let pmt = [
            0, 0x02, 0xb0, 18, 0, 1, 0xc1, 0, 0, 0xe1, 0x00, 0xf0, 0, 0x1b, 0xe1, 0x00, 0xf0, 0, 0,
            0, 0, 0,
        ];
        let stamp = |prefix: u8, ts: u64| {
            [
                prefix | ((ts >> 29) & 0x0e) as u8,
                (ts >> 22) as u8,
                ((ts >> 14) & 0xfe) as u8 | 1,
                (ts >> 7) as u8,
                ((ts << 1) & 0xfe) as u8 | 1,
            ]
        };
        let mut out = Vec::new();
        for i in 0..pictures {
            if i % 10 == 0 {
                out.extend(packet(0, 0, true, &pat));
                out.extend(packet(1, 0x1000, true, &pmt));
            }
            // One tick a picture: a segment would need 360,000 to reach 4 seconds.
            let mut pes = vec![0, 0, 1, 0xe0, 0, 0, 0x80, 0xc0, 10];
            pes.extend_from_slice(&stamp(0x31, i as u64));
            pes.extend_from_slice(&stamp(0x11, i as u64));
            pes.extend_from_slice(&[0, 0, 0, 1, 0x09, 0xf0, 0, 0, 0, 1, 0x67, 1, 2, 3]);
            pes.extend_from_slice(&[0, 0, 0, 1, 0x68, 4, 0, 0, 1, 0x65]);
            pes.resize(900, 0x55);
            for (j, chunk) in pes.chunks(184).enumerate() {
                out.extend(packet(2, 0x100, j == 0, chunk));
            }
        }
        out
    }

    /// A live channel's window keeps `window + 1` segments within `live_window_max_bytes`: a
    /// sender without usable timestamps makes every segment as large as the segmenter allows,
    /// and the window lets its oldest go to stay within the bytes.
    #[test]
    fn a_live_window_is_bounded_in_bytes() {
        let config = HlsConfig {
            window: 10,
            live_window_max_bytes: 1 << 20,
            ..HlsConfig::default()
        };
        let c = bare(None);
        let mut segmenter = Segmenter::new(Settings {
            target: config.target_duration_secs * CLOCK,
            max_bytes: 200_000,
            part: 0,
        });
        let input = stuck_clock(6000);
        let mut stored = 0;
        for chunk in input.chunks(7 * 188) {
            segmenter.push(chunk);
            let segments = segmenter.take();
            stored += segments.len();
            c.store(Vec::new(), segments, keep(&config, false), None);
            let w = registry::lock(&c.window);
            assert!(
                w.bytes <= 1 << 20,
                "{} bytes in {}",
                w.bytes,
                w.segments.len()
            );
            assert_eq!(
                w.bytes,
                w.segments
                    .iter()
                    .map(|(_, s)| s.data.len() as u64)
                    .sum::<u64>()
            );
        }
        assert!(stored >= 15, "{stored} segments");
        let w = registry::lock(&c.window);
        assert!(
            (1..=config.window).contains(&w.segments.len()),
            "{}",
            w.segments.len()
        );
        assert!(HlsConfig {
            live_window_max_bytes: 1000,
            ..HlsConfig::default()
        }
        .validate()
        .is_err());
    }

    /// A source jumping its timestamps makes a tiny segment at each jump: a catch-up window
    /// keeps `CATCHUP_MAX_SEGMENTS` of them however small, and a wall clock only for those.
    #[test]
    fn a_catch_up_window_is_bounded_in_segments_and_wall_clocks() {
        let config = HlsConfig::default();
        let c = bare(Some(0));
        let kept = keep(&config, true);
        let total = CATCHUP_MAX_SEGMENTS as u64 + 1500;
        for batch in (0..total).collect::<Vec<_>>().chunks(1000) {
            c.store(
                Vec::new(),
                batch.iter().map(|n| tiny(*n)).collect(),
                kept,
                None,
            );
        }
        let w = registry::lock(&c.window);
        assert_eq!(w.segments.len(), CATCHUP_MAX_SEGMENTS);
        assert_eq!(w.held.walls(), CATCHUP_MAX_SEGMENTS);
        assert_eq!(w.bytes, 752 * CATCHUP_MAX_SEGMENTS as u64);
        assert_eq!(
            w.segments.front().unwrap().0,
            total - CATCHUP_MAX_SEGMENTS as u64
        );
        assert!(
            w.trimmed,
            "a window that lost its start slides like a live one"
        );
        drop(w);
        // Dropped by bytes: the wall clocks go with their segments.
        let small = HlsConfig {
            catchup_max_bytes: 752 * 100,
            ..HlsConfig::default()
        };
        let c = bare(Some(0));
        for n in 0..1000 {
            c.store(Vec::new(), vec![tiny(n)], keep(&small, true), None);
        }
        let w = registry::lock(&c.window);
        assert_eq!(w.segments.len(), 100);
        assert_eq!(w.held.walls(), 100);
        assert!(w.held.wall_ms(900).is_some() && w.held.wall_ms(899).is_none());
    }

    /// A playlist is written once per version of its window, byte for byte as before:
    /// every request for that version gets the same bytes, and the next segment makes a new one.
    #[tokio::test]
    async fn a_playlist_is_written_once_per_window_version() {
        let config = HlsConfig::default();
        let begin = 1_700_000_000_000;
        let c = bare(Some(begin));
        let four = |n: u64| Segment {
            duration: 4 * CLOCK,
            discontinuity: n == 0,
            ..tiny(n)
        };
        let kept = keep(&config, true);
        c.store(Vec::new(), vec![four(0), four(1)], kept, None);
        let line = |n: u64| {
            format!(
                "#EXT-X-PROGRAM-DATE-TIME:{}\n#EXTINF:4.000,\n{n}.ts?iface=lo\n",
                playlist::iso8601(begin + 4000 * n as i64)
            )
        };
        let two = format!(
            "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:4\n#EXT-X-MEDIA-SEQUENCE:0\n\
             #EXT-X-PLAYLIST-TYPE:EVENT\n#EXT-X-DISCONTINUITY\n{}{}",
            line(0),
            line(1)
        );
        let first = render(&c, &config, "iface=lo").await;
        assert_eq!(first, two);
        // The same version and query: the same bytes, not written again.
        let again = render(&c, &config, "iface=lo").await;
        assert_eq!(again.as_ptr(), first.as_ptr());
        // Another query gets its own.
        let bare_query = render(&c, &config, "").await;
        assert!(bare_query.ends_with(b"\n1.ts\n"), "{bare_query:?}");
        // A segment appended: the next request lists it; what was handed out is unchanged.
        c.store(Vec::new(), vec![four(2)], kept, None);
        let three = render(&c, &config, "iface=lo").await;
        assert_eq!(three, format!("{two}{}", line(2)));
        assert_ne!(three.as_ptr(), first.as_ptr());
        assert_eq!(first, two);
        assert_eq!(
            render(&c, &config, "iface=lo").await.as_ptr(),
            three.as_ptr()
        );
        // Ended: complete, as VOD.
        c.end(None);
        let ended = render(&c, &config, "iface=lo").await;
        let vod = format!("{two}{}#EXT-X-ENDLIST\n", line(2))
            .replace("#EXT-X-PLAYLIST-TYPE:EVENT", "#EXT-X-PLAYLIST-TYPE:VOD");
        assert_eq!(ended, vod);
    }

    /// A segment is found by binary search: the window's lock is held for a few looks, not a
    /// scan of the 20,000 segments a catch-up window may hold.
    #[test]
    fn a_segment_is_found_in_a_few_looks() {
        let config = HlsConfig::default();
        let c = bare(Some(0));
        let total = CATCHUP_MAX_SEGMENTS as u64 + 1500;
        for batch in (0..total).collect::<Vec<_>>().chunks(5000) {
            let segments = batch.iter().map(|n| tiny(*n)).collect();
            c.store(Vec::new(), segments, keep(&config, true), None);
        }
        let w = registry::lock(&c.window);
        // Segment numbers are the sequences here: the first 1,500 left the window.
        let look = |n: u64| {
            PROBES.with(|p| p.set(0));
            let found = w.segment(n).map(|s| s.number);
            (found, PROBES.with(|p| p.get()))
        };
        let most = 2 + u64::from(CATCHUP_MAX_SEGMENTS.ilog2());
        for (n, want) in [
            (1500, Some(1500)),
            (total - 1, Some(total - 1)),
            (11_000, Some(11_000)),
            (1499, None),
            (total, None),
            (0, None),
        ] {
            let (found, probes) = look(n);
            assert_eq!(found, want, "segment {n}");
            assert!(probes <= most, "segment {n}: {probes} looks");
        }
    }

    /// Requests arriving together right after the window changed wait for one write of the
    /// playlist, and all get its bytes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn requests_arriving_together_share_one_write() {
        let config = HlsConfig::default();
        let c = Arc::new(bare(Some(1_700_000_000_000)));
        packets(&c, 20_000, &config);
        let query: Arc<str> = format!("token={}", "t".repeat(200)).into();
        let start = Arc::new(tokio::sync::Barrier::new(16));
        let requests: Vec<_> = (0..16)
            .map(|_| {
                let (c, config, query, start) =
                    (c.clone(), config.clone(), query.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    render(&c, &config, &query).await
                })
            })
            .collect();
        let mut bodies = Vec::new();
        for r in requests {
            bodies.push(r.await.unwrap());
        }
        assert_eq!(c.rendered.writes(), 1);
        assert!(bodies[0].len() > 4 << 20, "{} bytes", bodies[0].len());
        assert!(bodies.iter().all(|b| *b == bodies[0]));
        // The next request takes the one kept; a new segment, a new write.
        assert_eq!(render(&c, &config, &query).await, bodies[0]);
        assert_eq!(c.rendered.writes(), 1);
        c.store(Vec::new(), vec![tiny(20_000)], keep(&config, true), None);
        assert_ne!(render(&c, &config, &query).await, bodies[0]);
        assert_eq!(c.rendered.writes(), 2);
    }

    /// A large playlist is written on the blocking pool, at most `BLOCKING_WRITES` at once over
    /// all channels; a small one at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn large_playlists_are_written_off_the_runtime_a_few_at_once() {
        let config = HlsConfig::default();
        let shared = Arc::new(kept::Shared::default());
        let small = bare_in(Some(0), shared.clone());
        packets(&small, 10, &config);
        let text = render(&small, &config, "iface=lo").await;
        assert!(text.ends_with(b"9.ts?iface=lo\n"));
        assert_eq!(shared.blocking_writes().0, 0);
        let query: Arc<str> = "q".repeat(2000).into();
        let requests: Vec<_> = (0..8)
            .map(|_| {
                let c = Arc::new(bare_in(Some(0), shared.clone()));
                packets(&c, 2000, &config);
                let (config, query) = (config.clone(), query.clone());
                tokio::spawn(async move { render(&c, &config, &query).await.len() })
            })
            .collect();
        for r in requests {
            assert!(r.await.unwrap() > 2000 * 2000);
        }
        let (writes, peak) = shared.blocking_writes();
        assert_eq!(writes, 8);
        assert!((1..=kept::BLOCKING_WRITES as u64).contains(&peak), "{peak}");
    }

    /// What all channels keep (listings and playlists) stays within the bound, however many
    /// channels and queries ask; past it a playlist is still answered, and not kept.
    #[tokio::test]
    async fn what_channels_keep_stays_within_the_bound() {
        let config = HlsConfig::default();
        let limit = 1 << 20;
        let shared = Arc::new(kept::Shared::new(limit));
        let mut channels = Vec::new();
        for _ in 0..40 {
            let c = bare_in(Some(0), shared.clone());
            packets(&c, 200, &config);
            for q in 0..5 {
                let query = format!("q{q}={}", "x".repeat(500));
                let text = render(&c, &config, &query).await;
                let listing = registry::lock(&c.window).listing(&config, c.catchup, &c.rendered);
                assert_eq!(text, render::media(&config, &listing, &query));
                assert!(shared.used() <= limit, "{} kept", shared.used());
            }
            channels.push(c);
        }
        assert!(shared.used() > limit / 2, "{} kept", shared.used());
        // What a channel kept goes with it.
        drop(channels);
        assert_eq!(shared.used(), 0);
    }

    /// An fMP4 playlist goes the TS one's way: requests arriving together share one write, on
    /// the blocking pool when it is large, and the next request takes the one kept.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn fmp4_playlists_share_one_write_off_the_runtime() {
        let config = HlsConfig::default();
        let shared = Arc::new(kept::Shared::default());
        let c = Arc::new(bare_in(Some(1_700_000_000_000), shared.clone()));
        packets(&c, 20_000, &config);
        c.fmp4.fake(0..20_000);
        let query: Arc<str> = format!("token={}", "t".repeat(200)).into();
        let start = Arc::new(tokio::sync::Barrier::new(16));
        let fmp4 = |c: Arc<Channel>, config: HlsConfig, query: Arc<str>| async move {
            let listing = registry::lock(&c.window).listing(&config, c.catchup, &c.rendered);
            c.rendered
                .get_fmp4(&config, &listing, &query, &c.fmp4)
                .await
                .expect("an fMP4 form")
                .text
                .clone()
        };
        let requests: Vec<_> = (0..16)
            .map(|_| {
                let (c, config, query, start) =
                    (c.clone(), config.clone(), query.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    fmp4(c, config, query).await
                })
            })
            .collect();
        let mut bodies = Vec::new();
        for r in requests {
            bodies.push(r.await.unwrap());
        }
        assert_eq!(c.rendered.writes(), 1);
        assert_eq!(shared.blocking_writes().0, 1);
        assert!(bodies[0].len() > 4 << 20, "{} bytes", bodies[0].len());
        assert!(bodies[0].ends_with(format!("19999.m4s?{query}\n").as_bytes()));
        assert!(bodies.iter().all(|b| *b == bodies[0]));
        let again = fmp4(c.clone(), config.clone(), query.clone()).await;
        assert_eq!(again.as_ptr(), bodies[0].as_ptr());
        // The TS playlist of the same version is another playlist.
        let ts = render(&c, &config, &query).await;
        assert!(ts.ends_with(format!("19999.ts?{query}\n").as_bytes()));
        assert_eq!(c.rendered.writes(), 2);
    }

    /// Kept playlists take at most half of what channels keep: however many fill it, every
    /// channel's listing is still kept (else each request walks its window again, under the
    /// window's lock).
    #[tokio::test]
    async fn listings_are_kept_when_playlists_fill_the_bound() {
        let config = HlsConfig::default();
        let limit = 1 << 20;
        let shared = Arc::new(kept::Shared::new(limit));
        let mut channels = Vec::new();
        for _ in 0..40 {
            let c = bare_in(Some(0), shared.clone());
            packets(&c, 200, &config);
            render(&c, &config, &format!("q={}", "x".repeat(500))).await;
            channels.push(c);
        }
        assert!(shared.used() <= limit, "{} kept", shared.used());
        let c = bare_in(Some(0), shared.clone());
        packets(&c, 2000, &config);
        render(&c, &config, "iface=lo").await;
        assert!(
            registry::lock(&c.window).listing.is_some(),
            "listing not kept: {} of {limit} used",
            shared.used()
        );
        assert!(shared.used() <= limit, "{} kept", shared.used());
    }

    /// A shared write whose request was dropped (its client left) still ends: what it wrote
    /// is kept, and its flight goes, so hang-ups never use up the channel's shared writes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_write_outlives_the_request_that_started_it() {
        let config = HlsConfig::default();
        let shared = Arc::new(kept::Shared::default());
        let c = Arc::new(bare_in(Some(0), shared.clone()));
        packets(&c, 2000, &config);
        let query = |n: usize| format!("q{n}={}", "x".repeat(2000));
        let settled = |c: Arc<Channel>, want: usize| async move {
            for _ in 0..500 {
                if c.rendered.flights() == want {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            panic!("{} flights, not {want}", c.rendered.flights());
        };
        // Every place for a large write taken: the writes wait, and their requests hang up.
        let places = shared.places();
        let hang_up = |queries: std::ops::Range<usize>| {
            let (c, config, places) = (c.clone(), config.clone(), places.clone());
            async move {
                let held = places.acquire_many_owned(2).await.unwrap();
                let hung: Vec<_> = queries
                    .clone()
                    .map(|n| {
                        let (c, config, query) = (c.clone(), config.clone(), query(n));
                        tokio::spawn(async move { render(&c, &config, &query).await })
                    })
                    .collect();
                settled(c.clone(), queries.len()).await;
                for h in hung {
                    h.abort();
                    assert!(h.await.unwrap_err().is_cancelled());
                }
                drop(held);
                settled(c.clone(), 0).await;
            }
        };
        hang_up(0..1).await;
        assert_eq!(c.rendered.writes(), 1);
        // What it wrote is kept: asked again, it is not written again.
        let kept = render(&c, &config, &query(0)).await;
        assert!(kept.ends_with(format!("1999.ts?{}\n", query(0)).as_bytes()));
        assert_eq!(c.rendered.writes(), 1);
        hang_up(1..1 + render::MAX_FLIGHTS).await;
        assert_eq!(c.rendered.writes(), 1 + render::MAX_FLIGHTS as u64);
        // Another query: requests arriving together still share one write.
        let before = c.rendered.writes();
        let together: Vec<_> = (0..4)
            .map(|_| {
                let (c, config, query) = (c.clone(), config.clone(), query(99));
                tokio::spawn(async move { render(&c, &config, &query).await })
            })
            .collect();
        for t in together {
            t.await.unwrap();
        }
        assert_eq!(c.rendered.writes(), before + 1);
        assert_eq!(c.rendered.flights(), 0);
    }

    /// A request for `c`'s playlist with the `n`th of distinct 2 KB queries, from `client`.
    async fn ask(
        c: &Channel,
        sent: &Arc<sent::Sent>,
        metrics: &super::super::metrics::Metrics,
        client: std::net::IpAddr,
        n: usize,
    ) -> Response<Body> {
        let config = HlsConfig::default();
        let listing = registry::lock(&c.window).listing(&config, c.catchup, &c.rendered);
        let query = format!("q{n:04}={}", "x".repeat(2000));
        let playlist = c.rendered.get(&config, &listing, &query).await;
        answer(sent, metrics, &playlist, client)
    }

    /// Attack: clients ask a catch-up channel for its playlist with distinct long queries
    /// (each its own playlist of megabytes, too large for what channels keep) and read none of
    /// the answers. What they hold stays within the budget, and one client (an IPv6 one by its
    /// /64) holds at most a quarter of it, even alone; past either the next request is refused
    /// as the endpoint's other refusals are; answers sent or dropped give it back.
    #[tokio::test]
    async fn playlists_being_sent_stay_within_their_budget() {
        use http_body_util::BodyExt;
        let config = HlsConfig::default();
        let c = bare_in(Some(0), Arc::new(kept::Shared::new(1 << 20)));
        packets(&c, 2000, &config);
        let metrics = super::super::metrics::Metrics::default();
        let (a, b): (std::net::IpAddr, std::net::IpAddr) =
            ("10.0.0.1".parse().unwrap(), "2001:db8::1".parse().unwrap());
        let size = ask(&c, &Arc::default(), &metrics, a, 0)
            .await
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .len() as u64;
        assert!(size > 4 << 20, "{size} bytes");
        // Four answers fit, and a quarter of it is a little more than one.
        let sent = Arc::new(sent::Sent::new(4 * size + size / 2));
        let mut n = 1;
        let mut next = || {
            n += 1;
            n
        };
        // Four clients take one each; a fifth finds the budget full.
        let mut held = Vec::new();
        for i in 1..=4 {
            let resp = ask(&c, &sent, &metrics, [10, 0, 1, i].into(), next()).await;
            assert_eq!(resp.status(), StatusCode::OK);
            held.push(resp);
        }
        let refused = ask(&c, &sent, &metrics, a, next()).await;
        let refusals = || {
            metrics
                .refused
                .get_or_create(&super::super::metrics::RefusedLabels {
                    reason: "hls_memory",
                })
                .get()
        };
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(sent.used(), 4 * size);
        assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
        assert_eq!(
            refused.headers()[header::CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
        let mark = refused
            .extensions()
            .get::<crate::error::ErrorMark>()
            .unwrap();
        assert_eq!(
            (mark.side, mark.kind),
            (crate::error::Side::Internal, "hls_memory")
        );
        assert_eq!(refusals(), 1);
        let text = refused.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            text,
            "the HLS playlists being sent now hold all the memory set aside for them; \
             try again shortly\n"
        );
        assert_eq!(sent.used(), 4 * size);
        // Dropped, they give their bytes back.
        held.clear();
        assert_eq!(sent.used(), 0);
        // Alone, a client gets its share, a little more than one answer, though the budget has
        // room for more: one that took it all and read slowly would keep every other out.
        let mine = ask(&c, &sent, &metrics, a, next()).await;
        assert_eq!(mine.status(), StatusCode::OK);
        let past_share = ask(&c, &sent, &metrics, a, next()).await;
        assert_eq!(past_share.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(sent.used(), size);
        assert_eq!(refusals(), 2);
        // Another client gets its own; another address of its /64 is that client.
        let mut theirs = ask(&c, &sent, &metrics, b, next()).await;
        assert_eq!(theirs.status(), StatusCode::OK);
        let same_64 = "2001:db8::2".parse().unwrap();
        let theirs_too = ask(&c, &sent, &metrics, same_64, next()).await;
        assert_eq!(theirs_too.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refusals(), 3);
        // Sent to the last byte (the body not dropped yet), the other client's answer gives
        // its bytes back, and its /64 asks again.
        let mut got = 0;
        while let Some(frame) = theirs.body_mut().frame().await {
            got += frame.unwrap().into_data().unwrap().len() as u64;
        }
        assert_eq!(got, size);
        assert_eq!(sent.used(), size);
        let again = ask(&c, &sent, &metrics, same_64, next()).await;
        assert_eq!(again.status(), StatusCode::OK);
        assert_eq!(sent.used(), 2 * size);
        drop((mine, again, theirs));
        assert_eq!(sent.used(), 0);
    }

    /// A playlist its channel keeps is charged once, to what channels keep, however many
    /// answers send it; replaced while they do, it stays counted there until they are done.
    #[tokio::test]
    async fn a_kept_playlist_is_charged_once_while_it_is_sent() {
        let config = HlsConfig::default();
        let shared = Arc::new(kept::Shared::default());
        let c = bare_in(Some(0), shared.clone());
        packets(&c, 2000, &config);
        let metrics = super::super::metrics::Metrics::default();
        let size = render(&c, &config, &format!("q{:04}={}", 0, "x".repeat(2000)))
            .await
            .len() as u64;
        let before = shared.used();
        assert!(before > size, "{before} kept");
        // Room for one answer of a playlist not kept: none is needed.
        let sent = Arc::new(sent::Sent::new(size + size / 2));
        let answers: Vec<_> = futures_util::future::join_all((1..=10u8).map(|n| {
            let client = std::net::IpAddr::from([10, 0, 0, n]);
            ask(&c, &sent, &metrics, client, 0)
        }))
        .await;
        assert!(answers.iter().all(|r| r.status() == StatusCode::OK));
        assert_eq!(sent.used(), 0);
        assert_eq!(shared.used(), before);
        // Another query replaces it: both are counted while answers send the first.
        let other = ask(&c, &sent, &metrics, [10, 0, 0, 1].into(), 1).await;
        assert_eq!(other.status(), StatusCode::OK);
        assert_eq!(sent.used(), 0);
        assert_eq!(shared.used(), before + size);
        drop(answers);
        assert_eq!(shared.used(), before);
    }

    /// A timeshift playlist larger than any answer may send is refused before it is written
    /// (not even waiting for a place on the blocking pool); a full window
    /// (`timeshift::MAX_SEGMENTS`) with the longest query is written, within the bound.
    #[tokio::test]
    async fn a_timeshift_playlist_no_answer_could_send_is_refused_before_it_is_written() {
        let query = format!("t={}", "x".repeat(MAX_QUERY_BYTES - 2));
        let shared = kept::Shared::default();
        let places = shared.places();
        // More entries than fit with that query (an index with no count bound held millions).
        let big = timeshift_listing(
            MAX_TIMESHIFT_PLAYLIST / (MAX_QUERY_BYTES + TIMESHIFT_LINE_BYTES) + 1,
        );
        // Every place is taken: a write would wait for one.
        let taken = places
            .clone()
            .acquire_many_owned(kept::BLOCKING_WRITES as u32)
            .await
            .unwrap();
        let wait = Duration::from_secs(30);
        let refused = tokio::time::timeout(
            Duration::from_secs(5),
            write_timeshift(big, &query, &shared, wait),
        )
        .await
        .expect("refused at once, not queued to be written");
        match refused {
            Err(estimate) => assert!(estimate > MAX_TIMESHIFT_PLAYLIST, "{estimate}"),
            Ok(text) => panic!("a playlist of {} bytes was written", text.len()),
        }
        // One it could send is refused too while every place stays taken past its wait, not
        // queued behind the writes holding them (requests waited there without bound, each
        // with its listing).
        let short = Duration::from_millis(100);
        let busy = tokio::time::timeout(
            Duration::from_secs(5),
            write_timeshift(
                timeshift_listing(timeshift::MAX_SEGMENTS),
                &query,
                &shared,
                short,
            ),
        )
        .await
        .expect("refused after its wait, not queued for a place");
        match busy {
            Err(estimate) => assert!(estimate <= MAX_TIMESHIFT_PLAYLIST, "{estimate}"),
            Ok(text) => panic!("a playlist of {} bytes was written", text.len()),
        }
        // Places taken for less than the wait: the write queues for one and is written (only
        // trying for one, it was refused whenever a queued live or catch-up write was ahead).
        let freeing = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(taken);
        });
        let text = write_timeshift(
            timeshift_listing(timeshift::MAX_SEGMENTS),
            &query,
            &shared,
            wait,
        )
        .await
        .expect("written once a place frees");
        freeing.await.unwrap();
        assert!(text.len() <= MAX_TIMESHIFT_PLAYLIST, "{} bytes", text.len());
        assert_eq!(text.matches(".ts?t=").count(), timeshift::MAX_SEGMENTS);
        assert!(text.ends_with(&format!("{}.ts?{query}\n", timeshift::MAX_SEGMENTS - 1)));
    }

    /// At most `TIMESHIFT_WAITING` timeshift writes wait for a place at once: each holds its
    /// listing while it waits (requests with distinct queries each waited, ~1.2 MB apiece, and
    /// stood ahead of later live writes in the places' queue).
    #[tokio::test]
    async fn only_a_few_timeshift_writes_wait_for_a_place() {
        // Past the inline size (written on the blocking pool), far under the refusal's.
        let query = format!("t={}", "x".repeat(100));
        // Shared state of its own: other tests write timeshift playlists at the same time.
        let shared = Arc::new(kept::Shared::default());
        let taken = shared
            .places()
            .acquire_many_owned(kept::BLOCKING_WRITES as u32)
            .await
            .unwrap();
        let wait = Duration::from_secs(30);
        let waiters: Vec<_> = (0..TIMESHIFT_WAITING)
            .map(|_| {
                let (entries, query, shared) = (
                    timeshift_listing(timeshift::MAX_SEGMENTS),
                    query.clone(),
                    shared.clone(),
                );
                tokio::spawn(async move { write_timeshift(entries, &query, &shared, wait).await })
            })
            .collect();
        // Every one of them comes to wait for a place.
        tokio::time::timeout(Duration::from_secs(10), async {
            while shared.timeshift_waiting.load(Ordering::Acquire) < TIMESHIFT_WAITING {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("all waiting");
        // One more is refused at once, without waiting.
        let more = tokio::time::timeout(
            Duration::from_secs(5),
            write_timeshift(
                timeshift_listing(timeshift::MAX_SEGMENTS),
                &query,
                &shared,
                wait,
            ),
        )
        .await
        .expect("refused at once, not queued");
        assert!(more.is_err());
        // The places come back: the waiting ones are written, and give their places back.
        drop(taken);
        for waiter in waiters {
            assert!(waiter.await.unwrap().is_ok());
        }
        assert_eq!(shared.timeshift_waiting.load(Ordering::Acquire), 0);
    }

    /// Viewers of one version of a timeshift window (one after another or together) share one
    /// write of its playlist: each poll wrote the whole window (megabytes for a day).
    #[tokio::test]
    async fn viewers_of_one_timeshift_version_share_one_write() {
        let dir = tempfile::tempdir().unwrap();
        let recorder = Recorder::open(dir.path().join("ch"), 60, 2 << 30, 4).unwrap();
        let segment = |n: u64| Segment {
            data: vec![0x47; 188].into(),
            duration: 4 * CLOCK,
            keyframe: true,
            discontinuity: false,
            start: n * 4 * CLOCK,
            number: n,
        };
        for n in 0..3 {
            recorder
                .keep(n, &segment(n), 1_700_000_000_000 + n as i64 * 4_000)
                .await;
        }
        let memo = render::TimeshiftMemo::default();
        let shared = Arc::new(kept::Shared::new(kept::MAX_KEPT_TOTAL));
        let get = |query: &'static str| timeshift_window(&memo, &recorder, 4, query, &shared);
        let first = get("a=1").await.unwrap().unwrap();
        let again = get("a=1").await.unwrap().unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(memo.writes(), 1);
        let text = std::str::from_utf8(&first.text).unwrap();
        assert_eq!(text.matches(".ts?a=1\n").count(), 3, "{text}");
        // A new segment is a new version: requests arriving together share its one write.
        recorder.keep(3, &segment(3), 1_700_000_012_000).await;
        let (a, b) = tokio::join!(get("a=1"), get("a=1"));
        let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(memo.writes(), 2);
        assert_eq!(
            std::str::from_utf8(&a.text)
                .unwrap()
                .matches(".ts?a=1\n")
                .count(),
            4
        );
        // Another query is another playlist.
        let other = get("b=2").await.unwrap().unwrap();
        assert!(std::str::from_utf8(&other.text)
            .unwrap()
            .contains("3.ts?b=2\n"));
        assert_eq!(memo.writes(), 3);
        // Both queries of the version are kept: viewers with a token each no longer replace
        // each other's playlist, each reload a write (the memo kept one query).
        for _ in 0..3 {
            assert!(Arc::ptr_eq(&get("a=1").await.unwrap().unwrap(), &a));
            assert!(Arc::ptr_eq(&get("b=2").await.unwrap().unwrap(), &other));
        }
        assert_eq!(memo.writes(), 3);
    }

    #[test]
    fn playlist_entries_become_hls_urls() {
        let base = "http://gw:8888";
        let m3u = "#EXTM3U\n#EXTINF:-1 catchup-source=\"http://gw:8888/rtsp/h/p?x\",A\n\
                   http://gw:8888/rtp/239.1.1.1:5000?iface=eth0\n#EXTINF:-1,B\n\
                   http://gw:8888/udp/239.1.1.2:5000/\nhttp://elsewhere/x.m3u8\n";
        assert_eq!(
            hls_entries(m3u, base),
            "#EXTM3U\n#EXTINF:-1 catchup-source=\"http://gw:8888/rtsp/h/p?x\",A\n\
             http://gw:8888/hls/rtp/239.1.1.1:5000/index.m3u8?iface=eth0\n#EXTINF:-1,B\n\
             http://gw:8888/hls/udp/239.1.1.2:5000/index.m3u8\nhttp://elsewhere/x.m3u8\n"
        );
    }
}
