//! The MediaFlow `/proxy/mpd/*` request contract: query parameters in, typed requests and the
//! parameters of child URLs out, plus the key checks that turn "garbage output" into a clear 400.
//! No I/O.
//!
//! Endpoints: `manifest.m3u8` (master, `d` = MPD URL), `playlist.m3u8` (`d` + `profile_id`),
//! `init.mp4` (`init_url`, `init_range`) and `segment.mp4` (`init_url`, `segment_url`, both
//! ranges, `use_map`), and `segment.ts` (the same, remuxed to MPEG-TS; chosen by `remux_to_ts`).
//! Every one takes `key_id`/`key` and `mime_type`/`is_live` where they apply.

use url::Url;

use super::mpd::{Mpd, Representation};
use super::segment_info::ByteRange;
use super::MediaUrl;
use crate::cenc::InitInfo;
use crate::keys::{to_hex, KeyError, KeyRing, Kid};
use crate::query::{parse_destination, Query, QueryError};

/// Endpoint paths, for the URL maker.
pub const PLAYLIST_PATH: &str = "/proxy/mpd/playlist.m3u8";
pub const SEGMENT_PATH: &str = "/proxy/mpd/segment.mp4";
pub const INIT_PATH: &str = "/proxy/mpd/init.mp4";
/// Decrypted and remuxed to MPEG-TS (`remux_to_ts`).
pub const SEGMENT_TS_PATH: &str = "/proxy/mpd/segment.ts";

/// Why a `/proxy/mpd/*` request was refused before anything was fetched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("missing required parameter `{0}`")]
    Missing(&'static str),
    #[error("parameter `{name}`: {why}")]
    Invalid { name: &'static str, why: String },
    #[error(transparent)]
    Query(#[from] QueryError),
    #[error(transparent)]
    Key(#[from] KeyError),
}

/// One upstream object: URL and optional inclusive byte range.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Part {
    pub url: Url,
    pub range: Option<ByteRange>,
}

/// A parsed `segment.mp4` or `init.mp4` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentRequest {
    /// Absent only for a segment of a track without an init segment.
    pub init: Option<Part>,
    /// Absent for `init.mp4`.
    pub segment: Option<Part>,
    /// `video/mp4` or `audio/mp4`.
    pub content_type: &'static str,
    pub is_live: bool,
    /// The playlist has `#EXT-X-MAP`: answer the segment alone. Otherwise the init is prepended,
    /// as MediaFlow does for playlists without a map.
    pub use_map: bool,
}

impl SegmentRequest {
    /// Parses `segment.mp4` (`with_segment`) or `init.mp4` parameters.
    pub fn from_query(query: &Query, with_segment: bool) -> Result<Self, RequestError> {
        let part = |url: &'static str, range: &'static str| -> Result<Option<Part>, RequestError> {
            let Some(raw) = query.get(url).filter(|v| !v.is_empty()) else {
                return Ok(None);
            };
            let url = parse_destination(raw).map_err(|e| RequestError::Invalid {
                name: url,
                why: e.to_string(),
            })?;
            let range = query
                .get(range)
                .filter(|v| !v.is_empty())
                .map(|v| parse_range(v).ok_or_else(|| invalid_range(range, v)))
                .transpose()?;
            Ok(Some(Part { url, range }))
        };
        let init = part("init_url", "init_range")?;
        let segment = if with_segment {
            Some(
                part("segment_url", "segment_range")?
                    .ok_or(RequestError::Missing("segment_url"))?,
            )
        } else {
            None
        };
        if !with_segment && init.is_none() {
            return Err(RequestError::Missing("init_url"));
        }
        Ok(SegmentRequest {
            init,
            segment,
            content_type: content_type(query.get("mime_type")),
            is_live: query.flag("is_live"),
            use_map: query.flag("use_map"),
        })
    }
}

fn invalid_range(name: &'static str, value: &str) -> RequestError {
    RequestError::Invalid {
        name,
        why: format!(
            "{:?} is not a byte range like 0-1023",
            super::shorten(value)
        ),
    }
}

/// `first-last`, inclusive, as MPD `range` attributes and MediaFlow write them.
pub fn parse_range(text: &str) -> Option<ByteRange> {
    let (a, b) = text.trim().split_once('-')?;
    let (a, b) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (a <= b).then_some((a, b))
}

/// The response type for a `mime_type` parameter: audio tracks are `audio/mp4`, all else video.
pub fn content_type(mime_type: Option<&str>) -> &'static str {
    match mime_type {
        Some(m) if m.trim().to_ascii_lowercase().starts_with("audio/") => "audio/mp4",
        _ => "video/mp4",
    }
}

/// The caller's ClearKey keys: `None` when no `key` is given.
pub fn key_ring(query: &Query) -> Result<Option<KeyRing>, KeyError> {
    match query.get("key").filter(|k| !k.trim().is_empty()) {
        Some(key) => KeyRing::parse(query.get("key_id"), key).map(Some),
        None => Ok(None),
    }
}

/// Parameters children inherit: keys, upstream request headers and propagated response headers.
/// Everything else is either the child's own (`d`, ranges) or the parent's alone (`r_*`, `skip`).
pub fn carried(name: &str) -> bool {
    matches!(name, "key_id" | "key") || name.starts_with("h_") || name.starts_with("rp_")
}

/// Parameters a master playlist's links to media playlists carry: [`carried`] plus the playlist
/// options `skip`, `start_offset` and `remux_to_ts`.
pub fn carried_to_playlist(name: &str) -> bool {
    carried(name) || matches!(name, "skip" | "start_offset" | "remux_to_ts")
}

/// Whether media playlists point at MPEG-TS segments: the request's `remux_to_ts` when given
/// (`1`/`true`/`yes`/`on`, anything else is off), else the configured `default`.
pub fn remux_to_ts(query: &Query, default: bool) -> bool {
    match query.get("remux_to_ts").filter(|v| !v.trim().is_empty()) {
        Some(v) => crate::query::parse_bool(v),
        None => default,
    }
}

/// Like [`media_params`] for a playlist whose segments are remuxed to MPEG-TS: every segment
/// names its init (TS has no `#EXT-X-MAP`; the remuxer needs the track's configuration) and
/// points at [`SEGMENT_TS_PATH`].
pub fn ts_media_params(
    target: MediaUrl<'_>,
    is_live: bool,
) -> (&'static str, Vec<(String, String)>) {
    let (endpoint, mut params) = media_params(target, is_live);
    if endpoint != SEGMENT_PATH {
        return (endpoint, params);
    }
    params.retain(|(k, _)| k != "use_map" && k != "mime_type");
    (SEGMENT_TS_PATH, params)
}

/// Parameters of a master playlist's link to the media playlist of `rep`.
pub fn playlist_params(mpd_url: &str, rep: &Representation) -> Vec<(String, String)> {
    vec![
        ("d".into(), mpd_url.into()),
        ("profile_id".into(), rep.profile_id.clone()),
    ]
}

/// Endpoint and parameters for an `#EXT-X-MAP` or segment line of a media playlist.
pub fn media_params(target: MediaUrl<'_>, is_live: bool) -> (&'static str, Vec<(String, String)>) {
    let mut params = Vec::new();
    let (endpoint, rep) = match target {
        MediaUrl::Init { rep, init } => {
            push_part(&mut params, "init", &init.url, init.byte_range);
            (INIT_PATH, rep)
        }
        MediaUrl::Segment { rep, init, segment } => {
            if let Some(init) = init {
                push_part(&mut params, "init", &init.url, init.byte_range);
            }
            push_part(&mut params, "segment", &segment.url, segment.byte_range);
            params.push(("use_map".into(), (init.is_some()).to_string()));
            (SEGMENT_PATH, rep)
        }
    };
    let mime = rep.mime_type.clone().unwrap_or_else(|| match rep.kind {
        super::ContentKind::Audio => "audio/mp4".into(),
        _ => "video/mp4".into(),
    });
    params.push(("mime_type".into(), mime));
    params.push(("is_live".into(), is_live.to_string()));
    (endpoint, params)
}

fn push_part(params: &mut Vec<(String, String)>, name: &str, url: &Url, range: Option<ByteRange>) {
    params.push((format!("{name}_url"), url.to_string()));
    if let Some((a, b)) = range {
        params.push((format!("{name}_range"), format!("{a}-{b}")));
    }
}

/// A protected MPD requested without keys: what the caller must supply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeysNeeded {
    /// Distinct default KIDs, lowercase hex.
    pub kids: Vec<String>,
    pub license_urls: Vec<String>,
}

impl std::fmt::Display for KeysNeeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the MPD is protected: pass key_id and key")?;
        if !self.kids.is_empty() {
            write!(f, " for KID {}", self.kids.join(", "))?;
        }
        if !self.license_urls.is_empty() {
            write!(f, " (licence server: {})", self.license_urls.join(", "))?;
        }
        Ok(())
    }
}

/// KIDs and licence URLs named at most in a [`KeysNeeded`].
const MAX_NAMED: usize = 16;

/// `Some` when the MPD has a protected track and the request carries no key.
pub fn keys_needed(mpd: &Mpd, keys: Option<&KeyRing>) -> Option<KeysNeeded> {
    if keys.is_some() {
        return None;
    }
    if !mpd.representations().any(|(_, _, r)| r.is_protected()) {
        return None;
    }
    // Only protected tracks have ContentProtection entries.
    let protections = || {
        mpd.representations()
            .flat_map(|(_, _, r)| r.protection.iter())
    };
    Some(KeysNeeded {
        kids: first_named(protections().filter_map(|p| p.default_kid.as_deref())),
        license_urls: first_named(
            protections()
                .filter_map(|p| p.license_url.as_deref())
                .map(super::shorten),
        ),
    })
}

/// The first [`MAX_NAMED`] distinct values, in order, for the message that goes back to the
/// client. Reads no further once it has them: a hostile MPD may name a hundred thousand.
fn first_named<S: AsRef<str>>(values: impl IntoIterator<Item = S>) -> Vec<String> {
    let mut named: Vec<String> = Vec::new();
    for value in values {
        let value = value.as_ref();
        if !named.iter().any(|n| n == value) {
            named.push(value.to_owned());
            if named.len() == MAX_NAMED {
                break;
            }
        }
    }
    named
}

/// The KID of the first protected track `keys` cannot decrypt. A lone key serves a lone KID even
/// when its `key_id` does not match, as decryption itself allows.
pub fn unkeyed_kid(info: &InitInfo, keys: &KeyRing) -> Option<String> {
    let kids: Vec<Kid> = info.kids();
    let lone_key = keys.len() == 1 && kids.len() == 1;
    info.tracks
        .iter()
        .filter_map(|t| t.protection.filter(|p| p.is_protected))
        .find(|p| !lone_key && keys.get(&p.default_kid).is_none())
        .map(|p| to_hex(&p.default_kid))
}

/// Master playlist options from `resolution` (`720`, `720p`, `1280x720`) and `max_res`.
pub fn master_options(query: &Query) -> Result<super::MasterOptions, RequestError> {
    let resolution = match query.get("resolution").filter(|v| !v.trim().is_empty()) {
        Some(raw) => {
            let text = raw.trim().trim_end_matches(['p', 'P']);
            let height = text.rsplit(['x', 'X']).next().unwrap_or(text);
            Some(height.parse().map_err(|_| RequestError::Invalid {
                name: "resolution",
                why: format!("{:?} is not a height like 720p", super::shorten(raw)),
            })?)
        }
        None => None,
    };
    Ok(super::MasterOptions {
        resolution,
        max_res: query.flag("max_res"),
    })
}

/// Most ranges one `skip` may list; real ones skip an intro, a recap and the credits.
pub const MAX_SKIP_RANGES: usize = 64;

/// `skip=from-to,from-to` in seconds, at most [`MAX_SKIP_RANGES`] of them.
pub fn parse_skip(query: &Query) -> Result<Vec<(f64, f64)>, RequestError> {
    let Some(raw) = query.get("skip").filter(|v| !v.trim().is_empty()) else {
        return Ok(Vec::new());
    };
    let spans: Vec<&str> = raw.split(',').filter(|s| !s.trim().is_empty()).collect();
    // Every playlist segment is checked against every range.
    if spans.len() > MAX_SKIP_RANGES {
        return Err(RequestError::Invalid {
            name: "skip",
            why: format!("more than {MAX_SKIP_RANGES} ranges"),
        });
    }
    spans
        .into_iter()
        .map(|span| {
            let parsed = span.trim().split_once('-').and_then(|(a, b)| {
                let (a, b) = (a.trim().parse::<f64>().ok()?, b.trim().parse::<f64>().ok()?);
                (a.is_finite() && b.is_finite() && a <= b).then_some((a, b))
            });
            parsed.ok_or_else(|| RequestError::Invalid {
                name: "skip",
                why: format!(
                    "{:?} is not a range of seconds like 0-90",
                    super::shorten(span)
                ),
            })
        })
        .collect()
}

/// `start_offset` in seconds; live playlists default to `live_default` (MediaFlow uses -18 s so
/// players start behind the edge and prefetching has room), 0 meaning none.
pub fn start_offset(
    query: &Query,
    live: bool,
    live_default: f64,
) -> Result<Option<f64>, RequestError> {
    match query.get("start_offset").filter(|v| !v.trim().is_empty()) {
        Some(raw) => raw
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .map(Some)
            .ok_or_else(|| RequestError::Invalid {
                name: "start_offset",
                why: format!("{:?} is not a number of seconds", super::shorten(raw)),
            }),
        None => Ok((live && live_default != 0.0).then_some(live_default)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(raw: &str) -> Query {
        Query::parse(raw)
    }

    #[test]
    fn segment_request_with_ranges() {
        let r = SegmentRequest::from_query(
            &q("init_url=http%3A%2F%2Fo%2Fv.mp4&init_range=0-99&segment_url=http%3A%2F%2Fo%2Fv.mp4\
                &segment_range=200-299&mime_type=audio%2Fmp4&use_map=true"),
            true,
        )
        .unwrap();
        assert_eq!(r.init.unwrap().range, Some((0, 99)));
        assert_eq!(r.segment.unwrap().range, Some((200, 299)));
        assert_eq!(r.content_type, "audio/mp4");
        assert!(r.use_map && !r.is_live);
    }

    #[test]
    fn segment_request_errors() {
        assert_eq!(
            SegmentRequest::from_query(&q("init_url=http%3A%2F%2Fo%2Fi"), true),
            Err(RequestError::Missing("segment_url"))
        );
        assert_eq!(
            SegmentRequest::from_query(&q(""), false),
            Err(RequestError::Missing("init_url"))
        );
        let bad =
            SegmentRequest::from_query(&q("init_url=http%3A%2F%2Fo%2Fi&init_range=9-1"), false);
        assert!(matches!(
            bad,
            Err(RequestError::Invalid {
                name: "init_range",
                ..
            })
        ));
    }

    #[test]
    fn master_options_and_skips() {
        for (raw, want) in [("720p", 720), ("1280x720", 720), ("1080", 1080)] {
            let o = master_options(&q(&format!("resolution={raw}"))).unwrap();
            assert_eq!(o.resolution, Some(want));
        }
        assert!(master_options(&q("resolution=hd")).is_err());
        assert_eq!(
            parse_skip(&q("skip=0-90,1750.5-1800")).unwrap(),
            vec![(0.0, 90.0), (1750.5, 1800.0)]
        );
        assert!(parse_skip(&q("skip=5")).is_err());
        assert_eq!(start_offset(&q(""), true, -18.0).unwrap(), Some(-18.0));
        assert_eq!(start_offset(&q(""), false, -18.0).unwrap(), None);
        assert_eq!(
            start_offset(&q("start_offset=-6"), false, -18.0).unwrap(),
            Some(-6.0)
        );
    }

    /// Named values stop being read once 16 are kept: a hostile MPD may list 100,000 KIDs.
    #[test]
    fn first_named_reads_no_further_than_it_needs() {
        let mut read = 0;
        let values = (0..100_000)
            .map(|i| format!("{:032x}", i / 2))
            .inspect(|_| read += 1);
        let named = first_named(values);
        assert_eq!(named.len(), MAX_NAMED);
        assert_eq!(named[15], format!("{:032x}", 15));
        // Each value is listed twice: 16 distinct ones are the first 31 read.
        assert_eq!(read, 2 * MAX_NAMED - 1);
    }

    #[test]
    fn skip_ranges_are_capped() {
        let ranges = |n: usize| {
            let list: Vec<String> = (0..n).map(|i| format!("{i}-{i}.5")).collect();
            q(&format!("skip={}", list.join(",")))
        };
        assert_eq!(parse_skip(&ranges(MAX_SKIP_RANGES)).unwrap().len(), 64);
        assert_eq!(
            parse_skip(&ranges(MAX_SKIP_RANGES + 1)),
            Err(RequestError::Invalid {
                name: "skip",
                why: "more than 64 ranges".into(),
            })
        );
        // Empty items are not ranges, as before.
        assert_eq!(parse_skip(&q("skip=0-1,,")).unwrap(), vec![(0.0, 1.0)]);
    }

    #[test]
    fn carried_names() {
        for yes in ["key_id", "key", "h_referer", "rp_x"] {
            assert!(carried(yes), "{yes}");
        }
        for no in [
            "d",
            "r_x",
            "skip",
            "profile_id",
            "api_password",
            "x_headers",
        ] {
            assert!(!carried(no), "{no}");
        }
    }
}
