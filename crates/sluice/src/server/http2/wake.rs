//! Which streams need the connection's attention: each stream's waker queues its slot and wakes
//! the connection's task, which then polls only the streams queued (as `FuturesUnordered` does
//! for its futures, but a stream stays queued-able for its whole life, not for one result).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};

use futures_util::task::AtomicWaker;

/// The queue the streams' wakers share with their connection.
#[derive(Default)]
pub(super) struct Ready {
    queue: Mutex<Vec<usize>>,
    conn: AtomicWaker,
}

impl Ready {
    /// The connection's task is woken from now on (call at each poll).
    pub fn register(&self, waker: &Waker) {
        self.conn.register(waker);
    }

    /// Moves every queued slot into `into` (its order: the order they were woken).
    pub fn take(&self, into: &mut Vec<usize>) {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if into.is_empty() {
            std::mem::swap(&mut *queue, into);
        } else {
            into.append(&mut queue);
        }
    }
}

/// One stream's waker: queues `slot` once until the connection polls it.
pub(super) struct StreamWake {
    slot: usize,
    queued: AtomicBool,
    ready: Arc<Ready>,
}

impl StreamWake {
    pub fn new(slot: usize, ready: Arc<Ready>) -> Arc<StreamWake> {
        Arc::new(StreamWake {
            slot,
            queued: AtomicBool::new(false),
            ready,
        })
    }

    /// The connection is about to poll this stream: a wake from now on queues it again.
    pub fn polling(&self) {
        self.queued.store(false, Ordering::Release);
    }

    /// The connection queues this stream itself (it needs no wake-up): true when it was not
    /// queued already, so the caller lists it once.
    pub fn mark_queued(&self) -> bool {
        !self.queued.swap(true, Ordering::AcqRel)
    }
}

impl Wake for StreamWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.ready
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(self.slot);
        }
        self.ready.conn.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_queued_once_until_polled() {
        let ready = Arc::new(Ready::default());
        let a = StreamWake::new(3, ready.clone());
        let b = StreamWake::new(7, ready.clone());
        let (wa, wb) = (Waker::from(a.clone()), Waker::from(b.clone()));
        wa.wake_by_ref();
        wb.wake_by_ref();
        wa.wake_by_ref();
        let mut got = Vec::new();
        ready.take(&mut got);
        assert_eq!(got, [3, 7]);
        // Not polled yet: still counted as queued.
        wa.wake_by_ref();
        got.clear();
        ready.take(&mut got);
        assert!(got.is_empty());
        a.polling();
        wa.wake_by_ref();
        ready.take(&mut got);
        assert_eq!(got, [3]);
    }
}
