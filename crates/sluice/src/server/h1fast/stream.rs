//! The client connections the HTTP/1.1 fast path serves: a plain TCP socket, or (with `tls`) a
//! TLS stream over one once its handshake is done. Both read without waiting and wait on the TCP
//! socket's readiness, so the loop in `h1fast` is the same for either.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;

use crate::server::activity::{Activity, Watched};
use crate::server::handler::FastClient;

/// A client connection the fast path reads request heads from and writes answers to.
pub(in crate::server) trait FastStream:
    FastClient + Send + Sync + 'static
{
    /// The client spoke TLS: requests are `https` (`X-Forwarded-Proto`, `Forwarded`) and
    /// responses may carry the listener's `Alt-Svc`.
    const SECURE: bool;

    /// The watched TCP socket underneath: its readiness, send queue and activity.
    fn tcp(&self) -> &Watched<TcpStream>;

    /// Appends what can be read now to `buf`; `WouldBlock` when nothing can be without waiting
    /// for the socket (then waiting for its readiness is right: nothing is held above it).
    /// `cx` is the reading task's: a read may register it for the socket's next readiness.
    fn read_now(&mut self, cx: &mut Context<'_>, buf: &mut Vec<u8>) -> io::Result<usize>;

    /// The connection's activity record (requests in flight, send stalls).
    fn activity(&self) -> &Arc<Activity> {
        self.tcp().activity()
    }
}

/// A body the fast path splices goes straight into the client's socket; the connection's activity
/// still hears of it, so the send timeout sees a client that stopped reading.
impl FastClient for Watched<TcpStream> {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self.get_ref())
    }

    fn wrote(&self) {
        self.activity().wrote();
    }

    fn write_blocked(&self) {
        self.activity().write_blocked();
    }
}

impl FastStream for Watched<TcpStream> {
    const SECURE: bool = false;

    fn tcp(&self) -> &Watched<TcpStream> {
        self
    }

    /// Through tokio's own read: a socket last seen drained (a read shorter than the room
    /// given, or `WouldBlock`) is not read again until the poller reports new bytes, so the
    /// read after a response that would find nothing is not made.
    fn read_now(&mut self, cx: &mut Context<'_>, buf: &mut Vec<u8>) -> io::Result<usize> {
        read_into_spare(self, cx, buf)
    }
}

/// A TLS client: every byte goes through the record layer (no splice, no `sendfile`), so a body
/// is copied as on any other socket the fast path cannot splice into.
#[cfg(feature = "tls")]
pub(in crate::server) type TlsClient = crate::server::tls::ServerTls<Watched<TcpStream>>;

#[cfg(feature = "tls")]
impl FastClient for TlsClient {
    fn socket(&self) -> Option<&TcpStream> {
        None
    }

    // Never called without a socket: the TLS writer's own writes reach `Watched` underneath.
    fn wrote(&self) {}

    fn write_blocked(&self) {}
}

#[cfg(feature = "tls")]
impl FastStream for TlsClient {
    const SECURE: bool = true;

    fn tcp(&self) -> &Watched<TcpStream> {
        self.get_ref()
    }

    /// The record layer (sluice's own for TLS 1.3, rustls's otherwise: `tls::stream`) opens
    /// what the socket holds; `Pending` means it holds no plaintext and the socket would block
    /// (it reads until then), so the caller waits on the socket. Polled with a waker that does
    /// nothing: the caller registers its own through the socket's readiness.
    fn read_now(&mut self, _: &mut Context<'_>, buf: &mut Vec<u8>) -> io::Result<usize> {
        read_into_spare(
            self,
            &mut Context::from_waker(std::task::Waker::noop()),
            buf,
        )
    }
}

/// One `poll_read` into `buf`'s spare capacity, the bytes read appended: `WouldBlock` for
/// `Pending`.
fn read_into_spare<R: AsyncRead + Unpin>(
    reader: &mut R,
    cx: &mut Context<'_>,
    buf: &mut Vec<u8>,
) -> io::Result<usize> {
    let len = buf.len();
    let mut spare = ReadBuf::uninit(buf.spare_capacity_mut());
    match Pin::new(reader).poll_read(cx, &mut spare) {
        Poll::Ready(Ok(())) => {
            let n = spare.filled().len();
            // SAFETY: `poll_read` initialised the first `n` bytes of the spare capacity.
            unsafe { buf.set_len(len + n) };
            Ok(n)
        }
        Poll::Ready(Err(e)) => Err(e),
        Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
    }
}
