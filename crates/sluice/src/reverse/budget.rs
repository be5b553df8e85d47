//! The retry budget: retries may add at most a percentage of the recent request rate (plus a small
//! floor), so an outage cannot multiply the load on the servers that are left.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;

use crate::runtime::recent::{self, recent};

/// Requests and retries counted over the current and previous one-second windows.
#[derive(Debug)]
pub struct RetryBudget {
    epoch: Instant,
    percent: u64,
    floor: u64,
    /// The second the counters belong to.
    window: AtomicU64,
    requests: AtomicU64,
    retries: AtomicU64,
    /// Requests of the previous window, so a new window does not start empty.
    previous: AtomicU64,
}

impl RetryBudget {
    pub fn new(percent: u32, floor_per_sec: u32) -> Self {
        RetryBudget {
            epoch: recent(),
            percent: percent as u64,
            floor: floor_per_sec as u64,
            window: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            previous: AtomicU64::new(0),
        }
    }

    fn roll(&self) {
        let now = recent::since(self.epoch).as_secs();
        let window = self.window.load(Ordering::Relaxed);
        // Forward only: threads read the time at the start of their polls, so one may come late
        // with a second another has already left; moving back would empty the counts again.
        if now > window
            && self
                .window
                .compare_exchange(window, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let done = self.requests.swap(0, Ordering::Relaxed);
            self.previous
                .store(if now == window + 1 { done } else { 0 }, Ordering::Relaxed);
            self.retries.store(0, Ordering::Relaxed);
        }
    }

    /// Counts one request.
    pub fn record_request(&self) {
        self.roll();
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one retry from the budget; `false` when it is spent.
    pub fn try_retry(&self) -> bool {
        self.roll();
        let base = self
            .requests
            .load(Ordering::Relaxed)
            .max(self.previous.load(Ordering::Relaxed));
        let allowed = self.floor + base * self.percent / 100;
        let used = self.retries.fetch_add(1, Ordering::Relaxed);
        if used < allowed {
            true
        } else {
            self.retries.fetch_sub(1, Ordering::Relaxed);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_clock_does_not_move_the_window_back() {
        // Another thread has moved on to second 5; this one's poll began in second 0.
        let b = RetryBudget::new(10, 1);
        b.window.store(5, Ordering::Relaxed);
        b.requests.store(7, Ordering::Relaxed);
        b.record_request();
        assert_eq!(b.window.load(Ordering::Relaxed), 5);
        assert_eq!(b.requests.load(Ordering::Relaxed), 8, "the counts are kept");
    }

    #[test]
    fn floor_then_percentage() {
        let b = RetryBudget::new(10, 2);
        assert!(b.try_retry());
        assert!(b.try_retry());
        assert!(!b.try_retry());
        for _ in 0..100 {
            b.record_request();
        }
        // 2 + 10% of 100 = 12 in this window, 2 already used.
        let granted = (0..50).filter(|_| b.try_retry()).count();
        assert_eq!(granted, 10);
    }
}
