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
    /// Runs `f` with the state of `key`, created empty if unknown or idle too long, and keeps
    /// what `f` leaves in it. The lock is not held while `f` runs (it writes a whole playlist);
    /// two requests for one track at once both start from the same state and place the same
    /// segments alike, so either one's result may be kept.
    pub fn with<T>(&self, key: &str, f: impl FnOnce(&mut LiveSequence) -> T) -> T {
        let now = Instant::now();
        let mut state = match self.lock().get(key) {
            Some((state, seen)) if now.duration_since(*seen) < IDLE => state.clone(),
            _ => LiveSequence::default(),
        };
        let out = f(&mut state);
        let mut tracks = self.lock();
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
        out
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (LiveSequence, Instant)>> {
        self.tracks.lock().unwrap_or_else(|e| e.into_inner())
    }
}
