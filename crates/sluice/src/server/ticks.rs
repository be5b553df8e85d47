//! A connection's tick carried to its HTTP/2 streams. hyper runs each stream's service future in a
//! task of its own, which only its own wakers reach; a stream that waits here is also woken at
//! every tick of its connection (at most a second apart while a response is under way), so a
//! deadline inside it can be looked at when it is polled instead of keeping a timer of its own
//! (the fast path's upstream header timeout, `reverse::forward::HeadClock::Polled`).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use slab::Slab;

/// The wakers of one connection's streams that are waiting.
#[derive(Debug, Default)]
pub struct Ticks {
    waiting: Mutex<Slab<Waker>>,
}

impl Ticks {
    pub fn new() -> Arc<Ticks> {
        Arc::default()
    }

    /// Wakes every stream waiting now (each stays on the list until it is done).
    pub fn tick(&self) {
        let waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        for (_, waker) in waiting.iter() {
            waker.wake_by_ref();
        }
    }

    /// How many streams are waiting.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.waiting.lock().unwrap().len()
    }
}

pin_project_lite::pin_project! {
    /// `inner`, woken at each of the connection's ticks while it is pending (with `ticks`; as it
    /// is without).
    pub struct Ticked<F> {
        ticks: Option<Arc<Ticks>>,
        // Its place on the list, from its first pending poll until it is ready or dropped.
        key: Option<usize>,
        #[pin]
        inner: F,
    }

    impl<F> PinnedDrop for Ticked<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            leave(this.ticks.as_deref(), this.key);
        }
    }
}

impl<F> Ticked<F> {
    pub fn new(ticks: Option<Arc<Ticks>>, inner: F) -> Ticked<F> {
        Ticked {
            ticks,
            key: None,
            inner,
        }
    }
}

fn leave(ticks: Option<&Ticks>, key: &mut Option<usize>) {
    if let (Some(ticks), Some(k)) = (ticks, key.take()) {
        let mut waiting = ticks.waiting.lock().unwrap_or_else(|e| e.into_inner());
        waiting.try_remove(k);
    }
}

impl<F: Future> Future for Ticked<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        match this.inner.poll(cx) {
            Poll::Ready(out) => {
                leave(this.ticks.as_deref(), this.key);
                Poll::Ready(out)
            }
            Poll::Pending => {
                // A task's waker stays the same: registered once.
                if let (Some(ticks), None) = (this.ticks.as_deref(), *this.key) {
                    let mut waiting = ticks.waiting.lock().unwrap_or_else(|e| e.into_inner());
                    *this.key = Some(waiting.insert(cx.waker().clone()));
                }
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A stream future that waits for a deadline it only looks at when polled is woken by the
    /// tick and finishes; the list holds only the streams still waiting.
    #[tokio::test(start_paused = true)]
    async fn a_tick_wakes_a_waiting_stream_and_a_finished_one_leaves() {
        let ticks = Ticks::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        let looks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = looks.clone();
        let waits = std::future::poll_fn(move |_| {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if tokio::time::Instant::now() >= deadline {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        });
        let stream = tokio::spawn(Ticked::new(Some(ticks.clone()), waits));
        // Dropped while waiting: it leaves too.
        let dropped = tokio::spawn(Ticked::new(
            Some(ticks.clone()),
            std::future::pending::<()>(),
        ));
        tokio::task::yield_now().await;
        assert_eq!(ticks.len(), 2);
        dropped.abort();
        let _ = dropped.await;
        assert_eq!(ticks.len(), 1);
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            ticks.tick();
            tokio::task::yield_now().await;
        }
        stream.await.unwrap();
        // Polled first, then once a tick until the deadline had passed.
        assert_eq!(looks.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert_eq!(ticks.len(), 0);
        // Without a list it is only the future it wraps.
        assert_eq!(Ticked::new(None, async { 7 }).await, 7);
    }
}
