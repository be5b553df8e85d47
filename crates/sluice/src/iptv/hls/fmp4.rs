//! fMP4 segments of an HLS channel (`?container=fmp4`, or `iptv.hls.container = "fmp4"`): the
//! channel's TS segments rewritten once each by `sluice_media::fmp4`, shared by every fMP4
//! viewer, from the channel's first fMP4 request on (a channel nobody asks fMP4 of pays nothing).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use sluice_media::fmp4::{Fragment, Writer};
use sluice_media::segmenter::Segment;
use tokio::sync::watch;

use super::super::registry;

/// The segments a playlist lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Container {
    /// MPEG-TS, as the channel carries it.
    #[default]
    Ts,
    /// Fragmented MP4 (H.264 and AAC), with an init segment.
    Fmp4,
}

/// The query without `container=` (which is the player's choice, not part of the channel), and
/// the container it asks for (`default` when it names none); `Err` names a bad value.
pub(super) fn container(query: &str, default: Container) -> Result<(String, Container), String> {
    let mut kept = Vec::new();
    let mut chosen = default;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("container", "ts") => chosen = Container::Ts,
            ("container", "fmp4") => chosen = Container::Fmp4,
            ("container", other) => {
                let other: String = other.chars().take(24).collect();
                return Err(format!("container={other}: ts or fmp4"));
            }
            _ => kept.push(pair),
        }
    }
    Ok((kept.join("&"), chosen))
}

/// Segments rewritten per turn of the lock: the rewrite runs with the state unlocked, and a
/// turn's fragments are added under it (a catch-up window of 256 MiB is thousands of turns, and
/// the readers of the state wait for one turn's bookkeeping at most). A turn is also one job
/// of the media segment lane: the next turn queues for a place again, behind the jobs that
/// came meanwhile.
const CHUNK_SEGMENTS: usize = 4;

/// One channel's fMP4 segments.
///
/// The rewrite (a remux of every segment) runs on the blocking pool, one job per channel at a
/// time, outside `state`'s lock: a first fMP4 request on a catch-up channel holding 256 MiB
/// remuxes all of it, and under the lock every reader (the `catchup_total_bytes` accounting
/// under the HLS channel table's lock, the playlists, the fragments) waited for all of it on a
/// runtime worker, stalling every `/hls/` request. Each turn ([`CHUNK_SEGMENTS`]) is a job of
/// its own in the media segment lane: one job for the whole window held a place until all of
/// it was remuxed, and every live segment's remux or decryption waited behind it.
#[derive(Debug, Default)]
pub(super) struct Converted {
    state: Mutex<State>,
    /// Bytes of the fragments held (as `State::bytes`), read without the lock.
    bytes: AtomicU64,
    /// Bumped after each turn of the rewrite, for requests that wait for a segment's fragment.
    progress: watch::Sender<u64>,
    #[cfg(test)]
    probe: Probe,
}

/// What the tests see of the rewrite: segments rewritten, and how many of them with the state
/// locked meanwhile; and a lane of the test's own in place of the media segment lane.
#[cfg(test)]
#[derive(Debug, Default)]
struct Probe {
    rewritten: AtomicU64,
    locked: AtomicU64,
    lane: std::sync::OnceLock<TestLane>,
}

/// A lane for the tests: its places, where each turn logs the channel's name once done, and
/// how many times the channel's job waited for a place.
#[cfg(test)]
#[derive(Debug)]
struct TestLane {
    places: Arc<tokio::sync::Semaphore>,
    log: Arc<Mutex<Vec<&'static str>>>,
    name: &'static str,
    waits: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Some viewer asked for fMP4: every new segment is rewritten as it comes.
    wanted: bool,
    /// The writer, while no rewrite job has it (`None`: one is under way).
    writer: Option<Writer>,
    /// Segments waiting for the rewrite, ascending.
    pending: VecDeque<(u64, Segment)>,
    /// Media sequence number of the last segment queued for the rewrite.
    queued: Option<u64>,
    /// Media sequence number of the last segment given to the writer.
    last: Option<u64>,
    /// The first segment the channel's window still holds.
    oldest: u64,
    /// By media sequence number (ascending); `None` for a segment that could not be written.
    fragments: VecDeque<(u64, Option<Fragment>)>,
    /// Bytes of the fragments held (their init segments are shared, and small).
    bytes: u64,
    /// Why the last segment that could not be written could not.
    error: Option<String>,
    /// The numbers playlists name the init segments by (`init-<n>.mp4`).
    inits: Inits,
    /// The channel left the HLS table (dropped for `catchup_total_bytes`, idle, or replaced):
    /// nothing more is queued or rewritten. The job under way stops at its next turn: it held
    /// the channel's segments and went on remuxing, uncounted, until it had written them all.
    closed: bool,
}

/// The numbers a channel's init segments go by: one number per init as it changes, counted
/// over the channel's whole life, whatever writer made it. A writer numbers its own inits from
/// 1: one made fresh (after a rewrite job failed, or a segment made the writer panic) named its
/// first init `init-1.mp4` again, while the playlist went on, and a player holding the old
/// `init-1.mp4` (or the channel answering with the first fragment's init of that number) got
/// the wrong one. An init byte for byte the same as the last keeps its number; any other gets a
/// new one, never one used before: the playlist's `EXT-X-MAP` changes exactly when the init
/// does. A channel started again in place of an ended one goes on from that one's numbers
/// ([`Converted::carry_inits`]).
#[derive(Debug, Clone, Default)]
pub(super) struct Inits {
    /// The last init given a number, and that number.
    last: Option<(Bytes, u64)>,
    /// The last number given.
    given: u64,
}

impl Inits {
    /// The number of `fragment`'s init (which it is given, with the bytes kept for it).
    fn number(&mut self, fragment: &mut Fragment) {
        match &self.last {
            Some((bytes, n)) if *bytes == fragment.init => {
                fragment.init = bytes.clone();
                fragment.init_id = *n;
            }
            _ => {
                self.given += 1;
                fragment.init_id = self.given;
                self.last = Some((fragment.init.clone(), self.given));
            }
        }
    }
}

impl State {
    /// Queues the segments after the last one queued, and forgets what is older than `oldest`
    /// (gone from the window).
    fn add(&mut self, segments: &[(u64, Segment)], oldest: u64) {
        for (seq, seg) in segments {
            if self.queued.is_some_and(|l| *seq <= l) {
                continue;
            }
            self.queued = Some(*seq);
            self.pending.push_back((*seq, seg.clone()));
        }
        self.forget_before(oldest);
    }

    fn forget_before(&mut self, oldest: u64) {
        self.oldest = self.oldest.max(oldest);
        while self.pending.front().is_some_and(|(s, _)| *s < self.oldest) {
            self.pending.pop_front();
        }
        while self
            .fragments
            .front()
            .is_some_and(|(s, _)| *s < self.oldest)
        {
            if let Some((_, Some(gone))) = self.fragments.pop_front() {
                self.bytes -= gone.media.len() as u64;
            }
        }
    }

    /// Whether segment `sequence` is rewritten, or never will be (not queued, or gone). A
    /// segment the rewrite has taken from `pending` and is writing now is neither: judged by
    /// `pending` alone it looked settled, and a playlist of an ended channel came out with
    /// `ENDLIST` and without its last chunk.
    fn settled(&self, sequence: u64) -> bool {
        !self.wanted
            || self.closed
            || self.last.is_some_and(|l| l >= sequence)
            || sequence < self.oldest
            || self.queued.is_none_or(|q| q < sequence)
    }

    /// Fragment of segment `sequence`, when held (`Some(None)`: it has no fMP4 form).
    fn find(&self, sequence: u64) -> Option<&Option<Fragment>> {
        let i = self
            .fragments
            .binary_search_by_key(&sequence, |(s, _)| *s)
            .ok()?;
        self.fragments.get(i).map(|(_, f)| f)
    }
}

impl Converted {
    /// For a channel started in place of `ended` (its source came back, `ended` closed): its
    /// init numbers go on from the ended one's, whose playlist players may still hold.
    pub(super) fn carry_inits(&self, ended: &Converted) {
        let inits = registry::lock(&ended.state).inits.clone();
        registry::lock(&self.state).inits = inits;
    }

    /// New segments of the channel (`oldest`: the first one its window still holds), queued
    /// for the rewrite when a viewer wants fMP4.
    pub(super) fn add(self: &Arc<Self>, segments: &[(u64, Segment)], oldest: u64) {
        let mut state = registry::lock(&self.state);
        if state.wanted && !state.closed {
            state.add(segments, oldest);
            self.bytes.store(state.bytes, Ordering::Release);
            drop(state);
            self.start();
        }
    }

    /// A viewer asks for fMP4: from now on every segment is rewritten, starting with those the
    /// window holds (`window` takes them; it is called under this lock, so a segment stored
    /// meanwhile is either in it or queued by the next [`Converted::add`]). The rewrite runs
    /// on the blocking pool: [`Converted::settle`] waits for it.
    pub(super) fn want(self: &Arc<Self>, window: impl FnOnce() -> (Vec<(u64, Segment)>, u64)) {
        let mut state = registry::lock(&self.state);
        if !state.wanted && !state.closed {
            state.wanted = true;
            state.writer = Some(Writer::default());
            let (segments, oldest) = window();
            state.add(&segments, oldest);
            drop(state);
            self.start();
        }
    }

    /// The channel left the HLS table: nothing more is rewritten, the segments waiting are let
    /// go, and the job under way stops at its next turn (what it is writing now is not kept).
    /// Requests waiting for a segment's fragment stop waiting.
    pub(super) fn close(&self) {
        let mut state = registry::lock(&self.state);
        state.closed = true;
        state.pending = VecDeque::new();
        drop(state);
        self.progress.send_modify(|n| *n += 1);
    }

    /// Takes the writer for a turn, unless a job has it, nothing waits, or the channel is gone.
    fn claim(&self) -> Option<Writer> {
        let mut state = registry::lock(&self.state);
        if state.closed || state.pending.is_empty() {
            return None;
        }
        state.writer.take()
    }

    /// Starts the rewrite job unless one is under way or nothing waits for it: on the blocking
    /// pool (in the CPU lanes' segment lane), or here without a runtime. Each
    /// turn gives its place in the lane back and the next one queues again (the lane is fair):
    /// the live segments' jobs that came meanwhile go first.
    fn start(self: &Arc<Self>) {
        let Some(writer) = self.claim() else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            let mut writer = writer;
            loop {
                self.turn(writer);
                match self.claim() {
                    Some(next) => writer = next,
                    None => return,
                }
            }
        };
        let this = self.clone();
        handle.spawn(async move {
            let job = {
                let this = this.clone();
                move || this.turn(writer)
            };
            if this.in_lane(job).await.is_err() {
                // The writer went with the job: a fresh one, or the channel's rewrite would stop
                // for good and every later playlist wait out its time.
                tracing::warn!("fMP4 rewrite job failed");
                let mut state = registry::lock(&this.state);
                if state.writer.is_none() {
                    state.writer = Some(Writer::default());
                }
            }
            this.start();
        });
    }

    /// Runs `job` on the blocking pool, in the segment lane of the CPU lanes (`runtime::cpu`),
    /// shared with the media front end's remuxes and decryptions.
    async fn in_lane(
        &self,
        job: impl FnOnce() + Send + 'static,
    ) -> Result<(), tokio::task::JoinError> {
        #[cfg(test)]
        if let Some(lane) = self.probe.lane.get() {
            // Counted in the poll that queues for the place (the tests' runtime has one
            // thread): a count seen means the job waits in the lane.
            lane.waits.fetch_add(1, Ordering::AcqRel);
            let place = lane
                .places
                .clone()
                .acquire_owned()
                .await
                .expect("never closed");
            return tokio::task::spawn_blocking(move || {
                let _place = place;
                job()
            })
            .await;
        }
        crate::runtime::cpu::run(crate::runtime::cpu::Lane::Segment, job).await
    }

    /// Rewrites a few of the segments queued (one turn of the lock), then gives the writer
    /// back: [`Converted::start`] takes it again for the next turn.
    fn turn(&self, mut writer: Writer) {
        let (chunk, mut last) = {
            let mut state = registry::lock(&self.state);
            if state.closed {
                return;
            }
            if state.pending.is_empty() {
                state.writer = Some(writer);
                return;
            }
            let n = state.pending.len().min(CHUNK_SEGMENTS);
            let chunk: Vec<_> = state.pending.drain(..n).collect();
            (chunk, state.last)
        };
        let mut done = Vec::with_capacity(chunk.len());
        let mut error = None;
        for (seq, seg) in &chunk {
            if seg.discontinuity || last.is_none_or(|l| *seq != l + 1) {
                writer.reset();
            }
            last = Some(*seq);
            #[cfg(test)]
            {
                self.probe.rewritten.fetch_add(1, Ordering::AcqRel);
                // Held all along (by this thread): a reader's or the next turn's claim
                // holds it for a moment.
                let held = (0..1000).all(|_| {
                    let held = self.state.try_lock().is_err();
                    std::thread::yield_now();
                    held
                });
                if held {
                    self.probe.locked.fetch_add(1, Ordering::AcqRel);
                }
            }
            let end = seg.start + seg.duration;
            let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                writer.segment(&seg.data, (*seq + 1) as u32, Some(end))
            }));
            let fragment = match written {
                Ok(Ok(f)) => Some(f),
                Ok(Err(e)) => {
                    tracing::debug!(sequence = seq, error = %e, "segment not written as fMP4");
                    error = Some(e.to_string());
                    None
                }
                Err(_) => {
                    tracing::warn!(sequence = seq, "fMP4 writer panicked on a segment");
                    writer = Writer::default();
                    error = Some("the fMP4 writer failed".to_string());
                    None
                }
            };
            done.push((*seq, fragment));
        }
        drop(chunk);
        let mut state = registry::lock(&self.state);
        if state.closed {
            // Gone from the table meanwhile: what it holds is no longer counted.
            return;
        }
        state.last = last;
        if error.is_some() {
            state.error = error;
        }
        for (seq, mut fragment) in done {
            if let Some(f) = fragment.as_mut() {
                // In sequence order: the writer's own number is its own (see `Inits`).
                state.inits.number(f);
            }
            state.bytes += fragment.as_ref().map_or(0, |f| f.media.len() as u64);
            state.fragments.push_back((seq, fragment));
        }
        let oldest = state.oldest;
        state.forget_before(oldest);
        state.writer = Some(writer);
        self.bytes.store(state.bytes, Ordering::Release);
        #[cfg(test)]
        if let Some(lane) = self.probe.lane.get() {
            // Before the turn shows: a test that saw it settled sees it logged.
            registry::lock(&lane.log).push(lane.name);
        }
        drop(state);
        self.progress.send_modify(|n| *n += 1);
    }

    /// Waits (at most `wait`) until segment `sequence` is rewritten, or never will be; returns
    /// whether it was.
    pub(super) async fn settle(&self, sequence: u64, wait: std::time::Duration) -> bool {
        let mut rx = self.progress.subscribe();
        let settled = rx.wait_for(|_| registry::lock(&self.state).settled(sequence));
        let settled = tokio::time::timeout(wait, settled).await.is_ok();
        // A channel closed meanwhile (replaced, evicted) wakes its waiters, but what it holds
        // is not all it would have had: unsettled, so a playlist is not ended short of it (the
        // caller's 503 sends the player back, to the channel now in the table).
        settled && {
            let state = registry::lock(&self.state);
            !state.closed || state.last.is_some_and(|l| l >= sequence)
        }
    }

    /// Whether a viewer has asked for fMP4 (every segment is rewritten).
    pub(super) fn wanted(&self) -> bool {
        registry::lock(&self.state).wanted
    }

    /// Bytes of the fMP4 fragments held: without the lock (the `catchup_total_bytes`
    /// accounting reads it under the HLS channel table's lock).
    pub(super) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }

    /// Segment `sequence` as fMP4: `None` when it is not held, `Some(None)` when it has no
    /// fMP4 form.
    pub(super) fn fragment(&self, sequence: u64) -> Option<Option<Fragment>> {
        registry::lock(&self.state).find(sequence).cloned()
    }

    /// Sequence of the last segment rewritten so far (the fMP4 playlist lists none after it).
    pub(super) fn done(&self) -> Option<u64> {
        registry::lock(&self.state).last
    }

    /// Stands fragments of `sequences` in for rewritten segments (for tests: an fMP4 playlist
    /// without H.264 to rewrite).
    #[cfg(test)]
    pub(super) fn fake(&self, sequences: std::ops::Range<u64>) {
        let mut state = registry::lock(&self.state);
        state.wanted = true;
        for seq in sequences {
            let fragment = Fragment {
                media: Bytes::from_static(b"moof"),
                init: Bytes::from_static(b"moov"),
                init_id: 0,
            };
            state.last = Some(seq);
            state.queued = Some(seq);
            state.fragments.push_back((seq, Some(fragment)));
        }
    }

    /// Why the last segment that could not be written as fMP4 could not.
    pub(super) fn error(&self) -> Option<String> {
        registry::lock(&self.state).error.clone()
    }

    /// Init segment number `id`, while a held fragment needs it.
    pub(super) fn init(&self, id: u64) -> Option<Bytes> {
        let state = registry::lock(&self.state);
        state.fragments.iter().find_map(|(_, f)| {
            f.as_ref()
                .filter(|f| f.init_id == id)
                .map(|f| f.init.clone())
        })
    }

    /// The init number of each of `sequences` that a playlist lists: from the first after the
    /// last one that could not be written, up to the last one written so far (a segment just
    /// stored may not be yet). Returns how many were left off the front, and the numbers.
    pub(super) fn listing(&self, sequences: &[u64]) -> (usize, Vec<u64>) {
        let state = registry::lock(&self.state);
        let mut inits = Vec::with_capacity(sequences.len());
        let mut skipped = 0;
        for (i, seq) in sequences.iter().enumerate() {
            if state.last.is_none_or(|last| *seq > last) {
                break;
            }
            // By binary search: a catch-up playlist lists thousands of segments.
            let id = state.find(*seq).and_then(|f| f.as_ref().map(|f| f.init_id));
            match id {
                Some(id) => inits.push(id),
                None => {
                    inits.clear();
                    skipped = i + 1;
                }
            }
        }
        (skipped, inits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(n: u64) -> (u64, Segment) {
        let seg = Segment {
            number: n,
            start: n * 4 * sluice_media::segmenter::CLOCK,
            duration: 4 * sluice_media::segmenter::CLOCK,
            data: Bytes::from(vec![0x47; 188 * 4]),
            keyframe: true,
            discontinuity: false,
        };
        (n, seg)
    }

    /// The rewrite runs with the state unlocked: what the `catchup_total_bytes` accounting
    /// (under the channel table's lock) and every request read never waits for a remux of the
    /// whole window; and a request for a segment waits until it is rewritten.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_rewrite_runs_outside_the_state_lock() {
        let converted = Arc::new(Converted::default());
        let window: Vec<_> = (0..40).map(segment).collect();
        converted.want(|| (window, 0));
        assert!(
            converted
                .settle(39, std::time::Duration::from_secs(30))
                .await
        );
        converted.add(&(40..45).map(segment).collect::<Vec<_>>(), 3);
        assert!(
            converted
                .settle(44, std::time::Duration::from_secs(30))
                .await
        );
        assert_eq!(converted.probe.rewritten.load(Ordering::Acquire), 45);
        assert_eq!(
            converted.probe.locked.load(Ordering::Acquire),
            0,
            "segments rewritten while the state was locked"
        );
        assert_eq!(converted.done(), Some(44));
        // Null packets have no fMP4 form; what left the window is forgotten.
        assert!(matches!(converted.fragment(44), Some(None)));
        assert!(converted.fragment(2).is_none());
        assert!(converted.error().is_some());
        assert_eq!(converted.bytes(), 0);
    }

    /// A channel whose rewrite runs in `places` (a lane of the test's own), logging its turns
    /// as `name` in `log`.
    fn laned(
        name: &'static str,
        places: &Arc<tokio::sync::Semaphore>,
        log: &Arc<Mutex<Vec<&'static str>>>,
    ) -> Arc<Converted> {
        let converted = Arc::new(Converted::default());
        let lane = TestLane {
            places: places.clone(),
            log: log.clone(),
            name,
            waits: AtomicU64::new(0),
        };
        converted.probe.lane.set(lane).unwrap();
        converted
    }

    /// Until `converted`'s job has queued for a place `waits` times (the runtime has one
    /// thread: a job counted waits in the lane).
    async fn queued(converted: &Converted, waits: u64) {
        let lane = converted.probe.lane.get().unwrap();
        for _ in 0..100_000 {
            if lane.waits.load(Ordering::Acquire) >= waits {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("{} never queued for the lane", lane.name);
    }

    /// A rewrite gives its place in the segment lane back after each turn and queues again:
    /// a live channel's job waits for one turn of a catch-up channel's first fMP4 rewrite,
    /// not for all of it (one job held a place until the whole window was remuxed).
    #[tokio::test]
    async fn a_long_rewrite_gives_the_lane_back_between_turns() {
        let places = Arc::new(tokio::sync::Semaphore::new(1));
        let log = Arc::default();
        let long = laned("long", &places, &log);
        let short = laned("short", &places, &log);
        // Both wait for the one place, the long one first.
        let held = places.clone().acquire_owned().await.unwrap();
        let window: Vec<_> = (0..40).map(segment).collect();
        long.want(|| (window, 0));
        queued(&long, 1).await;
        let window: Vec<_> = (0..2).map(segment).collect();
        short.want(|| (window, 0));
        queued(&short, 1).await;
        drop(held);
        let wait = std::time::Duration::from_secs(30);
        assert!(long.settle(39, wait).await);
        assert!(short.settle(1, wait).await);
        let mut expected = vec!["long", "short"];
        expected.extend(["long"; 9]);
        assert_eq!(
            *registry::lock(&log),
            expected,
            "turns in the order they ran"
        );
        assert_eq!(long.probe.rewritten.load(Ordering::Acquire), 40);
        assert_eq!(long.done(), Some(39));
    }

    /// A channel gone from the table (dropped for `catchup_total_bytes`) stops its rewrite at
    /// the next turn and lets go of it: the job held the channel's segments and went on
    /// remuxing them, uncounted, to the end.
    #[tokio::test]
    async fn a_closed_channel_stops_its_rewrite() {
        let places = Arc::new(tokio::sync::Semaphore::new(1));
        let log = Arc::default();
        let gone = laned("gone", &places, &log);
        let held = places.clone().acquire_owned().await.unwrap();
        let window: Vec<_> = (0..40).map(segment).collect();
        gone.want(|| (window, 0));
        queued(&gone, 1).await;
        // Queued behind the first turn: the place comes here once that turn is done.
        let asked = Arc::new(AtomicU64::new(0));
        let next = tokio::spawn({
            let (places, asked) = (places.clone(), asked.clone());
            async move {
                asked.fetch_add(1, Ordering::AcqRel);
                places.acquire_owned().await.unwrap()
            }
        });
        for _ in 0..100_000 {
            if asked.load(Ordering::Acquire) > 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        drop(held);
        let next = next.await.unwrap();
        assert_eq!(gone.probe.rewritten.load(Ordering::Acquire), 4);
        // Its next turn queued for the place: it has it before this test has it again.
        queued(&gone, 2).await;
        gone.close();
        drop(next);
        // Once the place comes back here, any turn queued before has run.
        let last = places.clone().acquire_owned().await.unwrap();
        assert_eq!(
            gone.probe.rewritten.load(Ordering::Acquire),
            4,
            "segments rewritten after the channel was closed"
        );
        // Nothing waits for what will never be written (a waiter is woken, and told the segment
        // is not settled: a closed channel's playlist is not ended short of it), but what was
        // written stays settled; and the job let go of the channel.
        assert!(!gone.settle(39, std::time::Duration::from_secs(30)).await);
        assert!(gone.settle(3, std::time::Duration::from_secs(30)).await);
        for _ in 0..100_000 {
            if Arc::strong_count(&gone) == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(
            Arc::strong_count(&gone),
            1,
            "the job still holds the channel"
        );
        drop(last);
        gone.add(&[segment(40)], 0);
        assert_eq!(
            Arc::strong_count(&gone),
            1,
            "a closed channel queues nothing"
        );
        assert_eq!(gone.done(), Some(3));
    }

    /// One TS packet of `pid` (payload only, starting a unit) around `payload`, padded.
    fn packet(pid: u16, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0x47, 0x40 | (pid >> 8) as u8, pid as u8, 0x10];
        p.extend_from_slice(payload);
        assert!(p.len() <= 188, "one packet");
        p.resize(188, 0);
        p
    }

    /// A 33-bit timestamp as a PES header writes it (`prefix`: 3 for a PTS before a DTS, 1
    /// for the DTS).
    fn stamp(prefix: u8, t: u64) -> [u8; 5] {
        [
            prefix << 4 | ((t >> 29) & 0x0e) as u8 | 1,
            (t >> 22) as u8,
            ((t >> 14) & 0xfe) as u8 | 1,
            (t >> 7) as u8,
            ((t << 1) & 0xfe) as u8 | 1,
        ]
    }

    /// Segment `n`: PAT, PMT (one H.264 stream, PID 0x100) and one IDR picture whose SPS ends
    /// in `level` (another level, another init).
    fn h264(n: u64, level: u8) -> (u64, Segment) {
        let (_, mut seg) = segment(n);
        let pat = [
            0, 0x00, 0xb0, 13, 0, 1, 0xc1, 0, 0, 0, 1, 0xf0, 0x00, 0, 0, 0, 0,
        ];
        let pmt = [
            0, 0x02, 0xb0, 18, 0, 1, 0xc1, 0, 0, 0xe1, 0x00, 0xf0, 0, 0x1b, 0xe1, 0x00, 0xf0, 0, 0,
            0, 0, 0,
        ];
        let mut pes = vec![0, 0, 1, 0xe0, 0, 0, 0x80, 0xc0, 10];
        pes.extend_from_slice(&stamp(3, seg.start));
        pes.extend_from_slice(&stamp(1, seg.start));
        pes.extend_from_slice(&[0, 0, 0, 1, 0x67, 0x42, 0x00, level, 0xab]);
        pes.extend_from_slice(&[0, 0, 0, 1, 0x68, 0xce, 0x3c, 0x80]);
        pes.extend_from_slice(&[0, 0, 0, 1, 0x65, 0x88, 0x84, 0x21, 0xa0]);
        let mut data = packet(0, &pat);
        data.extend(packet(0x1000, &pmt));
        data.extend(packet(0x100, &pes));
        seg.data = Bytes::from(data);
        (n, seg)
    }

    /// The `mfhd` sequence number of a fragment (`moof` first, `mfhd` first in it).
    fn mfhd(f: &Fragment) -> u32 {
        assert_eq!(&f.media[4..8], b"moof");
        assert_eq!(&f.media[12..16], b"mfhd");
        u32::from_be_bytes(f.media[20..24].try_into().unwrap())
    }

    /// A fresh writer (a rewrite job that failed, a channel started again in place of an ended
    /// one) numbers its inits from 1: the playlist went on naming `init-1.mp4`, the number of
    /// another init, and that number's answer was the older init. The channel's numbers go on
    /// instead: the same init keeps its number, another gets a new one; and every fragment's
    /// `mfhd` number is its segment's (media sequence + 1), whichever writer made it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fresh_writer_goes_on_with_the_channels_init_numbers() {
        let wait = std::time::Duration::from_secs(30);
        let converted = Arc::new(Converted::default());
        let window = vec![h264(0, 30), h264(1, 30), h264(2, 31), h264(3, 31)];
        converted.want(|| (window, 0));
        assert!(converted.settle(3, wait).await);
        let fresh = |c: &Converted| registry::lock(&c.state).writer = Some(Writer::default());
        // The job failed: a fresh writer (as `start` gives one) for the next segments.
        fresh(&converted);
        converted.add(&[h264(4, 31)], 0);
        assert!(converted.settle(4, wait).await);
        fresh(&converted);
        converted.add(&[h264(5, 32)], 0);
        assert!(converted.settle(5, wait).await);
        assert_eq!(converted.error(), None);
        let fragment = |c: &Converted, n| c.fragment(n).flatten().expect("written");
        let (three, four) = (fragment(&converted, 3), fragment(&converted, 4));
        assert_eq!(
            four.init, three.init,
            "the same stream, the same init bytes"
        );
        assert_eq!(
            converted.listing(&[0, 1, 2, 3, 4, 5]),
            (0, vec![1, 1, 2, 2, 2, 3]),
            "init numbers as the playlist names them"
        );
        for n in 0..6 {
            let f = fragment(&converted, n);
            assert_eq!(converted.init(f.init_id), Some(f.init.clone()), "{n}");
            assert_eq!(mfhd(&f), n as u32 + 1, "{n}");
        }
        // A channel started again in place of this one goes on from its numbers.
        converted.close();
        let next = Arc::new(Converted::default());
        next.carry_inits(&converted);
        next.want(|| (vec![h264(6, 32), h264(7, 30)], 6));
        assert!(next.settle(7, wait).await);
        assert_eq!(next.listing(&[6, 7]), (0, vec![3, 4]));
        assert_eq!(mfhd(&fragment(&next, 7)), 8);
    }

    /// Segments the rewrite has taken from the queue and is writing now are not settled: by
    /// the queue alone they looked written (or gone), and a waiting playlist went on without
    /// them.
    #[test]
    fn segments_being_written_are_not_settled() {
        let state = State {
            wanted: true,
            queued: Some(12),
            last: Some(8),
            oldest: 2,
            ..State::default()
        };
        // 9..=12 taken by the rewrite: `pending` is empty while it writes them.
        assert!(state.pending.is_empty());
        for seq in 9..=12 {
            assert!(!state.settled(seq), "{seq} is being written");
        }
        assert!(state.settled(8), "written");
        assert!(state.settled(1), "gone from the window");
        assert!(state.settled(13), "never queued");
    }

    #[test]
    fn container_leaves_the_channel_query() {
        assert_eq!(
            container("iface=lo&container=fmp4", Container::Ts).unwrap(),
            ("iface=lo".into(), Container::Fmp4)
        );
        assert_eq!(
            container("container=ts&fec=5002", Container::Fmp4).unwrap(),
            ("fec=5002".into(), Container::Ts)
        );
        assert_eq!(
            container("iface=lo", Container::Fmp4).unwrap(),
            ("iface=lo".into(), Container::Fmp4)
        );
        assert!(container("container=mkv", Container::Ts).is_err());
    }
}
