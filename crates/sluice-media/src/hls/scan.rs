//! The first pass of `rewrite_playlist`: what kind of playlist this is, before anything is written.

use super::lines::{lines, LineKind};
use super::rewrite::variant_height;
use super::{select, HlsError, RewriteOptions, MAX_LINE_LEN};

/// Facts about the whole playlist that decisions on its first lines depend on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Summary {
    pub is_master: bool,
    pub has_start: bool,
    /// Media playlist without `EXT-X-ENDLIST` and not `PLAYLIST-TYPE:VOD`.
    pub is_live: bool,
    /// LL-HLS: the playlist has `EXT-X-PART-INF` (parts, a part hold-back for players).
    pub low_latency: bool,
    /// Height of the variants that survive selection; `None` keeps them all.
    pub keep_height: Option<u32>,
}

pub(crate) fn scan(body: &str, opts: &RewriteOptions) -> Result<Summary, HlsError> {
    let mut is_master = false;
    let mut has_start = false;
    let mut ended = false;
    let mut vod = false;
    let mut low_latency = false;
    let mut heights = Vec::new();
    for line in lines(body) {
        if line.text.len() > MAX_LINE_LEN {
            return Err(HlsError::LineTooLong {
                line: line.number,
                max: MAX_LINE_LEN,
            });
        }
        let LineKind::Tag { name, value } = line.kind() else {
            continue;
        };
        match name {
            "EXT-X-STREAM-INF" => {
                is_master = true;
                heights.push(variant_height(value));
            }
            "EXT-X-I-FRAME-STREAM-INF"
            | "EXT-X-MEDIA"
            | "EXT-X-SESSION-KEY"
            | "EXT-X-SESSION-DATA" => is_master = true,
            "EXT-X-START" => has_start = true,
            "EXT-X-ENDLIST" => ended = true,
            "EXT-X-PART-INF" => low_latency = true,
            "EXT-X-PLAYLIST-TYPE" => vod |= value.trim() == "VOD",
            _ => {}
        }
    }
    let keep_height = if is_master {
        select::choose(&heights, opts.max_res, opts.resolution)
    } else {
        None
    };
    Ok(Summary {
        is_master,
        has_start,
        is_live: !is_master && !ended && !vod,
        low_latency,
        keep_height,
    })
}
