//! `/hls/<channel>/index.m3u8` and its segments: every channel the gateway serves, as live HLS.
//!
//! One HLS channel per hub key, whatever the number of HLS viewers: it is a single subscriber
//! of the channel's hub (so raw-TS and HLS viewers share one join and one history), feeding one
//! [`Segmenter`] that cuts the stream at keyframes. Finished segments are kept in a short window
//! (`window` listed in the playlist, one more for players that loaded the previous playlist),
//! shared by every viewer without a copy. The channel has no connection to hold it: it stays
//! while requests come, and leaves its hub `linger_ms` plus three target durations after the
//! last one, after which the hub lingers as it does for any subscriber.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use http::{header, Method, Response, StatusCode};
use sluice_media::segmenter::playlist::{self, Entry};
use sluice_media::segmenter::{Segment, Segmenter, Settings, CLOCK};
use tokio::sync::watch;
use tokio::time::Instant;

use super::hub::HubKey;
use super::registry::{self, Subscription};
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
}

crate::config::section::config_section!(HlsConfig {
    enabled,
    target_duration_secs,
    window,
    playlist,
});

impl Default for HlsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            target_duration_secs: 4,
            window: 4,
            playlist: false,
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
        Ok(())
    }
}

/// A segment bigger than this (a stream without usable timestamps) is cut as a gap.
const MAX_SEGMENT_BYTES: usize = 32 << 20;

/// Why an HLS channel could not start.
#[derive(Debug, Clone)]
struct Failure {
    status: StatusCode,
    reason: String,
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
    failure: Option<Failure>,
}

/// One channel's segmenter output, shared by its HLS viewers.
#[derive(Debug)]
pub struct Channel {
    key: HubKey,
    window: Mutex<Window>,
    /// Bumped whenever the window changes, for requests that wait for a segment.
    changed: watch::Sender<u64>,
    touched: Mutex<Instant>,
}

impl Channel {
    fn touch(&self) {
        *registry::lock(&self.touched) = Instant::now();
    }

    fn idle(&self) -> Duration {
        registry::lock(&self.touched).elapsed()
    }

    fn store(&self, segments: Vec<Segment>, keep: usize) {
        if segments.is_empty() {
            return;
        }
        let mut w = registry::lock(&self.window);
        for s in segments {
            let seq = w.next;
            w.next += 1;
            w.segments.push_back((seq, s));
        }
        while w.segments.len() > keep {
            if let Some((_, gone)) = w.segments.pop_front() {
                w.discontinuities_gone += u64::from(gone.discontinuity);
            }
        }
        let next = w.next;
        drop(w);
        self.changed.send_replace(next);
    }

    fn end(&self, failure: Option<Failure>) {
        let mut w = registry::lock(&self.window);
        w.ended = true;
        if w.failure.is_none() {
            w.failure = failure;
        }
        drop(w);
        self.changed.send_modify(|n| *n += 0);
    }
}

/// Live HLS channels by hub key.
#[derive(Debug, Default)]
pub struct Table {
    channels: Mutex<HashMap<HubKey, Arc<Channel>>>,
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
}

/// Splits `/hls/<channel path>/<file>` into the channel's own path and the file.
fn split(path: &str) -> Option<(&str, File)> {
    let rest = path.strip_prefix("/hls")?;
    let (channel, file) = rest.rsplit_once('/')?;
    let file = match file {
        "index.m3u8" => File::Playlist,
        f => File::Segment(f.strip_suffix(".ts")?.parse().ok()?),
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
                "HLS paths are /hls/<channel>/index.m3u8 and /hls/<channel>/<n>.ts\n",
            );
        };
        let key = match self.key_for(channel_path, req) {
            Ok(key) => key,
            Err(resp) => return resp,
        };
        if req.method == Method::HEAD && file == File::Playlist {
            return playlist_response(String::new());
        }
        let channel = match self.hls_channel(key.0, key.1, req) {
            Ok(c) => c,
            Err(resp) => return resp,
        };
        channel.touch();
        let target = Duration::from_secs(config.target_duration_secs);
        let resp = match file {
            File::Playlist => {
                let wait = self.start_wait(&channel.key) + 2 * target;
                self.playlist_of(&channel, wait, req.uri.query().unwrap_or(""))
                    .await
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
        resp
    }

    /// The hub key (and FCC server) of a channel path, as its raw-TS request would have it.
    fn key_for(
        &self,
        channel_path: &str,
        req: &http::request::Parts,
    ) -> Result<(HubKey, Option<super::fcc::FccTarget>), Response<Body>> {
        if channel_path.starts_with("/rtsp/") {
            return self.rtsp_key(channel_path, req).map(|key| (key, None));
        }
        self.hub_key_of(channel_path, req.uri.query())
            .map_err(|reason| {
                self.registry.metrics.refuse("bad_request");
                super::text(StatusCode::BAD_REQUEST, &format!("{reason}\n"))
            })
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
    ) -> Result<Arc<Channel>, Response<Body>> {
        // A catch-up session is private to its viewer; its HLS channel is shared by the
        // requests of that one URL instead, so the table keys it without its private id.
        let mut shared = key.clone();
        if let Some(rtsp) = shared.rtsp.as_mut() {
            rtsp.private = 0;
        }
        let mut table = registry::lock(&self.hls.channels);
        if let Some(c) = table.get(&shared) {
            let failed = registry::lock(&c.window).failure.is_some();
            if !failed {
                return Ok(c.clone());
            }
        }
        let peer = req.extensions.get::<std::net::SocketAddr>().copied();
        let sub = self
            .registry
            .subscribe(key, fcc, peer)
            .map_err(|refusal| self.refused(refusal))?;
        let channel = Arc::new(Channel {
            key: shared.clone(),
            window: Mutex::new(Window::default()),
            changed: watch::Sender::new(0),
            touched: Mutex::new(Instant::now()),
        });
        table.insert(shared, channel.clone());
        drop(table);
        tokio::spawn(self.clone().segment(channel.clone(), sub));
        Ok(channel)
    }

    /// The channel's one reader: hub history in, segments out, until the hub ends or no
    /// viewer has asked for anything for a while.
    async fn segment(self: Arc<Self>, channel: Arc<Channel>, sub: Subscription) {
        let config = &self.config.hls;
        let target = Duration::from_secs(config.target_duration_secs);
        let idle_after = Duration::from_millis(self.config.linger_ms) + 3 * target;
        let keep = config.window + 1;
        let label = sub.hub.key.channel();
        let wait = self.start_wait(&sub.hub.key);
        let failure = 'run: {
            let Some(_first) = self.first_data_within(&sub.hub, wait).await else {
                let reason = match self.rtsp_failure(&sub.hub) {
                    Some(reason) => format!("RTSP upstream: {reason}"),
                    None => format!("no data from {label} within {} ms", wait.as_millis()),
                };
                break 'run Some(Failure {
                    status: StatusCode::GATEWAY_TIMEOUT,
                    reason,
                });
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
            });
            let mut skips = 0;
            let mut check = tokio::time::interval(Duration::from_millis(250));
            tracing::info!(channel = %label, "HLS segmenter started");
            loop {
                tokio::select! {
                    item = stream.next() => {
                        let Some(Ok(frame)) = item else {
                            segmenter.finish();
                            channel.store(segmenter.take(), keep);
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
                        channel.store(segmenter.take(), keep);
                    }
                    _ = check.tick() => {
                        if channel.idle() >= idle_after {
                            tracing::info!(channel = %label, "HLS segmenter stopped: no viewer");
                            self.forget(&channel);
                            return;
                        }
                    }
                }
            }
        };
        // Ended (or never started): viewers get the last segments and the end of the list,
        // or the reason, until they stop asking.
        channel.end(failure);
        tracing::info!(channel = %label, "HLS channel ended");
        while channel.idle() < idle_after {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        self.forget(&channel);
    }

    fn forget(&self, channel: &Arc<Channel>) {
        let mut table = registry::lock(&self.hls.channels);
        if table
            .get(&channel.key)
            .is_some_and(|c| Arc::ptr_eq(c, channel))
        {
            table.remove(&channel.key);
        }
    }

    async fn playlist_of(&self, channel: &Channel, wait: Duration, query: &str) -> Response<Body> {
        let mut rx = channel.changed.subscribe();
        let ready = tokio::time::timeout(
            wait,
            rx.wait_for(|_| {
                let w = registry::lock(&channel.window);
                !w.segments.is_empty() || w.ended
            }),
        )
        .await;
        let w = registry::lock(&channel.window);
        if let Some(f) = &w.failure {
            return super::text(f.status, &format!("{}\n", f.reason));
        }
        if ready.is_err() || w.segments.is_empty() {
            return super::text(
                StatusCode::GATEWAY_TIMEOUT,
                &format!("no segment of {} yet\n", channel.key.channel()),
            );
        }
        let listed = w.segments.len().min(self.config.hls.window);
        let skipped = w.segments.len() - listed;
        let gone = w.discontinuities_gone
            + w.segments
                .iter()
                .take(skipped)
                .map(|(_, s)| u64::from(s.discontinuity))
                .sum::<u64>();
        let entries: Vec<Entry> = w
            .segments
            .iter()
            .skip(skipped)
            .map(|(sequence, s)| Entry {
                sequence: *sequence,
                duration: s.duration,
                discontinuity: s.discontinuity,
            })
            .collect();
        let text = playlist::media(
            playlist::Window {
                target: self.config.hls.target_duration_secs,
                discontinuity_sequence: gone,
                ended: w.ended,
                query,
            },
            &entries,
        );
        playlist_response(text)
    }
}

/// Segment `n`: at once when held, after a wait when it is the next one, else 404.
async fn segment_of(channel: &Channel, n: u64, wait: Duration) -> Response<Body> {
    let mut rx = channel.changed.subscribe();
    let _ = tokio::time::timeout(
        wait,
        rx.wait_for(|_| {
            let w = registry::lock(&channel.window);
            w.next > n || w.ended || n > w.next + 1
        }),
    )
    .await;
    let w = registry::lock(&channel.window);
    match w.segments.iter().find(|(seq, _)| *seq == n) {
        Some((_, s)) => {
            let mut resp = Response::new(body::full(s.data.clone()));
            let h = resp.headers_mut();
            h.insert(header::CONTENT_TYPE, "video/mp2t".parse().unwrap());
            h.insert(header::CONTENT_LENGTH, s.data.len().into());
            h.insert(header::CACHE_CONTROL, "max-age=60".parse().unwrap());
            resp
        }
        None => super::text(
            StatusCode::NOT_FOUND,
            &format!("segment {n} is not in the window\n"),
        ),
    }
}

fn playlist_response(text: String) -> Response<Body> {
    let mut resp = Response::new(body::full(text));
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
