//! The live sequence state of every DASH track being played as HLS, kept between playlist
//! requests so a Period that restarts `$Number$` never sends a media sequence back (see
//! `sluice_media::dash::LiveSequence`). Bounded in entries and forgotten after idle time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sluice_media::dash::LiveSequence;

/// Tracks remembered at once; past it the longest idle is dropped.
const MAX_TRACKS: usize = 4096;

/// A track nobody has reloaded for this long starts afresh.
const IDLE: Duration = Duration::from_secs(15 * 60);

/// One state per live MPD URL and profile.
#[derive(Default)]
pub struct Sequences {
    tracks: Mutex<HashMap<String, (LiveSequence, Instant)>>,
}

impl Sequences {
    /// A copy of the state of `key`: empty if unknown or idle too long. The lock is not held
    /// while a playlist is built from it (on the blocking pool); [`Sequences::keep`] puts the
    /// result back.
    pub fn current(&self, key: &str) -> LiveSequence {
        let now = Instant::now();
        match self.lock().get(key) {
            Some((state, seen)) if now.duration_since(*seen) < IDLE => state.clone(),
            _ => LiveSequence::default(),
        }
    }

    /// Keeps `state`, built from `seen` (what [`Sequences::current`] gave), if the state of `key`
    /// is still `seen`; else another request kept its own meanwhile and this one's is dropped
    /// (false). Kept unconditionally, a request on an older MPD that ends after one on a newer
    /// MPD (which added a Period) would drop that Period's base, and a later playlist would
    /// number it anew, sending the media sequence back.
    pub fn keep(&self, key: &str, seen: &LiveSequence, state: LiveSequence) -> bool {
        let now = Instant::now();
        let mut tracks = self.lock();
        let unchanged = match tracks.get(key) {
            Some((kept, at)) if now.duration_since(*at) < IDLE => kept == seen,
            _ => *seen == LiveSequence::default(),
        };
        if !unchanged {
            return false;
        }
        if tracks.len() >= MAX_TRACKS && !tracks.contains_key(key) {
            tracks.retain(|_, (_, seen)| now.duration_since(*seen) < IDLE);
            let oldest = tracks.iter().min_by_key(|(_, (_, seen))| *seen);
            if let Some(oldest) = oldest.map(|(k, _)| k.clone()) {
                if tracks.len() >= MAX_TRACKS {
                    tracks.remove(&oldest);
                }
            }
        }
        tracks.insert(key.to_owned(), (state, now));
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (LiveSequence, Instant)>> {
        self.tracks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The media sequence of segment `number` of Period `key` placed with `state` (a copy).
    fn placed(state: &LiveSequence, key: &str, number: u64) -> u64 {
        state.clone().place([(key, number)])[0].media_sequence
    }

    /// Request A builds from an older MPD (Period "a", 1..=10), request B from a newer one that
    /// added Period "b" (numbers restarting at 1, placed from 11); both began from the same
    /// state and B is kept first. A, ending last, is not kept over it: Period "b" keeps its
    /// base, so its segment 5 stays 15 once "a" has left the MPD.
    #[test]
    fn a_build_from_an_older_state_does_not_replace_a_newer_one() {
        let sequences = Sequences::default();
        let key = "dash https://origin.example/live.mpd 0_v_1";
        let older: Vec<_> = (1..=10).map(|n| ("a", n)).collect();
        let mut start = LiveSequence::default();
        start.place(older.iter().copied());
        assert!(sequences.keep(key, &LiveSequence::default(), start));

        let seen_by_a = sequences.current(key);
        let seen_by_b = sequences.current(key);
        let mut a = seen_by_a.clone();
        a.place(older.iter().copied());
        let mut b = seen_by_b.clone();
        let newer: Vec<_> = older
            .iter()
            .copied()
            .chain((1..=5).map(|n| ("b", n)))
            .collect();
        let numbers: Vec<u64> = b.place(newer).iter().map(|p| p.media_sequence).collect();
        assert_eq!(numbers, (1..=15).collect::<Vec<_>>());

        assert!(sequences.keep(key, &seen_by_b, b.clone()));
        assert!(!sequences.keep(key, &seen_by_a, a));
        assert_eq!(sequences.current(key), b);
        assert_eq!(placed(&sequences.current(key), "b", 5), 15);

        // What A's state alone would have said: "b" numbered anew, from 11.
        let mut lost = LiveSequence::default();
        lost.place(older.iter().copied());
        assert_eq!(placed(&lost, "b", 5), 11);
    }

    /// A state kept from what is still there is kept; an unknown track starts empty.
    #[test]
    fn a_build_from_the_current_state_is_kept() {
        let sequences = Sequences::default();
        assert_eq!(sequences.current("t"), LiveSequence::default());
        let mut one = LiveSequence::default();
        one.place([("a", 7)]);
        assert!(sequences.keep("t", &LiveSequence::default(), one.clone()));
        let mut two = sequences.current("t");
        assert_eq!(two, one);
        two.place([("a", 8)]);
        assert!(sequences.keep("t", &one, two.clone()));
        assert_eq!(sequences.current("t"), two);
        assert_eq!(placed(&two, "a", 9), 9);
    }
}
