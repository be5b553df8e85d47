//! A channel's playlist, written outside its window's lock and once per change of the window.
//!
//! A catch-up window lists up to `CATCHUP_MAX_SEGMENTS` segments, a playlist of about 2 MB.
//! Written under the window's lock on every request, many viewers reloading it would queue on
//! that lock, and so would the segmenter storing the next segment (the live ingest). Instead
//! the window keeps what its playlist lists as a [`Listing`], taken once per change and shared
//! by every request until the next one; a request writes the playlist after letting the lock
//! go, and the channel keeps the last one written for the requests that follow with the same
//! query. Requests that arrive together for a new version wait for the one that writes it
//! (at most [`MAX_FLIGHTS`] such writes per channel; past them a request writes its own): N
//! reloads of one version of the window, together or one after another, cost one.
//!
//! A playlist that will be large (a full catch-up window with a long query: tens of
//! megabytes) is written on the blocking pool, [`BLOCKING_WRITES`] at once over all channels,
//! so it never holds a runtime worker (and the requests queued on it) for its whole write.
//!
//! What the channels keep (listings and playlists) has its own bound over all of them,
//! [`MAX_KEPT_TOTAL`]: each channel keeps at most one listing and one playlist, but catch-up
//! and ended channels are many, and a kept playlist of 8 MiB each would add up outside
//! `catchup_total_bytes`. Past the bound a listing or playlist is used once and not kept.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use sluice_media::segmenter::playlist::{self, Entry, Kind, LowLatency, PartEntry};
use sluice_media::segmenter::{Segment, CLOCK};
use tokio::sync::{OnceCell, Semaphore};

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

impl Listing {
    /// Bytes it holds, as counted against [`MAX_KEPT_TOTAL`].
    fn bytes(&self) -> u64 {
        let size = std::mem::size_of::<Listing>()
            + self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.parts.capacity() * std::mem::size_of::<PartEntry>();
        size as u64
    }

    /// About how many bytes its playlist takes with `query` (each line carries the query).
    fn estimate(&self, query: &str) -> usize {
        (self.entries.len() + self.parts.len()).saturating_mul(query.len() + 96)
    }
}

/// A kept listing, and its part of [`MAX_KEPT_TOTAL`].
#[derive(Debug)]
pub(super) struct KeptListing {
    listing: Arc<Listing>,
    _held: Held,
}

impl Window {
    /// The window changed: its next listing is taken again.
    pub(super) fn changed(&mut self) {
        self.version += 1;
        self.listing = None;
    }

    /// The listing of the window as it is now (`catchup`: where a catch-up session's range
    /// begins), taken once per version (kept while `rendered`'s budget has room).
    pub(super) fn listing(
        &mut self,
        config: &HlsConfig,
        catchup: Option<i64>,
        rendered: &Rendered,
    ) -> Arc<Listing> {
        if let Some(kept) = &self.listing {
            return kept.listing.clone();
        }
        let listing = Arc::new(take(self, config, catchup));
        if let Some(held) = rendered.shared.reserve(listing.bytes()) {
            self.listing = Some(KeptListing {
                listing: listing.clone(),
                _held: held,
            });
        }
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

/// What all channels keep together (listings and playlists): 64 MiB, the last playlists of
/// eight full catch-up windows with long queries, or of thousands of live channels.
pub(super) const MAX_KEPT_TOTAL: u64 = 64 << 20;

/// A playlist estimated at least this large is written on the blocking pool (a live window's,
/// a few kilobytes, is written at once).
const INLINE_BYTES: usize = 256 << 10;

/// Large playlists written at once, over all channels: a blocking thread cannot be stopped, so
/// the writes running are bounded here rather than by the requests in flight.
pub(super) const BLOCKING_WRITES: usize = 2;

/// Writes under way per channel that later requests join; past them a request writes its own
/// (two queries rarely reload a channel at once, and the waiters stay bounded).
pub(super) const MAX_FLIGHTS: usize = 4;

/// What every channel's playlists share: the bound on what they keep, and the places for
/// large writes.
#[derive(Debug)]
pub(super) struct Shared {
    limit: u64,
    used: AtomicU64,
    blocking: Arc<Semaphore>,
    /// Large writes: running now, the most at once, and all so far.
    #[cfg(test)]
    running: AtomicU64,
    #[cfg(test)]
    peak: AtomicU64,
    #[cfg(test)]
    blocking_writes: AtomicU64,
}

impl Default for Shared {
    fn default() -> Self {
        Self::new(MAX_KEPT_TOTAL)
    }
}

impl Shared {
    /// Channels keeping at most `limit` bytes together.
    pub(super) fn new(limit: u64) -> Self {
        Self {
            limit,
            used: AtomicU64::new(0),
            blocking: Arc::new(Semaphore::new(BLOCKING_WRITES)),
            #[cfg(test)]
            running: AtomicU64::new(0),
            #[cfg(test)]
            peak: AtomicU64::new(0),
            #[cfg(test)]
            blocking_writes: AtomicU64::new(0),
        }
    }

    /// `bytes` of the budget, when they fit in what is left.
    fn reserve(self: &Arc<Self>, bytes: u64) -> Option<Held> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .ok()?;
        Some(Held {
            shared: self.clone(),
            bytes,
        })
    }

    /// A large write started on the blocking pool.
    #[cfg(test)]
    fn started(&self) {
        self.blocking_writes.fetch_add(1, Ordering::AcqRel);
        let now = self.running.fetch_add(1, Ordering::AcqRel) + 1;
        self.peak.fetch_max(now, Ordering::AcqRel);
    }

    /// Bytes kept now over all channels.
    #[cfg(test)]
    pub(super) fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Large writes so far, and the most that ran at once.
    #[cfg(test)]
    pub(super) fn blocking_writes(&self) -> (u64, u64) {
        (
            self.blocking_writes.load(Ordering::Acquire),
            self.peak.load(Ordering::Acquire),
        )
    }
}

/// Bytes of the budget, given back when what they count is dropped.
#[derive(Debug)]
struct Held {
    shared: Arc<Shared>,
    bytes: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.shared.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// The last TS playlist written for a channel, and the writes under way.
#[derive(Debug)]
pub(super) struct Rendered {
    shared: Arc<Shared>,
    state: Mutex<State>,
    /// Playlists written (for tests: concurrent requests share one).
    #[cfg(test)]
    writes: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    last: Option<Last>,
    flights: Vec<Flight>,
}

#[derive(Debug)]
struct Last {
    version: u64,
    query: Box<str>,
    text: Bytes,
    _held: Held,
}

/// A playlist being written: the requests for the same version and query wait for it (and
/// when its writer gives up, one of them writes it instead).
#[derive(Debug)]
struct Flight {
    version: u64,
    query: Box<str>,
    text: Arc<OnceCell<Bytes>>,
}

impl State {
    /// The write of `version` for `query` to wait for (a new one when none is under way),
    /// `None` when the channel has [`MAX_FLIGHTS`] under way already.
    fn join(&mut self, version: u64, query: &str) -> Option<Arc<OnceCell<Bytes>>> {
        if let Some(f) = self
            .flights
            .iter()
            .find(|f| f.version == version && *f.query == *query)
        {
            return Some(f.text.clone());
        }
        // Writes of older versions no request will join again (their waiters hold them).
        self.flights.retain(|f| f.version >= version);
        if self.flights.len() >= MAX_FLIGHTS {
            return None;
        }
        let text = Arc::new(OnceCell::new());
        self.flights.push(Flight {
            version,
            query: query.into(),
            text: text.clone(),
        });
        Some(text)
    }
}

impl Rendered {
    /// The playlists of a channel, kept within `shared`'s bound.
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            state: Mutex::default(),
            #[cfg(test)]
            writes: AtomicU64::new(0),
        }
    }

    /// Playlists written so far.
    #[cfg(test)]
    pub(super) fn writes(&self) -> u64 {
        self.writes.load(Ordering::Acquire)
    }

    /// The TS playlist of `listing` for a request with `query`: the one written last when it
    /// was for the same version and query, the one being written when it is, else written now
    /// (no lock held meanwhile).
    pub(super) async fn get(
        &self,
        config: &HlsConfig,
        listing: &Arc<Listing>,
        query: &str,
    ) -> Bytes {
        let flight = {
            let mut state = registry::lock(&self.state);
            if let Some(last) = &state.last {
                if last.version == listing.version && *last.query == *query {
                    return last.text.clone();
                }
            }
            state.join(listing.version, query)
        };
        let text = match &flight {
            // A waiter whose writer was dropped (its client went) writes it instead.
            Some(cell) => cell
                .get_or_init(|| self.write(config, listing, query))
                .await
                .clone(),
            None => self.write(config, listing, query).await,
        };
        let mut state = registry::lock(&self.state);
        if let Some(cell) = &flight {
            state.flights.retain(|f| !Arc::ptr_eq(&f.text, cell));
        }
        // A request that took its listing earlier does not replace a newer playlist, the
        // waiters of one write keep it once, and a playlist past `MAX_KEPT_BYTES` or the
        // room left under `MAX_KEPT_TOTAL` is not kept (it lives as long as its answer).
        let keep = text.len() <= MAX_KEPT_BYTES
            && state.last.as_ref().is_none_or(|l| {
                l.version < listing.version || (l.version == listing.version && *l.query != *query)
            });
        if keep {
            // The old one's bytes go back first: it is replaced whether or not this one fits.
            state.last = None;
            if let Some(held) = self.shared.reserve(text.len() as u64) {
                state.last = Some(Last {
                    version: listing.version,
                    query: query.into(),
                    text: text.clone(),
                    _held: held,
                });
            }
        }
        text
    }

    /// Writes the playlist: a large one on the blocking pool, once a place is free.
    async fn write(&self, config: &HlsConfig, listing: &Arc<Listing>, query: &str) -> Bytes {
        #[cfg(test)]
        self.writes.fetch_add(1, Ordering::AcqRel);
        if listing.estimate(query) < INLINE_BYTES {
            return Bytes::from(media(config, listing, query));
        }
        // The place goes with the job (not with this request, which may be dropped while the
        // job runs on). The places are never closed; were they, the playlist is written here.
        let Ok(place) = self.shared.blocking.clone().acquire_owned().await else {
            return Bytes::from(media(config, listing, query));
        };
        let (job, on, with) = (listing.clone(), config.clone(), query.to_owned());
        #[cfg(test)]
        let shared = self.shared.clone();
        let written = tokio::task::spawn_blocking(move || {
            let _place = place;
            #[cfg(test)]
            shared.started();
            let text = media(&on, &job, &with);
            #[cfg(test)]
            shared.running.fetch_sub(1, Ordering::AcqRel);
            text
        })
        .await;
        match written {
            Ok(text) => Bytes::from(text),
            // Only a panic or a runtime shutting down ends a blocking job early: the playlist
            // is written here, as it was before.
            Err(_) => Bytes::from(media(config, listing, query)),
        }
    }
}
