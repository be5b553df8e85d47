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

    /// Keeps `state`, built from `seen` (what [`Sequences::current`] gave). If another request
    /// kept its own state meanwhile, the two are merged instead ([`LiveSequence::merge`]): kept
    /// unconditionally, a request on an older MPD that ends after one on a newer MPD (which added
    /// a Period) would drop that Period's base, and dropped, the newer request's base would be
    /// lost the other way round; either way a later playlist would number the Period anew,
    /// sending the media sequence back. True when `state` was kept as built.
    pub fn keep(&self, key: &str, seen: &LiveSequence, state: LiveSequence) -> bool {
        let now = Instant::now();
        let mut tracks = self.lock();
        if let Some((kept, at)) = tracks.get_mut(key) {
            if now.duration_since(*at) < IDLE && kept != seen {
                kept.merge(&state);
                *at = now;
                return false;
            }
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

    /// Two requests ending the other way round: A (an MPD that added segment 11 of "a") is kept
    /// first, B (a newer one that also added Period "b", placed from 12) ends after it and is
    /// merged in, not dropped, so "b" keeps the base B served it with once "a" has left the MPD.
    #[test]
    fn a_build_from_a_newer_mpd_ending_last_is_merged_in() {
        let sequences = Sequences::default();
        let key = "t";
        let older: Vec<_> = (1..=10).map(|n| ("a", n)).collect();
        let mut start = LiveSequence::default();
        start.place(older.iter().copied());
        assert!(sequences.keep(key, &LiveSequence::default(), start));

        let seen = sequences.current(key);
        let mut a = seen.clone();
        a.place(older.iter().copied().chain([("a", 11)]));
        let mut b = seen.clone();
        let newer = older
            .iter()
            .copied()
            .chain([("a", 11)])
            .chain((1..=5).map(|n| ("b", n)));
        let numbers: Vec<u64> = b.place(newer).iter().map(|p| p.media_sequence).collect();
        assert_eq!(numbers, (1..=16).collect::<Vec<_>>());

        assert!(sequences.keep(key, &seen, a));
        assert!(!sequences.keep(key, &seen, b));
        assert_eq!(placed(&sequences.current(key), "b", 5), 16);
        // Dropped, as before: "b" seen alone would be numbered from 12, back from 16 to 12.
        let mut lost = LiveSequence::default();
        lost.place(older.iter().copied().chain([("a", 11)]));
        assert_eq!(placed(&lost, "b", 5), 12);
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
