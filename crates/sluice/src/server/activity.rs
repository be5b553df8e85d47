//! Per-connection activity: requests in flight and when the last one ended, for the idle timeout.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// Shared between a connection's watchdog and its requests.
#[derive(Debug)]
pub struct Activity {
    start: Instant,
    in_flight: AtomicUsize,
    last_ms: AtomicU64,
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Activity {
            start: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
        })
    }

    /// Marks a request started; the guard marks it finished when dropped (body done or abandoned).
    pub fn begin(self: &Arc<Self>) -> ActivityGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        ActivityGuard(self.clone())
    }

    /// How long the connection has had nothing in flight, or `None` while a request is active.
    pub fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        Some(self.start.elapsed().saturating_sub(last))
    }
}

/// Ends one in-flight request when dropped.
#[derive(Debug)]
pub struct ActivityGuard(Arc<Activity>);

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        let now = self.0.start.elapsed().as_millis() as u64;
        self.0.last_ms.store(now, Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
