//! A nudge for a fill's writer: a request that joins a fill still waiting for the origin's head
//! asks the writer to read its origin socket now, instead of when the runtime next polls its I/O
//! driver (`docs/cache.md`, "S4 (a): joiners nudge the writer").
//!
//! tokio answers a socket read from readiness that only a driver poll sets, and a busy runtime
//! polls its driver only between runs of queued tasks (a multi-threaded worker once per 1,024,
//! `runtime.rs`): under a burst of client requests the origin's answer sat in the socket until
//! the whole burst was read. A nudge makes the writer's
//! next read one direct `recv` (`reverse/dial.rs`, `EagerStream`); a nudge that finds nothing costs
//! that one `recv` returning `EAGAIN`, and only requests that join a fill before its head nudge.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

tokio::task_local! {
    /// The nudge of the fill whose writer this task runs.
    static WRITER: Arc<Nudge>;
}

/// One fill's nudge: whether a joiner asked, and the writer's task to wake.
#[derive(Default)]
pub struct Nudge {
    asked: AtomicBool,
    writer: Mutex<Option<Waker>>,
}

impl Nudge {
    pub fn new() -> Arc<Nudge> {
        Arc::new(Nudge::default())
    }

    /// Runs a writer under this nudge: reads of its upstream connection can see a nudge, and
    /// each poll leaves the task's waker for the joiners.
    pub async fn drive<F: Future>(self: Arc<Self>, writer: F) -> F::Output {
        let recorded = Recorded {
            nudge: self.clone(),
            writer,
        };
        WRITER.scope(self, recorded).await
    }

    /// Asks the writer to try its socket at once: sets the ask and wakes the writer's task. A
    /// multi-threaded worker runs it next (its slot for the task woken last); a current-thread
    /// runtime (one thread) runs it after the tasks already queued (`docs/cache.md`).
    pub fn nudge(&self) {
        self.asked.store(true, Ordering::Release);
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = writer.as_ref() {
            w.wake_by_ref();
        }
    }
}

/// Whether the calling task is a fill's writer that a joiner nudged since the last call; a `true`
/// is taken (the next call says `false` until the next nudge).
pub fn take() -> bool {
    WRITER
        .try_with(|n| n.asked.swap(false, Ordering::AcqRel))
        .unwrap_or(false)
}

pin_project_lite::pin_project! {
    /// The writer's future, leaving its task's waker in the nudge at every poll.
    struct Recorded<F> {
        nudge: Arc<Nudge>,
        #[pin]
        writer: F,
    }
}

impl<F: Future> Future for Recorded<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        {
            let mut w = this.nudge.writer.lock().unwrap_or_else(|e| e.into_inner());
            match w.as_ref() {
                Some(old) if old.will_wake(cx.waker()) => {}
                _ => *w = Some(cx.waker().clone()),
            }
        }
        let out = this.writer.poll(cx);
        if out.is_ready() {
            // A finished writer keeps no task alive through its waker.
            *this.nudge.writer.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_nudge_is_seen_once_by_its_writer_only() {
        let nudge = Nudge::new();
        assert!(!take(), "outside a writer there is no nudge");
        let (started_tx, started) = tokio::sync::oneshot::channel::<bool>();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let seen = tokio::spawn(nudge.clone().drive(async move {
            started_tx.send(take()).unwrap();
            rx.await.unwrap();
            (take(), take())
        }));
        let before = started.await.unwrap();
        nudge.nudge();
        tx.send(()).unwrap();
        let (first, second) = seen.await.unwrap();
        assert!(!before);
        assert!(first, "the writer sees the nudge");
        assert!(!second, "and takes it");
        assert!(nudge.writer.lock().unwrap().is_none());
    }

    #[tokio::test]
    async fn a_nudge_wakes_a_waiting_writer() {
        let nudge = Nudge::new();
        let writer = tokio::spawn(nudge.clone().drive(std::future::poll_fn(|_| {
            if take() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })));
        tokio::task::yield_now().await;
        assert!(!writer.is_finished());
        nudge.nudge();
        tokio::time::timeout(std::time::Duration::from_secs(5), writer)
            .await
            .expect("the nudge woke the writer")
            .unwrap();
    }
}
