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

    fn lock(&self) -> std::sync::MutexGuard<'_, Slab<Waker>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes every stream waiting now (each stays on the list until it is done).
    pub fn tick(&self) {
        for (_, waker) in self.lock().iter() {
            waker.wake_by_ref();
        }
    }

    /// The connection has nothing in flight: an empty list gives its room back, so an idle
    /// connection holds none after a burst of streams.
    pub fn settle(&self) {
        let mut waiting = self.lock();
        if waiting.is_empty() && waiting.capacity() > 0 {
            *waiting = Slab::new();
        }
    }

    /// How many streams are waiting, and the room the list holds.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let waiting = self.lock();
        (waiting.len(), waiting.capacity())
    }
}

pin_project_lite::pin_project! {
    /// `inner`, woken at each of the connection's ticks while it is pending (with `ticks`; as it
    /// is without).
    pub struct Ticked<F> {
        ticks: Option<Arc<Ticks>>,
        // Its place on the list, from its first pending poll until it is ready or dropped, and
        // the waker put there (`Waker::will_wake`'s two pointers, to see a new one without the
        // lock).
        key: Option<(usize, WakerId)>,
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

/// What `Waker::will_wake` compares: the data and vtable pointers (as addresses: compared,
/// never followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WakerId(usize, usize);

impl WakerId {
    fn of(waker: &Waker) -> WakerId {
        WakerId(
            waker.data() as usize,
            std::ptr::from_ref(waker.vtable()) as usize,
        )
    }
}

fn leave(ticks: Option<&Ticks>, key: &mut Option<(usize, WakerId)>) {
    if let (Some(ticks), Some((k, _))) = (ticks, key.take()) {
        ticks.lock().try_remove(k);
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
                let Some(ticks) = this.ticks.as_deref() else {
                    return Poll::Pending;
                };
                let id = WakerId::of(cx.waker());
                match *this.key {
                    // Registered with this waker (a task's stays the same): nothing to do.
                    Some((_, put)) if put == id => {}
                    // Polled with another waker: it replaces the one on the list.
                    Some((k, _)) => {
                        if let Some(w) = ticks.lock().get_mut(k) {
                            w.clone_from(cx.waker());
                        }
                        *this.key = Some((k, id));
                    }
                    None => *this.key = Some((ticks.lock().insert(cx.waker().clone()), id)),
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
        assert_eq!(ticks.held().0, 2);
        dropped.abort();
        let _ = dropped.await;
        assert_eq!(ticks.held().0, 1);
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            ticks.tick();
            tokio::task::yield_now().await;
        }
        stream.await.unwrap();
        // Polled first, then once a tick until the deadline had passed.
        assert_eq!(looks.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert_eq!(ticks.held().0, 0);
        // Idle, the list gives its room back.
        assert!(ticks.held().1 > 0);
        ticks.settle();
        assert_eq!(ticks.held(), (0, 0));
        // Without a list it is only the future it wraps.
        assert_eq!(Ticked::new(None, async { 7 }).await, 7);
    }

    /// Counts its wakes.
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Polled with another waker than the one registered, the list holds the new one: the
    /// tick reaches whoever polled last.
    #[test]
    fn a_new_waker_replaces_the_registered_one() {
        let ticks = Ticks::new();
        let mut waiting = std::pin::pin!(Ticked::new(
            Some(ticks.clone()),
            std::future::pending::<()>()
        ));
        let (first, second) = (
            Arc::new(Count(Default::default())),
            Arc::new(Count(Default::default())),
        );
        for count in [&first, &second, &second] {
            let waker = Waker::from(count.clone());
            assert!(waiting
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending());
        }
        assert_eq!(ticks.held().0, 1);
        ticks.tick();
        let woken = |c: &Arc<Count>| c.0.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!((woken(&first), woken(&second)), (0, 1));
    }
}
