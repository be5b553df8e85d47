//! Listening sockets and the accept loop's back-off when the process runs out of file descriptors.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};

/// Binds `addr` with `SO_REUSEADDR` and a deep backlog.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    TcpListener::from_std(socket.into())
}

/// Accepts one connection. Errors that mean "out of resources" pause the loop instead of spinning;
/// per-connection errors (the client reset before accept) are skipped.
pub async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                return (stream, peer);
            }
            Err(e) if is_resource_exhaustion(&e) => {
                tracing::warn!(error = %e, "accept: out of resources, pausing 100 ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => tracing::debug!(error = %e, "accept failed"),
        }
    }
}

fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM)
    )
}
