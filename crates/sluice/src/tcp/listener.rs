//! One TCP listener's accept loop: a connection slot is taken before `accept`, so at
//! `max_connections` the loop stops accepting (the kernel backlog holds newcomers) instead of
//! accepting and closing; running out of file descriptors pauses the loop instead of spinning.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use super::{session, Settings, Shared};

/// Binds `addr` the way the HTTP listeners are bound (`server::listener::bind`): an inherited
/// socket for it (socket activation, binary upgrade) is taken over, and the socket is recorded
/// so the next upgrade hands it on.
pub(super) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    crate::server::listener::bind(addr)
}

/// Accepts until `stop` turns true; each connection runs as a task on `tracker`.
pub(super) async fn run(
    listener: TcpListener,
    mut settings: watch::Receiver<Arc<Settings>>,
    shared: Arc<Shared>,
    tracker: TaskTracker,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        // Settings (and with them the connection limit) may be swapped by a reload at any time.
        let current = settings.borrow_and_update().clone();
        let permit = tokio::select! {
            p = current.limit.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            r = settings.changed() => match r {
                Ok(()) => continue,
                Err(_) => return,
            },
            _ = stop.wait_for(|s| *s) => return,
        };
        let (stream, peer) = tokio::select! {
            r = accept(&listener) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        let current = settings.borrow().clone();
        let shared = Arc::clone(&shared);
        tracker.spawn(async move {
            session::serve(stream, peer, current, shared).await;
            drop(permit);
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
