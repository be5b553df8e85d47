//! A response body's share of its connection's turn: after its first bytes (at most
//! `FIRST_BYTES`), after the first bytes that follow a wait on a fill, and after `TURN_BYTES` in
//! a row, the body yields until the runtime has run every other task that is ready, so many
//! clients woken by one fill all get their heads and first bytes out before any of them writes
//! bulk.
//!
//! Why a yield needs more than `wake_by_ref` + `Pending`: hyper's HTTP/1 dispatcher polls a
//! body again in the same turn once it has flushed (`poll_loop` loops up to 16 times while the
//! body can be written), so a body that yields for one poll only is polled again at once and the
//! yield is lost. Here the body stays `Pending` until a wake handed to the scheduler's deferred
//! list (`tokio::task::yield_now`, which tokio runs only once its run queue is empty and it has
//! polled the I/O driver) has fired, however often it is polled meanwhile.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};

/// At most this many bytes go with a body's first frame and with the first frame after a wait;
/// the rest follows after the yield. Without the cap, a client joining a fill whose slice already
/// holds 400 KiB got all of it in its first write, and 100 clients woken by one fill made the last
/// of them wait for 40 MB of copies before its head left (S4 (a)).
pub(crate) const FIRST_BYTES: usize = 16 * 1024;

/// Bytes a body hands its connection in a row before it yields. A yield costs one task switch,
/// so per 256 KiB it is noise.
pub(crate) const TURN_BYTES: u64 = 256 * 1024;

/// The state of one body's turns.
pub(crate) struct Turn {
    /// Bytes handed out since the last yield or wait.
    sent: u64,
    /// Yield before the next frame.
    due: bool,
    /// The next frame is the first after a wait (or the body's first): yield after it.
    after_first: bool,
    /// A yield in progress: `Pending` until its deferred wake fired.
    yielding: Option<Arc<Deferred>>,
}

impl Default for Turn {
    fn default() -> Self {
        Turn::new()
    }
}

impl Turn {
    pub fn new() -> Turn {
        Turn {
            sent: 0,
            due: false,
            after_first: true,
            yielding: None,
        }
    }

    /// Whether the body must return `Pending` now (its task will be woken).
    pub fn hold(&mut self, cx: &mut Context<'_>) -> bool {
        if let Some(d) = &self.yielding {
            if !d.fired.load(Ordering::Acquire) {
                // Wake whoever polled last (a future's contract), then look again: the
                // deferred wake may have fired while the waker was being swapped.
                let mut task = d.task.lock().unwrap_or_else(|e| e.into_inner());
                if !task.will_wake(cx.waker()) {
                    *task = cx.waker().clone();
                }
                drop(task);
                if !d.fired.load(Ordering::Acquire) {
                    return true;
                }
            }
            self.yielding = None;
            self.sent = 0;
        }
        if !self.due {
            return false;
        }
        self.due = false;
        let deferred = Arc::new(Deferred {
            fired: AtomicBool::new(false),
            task: Mutex::new(cx.waker().clone()),
        });
        let waker = Waker::from(deferred.clone());
        let mut yielding = std::pin::pin!(tokio::task::yield_now());
        // Its first poll hands `waker` to the scheduler (or, outside a runtime, wakes it at once).
        let _ = yielding.as_mut().poll(&mut Context::from_waker(&waker));
        self.yielding = Some(deferred);
        // Outside a runtime the wake has already fired: go on without a lost poll.
        self.hold(cx)
    }

    /// Whether the next frame is the first after a wait (or the body's first): the one cut at
    /// `FIRST_BYTES`.
    pub fn first(&self) -> bool {
        self.after_first
    }

    /// Counts a frame of `len` bytes the body hands out.
    pub fn sent(&mut self, len: usize) {
        self.sent += len as u64;
        if self.after_first || self.sent >= TURN_BYTES {
            self.after_first = false;
            self.due = true;
        }
    }

    /// The body is waiting for bytes (a fill's next chunk): the next bytes are the first after
    /// a wait.
    pub fn waiting(&mut self) {
        self.sent = 0;
        self.after_first = true;
    }
}

/// The wake a yield hands the scheduler: marks the yield over, then wakes the body's task.
struct Deferred {
    fired: AtomicBool,
    /// The task to wake: the one that polled the body last.
    task: Mutex<Waker>,
}

impl Wake for Deferred {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        self.task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .wake_by_ref();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Poll;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn outside_a_runtime_a_yield_costs_nothing() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut t = Turn::new();
        assert!(!t.hold(&mut cx));
        t.sent(10);
        // The deferred wake fires at once outside a runtime: no frame is held back.
        assert!(!t.hold(&mut cx));
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_yield_holds_through_repolls_until_every_ready_task_ran() {
        // Another task that is ready when the body yields: it must run before the body goes on.
        let other_ran = Arc::new(AtomicBool::new(false));
        let flag = other_ran.clone();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let counted = Waker::from(count.clone());
        let (mut t, ran_before_resume) = tokio::spawn(async move {
            let mut t = Turn::new();
            let mut frames = 0;
            // The body's first frame, then polls as hyper makes them within one turn.
            std::future::poll_fn(|cx| {
                if frames == 0 {
                    assert!(!t.hold(cx));
                    t.sent(8 * 1024);
                    frames = 1;
                    let flag = flag.clone();
                    tokio::spawn(async move { flag.store(true, Ordering::SeqCst) });
                }
                // Re-polled again and again in the same turn: held every time.
                for _ in 0..16 {
                    assert!(t.hold(cx));
                }
                Poll::Ready(())
            })
            .await;
            let mut resumed = false;
            std::future::poll_fn(|cx| {
                if t.hold(cx) {
                    return Poll::Pending;
                }
                resumed = true;
                Poll::Ready(())
            })
            .await;
            assert!(resumed);
            (t, other_ran.load(Ordering::SeqCst))
        })
        .await
        .unwrap();
        assert!(
            ran_before_resume,
            "the ready task ran before the body resumed"
        );
        // Under the budget, after the first frame, nothing is held back.
        let mut cx = Context::from_waker(&counted);
        t.sent(64 * 1024);
        assert!(!t.hold(&mut cx));
        // The budget spent: the next frame waits for a yield.
        t.sent(TURN_BYTES as usize);
        assert!(t.yielding.is_none());
        assert!(t.due);
        // After a wait, the first bytes again end the turn.
        t.due = false;
        t.waiting();
        t.sent(1);
        assert!(t.due);
    }
}
