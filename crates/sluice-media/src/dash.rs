//! DASH: MPD parsing, segment addressing, live windows and conversion to HLS playlists. No I/O.
//!
//! # Layout
//! - `xml`: bounded element tree from quick-xml (depth, size and attribute caps, DTD entities never
//!   expanded).
//! - `time`: ISO 8601 durations and xs:dateTime values as seconds.
//! - `mpd`: the typed model ([`Mpd`] → [`Period`] → [`AdaptationSet`] → [`Representation`]) with
//!   BaseURL, attribute and segment-information inheritance resolved.
//! - `protection`: ContentProtection descriptors (system, default KID, licence URL).
//! - `track`: content kind, channel count and frame rate decoding.
//! - `segment_info`: SegmentTemplate / SegmentList / SegmentBase merged down the hierarchy.
//! - `template`: `$Number%05d$`-style URL templates.
//! - `timeline`: SegmentTimeline expansion cut to a window.
//! - `segments`: Representation + Period + now → init segment and segment list.
//! - `sidx`: `sidx` box → per-fragment byte ranges for SegmentBase tracks.
//! - `master`, `media`: HLS master and media playlists.
//! - `sequence`: live media and discontinuity sequence numbers kept across MPD updates.
//! - `proxy`: the `/proxy/mpd/*` request parameters, child-URL parameters and key checks.
//! - `out`: DASH out, the MPD itself rewritten so every init and segment goes through the proxy.
//!
//! Data flows one way: `parse_mpd` → `segment_index` → `to_hls_master` / `to_hls_media`. The caller
//! supplies "now", the proxy URL shapes (closures) and, for SegmentBase tracks, the fetched `sidx`:
//! `sidx_fetch(rep)` names the bytes to fetch, `parse_sidx` turns them into fragments, and
//! `MediaOptions::sidx` hands them back.
//!
//! Media playlists are addressed by profile id `{AdaptationSet@id}_{Representation@id}_{bandwidth}`
//! (a set without `@id` uses its 0-based position in the Period), the same shape as MediaFlow's, so
//! it survives MPD refreshes and existing `profile_id=` URLs keep working.

mod master;
mod media;
mod mpd;
pub mod out;
mod protection;
pub mod proxy;
mod segment_info;
mod segments;
mod sequence;
mod sidx;
mod template;
mod time;
mod timeline;
mod track;
mod xml;

#[cfg(test)]
mod tests;

pub use master::{to_hls_master, MasterOptions, MAX_AUDIO_LANGUAGES, MAX_VIDEO_VARIANTS};
pub use media::{to_hls_media, to_hls_media_live, MediaOptions, MediaUrl};
pub use mpd::{
    parse_mpd, AdaptationSet, ContentKind, Mpd, Period, PresentationType, Representation,
    DEFAULT_TIME_SHIFT_DEPTH,
};
pub use protection::{ContentProtection, DrmSystem};
pub use segment_info::{
    Addressing, ByteRange, SegmentBase, SegmentList, SegmentTemplate, SegmentUrl, TimelineEntry,
    UrlRange,
};
pub use segments::{segment_index, sidx_fetch, InitSegment, Segment, SegmentIndex, SidxFetch};
pub use sequence::{LiveSequence, Placed};
pub use sidx::{parse_sidx, SidxFragment};
pub use template::{Template, TemplateVars};
pub use time::{format_datetime, parse_datetime, parse_duration};

/// Most segments one Representation may expand to; beyond it the MPD is treated as hostile.
pub const MAX_SEGMENTS: usize = 100_000;

/// Most timeline entries, segment URLs and ContentProtection entries all Representations of one
/// MPD may resolve to together, each Representation counting what it inherits. Inherited lists
/// are shared, not copied, but DASH out writes each Representation's timeline and every later
/// stage may walk it, so M Representations under one N-entry timeline cost N x M. Ten
/// Representations each at [`MAX_SEGMENTS`]: a real ladder (a dozen tracks, a day of irregular
/// audio durations that `r` cannot fold) stays below it, and a document under the element
/// cap written to be M x N (100,000 x 100,000) is refused.
pub const MAX_RESOLVED_ENTRIES: usize = 10 * MAX_SEGMENTS;

/// Most bytes of inherited text (BaseURL, mimeType, codecs, lang, template URLs, ...) all
/// Representations of one MPD may hold copies of together: one long attribute on an
/// AdaptationSet is otherwise copied into each of its Representations. Real ones hold under
/// 2 KiB each, so even a thousand tracks are 30 times below it.
pub const MAX_RESOLVED_BYTES: usize = 64 * 1024 * 1024;

/// Longest segment or init URL (BaseURL and template resolved) accepted: a longer one is
/// repeated into every segment of the track. The same bound as an HLS playlist's URLs.
pub const MAX_URL_LEN: usize = crate::hls::MAX_URL_LEN;

/// Most bytes of segment and init URLs one track's playlist may expand to (over all its
/// Periods): 335 bytes a segment at `MAX_SEGMENTS`, where real URLs are under 200. A long
/// template times many segments is treated as hostile.
pub const MAX_URL_BYTES: usize = 32 * 1024 * 1024;

/// Why an MPD could not be parsed or converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DashError {
    #[error("malformed XML: {0}")]
    Xml(String),
    #[error("not an MPD: root element is <{0}>")]
    NotMpd(String),
    #[error("XML nested deeper than {0} elements")]
    TooDeep(usize),
    #[error("more than {0} XML elements")]
    TooManyElements(usize),
    #[error("more than {0} attributes on one XML element")]
    TooManyAttributes(usize),
    #[error("invalid {name}: {value:?}")]
    InvalidAttribute { name: &'static str, value: String },
    #[error("missing {0}")]
    Missing(&'static str),
    #[error("invalid URL {0:?}")]
    InvalidUrl(String),
    #[error("bad segment template {template:?}: {why}")]
    Template { template: String, why: &'static str },
    #[error("the Representations resolve to more than {limit} {what} in all")]
    TooMuchResolved { what: &'static str, limit: usize },
    #[error("more than {0} segments")]
    TooManySegments(usize),
    #[error("a segment URL longer than {0} bytes")]
    UrlTooLong(usize),
    #[error("segment URLs over {0} bytes in all")]
    TooManyUrlBytes(usize),
    #[error("number out of range")]
    Overflow,
    #[error("bad sidx: {0}")]
    Sidx(&'static str),
    #[error("sidx of {url} (bytes {}-{}) must be fetched first", range.0, range.1)]
    SidxMissing { url: String, range: ByteRange },
    #[error("no profile {0:?} in the MPD")]
    UnknownProfile(String),
    #[error("MPD has no audio or video Representation")]
    NoTracks,
}

/// Longest piece of input quoted in an error message.
const QUOTE_MAX: usize = 80;

/// Input quoted in an error, cut short (on a char boundary) so hostile input cannot bloat logs.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(QUOTE_MAX) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}
