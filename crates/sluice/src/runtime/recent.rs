//! The clock read once per poll of a connection's or stream's task ([`Fresh`]) instead of at
//! every place that asks for the time ([`recent`]): a keep-alive request asked it ~19 times
//! (idle and header deadlines, pool ages, the upstream timeout, latency, metering, the retry
//! budget), each a `clock_gettime` of ~25 ns.
//!
//! Outside a [`Fresh`] poll, [`recent`] reads the clock: a cached instant never outlives the
//! poll that read it, so no caller can see one older than the work it is doing. Only sluice's own
//! sites ask it; hyper's HTTP/2 pings keep the clock, because their round-trip time compares an
//! instant from one task with one from another, which poll-start instants could put in the wrong
//! order on a multi-threaded runtime.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::Instant;

thread_local! {
    static POLL_BEGAN: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// When the current [`Fresh`] poll on this thread began, or the clock outside one.
///
/// Good for deadlines, ages and latencies, all of which tolerate the few microseconds one poll
/// runs; not for timing work done inside that same poll (it reads zero). A request answered
/// within one poll (a memory-cache hit) so records no time, as nginx's `$request_time`, which
/// reads a clock cached once per turn of its event loop, records `0.000`.
#[inline]
pub fn recent() -> Instant {
    POLL_BEGAN.with(Cell::get).unwrap_or_else(Instant::now)
}

/// How long ago `then` was, by [`recent`].
#[inline]
pub fn since(then: Instant) -> std::time::Duration {
    recent().saturating_duration_since(then)
}

/// Runs `poll` with [`recent`] fixed at the clock as it starts; what was there before comes back
/// afterwards, even if `poll` panics.
#[inline]
pub fn within<R>(poll: impl FnOnce() -> R) -> R {
    struct Restore(Option<Instant>);
    impl Drop for Restore {
        fn drop(&mut self) {
            POLL_BEGAN.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(POLL_BEGAN.with(|c| c.replace(Some(Instant::now()))));
    poll()
}

/// A future whose every poll runs [`within`] one clock read. The future is dropped inside its
/// last poll too: a task's future is otherwise dropped by tokio after that poll, outside it, and
/// what its drop records (a request's metering, an upstream's latency) would read the clock.
#[derive(Debug)]
pub struct Fresh<F>(Option<F>);

impl<F> Fresh<F> {
    pub fn new(future: F) -> Fresh<F> {
        Fresh(Some(future))
    }
}

impl<F: Future> Future for Fresh<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: the inner future is never moved out of the pinned wrapper, only dropped in
        // place (`Pin::set`).
        let mut inner = unsafe { self.map_unchecked_mut(|f| &mut f.0) };
        within(|| {
            let Some(future) = inner.as_mut().as_pin_mut() else {
                panic!("`Fresh` polled after it completed");
            };
            let out = future.poll(cx);
            if out.is_ready() {
                inner.set(None);
            }
            out
        })
    }
}

/// hyper's executor for a connection's HTTP/2 streams: tokio's, each stream's task [`Fresh`].
#[cfg(feature = "http2")]
#[derive(Debug, Clone, Copy, Default)]
pub struct FreshExecutor;

#[cfg(feature = "http2")]
impl<F> hyper::rt::Executor<F> for FreshExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        tokio::spawn(Fresh::new(fut));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_poll_sees_one_instant_and_outside_it_the_clock() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let seen = Fresh::new(async {
                let a = recent();
                std::thread::sleep(Duration::from_millis(5));
                let b = recent();
                (a, b)
            })
            .await;
            assert_eq!(seen.0, seen.1, "one instant for the whole poll");
            // Outside, the clock itself: it has moved on past the sleep.
            let outside = recent();
            assert!(outside >= seen.0 + Duration::from_millis(5));
        });
    }

    #[test]
    fn each_poll_reads_the_clock_again() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let (a, b) = Fresh::new(async {
                let a = recent();
                tokio::time::sleep(Duration::from_millis(20)).await;
                (a, recent())
            })
            .await;
            assert!(b >= a + Duration::from_millis(20));
        });
    }

    #[test]
    fn the_future_is_dropped_inside_its_last_poll() {
        /// Notes, when dropped, whether a poll's instant was there to read.
        struct Notes(std::sync::Arc<std::sync::Mutex<Option<bool>>>);
        impl Drop for Notes {
            fn drop(&mut self) {
                *self.0.lock().unwrap() = Some(POLL_BEGAN.with(Cell::get).is_some());
            }
        }
        /// Ready at once, keeping what it holds until it is dropped.
        struct Holds(#[allow(dead_code)] Notes);
        impl Future for Holds {
            type Output = ();
            fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
                Poll::Ready(())
            }
        }
        let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
        let mut task = Box::pin(Fresh::new(Holds(Notes(seen.clone()))));
        let waker = std::task::Waker::noop();
        assert!(task
            .as_mut()
            .poll(&mut Context::from_waker(waker))
            .is_ready());
        assert_eq!(*seen.lock().unwrap(), Some(true), "dropped within the poll");
    }

    #[test]
    fn nested_polls_restore_the_outer_instant_even_after_a_panic() {
        within(|| {
            let outer = recent();
            std::thread::sleep(Duration::from_millis(2));
            let inner = within(recent);
            assert!(inner > outer);
            assert_eq!(recent(), outer);
            let caught = std::panic::catch_unwind(|| within::<()>(|| panic!("in a poll")));
            assert!(caught.is_err());
            assert_eq!(recent(), outer);
        });
        assert!(POLL_BEGAN.with(Cell::get).is_none());
    }
}
