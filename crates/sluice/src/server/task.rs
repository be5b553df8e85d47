//! A client connection's task, written out by hand so an idle keep-alive connection on the
//! HTTP/1.1 fast path holds only its wait for the next request: the socket, a few instants and
//! its place on the runtime's clock. Everything else (a request being served, TLS, hyper's
//! connection) is one box, allocated while it works. A socket hyper upgraded to a tunnel keeps
//! its connection's task, and so its slot, until it closes ([`Held`]).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::listener::Slot;
use super::{Conn, Handler};

/// A boxed stretch of a connection's life.
type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// One accepted connection, spawned as its own task; its slot is let go when it ends.
pub(super) struct Connection<H> {
    #[cfg_attr(not(any(feature = "reverse", feature = "http2")), allow(dead_code))]
    conn: Arc<Conn<H>>,
    #[cfg_attr(not(any(feature = "reverse", feature = "http2")), allow(dead_code))]
    peer: Peer,
    state: State,
    _slot: Slot,
}

enum State {
    /// Waiting, idle, for the fast path's next request.
    #[cfg(feature = "reverse")]
    Idle(super::h1fast::Idle),
    /// Serving fast-path requests; the connection comes back once the socket has nothing more.
    #[cfg(feature = "reverse")]
    Busy(Boxed<(super::h1fast::Idle, super::h1fast::End)>),
    /// A plain connection's first bytes being read to tell h2c from HTTP/1.1 (`Conn::sniff`);
    /// its box is let go at the hand-off.
    #[cfg(feature = "http2")]
    Sniff(Boxed<Option<(super::activity::Watched<tokio::net::TcpStream>, Vec<u8>)>>),
    /// TLS, or hyper's connection: to the end.
    Other(Boxed<()>),
    Done,
}

/// The client's address in 16 bytes instead of `SocketAddr`'s 32 (an IPv6 one boxed): every
/// open connection's task holds it, and those 16 bytes decide whether an idle connection's task
/// fits tokio's 256-byte cell or takes a 384-byte one.
#[derive(Debug, Clone)]
enum Peer {
    V4(std::net::SocketAddrV4),
    V6(Box<std::net::SocketAddrV6>),
}

impl Peer {
    fn new(addr: SocketAddr) -> Peer {
        match addr {
            SocketAddr::V4(v4) => Peer::V4(v4),
            SocketAddr::V6(v6) => Peer::V6(Box::new(v6)),
        }
    }

    #[cfg_attr(not(feature = "reverse"), allow(dead_code))]
    fn get(&self) -> SocketAddr {
        match self {
            Peer::V4(v4) => SocketAddr::V4(*v4),
            Peer::V6(v6) => SocketAddr::V6(**v6),
        }
    }
}

impl<H: Handler> Connection<H> {
    /// A connection that goes its whole way in `work` (TLS, or hyper from the start).
    pub(super) fn other(conn: Arc<Conn<H>>, peer: SocketAddr, slot: Slot, work: Boxed<()>) -> Self {
        Connection {
            conn,
            peer: Peer::new(peer),
            state: State::Other(work),
            _slot: slot,
        }
    }

    /// A plain connection whose first bytes decide between sluice's HTTP/2 server and hyper.
    #[cfg(feature = "http2")]
    pub(super) fn sniffing(
        conn: Arc<Conn<H>>,
        stream: super::activity::Watched<tokio::net::TcpStream>,
        peer: SocketAddr,
        slot: Slot,
    ) -> Self {
        let sniff = Box::pin(conn.clone().sniff(stream));
        Connection {
            conn,
            peer: Peer::new(peer),
            state: State::Sniff(sniff),
            _slot: slot,
        }
    }

    /// A plain connection starting on the fast path, waiting for its first request.
    #[cfg(feature = "reverse")]
    pub(super) fn fast(
        conn: Arc<Conn<H>>,
        stream: super::activity::Watched<tokio::net::TcpStream>,
        peer: SocketAddr,
        slot: Slot,
    ) -> Self {
        let idle = super::h1fast::Idle::new(stream, conn.clock.clone());
        Connection {
            conn,
            peer: Peer::new(peer),
            state: State::Idle(idle),
            _slot: slot,
        }
    }
}

impl<H: Handler> Future for Connection<H> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // Every field is `Unpin` (the futures it drives are boxed).
        let this = self.get_mut();
        loop {
            match &mut this.state {
                #[cfg(feature = "reverse")]
                State::Idle(idle) => match idle.poll_wait(&this.conn, cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(false) => this.state = State::Done,
                    Poll::Ready(true) => {
                        let State::Idle(idle) = std::mem::replace(&mut this.state, State::Done)
                        else {
                            unreachable!()
                        };
                        // Built in its box, not copied there (it is large).
                        let (conn, peer) = (this.conn.clone(), this.peer.get());
                        let busy = super::boxed_in_place(|| conn.serve_busy(idle, peer));
                        this.state = State::Busy(busy);
                    }
                },
                #[cfg(feature = "reverse")]
                State::Busy(busy) => {
                    use super::h1fast::End;
                    let Poll::Ready((idle, end)) = busy.as_mut().poll(cx) else {
                        return Poll::Pending;
                    };
                    this.state = match end {
                        End::Idle => State::Idle(idle),
                        End::Closed => State::Done,
                        End::HandOff(bytes) => State::Other(this.conn.clone().hand_to_hyper(
                            idle.into_stream(),
                            this.peer.get(),
                            bytes,
                        )),
                    };
                }
                #[cfg(feature = "http2")]
                State::Sniff(sniff) => {
                    let Poll::Ready(sniffed) = sniff.as_mut().poll(cx) else {
                        return Poll::Pending;
                    };
                    this.state = match sniffed {
                        Some((stream, bytes)) => State::Other(this.conn.clone().hand_to_hyper(
                            stream,
                            this.peer.get(),
                            bytes,
                        )),
                        None => State::Done,
                    };
                }
                State::Other(work) => {
                    if work.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    this.state = State::Done;
                }
                State::Done => return Poll::Ready(()),
            }
        }
    }
}

/// Whether a connection's socket is open still; [`Held`] says when it closes.
#[derive(Default)]
struct Open {
    closed: std::sync::atomic::AtomicBool,
    waker: futures_util::task::AtomicWaker,
}

/// A connection's socket as hyper is given it. An HTTP/1.1 upgrade hands the socket over to the
/// tunnel's own task and hyper's connection ends; the connection's task then waits for
/// [`Closed`] before it ends, so its slot (`server.max_connections`, the client's place in
/// `max_connections_per_ip`) and its place in the drain's count are held for as long as the
/// tunnel keeps the socket open, not given back at the switch.
pub(super) struct Held<I> {
    io: I,
    open: Arc<Open>,
}

/// Resolves once the [`Held`] socket it came with is dropped.
pub(super) struct Closed(Arc<Open>);

impl<I> Held<I> {
    pub(super) fn new(io: I) -> (Held<I>, Closed) {
        let open = Arc::new(Open::default());
        (
            Held {
                io,
                open: open.clone(),
            },
            Closed(open),
        )
    }
}

impl<I> Drop for Held<I> {
    fn drop(&mut self) {
        self.open
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.open.waker.wake();
    }
}

impl Future for Closed {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        use std::sync::atomic::Ordering;
        if self.0.closed.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        self.0.waker.register(cx.waker());
        // Closed between the look and the registration: its wake may have found no waker.
        if self.0.closed.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Held<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Held<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
