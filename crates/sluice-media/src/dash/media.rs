//! HLS media playlist for one profile: its segments across Periods, the live window, skips and
//! start offset. No I/O; the caller decides what init and segment URLs look like.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use super::master::clean;
use super::mpd::{Mpd, Period, Representation};
use super::segments::{
    segment_index_within, sidx_fetch, InitSegment, Segment, SidxFetch, UrlBytes,
};
use super::sequence::{LiveSequence, Placed};
use super::sidx::SidxFragment;
use super::time::format_datetime;
use super::{shorten, DashError};
use crate::keys::to_hex;

/// Per-request choices for a media playlist.
#[derive(Debug, Clone, Default)]
pub struct MediaOptions {
    /// Wall clock, unix seconds; only live MPDs look at it.
    pub now: f64,
    /// Live: keep at most this many of the newest segments (more if `start_offset` reaches further
    /// back). `None` keeps the whole time-shift window. MediaFlow keeps 15 for fMP4.
    pub live_depth: Option<usize>,
    /// Emitted as `#EXT-X-START:TIME-OFFSET=…,PRECISE=YES`.
    pub start_offset: Option<f64>,
    /// Presentation-time ranges `(from, to)` in seconds whose segments are dropped.
    pub skip: Vec<(f64, f64)>,
    /// Leave out `#EXT-X-MAP`: the segment URL (which is given the init) must then serve
    /// init + segment in one body, as MediaFlow does for on-demand SegmentTemplate tracks.
    pub no_map: bool,
    /// Parsed `sidx` boxes for SegmentBase tracks, keyed as [`sidx_fetch`] names them.
    pub sidx: HashMap<SidxFetch, Vec<SidxFragment>>,
}

/// What the URL maker is asked to point at.
#[derive(Debug, Clone, Copy)]
pub enum MediaUrl<'a> {
    /// For `#EXT-X-MAP`.
    Init {
        rep: &'a Representation,
        init: &'a InitSegment,
    },
    Segment {
        rep: &'a Representation,
        init: Option<&'a InitSegment>,
        segment: &'a Segment,
    },
}

/// One segment placed in the playlist.
struct Entry<'a> {
    period: usize,
    rep: &'a Representation,
    init: Option<InitSegment>,
    segment: Segment,
    /// Presentation time of its start, seconds.
    start: f64,
    /// Unix time of its start, live only.
    wall_clock: Option<f64>,
    /// Something was skipped right before it.
    after_gap: bool,
    /// Its HLS media and discontinuity sequence numbers.
    placed: Placed,
}

/// The profiles the playlist follows: the exact profile id in each Period, else the track of the
/// same kind with the closest bandwidth (ad breaks often renumber their Representations).
fn tracks<'a>(
    mpd: &'a Mpd,
    profile_id: &str,
) -> Result<Vec<(usize, &'a Period, &'a Representation)>, DashError> {
    let wanted = mpd
        .find_profile(profile_id)
        .ok_or_else(|| DashError::UnknownProfile(shorten(profile_id)))?;
    let mut out = Vec::new();
    for (i, period) in mpd.periods.iter().enumerate() {
        let reps = period
            .adaptation_sets
            .iter()
            .flat_map(|s| &s.representations);
        let exact = reps.clone().find(|r| r.profile_id == profile_id);
        let similar = || {
            reps.clone()
                .filter(|r| r.kind == wanted.kind && r.lang == wanted.lang)
                .min_by_key(|r| r.bandwidth.abs_diff(wanted.bandwidth))
        };
        if let Some(rep) = exact.or_else(similar) {
            out.push((i, period, rep));
        }
    }
    Ok(out)
}

fn collect_entries<'a>(
    mpd: &'a Mpd,
    profile_id: &str,
    options: &MediaOptions,
) -> Result<Vec<Entry<'a>>, DashError> {
    let mut entries = Vec::new();
    // Every entry holds its init and segment URLs, and each becomes a proxy URL.
    let mut bytes = UrlBytes::default();
    for (index, period, rep) in tracks(mpd, profile_id)? {
        let sidx = sidx_fetch(rep)
            .and_then(|key| options.sidx.get(&key))
            .map(Vec::as_slice);
        // Each Period may list only what the ones before it left of the bound, so a second
        // Period is refused before its segments are made, not after.
        let room = super::MAX_SEGMENTS.saturating_sub(entries.len());
        let listed = segment_index_within(mpd, period, rep, options.now, sidx, room)?;
        for segment in listed.segments {
            bytes.add(&segment.url)?;
            if let Some(init) = &listed.init {
                bytes.add(&init.url)?;
            }
            let segment_number = segment.number;
            let start = period.start + segment.start_secs;
            let wall_clock = mpd
                .availability_start_time
                .filter(|_| mpd.is_live())
                .map(|ast| ast + start);
            entries.push(Entry {
                period: index,
                rep,
                init: listed.init.clone(),
                segment,
                start,
                wall_clock,
                after_gap: false,
                placed: Placed {
                    media_sequence: segment_number,
                    discontinuity_sequence: 0,
                },
            });
        }
    }
    Ok(entries)
}

/// Builds the media playlist of `profile_id` (see [`Representation::profile_id`]). A live MPD's
/// media sequence starts from this one update alone: see [`to_hls_media_live`].
pub fn to_hls_media(
    mpd: &Mpd,
    profile_id: &str,
    options: &MediaOptions,
    url: impl FnMut(MediaUrl<'_>) -> String,
) -> Result<String, DashError> {
    to_hls_media_live(mpd, profile_id, options, &mut LiveSequence::default(), url)
}

/// [`to_hls_media`] for a track whose [`LiveSequence`] the caller keeps between MPD updates, so
/// the media sequence never goes back when a new Period restarts `$Number$`, and the
/// discontinuity sequence counts the Periods that have left the window. A static MPD leaves
/// `sequence` alone.
pub fn to_hls_media_live(
    mpd: &Mpd,
    profile_id: &str,
    options: &MediaOptions,
    sequence: &mut LiveSequence,
    mut url: impl FnMut(MediaUrl<'_>) -> String,
) -> Result<String, DashError> {
    let mut entries = collect_entries(mpd, profile_id, options)?;
    if mpd.is_live() {
        // Every listed segment, before the window is cut, so each new Period meets the one
        // before it. One short key per Period, shared by its segments.
        let keys: Vec<String> = mpd.periods.iter().map(period_key).collect();
        let placed = sequence.place(
            entries
                .iter()
                .map(|e| (keys[e.period].as_str(), e.segment.number)),
        );
        for (entry, placed) in entries.iter_mut().zip(placed) {
            entry.placed = placed;
        }
        keep_newest(&mut entries, options);
    }
    apply_skips(&mut entries, &options.skip);
    let target = entries
        .iter()
        .map(|e| (e.segment.duration_secs * 1000.0).round() / 1000.0)
        .fold(1.0_f64, f64::max)
        .ceil();
    let mut out = String::from("#EXTM3U\n#EXT-X-VERSION:6\n");
    out.push_str(&format!("#EXT-X-TARGETDURATION:{target}\n"));
    let first = entries.first().map(|e| e.placed);
    let media_sequence = first.map_or(0, |p| p.media_sequence);
    out.push_str(&format!("#EXT-X-MEDIA-SEQUENCE:{media_sequence}\n"));
    if let Some(d) = first.map(|p| p.discontinuity_sequence).filter(|d| *d > 0) {
        out.push_str(&format!("#EXT-X-DISCONTINUITY-SEQUENCE:{d}\n"));
    }
    if !mpd.is_live() {
        out.push_str("#EXT-X-PLAYLIST-TYPE:VOD\n");
    }
    out.push_str("#EXT-X-INDEPENDENT-SEGMENTS\n");
    if let Some(offset) = options.start_offset.filter(|o| o.is_finite()) {
        out.push_str(&format!(
            "#EXT-X-START:TIME-OFFSET={},PRECISE=YES\n",
            decimal(offset)
        ));
    }
    let mut map: Option<&InitSegment> = None;
    let mut period = entries.first().map(|e| e.period);
    for entry in &entries {
        if period != Some(entry.period) || entry.after_gap {
            out.push_str("#EXT-X-DISCONTINUITY\n");
            period = Some(entry.period);
        }
        let new_map = entry
            .init
            .as_ref()
            .filter(|i| !options.no_map && map != Some(*i));
        if let Some(init) = new_map {
            let uri = url(MediaUrl::Init {
                rep: entry.rep,
                init,
            });
            out.push_str(&format!("#EXT-X-MAP:URI=\"{}\"\n", clean(&uri)));
            map = Some(init);
        }
        if let Some(at) = entry.wall_clock {
            out.push_str(&format!(
                "#EXT-X-PROGRAM-DATE-TIME:{}\n",
                format_datetime(at)
            ));
        }
        let uri = url(MediaUrl::Segment {
            rep: entry.rep,
            init: entry.init.as_ref(),
            segment: &entry.segment,
        });
        out.push_str(&format!(
            "#EXTINF:{:.3},\n{}\n",
            entry.segment.duration_secs,
            clean(&uri)
        ));
    }
    if !mpd.is_live() {
        out.push_str("#EXT-X-ENDLIST\n");
    }
    Ok(out)
}

/// Longest `Period@id` used as its own key; a longer one is replaced by its SHA-256, so the key
/// the caller keeps between updates stays small whatever the MPD says.
pub(crate) const MAX_PERIOD_KEY_ID: usize = 64;

/// What names a Period from one MPD update to the next: its `id`, else its start. A key from an
/// id is at most 74 bytes, and a hashed one cannot equal a kept one (it is longer).
pub(crate) fn period_key(period: &Period) -> String {
    match &period.id {
        Some(id) if id.len() <= MAX_PERIOD_KEY_ID => format!("id {id}"),
        Some(id) => format!("id sha256:{}", to_hex(&Sha256::digest(id.as_bytes()))),
        None => format!("start {:.3}", period.start),
    }
}

/// Drops all but the newest `live_depth` segments, keeping enough to honour a negative start offset.
fn keep_newest(entries: &mut Vec<Entry<'_>>, options: &MediaOptions) {
    let Some(depth) = options.live_depth else {
        return;
    };
    let longest = entries
        .iter()
        .map(|e| e.segment.duration_secs)
        .fold(0.0, f64::max);
    let reach = options
        .start_offset
        .filter(|o| *o < 0.0)
        .map_or(0.0, |o| -o + longest);
    let mut kept = 0;
    let mut covered = 0.0;
    for entry in entries.iter().rev() {
        if kept >= depth && covered >= reach {
            break;
        }
        kept += 1;
        covered += entry.segment.duration_secs;
    }
    entries.drain(..entries.len() - kept);
}

/// Removes segments overlapping any skip range and marks the segment after each removal.
fn apply_skips(entries: &mut Vec<Entry<'_>>, skip: &[(f64, f64)]) {
    if skip.is_empty() {
        return;
    }
    let mut dropped = false;
    let mut kept_any = false;
    entries.retain_mut(|e| {
        let end = e.start + e.segment.duration_secs;
        if skip.iter().any(|&(from, to)| e.start < to && end > from) {
            dropped = true;
            return false;
        }
        // A skip at the very beginning leaves nothing to be discontinuous with.
        e.after_gap = dropped && kept_any;
        dropped = false;
        kept_any = true;
        true
    });
}

/// Seconds with up to three decimals and no trailing zeros: `-18`, `2.5`.
fn decimal(value: f64) -> String {
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".to_owned()
    } else {
        text.to_owned()
    }
}
