//! HLS playlist rewriting: every URI of a master or media playlist routed back through the proxy. No I/O.
//!
//! [`rewrite_playlist`] takes the playlist text, the final upstream URL (after redirects) that
//! relative URIs resolve against, the request's [`RewriteOptions`], and a callback that turns
//! an absolute upstream URL plus a [`Target`] into the proxy URL to write (the front end knows
//! endpoints, query parameters and tokens; this module only knows what each URI *is*).
//!
//! # Routing rules (MediaFlow's contract)
//! - the URI line after `#EXT-X-STREAM-INF` → [`Target::Playlist`], whatever its extension;
//! - `URI="..."` of `#EXT-X-MEDIA`, `#EXT-X-I-FRAME-STREAM-INF`, `#EXT-X-RENDITION-REPORT`
//!   → [`Target::Playlist`];
//! - `#EXT-X-KEY`, `#EXT-X-SESSION-KEY` → [`Target::Key`] (`METHOD=NONE` has no URI);
//! - `#EXT-X-MAP`, and `#EXT-X-PRELOAD-HINT` with `TYPE=MAP` → [`Target::Map`];
//! - `#EXT-X-PART`, other `#EXT-X-PRELOAD-HINT` → [`Target::Segment`];
//! - other URI lines → [`Target::Playlist`] if [`is_playlist_url`], else [`Target::Segment`];
//! - `#EXT-X-SESSION-DATA` URIs are made absolute but never proxied.
//!
//! URIs that do not resolve to an absolute `http`/`https` URL (`skd://`, `data:`, garbage) and
//! tags whose attribute list is malformed are left exactly as they were. Unknown tags, comments
//! and blank lines are copied byte for byte, each line keeps its own terminator (LF or CRLF).
//! Anything before `#EXTM3U` (a BOM, blank lines) is dropped: players want `#EXTM3U` first.
//!
//! # LL-HLS
//! Parts, preload hints and rendition reports are routed as above; `blocking` checks the delivery
//! directives of blocking reloads (`_HLS_msn`, `_HLS_part`, `_HLS_skip`) and puts them on the
//! upstream URL.
//!
//! # Options
//! See [`RewriteOptions`]; `skip` and the start offsets are documented there with their rules.

mod attr;
pub mod blocking;
mod budget;
mod lines;
mod rewrite;
mod scan;
mod select;
mod skip;
#[cfg(test)]
mod tests;

pub use budget::{count_entries, max_output_len, MAX_URL_LEN, OUTPUT_ALLOWANCE, OUTPUT_GROWTH};
pub use select::parse_resolution;
pub use skip::parse_skip;

use url::Url;

/// Lines longer than this are refused: real playlists stay far below it (the longest lines are
/// SCTE-35 date ranges of a few KiB), and a cap bounds the work any one line can cause.
pub const MAX_LINE_LEN: usize = 64 * 1024;

/// What kind of proxy URL the caller must build for a URI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Another playlist: the manifest endpoint (`/proxy/hls/manifest.m3u8`).
    Playlist,
    /// Media bytes: `/proxy/hls/segment.<ext>`.
    Segment { ext: SegmentExt },
    /// A decryption key; MediaFlow serves these from the segment endpoint as `segment.ts`.
    Key,
    /// An init section (`EXT-X-MAP`): `/proxy/hls/segment.<ext>`, `mp4` unless the URI says otherwise.
    Map { ext: SegmentExt },
}

/// Extensions of the segment endpoint; picked from the URI's last path segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentExt {
    Ts,
    M4s,
    Mp4,
    M4a,
    M4v,
    Aac,
}

impl SegmentExt {
    pub fn as_str(self) -> &'static str {
        match self {
            SegmentExt::Ts => "ts",
            SegmentExt::M4s => "m4s",
            SegmentExt::Mp4 => "mp4",
            SegmentExt::M4a => "m4a",
            SegmentExt::M4v => "m4v",
            SegmentExt::Aac => "aac",
        }
    }

    /// The extension of the URL's last path segment, if it is one of ours (case-insensitive).
    pub fn from_url(url: &Url) -> Option<SegmentExt> {
        let file = url.path().rsplit('/').next()?;
        let (_, ext) = file.rsplit_once('.')?;
        Self::parse(ext)
    }

    /// One of our extensions, without the dot (case-insensitive).
    pub fn parse(ext: &str) -> Option<SegmentExt> {
        [
            SegmentExt::Ts,
            SegmentExt::M4s,
            SegmentExt::Mp4,
            SegmentExt::M4a,
            SegmentExt::M4v,
            SegmentExt::Aac,
        ]
        .into_iter()
        .find(|e| ext.eq_ignore_ascii_case(e.as_str()))
    }
}

/// Per-request rewriting choices (MediaFlow's `/proxy/hls/manifest.m3u8` parameters).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RewriteOptions {
    /// Replaces scheme, host and port of `EXT-X-KEY` and `EXT-X-SESSION-KEY` URIs (not maps).
    pub key_url: Option<Url>,
    /// Only keys (and playlists, so their keys are reached) go through the proxy; segments and
    /// maps become absolute direct URLs.
    pub key_only_proxy: bool,
    /// Nothing is proxied: relative URIs are only made absolute. Wins over `key_only_proxy`.
    pub no_proxy: bool,
    /// Injected as `#EXT-X-START:TIME-OFFSET=<x>,PRECISE=YES` right after `#EXTM3U` in any
    /// playlist that has no `EXT-X-START` of its own. Must be finite.
    pub start_offset: Option<f64>,
    /// Like `start_offset` but only for live media playlists, and only when `start_offset` is
    /// unset. Live means: not a master, no `#EXT-X-ENDLIST`, and no `#EXT-X-PLAYLIST-TYPE:VOD`
    /// (`EVENT` counts as live). The media sequence number plays no part: a stream that has just
    /// started at sequence 0 is as live as any. Not for LL-HLS playlists (`EXT-X-PART-INF`): a
    /// start far behind the live edge would undo the part hold-back low latency rests on.
    pub default_live_start_offset: Option<f64>,
    /// Time ranges in seconds, measured by summing `EXTINF` durations from the first segment.
    /// In media playlists, segments overlapping a range are removed together with their own
    /// tags (`EXTINF`, `BYTERANGE`, `PROGRAM-DATE-TIME`, `DISCONTINUITY`, `GAP`, `PART`); keys,
    /// maps and other tags stay since later segments may rely on them. Where segments were cut
    /// between two kept ones, the next kept one gets `#EXT-X-DISCONTINUITY` (once); a cut at the
    /// very start needs none. An implicit `BYTERANGE` offset after a cut is made explicit.
    /// Ignored in master playlists. Sequence numbers are not renumbered: `skip` is meant for
    /// VOD, where players do not track them.
    pub skip: Vec<(f64, f64)>,
    /// Master playlists: keep only the variants of the highest `RESOLUTION`.
    pub max_res: bool,
    /// Master playlists: keep the variants of this height, else the closest lower one, else the
    /// lowest. Wins over `max_res`. Variants of equal height are all kept (they usually differ in
    /// codec, which the player still needs to choose on); variants without `RESOLUTION` are
    /// dropped when another has one; if none has one, all are kept. `EXT-X-MEDIA` renditions and
    /// `EXT-X-I-FRAME-STREAM-INF` stay untouched.
    pub resolution: Option<u32>,
}

/// Why a playlist could not be rewritten, or an option parsed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HlsError {
    #[error("not an HLS playlist: the text does not start with #EXTM3U")]
    NotAPlaylist,
    #[error("line {line} is longer than {max} bytes")]
    LineTooLong { line: usize, max: usize },
    #[error("line {line}: EXTINF duration is not a finite non-negative number")]
    InvalidDuration { line: usize },
    #[error("line {line}: the proxy URL built for it contains a quote or a line break")]
    InvalidProxyUrl { line: usize },
    #[error("line {line}: a URL longer than {max} bytes")]
    UrlTooLong { line: usize, max: usize },
    #[error("the rewritten playlist would be over {max} bytes")]
    OutputTooLarge { max: usize },
    #[error("start offset must be a finite number of seconds")]
    InvalidStartOffset,
    #[error("invalid skip {input:?}: {reason}")]
    InvalidSkip { input: String, reason: &'static str },
    #[error("invalid resolution {0:?}: expected like 720p, 720 or 1280x720")]
    InvalidResolution(String),
}

/// What the first bytes of an upstream response look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sniff {
    Playlist,
    /// An HTML page (login wall, error page, CDN block) where a playlist was expected.
    Html,
    Other,
}

/// Rewrites `text` (a master or media playlist) so its URIs go where `make_url` says.
///
/// `base` is the final upstream URL after redirects. `make_url` gets the kind of proxy URL to
/// build and the absolute upstream URL, and must return a URL without `"`, CR or LF
/// (percent-encode it). Linear in the input size; never panics on any input. Fails with
/// `UrlTooLong` at an upstream URL over [`MAX_URL_LEN`] and with `OutputTooLarge` once the output
/// would pass [`max_output_len`] of the input.
pub fn rewrite_playlist(
    text: &str,
    base: &Url,
    opts: &RewriteOptions,
    make_url: &mut dyn FnMut(Target, &Url) -> String,
) -> Result<String, HlsError> {
    let body = ensure_playlist(text)?;
    let summary = scan::scan(body, opts)?;
    let start = start_offset(opts, &summary)?;
    let mut lines = lines::lines(body);
    let Some(first) = lines.next() else {
        return Err(HlsError::NotAPlaylist);
    };
    let eol = if first.eol.is_empty() {
        "\n"
    } else {
        first.eol
    };
    let mut writer = rewrite::Writer::new(base, opts, make_url, &summary, eol, body.len());
    writer.push_str(first.text);
    writer.push_str(eol);
    if let Some(offset) = start {
        writer.push_str(&format!(
            "#EXT-X-START:TIME-OFFSET={},PRECISE=YES{eol}",
            format_offset(offset)
        ));
    }
    for line in lines {
        writer.line(line)?;
    }
    writer.finish()
}

/// The `EXT-X-START` offset to inject, if any.
fn start_offset(opts: &RewriteOptions, summary: &scan::Summary) -> Result<Option<f64>, HlsError> {
    let offset = match (opts.start_offset, opts.default_live_start_offset) {
        (Some(x), _) => Some(x),
        (None, Some(x)) if summary.is_live && !summary.low_latency => Some(x),
        _ => None,
    };
    match offset {
        Some(x) if !x.is_finite() => Err(HlsError::InvalidStartOffset),
        Some(_) if summary.has_start => Ok(None),
        other => Ok(other),
    }
}

/// HLS decimal: never an exponent; whole numbers as `-18.0`, like MediaFlow writes them.
fn format_offset(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

/// The playlist with any leading BOM and whitespace removed, or `NotAPlaylist` if it does not
/// then start with `#EXTM3U`.
pub fn ensure_playlist(text: &str) -> Result<&str, HlsError> {
    let body = skip_preamble(text.as_bytes());
    if body.starts_with(b"#EXTM3U") {
        Ok(&text[text.len() - body.len()..])
    } else {
        Err(HlsError::NotAPlaylist)
    }
}

/// Classifies the first bytes of a response (a few hundred are plenty).
pub fn sniff(head: &[u8]) -> Sniff {
    let head = skip_preamble(head);
    if head.starts_with(b"#EXTM3U") {
        return Sniff::Playlist;
    }
    let html = [&b"<!doctype"[..], b"<html", b"<head", b"<body"]
        .iter()
        .any(|p| head.len() >= p.len() && head[..p.len()].eq_ignore_ascii_case(p));
    if html {
        Sniff::Html
    } else {
        Sniff::Other
    }
}

fn skip_preamble(bytes: &[u8]) -> &[u8] {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    &bytes[start..]
}

/// `true` if the URL names a playlist: path ending `.m3u8`, `.m3u` or `.m3u_plus`
/// (case-insensitive), or a `type=m3u...` query parameter.
pub fn is_playlist_url(url: &Url) -> bool {
    let path = url.path().as_bytes();
    let by_path = [&b".m3u8"[..], b".m3u", b".m3u_plus"].iter().any(|ext| {
        path.len() >= ext.len() && path[path.len() - ext.len()..].eq_ignore_ascii_case(ext)
    });
    // Raw query bytes, not decoded pairs: this runs for every segment URI, and nobody
    // percent-encodes `type=m3u`.
    by_path
        || url.query().is_some_and(|q| {
            q.split('&').any(|pair| {
                pair.strip_prefix("type=")
                    .is_some_and(|v| v.len() >= 3 && v.as_bytes()[..3].eq_ignore_ascii_case(b"m3u"))
            })
        })
}

/// A complete, empty VOD playlist: served instead of an HTML page where a playlist was
/// expected, so players end the stream cleanly rather than retry forever.
pub fn graceful_end_playlist() -> &'static str {
    "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:1\n#EXT-X-MEDIA-SEQUENCE:0\n#EXT-X-PLAYLIST-TYPE:VOD\n#EXT-X-ENDLIST\n"
}

/// A bounded copy of user input for error messages.
fn snippet(input: &str) -> String {
    input.chars().take(64).collect()
}
