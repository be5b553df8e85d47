//! One TCP listener's accept loop: a connection slot is taken before `accept`, so at
//! `max_connections` the loop stops accepting (the kernel backlog holds newcomers) instead of
//! accepting and closing; running out of file descriptors pauses the loop instead of spinning.
//! The limit lives as long as the listener, so a reload that lowers it counts the connections
//! already open.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_util::task::TaskTracker;

use super::{session, Settings, Shared};

/// Binds `addr` the way the HTTP listeners are bound (`server::listener::bind`): an inherited
/// socket for it (socket activation, binary upgrade) is taken over, and the socket is recorded
/// so the next upgrade hands it on.
pub(super) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    crate::server::listener::bind(addr)
}

/// One listener's `max_connections`: a slot per open connection. A reload changes it in place
/// ([`Limit::set`]) rather than starting a fresh count, which would let the connections already
/// open hold slots of the old count while new ones take every slot of the new.
pub(super) struct Limit {
    slots: Arc<Semaphore>,
    /// Locked while a slot is handed back, so a lowering never races a closing connection.
    state: Mutex<LimitState>,
}

struct LimitState {
    /// The limit the config asks for now; the next change is measured from it.
    max: usize,
    /// Slots to take back as connections close: a lowering with more connections open than the
    /// new limit. Until they are back, the listener stays full and accepts nothing.
    owed: usize,
}

impl Limit {
    pub(super) fn new(max: usize) -> Arc<Limit> {
        Arc::new(Limit {
            slots: Arc::new(Semaphore::new(max)),
            state: Mutex::new(LimitState { max, owed: 0 }),
        })
    }

    /// Makes `max` the limit: raising it adds slots (first cancelling any still owed); lowering
    /// it removes the free slots now and the rest as connections close.
    pub(super) fn set(&self, max: usize) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if max > state.max {
            let more = max - state.max;
            let cancelled = more.min(state.owed);
            state.owed -= cancelled;
            self.slots.add_permits(more - cancelled);
        } else {
            let fewer = state.max - max;
            let free = self.slots.forget_permits(fewer);
            state.owed += fewer - free;
        }
        state.max = max;
    }

    /// Waits for a free slot.
    async fn take(self: &Arc<Limit>) -> Slot {
        // The semaphore is never closed, so acquiring cannot fail.
        let permit = Arc::clone(&self.slots).acquire_owned().await.ok();
        Slot {
            permit,
            limit: Arc::clone(self),
        }
    }
}

/// A connection's slot; given back (or kept back, if a lowered limit is owed one) on drop.
struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    limit: Arc<Limit>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let mut state = self.limit.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.owed > 0 {
            state.owed -= 1;
            permit.forget();
        } else {
            drop(permit);
        }
    }
}

/// Accepts until `stop` turns true; each connection runs as a task on `tracker`, holding a slot
/// of `limit`.
pub(super) async fn run(
    listener: TcpListener,
    mut settings: watch::Receiver<Arc<Settings>>,
    limit: Arc<Limit>,
    shared: Arc<Shared>,
    tracker: TaskTracker,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        settings.borrow_and_update();
        let slot = tokio::select! {
            s = limit.take() => s,
            _ = stop.wait_for(|s| *s) => return,
        };
        let (stream, peer) = tokio::select! {
            r = accept(&listener) => r,
            // A reload may have lowered the limit below the connections open: the slot held for
            // the next connection goes back (and is kept back if owed) and is taken again.
            r = settings.changed() => match r {
                Ok(()) => continue,
                Err(_) => return,
            },
            _ = stop.wait_for(|s| *s) => return,
        };
        // Settings may be swapped by a reload at any time: a connection keeps the ones it met,
        // but picks its server from the groups current once its handshake is done.
        let current = settings.clone();
        let shared = Arc::clone(&shared);
        tracker.spawn(async move {
            session::serve(stream, peer, current, shared).await;
            drop(slot);
        });
    }
}

async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                return (stream, peer);
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                ) =>
            {
                tracing::warn!(error = %e, "tcp accept: out of resources, pausing 100 ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => tracing::debug!(error = %e, "tcp accept failed"),
        }
    }
}
