//! Opening a TCP connection to an upstream server: a non-blocking `connect()` that returns at once
//! when the handshake is already done, and a stream that writes before the runtime has seen it
//! become writable (see `docs/cache.md`, "S4 (a) and (b) traced again").
//!
//! Why not `tokio::net::TcpStream::connect`: it waits for the socket's first readiness event, and
//! the runtime delivers that event only when it next polls its I/O driver, which under a burst of
//! client requests is after dozens of queued tasks. On loopback the handshake has finished by the
//! time `connect()` returns, so the request could go out in the same poll.

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::client::ConnectFailure;
use crate::upstream::happy;

/// Each address's own connect deadline: the caller's deadline (the route's
/// `connect_timeout_secs`) bounds the whole dial, and the next address starts after
/// [`happy::STAGGER`] whatever this is, so it only has to outlast any deadline a caller sets.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(120);

/// Connects to an `ip:port` at once; resolves a `host:port` through the shared resolver (cached,
/// `localhost` answered locally, C library lookups bounded) and connects to the first address that answers, racing them as
/// Happy Eyeballs does: a silent first address costs [`happy::STAGGER`], not the whole deadline.
pub(super) async fn dial(addr: &str) -> Result<Connected, ConnectFailure> {
    // An address (the common upstream): one connect, no resolver and no race to set up.
    if let Ok(sa) = addr.parse::<SocketAddr>() {
        return connect(sa).await.map_err(|source| ConnectFailure::Refused {
            addr: addr.to_string(),
            source,
        });
    }
    let resolve = |source| ConnectFailure::Resolve {
        addr: addr.to_string(),
        source,
    };
    let (host, port) = happy::split_host_port(addr).map_err(resolve)?;
    let addrs = happy::resolver()
        .lookup(host, port)
        .await
        .map_err(resolve)?;
    connect_any(&addrs)
        .await
        .map_err(|source| ConnectFailure::Refused {
            addr: addr.to_string(),
            source,
        })
}

/// Connects to the first of `addrs` that answers (Happy Eyeballs).
async fn connect_any(addrs: &[SocketAddr]) -> io::Result<Connected> {
    happy::connect_with(addrs, happy::STAGGER, ATTEMPT_TIMEOUT, connect).await
}

/// A connected stream, and whether the handshake had finished when `connect()` returned (then
/// the runtime has not yet reported the socket writable: [`EagerStream`] writes anyway).
pub(super) struct Connected {
    pub tcp: TcpStream,
    pub early: bool,
}

async fn connect(addr: SocketAddr) -> io::Result<Connected> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_nonblocking(true)?;
    let _ = socket.set_nodelay(true);
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let tcp = TcpStream::from_std(std::net::TcpStream::from(socket))?;
    // A socket still in SYN-SENT has no peer yet (ENOTCONN); one with a peer is established.
    if tcp.peer_addr().is_ok() {
        return Ok(Connected { tcp, early: true });
    }
    tcp.writable().await?;
    if let Some(e) = tcp.take_error()? {
        return Err(e);
    }
    // Writable without an error but no peer: the connection was reset meanwhile.
    tcp.peer_addr()?;
    Ok(Connected { tcp, early: false })
}

/// A TCP stream whose writes go straight to the socket until one would block, instead of first
/// waiting for a readiness event the runtime has not delivered yet. After the first `EAGAIN` it is
/// the plain tokio stream (whose readiness then comes from the event the registration produced).
/// Reads go through tokio, except the one read after a cache fill's writer was nudged.
pub(super) struct EagerStream {
    tcp: TcpStream,
    eager: bool,
}

impl EagerStream {
    pub fn new(c: Connected) -> EagerStream {
        EagerStream {
            tcp: c.tcp,
            eager: c.early,
        }
    }

    /// The socket, for calls that bypass the stream (splicing a body out of it).
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// One direct write; `None` when it would block (fall back to the runtime's readiness).
    fn direct(
        &mut self,
        write: impl FnOnce(SockRef<'_>) -> io::Result<usize>,
    ) -> Option<io::Result<usize>> {
        match write(SockRef::from(&self.tcp)) {
            Ok(n) => Some(Ok(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.eager = false;
                None
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => None,
            Err(e) => Some(Err(e)),
        }
    }
}

impl AsyncRead for EagerStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // A cache fill's writer that a joining request nudged reads the socket itself: the
        // origin's answer may be there before the runtime has polled for it (`cache::nudge`).
        if buf.remaining() > 0 && crate::cache::nudge::take() {
            // SAFETY: `recv` only writes initialised bytes into the unfilled part, and exactly
            // the `n` it returns are marked filled.
            let unfilled = unsafe { buf.unfilled_mut() };
            match SockRef::from(&self.tcp).recv(unfilled) {
                Ok(n) => {
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for EagerStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.eager {
            if let Some(r) = self.direct(|s| s.send(buf)) {
                return Poll::Ready(r);
            }
        }
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.eager {
            if let Some(r) = self.direct(|s| s.send_vectored(bufs)) {
                return Poll::Ready(r);
            }
        }
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn a_loopback_connect_is_established_and_writes_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let c = dial(&addr).await.unwrap();
        assert!(c.early, "loopback handshakes finish inside connect()");
        assert!(c.tcp.nodelay().unwrap());
        let mut s = EagerStream::new(c);
        // The write completes in its first poll, before the runtime ever polled its driver for
        // this socket.
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let polled = Pin::new(&mut s).poll_write(&mut cx, b"GET / HTTP/1.1\r\n\r\n");
        assert!(matches!(polled, Poll::Ready(Ok(18))), "{polled:?}");
        let (mut peer, _) = listener.accept().await.unwrap();
        let mut got = [0u8; 18];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"GET / HTTP/1.1\r\n\r\n");
        peer.write_all(b"pong").await.unwrap();
        let mut back = [0u8; 4];
        s.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"pong");
    }

    #[tokio::test]
    async fn a_full_socket_falls_back_to_readiness_and_loses_no_byte() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let mut s = EagerStream::new(dial(&addr).await.unwrap());
        let (mut peer, _) = listener.accept().await.unwrap();
        // Far more than the socket buffers hold: the direct writes hit EAGAIN, the rest waits
        // for readiness while the peer reads.
        let data: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8).collect();
        let expect = data.clone();
        let writer = tokio::spawn(async move {
            s.write_all(&data).await.unwrap();
            s.shutdown().await.unwrap();
            s.eager
        });
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.unwrap();
        assert!(!writer.await.unwrap(), "the socket filled up at least once");
        assert_eq!(got.len(), expect.len());
        assert!(got == expect);
    }

    /// A listener whose accept queue is full drops further SYNs: a black hole on loopback.
    fn black_hole() -> (Socket, Vec<std::net::TcpStream>, SocketAddr) {
        let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        sock.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        sock.listen(0).unwrap();
        let addr = sock.local_addr().unwrap().as_socket().unwrap();
        let mut fillers = Vec::new();
        for _ in 0..4 {
            let d = std::time::Duration::from_millis(200);
            if let Ok(s) = std::net::TcpStream::connect_timeout(&addr, d) {
                fillers.push(s);
            }
        }
        (sock, fillers, addr)
    }

    /// Finding: the addresses of a server's name were tried one after the other, each connect
    /// waiting as long as it took, so a first address that drops SYNs held the dial until the
    /// route's deadline and the next address was never tried. They are raced: the second
    /// answers. (The guard below only bounds a hang: the black hole never answers.)
    #[tokio::test]
    async fn a_silent_first_address_does_not_keep_the_next_from_being_tried() {
        let (_hole, _fill, dead) = black_hole();
        let good = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let good_addr = good.local_addr().unwrap();
        let c = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            connect_any(&[dead, good_addr]),
        )
        .await
        .expect("the second address was never tried")
        .unwrap();
        assert_eq!(c.tcp.peer_addr().unwrap(), good_addr);
    }

    /// Finding: a server's name was looked up with `getaddrinfo` on each new connection, outside
    /// the resolver (no cache, no bound on blocking lookups, `localhost` as the C library
    /// answers). It goes through the shared resolver: `localhost` is `::1` and `127.0.0.1`
    /// (RFC 6761), so a server listening on `::1` alone is reached by name.
    #[tokio::test]
    async fn a_name_is_resolved_by_the_shared_resolver() {
        let Ok(v6) = TcpListener::bind("[::1]:0").await else {
            eprintln!("no IPv6 loopback here; skipped");
            return;
        };
        let port = v6.local_addr().unwrap().port();
        let c = dial(&format!("localhost:{port}")).await.unwrap();
        assert_eq!(c.tcp.peer_addr().unwrap(), v6.local_addr().unwrap());
        let err = dial("no-port").await.err().unwrap();
        assert!(matches!(err, ConnectFailure::Resolve { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_refused_connect_is_an_error_of_the_dial() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let err = dial(&addr).await.err().unwrap();
        assert!(matches!(err, ConnectFailure::Refused { .. }), "{err}");
    }
}
