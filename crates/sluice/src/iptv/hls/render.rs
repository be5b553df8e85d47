//! A channel's playlist, written outside its window's lock and once per change of the window.
//!
//! A catch-up window lists up to `CATCHUP_MAX_SEGMENTS` segments, a playlist of about 2 MB.
//! Written under the window's lock on every request, many viewers reloading it would queue on
//! that lock, and so would the segmenter storing the next segment (the live ingest). Instead
//! the window keeps what its playlist lists as a [`Listing`], taken once per change and shared
//! by every request until the next one; a request writes the playlist after letting the lock
//! go, and the channel keeps the last one written for the requests that follow with the same
//! query: N reloads of one version of the window, one after another, cost one.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use sluice_media::segmenter::playlist::{self, Entry, Kind, LowLatency, PartEntry};
use sluice_media::segmenter::{Segment, CLOCK};

use super::super::registry;
use super::{HlsConfig, Window};

/// What one version of a window's playlist lists, copied out of the window.
#[derive(Debug)]
pub(super) struct Listing {
    /// The version of the window it was taken from.
    pub version: u64,
    pub entries: Vec<Entry>,
    /// Discontinuities before the first entry.
    pub gone: u64,
    pub kind: Kind,
    /// Low-latency HLS: the parts to list (none when it is off).
    pub parts: Vec<PartEntry>,
    pub ended: bool,
}

impl Window {
    /// The window changed: its next listing is taken again.
    pub(super) fn changed(&mut self) {
        self.version += 1;
        self.listing = None;
    }

    /// The listing of the window as it is now (`catchup`: where a catch-up session's range
    /// begins), taken once per version.
    pub(super) fn listing(&mut self, config: &HlsConfig, catchup: Option<i64>) -> Arc<Listing> {
        if let Some(l) = &self.listing {
            return l.clone();
        }
        let listing = Arc::new(take(self, config, catchup));
        self.listing = Some(listing.clone());
        listing
    }
}

/// The window's segments as a playlist lists them, the discontinuities before the first, the
/// playlist type and, for low-latency HLS, the parts.
fn take(w: &Window, config: &HlsConfig, catchup: Option<i64>) -> Listing {
    let part_target = config.part_target_ms * CLOCK / 1000;
    let listed = match catchup {
        Some(_) => w.segments.len(),
        None => w.segments.len().min(config.window),
    };
    let kind = match catchup {
        Some(_) if w.trimmed => Kind::Live,
        Some(_) if w.ended => Kind::Vod,
        Some(_) => Kind::Event,
        None => Kind::Live,
    };
    let mut elapsed = w.gone_ticks;
    let mut on_clock = |s: &Segment| {
        let at = catchup.map(|begin| begin + (elapsed * 1000 / CLOCK) as i64);
        elapsed += s.duration;
        at
    };
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
            wall_ms: on_clock(s).or_else(|| {
                (part_target > 0)
                    .then(|| w.held.wall_ms(*sequence))
                    .flatten()
            }),
        })
        .collect();
    let parts = if part_target > 0 {
        w.held.entries(w.next)
    } else {
        Vec::new()
    };
    Listing {
        version: w.version,
        entries,
        gone,
        kind,
        parts,
        ended: w.ended,
    }
}

/// The TS playlist of a listing (with its parts, for low-latency HLS): live, or for a catch-up
/// session every segment so far, as EVENT and then VOD, on the programme's clock.
pub(super) fn media(config: &HlsConfig, listing: &Listing, query: &str) -> String {
    let part_target = config.part_target_ms * CLOCK / 1000;
    playlist::media(
        playlist::Window {
            target: config.target_duration_secs,
            discontinuity_sequence: listing.gone,
            ended: listing.ended,
            query,
            kind: listing.kind,
            start_ms: None,
            low_latency: (part_target > 0).then_some(LowLatency {
                part_target,
                parts: &listing.parts,
            }),
        },
        &listing.entries,
    )
}

/// Largest playlist kept for the next request: a full catch-up window with a long query.
const MAX_KEPT_BYTES: usize = 8 << 20;

/// The last TS playlist written for a channel.
#[derive(Debug, Default)]
pub(super) struct Rendered {
    last: Mutex<Option<Last>>,
}

#[derive(Debug)]
struct Last {
    version: u64,
    query: Box<str>,
    text: Bytes,
}

impl Rendered {
    /// The TS playlist of `listing` for a request with `query`: the one written last when it
    /// was for the same version and query, else written now (no lock held meanwhile).
    pub(super) fn get(&self, config: &HlsConfig, listing: &Listing, query: &str) -> Bytes {
        if let Some(last) = &*registry::lock(&self.last) {
            if last.version == listing.version && *last.query == *query {
                return last.text.clone();
            }
        }
        let text = Bytes::from(media(config, listing, query));
        let mut last = registry::lock(&self.last);
        // A request that took its listing earlier does not replace a newer playlist, and a
        // playlist past `MAX_KEPT_BYTES` is not kept (it lives as long as its answer).
        if text.len() <= MAX_KEPT_BYTES
            && last.as_ref().is_none_or(|l| l.version <= listing.version)
        {
            *last = Some(Last {
                version: listing.version,
                query: query.into(),
                text: text.clone(),
            });
        }
        text
    }
}
