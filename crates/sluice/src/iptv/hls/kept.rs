//! What every channel's playlists share: the bound on what they keep ([`MAX_KEPT_TOTAL`],
//! playlists at most half of it), the places for large writes ([`BLOCKING_WRITES`]) and the
//! count of timeshift writes waiting for one.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Semaphore;

/// What all channels keep together (listings and playlists): 64 MiB, the last playlists of
/// eight full catch-up windows with long queries, or of thousands of live channels.
pub(super) const MAX_KEPT_TOTAL: u64 = 64 << 20;

/// Large playlists written at once, over all channels: a blocking thread cannot be stopped, so
/// the writes running are bounded here rather than by the requests in flight.
pub(super) const BLOCKING_WRITES: usize = 2;

/// What every channel's playlists share: the bound on what they keep, and the places for
/// large writes.
#[derive(Debug)]
pub(super) struct Shared {
    limit: u64,
    used: AtomicU64,
    /// Bytes of kept playlists (part of `used`): at most half of `limit`, so the listings,
    /// which spare each request a walk of its window under the window's lock, always fit.
    playlists: AtomicU64,
    /// The places for large writes ([`BLOCKING_WRITES`]).
    pub(super) blocking: Arc<Semaphore>,
    /// Timeshift playlist writes waiting for one of those places now (bounded by the writer).
    pub(super) timeshift_waiting: AtomicUsize,
    /// Large writes: running now, the most at once, and all so far.
    #[cfg(test)]
    pub(super) running: AtomicU64,
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

/// `bytes` more on `counter`, when the total stays within `limit`.
fn add_within(counter: &AtomicU64, bytes: u64, limit: u64) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            used.checked_add(bytes).filter(|total| *total <= limit)
        })
        .is_ok()
}

impl Shared {
    /// Channels keeping at most `limit` bytes together.
    pub(super) fn new(limit: u64) -> Self {
        Self {
            limit,
            used: AtomicU64::new(0),
            playlists: AtomicU64::new(0),
            blocking: Arc::new(Semaphore::new(BLOCKING_WRITES)),
            timeshift_waiting: AtomicUsize::new(0),
            #[cfg(test)]
            running: AtomicU64::new(0),
            #[cfg(test)]
            peak: AtomicU64::new(0),
            #[cfg(test)]
            blocking_writes: AtomicU64::new(0),
        }
    }

    /// `bytes` of the budget for a listing, when they fit in what is left.
    pub(super) fn reserve(self: &Arc<Self>, bytes: u64) -> Option<Held> {
        add_within(&self.used, bytes, self.limit).then(|| Held {
            shared: self.clone(),
            bytes,
            playlist: false,
        })
    }

    /// `bytes` of the budget for a playlist, when they fit in what is left and in the half
    /// of the budget playlists may take.
    pub(super) fn reserve_playlist(self: &Arc<Self>, bytes: u64) -> Option<Held> {
        if !add_within(&self.playlists, bytes, self.limit / 2) {
            return None;
        }
        if !add_within(&self.used, bytes, self.limit) {
            self.playlists.fetch_sub(bytes, Ordering::AcqRel);
            return None;
        }
        Some(Held {
            shared: self.clone(),
            bytes,
            playlist: true,
        })
    }

    /// A large write started on the blocking pool.
    #[cfg(test)]
    pub(super) fn started(&self) {
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

    /// The places for large writes (a test holds them to keep a write waiting).
    #[cfg(test)]
    pub(super) fn places(&self) -> Arc<Semaphore> {
        self.blocking.clone()
    }
}

/// Bytes of the budget, given back when what they count is dropped.
#[derive(Debug)]
pub(super) struct Held {
    shared: Arc<Shared>,
    bytes: u64,
    /// Counted against the playlists' half too.
    playlist: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.playlist {
            self.shared
                .playlists
                .fetch_sub(self.bytes, Ordering::AcqRel);
        }
        self.shared.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}
