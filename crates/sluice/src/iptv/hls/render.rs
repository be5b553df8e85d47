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
//! fMP4 playlists (`?container=fmp4`) go the same way, told apart by their form and by how far
//! the channel's segments are rewritten, and kept apart: the channel keeps its last one of each
//! form, so viewers of both do not replace each other's.
//!
//! A playlist that will be large (a full catch-up window with a long query: tens of
//! megabytes) is written on the blocking pool, [`super::kept::BLOCKING_WRITES`] at once over all channels,
//! so it never holds a runtime worker (and the requests queued on it) for its whole write. A
//! shared write is a task of its own: a client leaving does not throw away what it started.
//!
//! What the channels keep (listings and playlists) has its own bound over all of them,
//! [`super::kept::MAX_KEPT_TOTAL`]: each channel keeps at most one listing and two playlists, but catch-up
//! and ended channels are many, and a kept playlist of 8 MiB each would add up outside
//! `catchup_total_bytes`. Playlists take at most half of it, so every channel's listing still
//! fits. Past the bound a listing or playlist is used once and not kept. A kept playlist's part
//! of the bound lasts as long as the playlist (answers still sending one that was replaced hold
//! it); one not kept is charged to the answers that send it ([`super::sent`]).

#[cfg(test)]
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use sluice_media::segmenter::playlist::{self, Entry, Kind, LowLatency, PartEntry};
use sluice_media::segmenter::{Segment, CLOCK};
use tokio::sync::{watch, OwnedSemaphorePermit};

use super::super::registry;
use super::fmp4::Converted;
use super::kept::{Held, Shared};
use super::sent::Playlist;
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
        if let Some(held) = rendered.inner.shared.reserve(listing.bytes()) {
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

/// The fMP4 playlist of a listing: as its TS one without parts, from the first segment after
/// the last one that has no fMP4 form (in `converted`); `None` when none has one.
pub(super) fn media_fmp4(
    config: &HlsConfig,
    listing: &Listing,
    query: &str,
    converted: &Converted,
) -> Option<String> {
    let entries = &listing.entries;
    let sequences: Vec<u64> = entries.iter().map(|e| e.sequence).collect();
    let (skipped, inits) = converted.listing(&sequences);
    if inits.is_empty() {
        return None;
    }
    let gone = listing.gone
        + entries[..skipped]
            .iter()
            .map(|e| u64::from(e.discontinuity))
            .sum::<u64>();
    Some(playlist::media_fmp4(
        playlist::Window {
            target: config.target_duration_secs,
            discontinuity_sequence: gone,
            ended: listing.ended,
            query,
            kind: listing.kind,
            start_ms: None,
            low_latency: None,
        },
        &entries[skipped..skipped + inits.len()],
        &inits,
    ))
}

/// Largest playlist kept for the next request: a full catch-up window with a long query.
const MAX_KEPT_BYTES: usize = 8 << 20;

/// A playlist estimated at least this large is written on the blocking pool (a live window's,
/// a few kilobytes, is written at once).
const INLINE_BYTES: usize = 256 << 10;

/// Writes under way per channel that later requests join; past them a request writes its own
/// (two queries rarely reload a channel at once, and the waiters stay bounded).
pub(super) const MAX_FLIGHTS: usize = 4;

/// Which playlist of a listing: TS, or fMP4 with the channel's segments rewritten up to a
/// sequence (a segment just stored may not be yet: the playlist written before it is, lists
/// one segment less, and is not handed out once it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Ts,
    Fmp4(Option<u64>),
}

impl Form {
    /// Where the channel keeps its last playlist of this form: one TS and one fMP4, so
    /// viewers of both forms do not replace each other's.
    fn slot(self) -> usize {
        match self {
            Form::Ts => 0,
            Form::Fmp4(_) => 1,
        }
    }
}

/// A playlist as written: `None` for an fMP4 one when no segment has an fMP4 form.
type Text = Option<Arc<Playlist>>;

/// The last playlists written for a channel, and the writes under way.
#[derive(Debug)]
pub(super) struct Rendered {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    state: Mutex<State>,
    /// Playlists written (for tests: concurrent requests share one).
    #[cfg(test)]
    writes: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// The last playlist written, per form (by [`Form::slot`]).
    last: [Option<Last>; 2],
    flights: Vec<Flight>,
}

#[derive(Debug)]
struct Last {
    version: u64,
    form: Form,
    query: Box<str>,
    /// Its part of `MAX_KEPT_TOTAL` goes with it (and lasts while answers still send it).
    playlist: Arc<Playlist>,
}

/// A playlist being written: the requests for the same version, form and query wait for it.
/// Its writer is not the request that started it (which may be dropped when its client
/// leaves) but the write itself, which sends what it wrote to every waiter.
#[derive(Debug)]
struct Flight {
    version: u64,
    form: Form,
    query: Box<str>,
    text: watch::Receiver<Option<Text>>,
}

/// What a request does about a playlist being written.
enum Joined {
    /// Waits for the write under way.
    Wait(watch::Receiver<Option<Text>>),
    /// Writes it, and sends it to those waiting.
    Lead(watch::Sender<Option<Text>>),
    /// Writes its own: the channel has [`MAX_FLIGHTS`] under way already.
    Alone,
}

impl State {
    /// The write of `version` in `form` for `query` to wait for, or to lead when none is
    /// under way.
    fn join(&mut self, version: u64, form: Form, query: &str) -> Joined {
        if let Some(f) = self
            .flights
            .iter()
            .find(|f| f.version == version && f.form == form && *f.query == *query)
        {
            return Joined::Wait(f.text.clone());
        }
        // Writes of older versions no request will join again (their waiters hold them), and
        // a write whose sender is gone (it panicked) never sends: neither takes a place.
        self.flights
            .retain(|f| f.version >= version && f.text.has_changed().is_ok());
        if self.flights.len() >= MAX_FLIGHTS {
            return Joined::Alone;
        }
        let (send, text) = watch::channel(None);
        self.flights.push(Flight {
            version,
            form,
            query: query.into(),
            text,
        });
        Joined::Lead(send)
    }
}

/// One playlist to write, with what it is written from (owned: a large one is written on the
/// blocking pool, and goes on when the request that asked for it is dropped).
#[derive(Clone)]
struct Job {
    config: HlsConfig,
    listing: Arc<Listing>,
    query: Box<str>,
    /// The channel's fMP4 segments, for an fMP4 playlist.
    fmp4: Option<Arc<Converted>>,
}

impl Job {
    fn form(&self) -> Form {
        match &self.fmp4 {
            None => Form::Ts,
            Some(c) => Form::Fmp4(c.done()),
        }
    }

    /// Whether it is written on the blocking pool.
    fn large(&self) -> bool {
        self.listing.estimate(&self.query) >= INLINE_BYTES
    }

    fn run(&self) -> Text {
        match &self.fmp4 {
            None => Some(Playlist::new(media(
                &self.config,
                &self.listing,
                &self.query,
            ))),
            Some(c) => media_fmp4(&self.config, &self.listing, &self.query, c).map(Playlist::new),
        }
    }
}

impl Rendered {
    /// The playlists of a channel, kept within `shared`'s bound.
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Self {
            inner: Arc::new(Inner {
                shared,
                state: Mutex::default(),
                #[cfg(test)]
                writes: AtomicU64::new(0),
            }),
        }
    }

    /// Playlists written so far.
    #[cfg(test)]
    pub(super) fn writes(&self) -> u64 {
        self.inner.writes.load(Ordering::Acquire)
    }

    /// Writes under way that requests may join.
    #[cfg(test)]
    pub(super) fn flights(&self) -> usize {
        registry::lock(&self.inner.state).flights.len()
    }

    /// The TS playlist of `listing` for a request with `query`: the one written last when it
    /// was for the same version and query, the one being written when it is, else written now
    /// (no lock held meanwhile).
    pub(super) async fn get(
        &self,
        config: &HlsConfig,
        listing: &Arc<Listing>,
        query: &str,
    ) -> Arc<Playlist> {
        match self.get_as(config, listing, query, None).await {
            Some(playlist) => playlist,
            None => Playlist::new(Bytes::new()),
        }
    }

    /// The fMP4 playlist of `listing` for a request with `query`, as [`Rendered::get`] gets
    /// the TS one; `None` when no segment of `converted` has an fMP4 form.
    pub(super) async fn get_fmp4(
        &self,
        config: &HlsConfig,
        listing: &Arc<Listing>,
        query: &str,
        converted: &Arc<Converted>,
    ) -> Text {
        self.get_as(config, listing, query, Some(converted)).await
    }

    async fn get_as(
        &self,
        config: &HlsConfig,
        listing: &Arc<Listing>,
        query: &str,
        fmp4: Option<&Arc<Converted>>,
    ) -> Text {
        let job = Job {
            config: config.clone(),
            listing: listing.clone(),
            query: query.into(),
            fmp4: fmp4.cloned(),
        };
        let form = job.form();
        let joined = {
            let mut state = registry::lock(&self.inner.state);
            if let Some(last) = &state.last[form.slot()] {
                if last.version == listing.version && last.form == form && *last.query == *query {
                    return Some(last.playlist.clone());
                }
            }
            state.join(listing.version, form, query)
        };
        let mut waiting = match joined {
            Joined::Wait(text) => text,
            Joined::Lead(send) if !job.large() => {
                let text = self.inner.write_here(&job);
                self.inner.finish(&job, form, &text, Some(&send));
                let _ = send.send(Some(text.clone()));
                return text;
            }
            Joined::Lead(send) => {
                // Written by a task of its own: when this request is dropped (its client
                // left), the write still reaches those waiting for it and is kept.
                let waiting = send.subscribe();
                let (inner, job) = (self.inner.clone(), job.clone());
                tokio::spawn(async move {
                    // A write no one can have any more is not started: its flight left the
                    // list (a newer version came) and every request waiting for it left.
                    // Else hang-ups on each new version would queue writes without end on
                    // the places every channel's large playlists wait for.
                    let place = tokio::select! {
                        place = inner.shared.blocking.clone().acquire_owned() => place,
                        () = send.closed() => return,
                    };
                    let text = match place {
                        Ok(place) => inner.write_in(place, &job).await,
                        Err(_) => inner.write_here(&job),
                    };
                    inner.finish(&job, form, &text, Some(&send));
                    let _ = send.send(Some(text));
                });
                waiting
            }
            Joined::Alone => {
                let text = self.inner.write(&job).await;
                self.inner.finish(&job, form, &text, None);
                return text;
            }
        };
        let sent = match waiting.wait_for(Option::is_some).await {
            Ok(text) => Ok(text.clone().flatten()),
            Err(e) => Err(e),
        };
        match sent {
            Ok(text) => text,
            // The write ended without sending (it panicked, or the runtime is shutting
            // down): this request writes its own.
            Err(_) => self.inner.write(&job).await,
        }
    }
}

impl Inner {
    /// Ends a write: takes it off the flights (`send`: its flight) and keeps what it wrote
    /// for the requests that follow. A request that took its listing earlier does not replace
    /// a newer playlist, and a playlist past `MAX_KEPT_BYTES` or the room left for playlists
    /// under `MAX_KEPT_TOTAL` is not kept (it lives as long as its answers, charged to them:
    /// [`super::sent`]). A kept one's part of `MAX_KEPT_TOTAL` goes with it, not its slot.
    fn finish(
        &self,
        job: &Job,
        form: Form,
        text: &Text,
        send: Option<&watch::Sender<Option<Text>>>,
    ) {
        let mut state = registry::lock(&self.state);
        if let Some(send) = send {
            state
                .flights
                .retain(|f| !f.text.same_channel(&send.subscribe()));
        }
        let Some(playlist) = text else {
            return;
        };
        let version = job.listing.version;
        let keep = playlist.text.len() <= MAX_KEPT_BYTES
            && state.last[form.slot()].as_ref().is_none_or(|l| {
                l.version < version
                    || (l.version == version && (*l.query != *job.query || l.form != form))
            });
        if keep {
            // The old one's bytes go back first (unless answers still send it): it is
            // replaced whether or not this one fits.
            state.last[form.slot()] = None;
            if let Some(held) = self.shared.reserve_playlist(playlist.text.len() as u64) {
                playlist.keep(held);
                state.last[form.slot()] = Some(Last {
                    version,
                    form,
                    query: job.query.clone(),
                    playlist: playlist.clone(),
                });
            }
        }
    }

    /// Writes the playlist: a large one on the blocking pool, once a place is free.
    async fn write(&self, job: &Job) -> Text {
        if job.large() {
            self.write_off(job).await
        } else {
            self.write_here(job)
        }
    }

    /// Writes the playlist here, on the runtime (a small one).
    fn write_here(&self, job: &Job) -> Text {
        #[cfg(test)]
        self.writes.fetch_add(1, Ordering::AcqRel);
        job.run()
    }

    /// Writes the playlist on the blocking pool, once a place is free.
    async fn write_off(&self, job: &Job) -> Text {
        // The places are never closed; were they, the playlist is written here.
        match self.shared.blocking.clone().acquire_owned().await {
            Ok(place) => self.write_in(place, job).await,
            Err(_) => self.write_here(job),
        }
    }

    /// Writes the playlist on the blocking pool, in `place` (which goes with the blocking
    /// job: it cannot be stopped).
    async fn write_in(&self, place: OwnedSemaphorePermit, job: &Job) -> Text {
        #[cfg(test)]
        self.writes.fetch_add(1, Ordering::AcqRel);
        let owned = job.clone();
        #[cfg(test)]
        let shared = self.shared.clone();
        let written = tokio::task::spawn_blocking(move || {
            let _place = place;
            #[cfg(test)]
            shared.started();
            let text = owned.run();
            #[cfg(test)]
            shared.running.fetch_sub(1, Ordering::AcqRel);
            text
        })
        .await;
        // Only a panic or a runtime shutting down ends a blocking job early: the playlist is
        // written here, as it was before.
        written.unwrap_or_else(|_| job.run())
    }
}

/// What one timeshift window lists, as far as its whole-window playlist goes: its first and
/// newest sequence and the discontinuities gone before it (a window changes only when a
/// segment is stored, which moves the newest).
pub(super) type TimeshiftVersion = (u64, u64, u64);

/// Whole-window timeshift playlists a channel keeps: one per version and query, the last
/// [`TIMESHIFT_KEPT`] written (queries carrying a token per viewer each have their own).
const TIMESHIFT_KEPT: usize = 8;

/// The last whole-window timeshift playlists written for a channel, for the requests of the
/// same version and query. A full window lists up to `timeshift::MAX_SEGMENTS` segments
/// (megabytes with a query on each line): written on every poll, a hundred viewers reloading
/// once a target duration each made one such write, all queued on the blocking pool's places.
/// Requests for a version and query not kept wait for the one writing it (a lock per version
/// and query, gone when its last request is: a write never waits for another query's), then
/// share what it wrote.
#[derive(Debug, Default)]
pub(super) struct TimeshiftMemo {
    state: Mutex<TimeshiftState>,
    /// Playlists written (for tests: requests of one version share one).
    #[cfg(test)]
    writes: AtomicU64,
}

/// One playlist's version and query.
type TimeshiftKey = (TimeshiftVersion, Box<str>);

#[derive(Debug, Default)]
struct TimeshiftState {
    /// At most [`TIMESHIFT_KEPT`], oldest first.
    kept: std::collections::VecDeque<TimeshiftLast>,
    /// The writes under way, each with the requests waiting for it.
    flights: std::collections::HashMap<TimeshiftKey, Arc<tokio::sync::Mutex<()>>>,
}

impl TimeshiftState {
    fn find(&self, version: TimeshiftVersion, query: &str) -> Option<Arc<Playlist>> {
        let l = self
            .kept
            .iter()
            .find(|l| l.version == version && *l.query == *query)?;
        Some(l.playlist.clone())
    }
}

#[derive(Debug)]
struct TimeshiftLast {
    version: TimeshiftVersion,
    query: Box<str>,
    /// Its part of `MAX_KEPT_TOTAL` goes with it (and lasts while answers still send it).
    playlist: Arc<Playlist>,
}

/// A request's part in a flight: the last to leave (written, refused or hung up) takes the
/// flight out of the map.
struct Boarded<'a> {
    memo: &'a TimeshiftMemo,
    key: TimeshiftKey,
    flight: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for Boarded<'_> {
    fn drop(&mut self) {
        let mut state = registry::lock(&self.memo.state);
        // Clones are made only under this lock: the map's and this one left means no other.
        let last = state
            .flights
            .get(&self.key)
            .is_some_and(|f| Arc::ptr_eq(f, &self.flight) && Arc::strong_count(f) == 2);
        if last {
            state.flights.remove(&self.key);
        }
    }
}

impl TimeshiftMemo {
    /// The whole-window playlist for `query`: one kept when `now` (the window's version as it
    /// is) is its version, else written from `take` (the window's version and listing, copied
    /// when called) by `write`, and kept within `shared`'s bound. `Err` carries what `write`
    /// refused (an estimated size).
    pub(super) async fn get<W, F>(
        &self,
        now: TimeshiftVersion,
        query: &str,
        shared: &Arc<Shared>,
        take: impl FnOnce() -> (TimeshiftVersion, super::TimeshiftListing),
        write: W,
    ) -> Result<Arc<Playlist>, usize>
    where
        W: FnOnce(super::TimeshiftListing) -> F,
        F: std::future::Future<Output = Result<String, usize>>,
    {
        let boarded = {
            let mut state = registry::lock(&self.state);
            if let Some(playlist) = state.find(now, query) {
                return Ok(playlist);
            }
            let key: TimeshiftKey = (now, query.into());
            let flight = state.flights.entry(key.clone()).or_default().clone();
            Boarded {
                memo: self,
                key,
                flight,
            }
        };
        let _flying = boarded.flight.lock().await;
        // The one ahead may have written it.
        let written = registry::lock(&self.state).find(now, query);
        if let Some(playlist) = written {
            return Ok(playlist);
        }
        let (version, listing) = take();
        #[cfg(test)]
        self.writes.fetch_add(1, Ordering::AcqRel);
        let playlist = Playlist::new(write(listing).await?);
        let mut state = registry::lock(&self.state);
        // Its query's older versions, and playlists of older windows, are asked no more:
        // their bytes go back first (unless answers still send them).
        state
            .kept
            .retain(|l| *l.query != *query && l.version.1 >= version.1);
        while state.kept.len() >= TIMESHIFT_KEPT {
            state.kept.pop_front();
        }
        if playlist.text.len() <= MAX_KEPT_BYTES {
            if let Some(held) = shared.reserve_playlist(playlist.text.len() as u64) {
                playlist.keep(held);
                state.kept.push_back(TimeshiftLast {
                    version,
                    query: query.into(),
                    playlist: playlist.clone(),
                });
            }
        }
        Ok(playlist)
    }

    /// Playlists written so far.
    #[cfg(test)]
    pub(super) fn writes(&self) -> u64 {
        self.writes.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::kept::BLOCKING_WRITES;
    use super::*;

    /// A listing of `segments` six-second segments, as version `version` of a window.
    fn listing(version: u64, segments: u64) -> Arc<Listing> {
        Arc::new(Listing {
            version,
            entries: (0..segments)
                .map(|sequence| Entry {
                    sequence,
                    duration: 6 * CLOCK,
                    discontinuity: false,
                    wall_ms: None,
                })
                .collect(),
            gone: 0,
            kind: Kind::Event,
            parts: Vec::new(),
            ended: false,
        })
    }

    /// Waits until `rendered` has `want` flights, all of `version`.
    async fn settled(rendered: &Rendered, want: usize, version: u64) {
        for _ in 0..500 {
            {
                let state = registry::lock(&rendered.inner.state);
                if state.flights.len() == want && state.flights.iter().all(|f| f.version == version)
                {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("{} flights, not {want} of {version}", rendered.flights());
    }

    /// Attack: on every new version of a channel, requests with four queries (each a large
    /// write) that hang up at once, while the places for large writes are taken. A shared
    /// write whose flight a newer version replaced and whose requests all left is never
    /// started: once the places are free, only the last version's writes (which requests may
    /// still join) run, not one per version and query queued ahead of every other channel's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn abandoned_writes_of_older_versions_never_queue() {
        let config = HlsConfig::default();
        let shared = Arc::new(Shared::default());
        let rendered = Arc::new(Rendered::new(shared.clone()));
        let places = shared.places();
        let held = places
            .clone()
            .acquire_many_owned(BLOCKING_WRITES as u32)
            .await
            .unwrap();
        let query = |n: usize| format!("q{n}={}", "x".repeat(2000));
        let versions = 50;
        let mut listings = Vec::new();
        for version in 0..versions {
            let listing = listing(version, 200);
            listings.push(listing.clone());
            assert!(listing.estimate(&query(0)) >= INLINE_BYTES);
            let hung: Vec<_> = (0..MAX_FLIGHTS)
                .map(|n| {
                    let (rendered, config, listing) =
                        (rendered.clone(), config.clone(), listing.clone());
                    tokio::spawn(async move { rendered.get(&config, &listing, &query(n)).await })
                })
                .collect();
            settled(&rendered, MAX_FLIGHTS, version).await;
            for h in hung {
                h.abort();
                assert!(h.await.unwrap_err().is_cancelled());
            }
        }
        // Nothing holds an older version's listing: its writes are gone, not queued.
        for _ in 0..500 {
            if listings
                .iter()
                .all(|l| Arc::strong_count(l) == 1 || l.version == versions - 1)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let held_on = listings.iter().filter(|l| Arc::strong_count(l) > 1).count();
        assert_eq!(
            held_on, 1,
            "{held_on} versions' listings held by their writes"
        );
        drop(held);
        // The places are taken in turn: both are free again only once every write queued
        // before has started (and ended).
        let all = places
            .acquire_many_owned(BLOCKING_WRITES as u32)
            .await
            .unwrap();
        let (writes, _) = shared.blocking_writes();
        assert_eq!(writes, MAX_FLIGHTS as u64, "{writes} large writes");
        drop(all);
        settled(&rendered, 0, 0).await;
        assert_eq!(rendered.writes(), MAX_FLIGHTS as u64);
    }

    /// TS and fMP4 viewers of one channel, reloading in turn: each form's last playlist is
    /// kept apart, so neither is written again for the other's request.
    #[tokio::test]
    async fn each_form_keeps_its_last_playlist() {
        let config = HlsConfig::default();
        let rendered = Rendered::new(Arc::new(Shared::default()));
        let listing = listing(0, 10);
        let converted = Arc::new(Converted::default());
        converted.fake(0..10);
        let ts = rendered.get(&config, &listing, "q=1").await.text.clone();
        assert!(ts.ends_with(b"9.ts?q=1\n"), "{ts:?}");
        let rendered = Arc::new(rendered);
        let fmp4 = |rendered: Arc<Rendered>| {
            let (config, listing, converted) = (config.clone(), listing.clone(), converted.clone());
            async move {
                rendered
                    .get_fmp4(&config, &listing, "q=1", &converted)
                    .await
                    .expect("an fMP4 form")
                    .text
                    .clone()
            }
        };
        let first = fmp4(rendered.clone()).await;
        assert!(first.ends_with(b"9.m4s?q=1\n"), "{first:?}");
        assert_eq!(rendered.writes(), 2);
        for _ in 0..3 {
            let again = rendered.get(&config, &listing, "q=1").await.text.clone();
            assert_eq!(again.as_ptr(), ts.as_ptr());
            assert_eq!(fmp4(rendered.clone()).await.as_ptr(), first.as_ptr());
        }
        assert_eq!(rendered.writes(), 2);
    }

    /// A timeshift write for one query does not wait for another query's (one lock per
    /// channel was held across every write), and requests of one version and query share
    /// its write; the flights are gone once done.
    #[tokio::test]
    async fn a_timeshift_write_does_not_wait_for_another_query() {
        let memo = TimeshiftMemo::default();
        let shared = Arc::new(Shared::default());
        let version = (0, 2, 0);
        let take = || {
            let listing = super::super::TimeshiftListing {
                entries: Vec::new(),
                target: 4,
                gone: 0,
                shown: super::super::Shown::Window,
            };
            (version, listing)
        };
        let (release, held) = tokio::sync::oneshot::channel::<()>();
        let slow = memo.get(version, "a=1", &shared, take, |_| async move {
            held.await.ok();
            Ok("slow\n".to_owned())
        });
        let slow_again = memo.get(version, "a=1", &shared, take, |_| async {
            Ok("again\n".to_owned())
        });
        let other = async {
            let quick = memo.get(version, "b=2", &shared, take, |_| async {
                Ok("quick\n".to_owned())
            });
            let quick = tokio::time::timeout(Duration::from_secs(5), quick)
                .await
                .expect("not behind the other query's write")
                .unwrap();
            release.send(()).unwrap();
            quick
        };
        let (slow, slow_again, quick) = tokio::join!(slow, slow_again, other);
        assert_eq!(&quick.text[..], b"quick\n");
        let (slow, slow_again) = (slow.unwrap(), slow_again.unwrap());
        assert_eq!(&slow.text[..], b"slow\n");
        assert!(Arc::ptr_eq(&slow, &slow_again), "one write for one query");
        assert_eq!(memo.writes(), 2);
        assert!(registry::lock(&memo.state).flights.is_empty());
    }
}
