//! Busy polling (`server.busy_poll_us`): after an HTTP request, or bytes moved by the TCP relay,
//! a current-thread runtime keeps looking for new events, without sleeping, for a short while
//! before it parks.
//!
//! Why: a thread that sleeps in `epoll_wait` is woken by the kernel when a packet arrives, and
//! waking a thread whose CPU is idle costs the *sender's* CPU an inter-processor interrupt; under a
//! hypervisor both sides pay a VM exit (the sender to raise the interrupt, the idle CPU to leave
//! `HLT`). A proxy between a client and a server on other CPUs is woken that way for nearly every
//! packet once it is fast enough to go idle between them. Polling instead of sleeping for a few
//! hundred microseconds after each request keeps the CPU awake while traffic is flowing, so the
//! kernel only marks the socket ready. It is HAProxy's `busy-polling`; it spends idle CPU time of
//! the proxy's own core, never more than the window after the last request.
//!
//! How: one task per runtime. While the last request is recent it yields in a loop; tokio's
//! current-thread scheduler then looks at the I/O driver without blocking (`epoll_wait` with a
//! zero timeout) before running it again, so events are picked up within a loop turn. Once the
//! window has passed it waits on a notification that the next request sends ([`stamp`]), so an
//! idle process does not wake at all.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// One runtime's polling state, shared by its poller task and the requests on its thread.
#[derive(Debug)]
struct Poller {
    base: Instant,
    /// Nanoseconds after `base` of the last request.
    last: AtomicU64,
    /// The poller waits for the next request.
    asleep: AtomicBool,
    wake: Notify,
    window: Duration,
}

thread_local! {
    static POLLER: RefCell<Option<Arc<Poller>>> = const { RefCell::new(None) };
}

/// Sets up busy polling for the calling thread's runtime (the thread that will `block_on` it, or
/// runs it) and returns the poller task to spawn on that runtime; `None` when `window` is zero.
pub fn install(window: Duration) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
    if window.is_zero() {
        return None;
    }
    let poller = Arc::new(Poller {
        base: Instant::now(),
        last: AtomicU64::new(0),
        asleep: AtomicBool::new(false),
        wake: Notify::new(),
        window,
    });
    POLLER.with(|p| *p.borrow_mut() = Some(poller.clone()));
    Some(run(poller))
}

/// Notes a request (or relayed bytes) on the calling thread: its runtime polls for the next
/// `window`.
pub fn stamp() {
    POLLER.with(|p| {
        if let Some(p) = p.borrow().as_ref() {
            p.last
                .store(p.base.elapsed().as_nanos() as u64, Ordering::Relaxed);
            if p.asleep.swap(false, Ordering::Relaxed) {
                p.wake.notify_one();
            }
        }
    });
}

async fn run(p: Arc<Poller>) {
    let window = p.window.as_nanos() as u64;
    loop {
        let since =
            (p.base.elapsed().as_nanos() as u64).saturating_sub(p.last.load(Ordering::Relaxed));
        if since < window {
            tokio::task::yield_now().await;
            continue;
        }
        p.asleep.store(true, Ordering::Relaxed);
        // A stamp between the check and here stored a permit: this returns at once.
        p.wake.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_turns_it_off() {
        assert!(install(Duration::ZERO).is_none());
    }

    /// The poller spins only inside the window after a stamp, then sleeps until the next one.
    #[test]
    fn polls_after_a_request_then_sleeps_until_the_next() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let window = Duration::from_millis(20);
        let task = install(window).unwrap();
        let p = POLLER.with(|p| p.borrow().clone()).unwrap();
        // Stamps, waits 5 ms and says whether the poller was awake then. A look that came after
        // the window had already passed (the thread was descheduled on a busy machine) proves
        // nothing, so it is taken again, a bounded number of times.
        let awake_inside_the_window = || async {
            for _ in 0..50 {
                let start = Instant::now();
                stamp();
                tokio::time::sleep(Duration::from_millis(5)).await;
                let awake = !p.asleep.load(Ordering::Relaxed);
                if start.elapsed() < window {
                    return awake;
                }
            }
            panic!("no look inside the window in 50 tries");
        };
        rt.block_on(async {
            tokio::spawn(task);
            // Within the window: the poller keeps yielding, never asleep.
            assert!(awake_inside_the_window().await);
            // Past it: asleep.
            tokio::time::sleep(Duration::from_millis(40)).await;
            assert!(p.asleep.load(Ordering::Relaxed));
            // A request wakes it.
            stamp();
            assert!(!p.asleep.load(Ordering::Relaxed));
            assert!(awake_inside_the_window().await);
        });
        POLLER.with(|p| *p.borrow_mut() = None);
    }
}
