//! `[media]`: the media front end's section and its subsections (`[media.acestream]`,
//! `[media.ratelimit]`, `[media.public_ip]`; forward, EPG and extractors own theirs), with
//! defaults and checks.

pub mod public_ip;
pub mod ratelimit;

use anyhow::bail;
use serde::{Deserialize, Serialize};

/// The MediaFlow-compatible media proxy front end.
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
    /// Most entries one HLS playlist may have: every URI the rewriter routes through the proxy
    /// (segment and other URI lines, with or without `#EXTINF`, and the URIs of parts, maps, keys,
    /// renditions, I-frame playlists, preload hints and rendition reports). Above it the origin's
    /// playlist is refused with a 502, like one over `max_manifest_bytes`, instead of unbounded
    /// rewriting work. 50,000 leaves a 20,000-segment VOD with a key on every segment room, and an
    /// LL-HLS playlist's parts (a few per segment, kept for the newest segments only) room to
    /// spare. (DASH representations have the MPD parser's own cap.)
    pub max_playlist_segments: usize,
    /// Most entry URLs one `/playlist/playlist` merge may hold, over all its sources together.
    /// Each proxied entry becomes a sealed URL of a few hundred bytes, so without it 16 hostile
    /// sources of 8 MB each (750,000 short URLs apiece) made one request seal 12 million URLs
    /// into gigabytes. Real channel lists reach tens of thousands of entries (an Xtream
    /// `m3u_plus` export with films and series a hundred thousand or so); 200,000 leaves those
    /// room and bounds one merge to a few hundred thousand seals. Above it the request is a
    /// 502, the sources' fault; the output is also held to 4 × the sources plus 64 MiB, as in
    /// HLS.
    pub max_merged_entries: usize,
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
    /// Hosts (`cdn.example.com`, or `*.example.com` for every subdomain) that also get a viewer's
    /// `h_authorization`, `h_cookie` and `h_proxy-authorization` when a rewritten HLS playlist or
    /// MPD names them, besides the origin of the request's `d` (CloudFront signed cookies shared
    /// by `www.` and `cdn.`): over https, or http when `d` is http. Never `h_host`, which names a
    /// virtual host of `d`'s origin. Empty: the credentials go to `d`'s origin alone.
    pub credential_hosts: Vec<String>,
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
    pub forward: super::forward::ForwardConfig,
    /// `[media.epg]`: the `/proxy/epg` guide proxy.
    pub epg: super::epg::EpgConfig,
    /// `[media.extractors]`: the commands behind `/extractor/video`.
    pub extractors: super::extractor::ExtractorsConfig,
}

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
            max_playlist_segments: 50_000,
            max_merged_entries: 200_000,
            splice_stream: true,
            max_requests_per_client: 64,
            max_requests_per_token: 64,
            credential_hosts: Vec::new(),
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

impl MediaConfig {
    /// Checks the values before anything binds.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.max_playlist_segments == 0 {
            bail!("media.max_playlist_segments must be at least 1");
        }
        if self.max_merged_entries == 0 {
            bail!("media.max_merged_entries must be at least 1");
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
        super::links::CredentialHosts::parse(&self.credential_hosts)?;
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

/// The largest `media.acestream.buffer_bytes`: 1 GiB, 256 times the default.
const MAX_ACESTREAM_BUFFER_BYTES: usize = 1 << 30;

/// `[media.acestream]`: where the engine is and how sessions are shared.
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
    /// Engine sessions open at once. One client (an IPv4 address, an IPv6 /64) holds at most half
    /// of them alone (one another client joined no longer counts); a client at its share, or at a
    /// full pool, closes its longest-idle session without viewers to open another, and gets 503
    /// only when every one it holds is watched. Joining an open session is always allowed.
    pub max_sessions: usize,
}

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
        // It sizes each session's broadcast channel up front (a slot per 16 KiB): 1 TiB made
        // 2^26 slots before a byte arrived.
        if self.buffer_bytes > MAX_ACESTREAM_BUFFER_BYTES {
            anyhow::bail!("media.acestream.buffer_bytes must be at most 1073741824 (1 GiB)");
        }
        if self.max_sessions == 0 {
            anyhow::bail!("media.acestream.max_sessions must be at least 1");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The session buffer sizes a channel up front, so it has a ceiling: 1 GiB passes, more is
    /// refused by name.
    #[test]
    fn the_acestream_buffer_has_a_ceiling() {
        let with = |buffer_bytes| AcestreamConfig {
            buffer_bytes,
            ..AcestreamConfig::default()
        };
        with(1 << 30).validate().unwrap();
        for too_big in [(1 << 30) + 1, usize::MAX] {
            let err = format!("{:#}", with(too_big).validate().unwrap_err());
            assert!(err.contains("media.acestream.buffer_bytes"), "{err}");
        }
    }
}
