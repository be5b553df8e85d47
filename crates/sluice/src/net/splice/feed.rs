//! One HTTP response body of known length moved from an upstream socket into the client's socket
//! with `splice(2)` through a pooled pipe: the kernel moves page references, user space never
//! sees the bytes. Driven from the client connection's write path (`server::spliced`), or, with
//! the upstream socket lent rather than owned, from the reverse proxy's fast path.

use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::{splice, Pipe, PipePool, SMALL_PIPE};

/// Why a feed stopped before its last byte.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error("upstream closed the connection {missing} bytes before the end of the body")]
    UpstreamClosed { missing: u64 },
    #[error("upstream sent no body bytes for {0:?}")]
    UpstreamIdle(Duration),
    #[error("reading the upstream: {0}")]
    Upstream(#[source] io::Error),
    #[error("writing to the client: {0}")]
    Downstream(#[source] io::Error),
    #[error("no pipe for the splice: {0}")]
    NoPipe(#[source] io::Error),
}

/// Which socket a pending feed waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// The upstream has sent nothing new (its idle clock runs).
    Upstream,
    /// The client's send queue is full (the connection's send watch applies).
    Downstream,
}

/// A body still to be moved: the upstream socket, positioned at the first body byte not yet
/// read, and how many bytes remain.
pub struct Feed {
    /// `None` only once handed back by `Drop`.
    src: Option<TcpStream>,
    body: BodySplice,
    /// Called with every chunk read from the upstream (metrics).
    on_read: Box<dyn Fn(usize) + Send + Sync>,
    /// Takes the upstream socket back once the body has been read to its end (keep-alive).
    on_done: Option<Box<dyn FnOnce(TcpStream) + Send + Sync>>,
}

impl Feed {
    /// A feed of the next `len` bytes of `src`; `idle` bounds the wait for each upstream chunk.
    pub fn new(
        src: TcpStream,
        len: u64,
        idle: Duration,
        on_read: Box<dyn Fn(usize) + Send + Sync>,
    ) -> Feed {
        Feed {
            src: Some(src),
            body: BodySplice::new(len, idle),
            on_read,
            on_done: None,
        }
    }

    /// Hands the upstream socket to `on_done` when the feed ends with every byte moved.
    pub fn on_done(mut self, on_done: impl FnOnce(TcpStream) + Send + Sync + 'static) -> Feed {
        self.on_done = Some(Box::new(on_done));
        self
    }

    /// Takes the pipe now rather than at the first send: a caller that has not answered yet can
    /// still send the body another way when none is to be had (descriptor limit), where a feed
    /// without a pipe can only cut its body short ([`FeedError::NoPipe`]).
    pub fn take_pipe(&mut self) -> io::Result<()> {
        self.body.take_pipe()
    }

    /// The upstream socket back, positioned where the feed found it if nothing was sent.
    pub fn into_socket(mut self) -> TcpStream {
        self.src.take().expect("held until drop")
    }

    /// Every byte has reached the client's socket.
    pub fn is_done(&self) -> bool {
        self.body.is_done()
    }

    /// Which socket the last `Pending` from [`Feed::poll_send`] waits for.
    pub fn waiting(&self) -> Waiting {
        self.body.waiting()
    }

    /// Moves up to `max` bytes into `dst`; `Ready(Ok(n))` with `n > 0` unless the feed is done.
    pub fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        dst: &TcpStream,
        max: usize,
    ) -> Poll<Result<usize, FeedError>> {
        let src = self.src.as_ref().expect("held until drop");
        self.body.poll_send(cx, src, dst, max, &*self.on_read)
    }
}

/// The state of one body of known length on its way from one socket to another through a pooled
/// pipe, the sockets borrowed at each call: [`Feed`] owns its upstream socket, the reverse
/// proxy's fast path keeps its upstream connection and lends it (`reverse::fast`).
pub struct BodySplice {
    pool: &'static PipePool,
    pipe: Option<Pipe>,
    /// Bytes in the pipe, read from the upstream, not yet written to the client.
    in_pipe: usize,
    /// Body bytes still in (or on their way to) the upstream socket.
    unread: u64,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
    waiting: Waiting,
}

impl BodySplice {
    /// The next `len` bytes of an upstream; `idle` bounds the wait for each upstream chunk.
    pub fn new(len: u64, idle: Duration) -> BodySplice {
        BodySplice {
            pool: super::shared_pool(),
            pipe: None,
            in_pipe: 0,
            unread: len,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
            waiting: Waiting::Upstream,
        }
    }

    /// Every byte has reached the client's socket.
    pub fn is_done(&self) -> bool {
        self.unread == 0 && self.in_pipe == 0
    }

    /// Takes the pipe (grown for a body longer than a default pipe) unless already held.
    pub fn take_pipe(&mut self) -> io::Result<()> {
        if self.pipe.is_none() {
            let mut pipe = self.pool.take()?;
            if self.unread > SMALL_PIPE as u64 {
                self.pool.grow(&mut pipe);
            }
            self.pipe = Some(pipe);
        }
        Ok(())
    }

    /// Which socket the last `Pending` from [`BodySplice::poll_send`] waits for.
    pub fn waiting(&self) -> Waiting {
        self.waiting
    }

    /// Moves up to `max` bytes from `src` into `dst`; `Ready(Ok(n))` with `n > 0` unless the body
    /// is done. `on_read` is called with every chunk read from `src`.
    pub fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        src: &TcpStream,
        dst: &TcpStream,
        max: usize,
        on_read: &dyn Fn(usize),
    ) -> Poll<Result<usize, FeedError>> {
        if max == 0 || self.is_done() {
            return Poll::Ready(Ok(0));
        }
        self.take_pipe().map_err(FeedError::NoPipe)?;
        let pipe = self.pipe.as_ref().expect("taken above");
        if self.in_pipe == 0 {
            // Fill: never more than the body, so bytes after it stay in the upstream socket.
            let want = (pipe.capacity as u64).min(self.unread) as usize;
            loop {
                if src.poll_read_ready(cx).is_pending() {
                    self.waiting = Waiting::Upstream;
                    if self.deadline.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Err(FeedError::UpstreamIdle(self.idle)));
                    }
                    return Poll::Pending;
                }
                match src.try_io(Interest::READABLE, || {
                    splice(src.as_raw_fd(), pipe.write.as_raw_fd(), want)
                }) {
                    Ok(0) => {
                        return Poll::Ready(Err(FeedError::UpstreamClosed {
                            missing: self.unread,
                        }))
                    }
                    Ok(n) => {
                        self.in_pipe = n;
                        self.unread -= n as u64;
                        on_read(n);
                        let next = Instant::now() + self.idle;
                        self.deadline.as_mut().reset(next);
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Poll::Ready(Err(FeedError::Upstream(e))),
                }
            }
        }
        // Drain: pipe → client, at most what the caller accounts for.
        let give = self.in_pipe.min(max);
        loop {
            if dst.poll_write_ready(cx).is_pending() {
                self.waiting = Waiting::Downstream;
                return Poll::Pending;
            }
            match dst.try_io(Interest::WRITABLE, || {
                splice(pipe.read.as_raw_fd(), dst.as_raw_fd(), give)
            }) {
                Ok(m) => {
                    self.in_pipe -= m;
                    return Poll::Ready(Ok(m));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(FeedError::Downstream(e))),
            }
        }
    }
}

impl Drop for BodySplice {
    fn drop(&mut self) {
        if let Some(pipe) = self.pipe.take() {
            if self.in_pipe == 0 {
                self.pool.give(pipe);
            } else {
                // Bytes still inside: the pipe cannot serve another body.
                self.pool.forget(pipe);
            }
        }
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        if self.is_done() {
            if let (Some(src), Some(on_done)) = (self.src.take(), self.on_done.take()) {
                on_done(src);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (outer, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (outer.unwrap(), accepted.unwrap().0)
    }

    async fn send_all(feed: &mut Feed, dst: &TcpStream) -> Result<u64, FeedError> {
        let mut sent = 0u64;
        while !feed.is_done() {
            sent += std::future::poll_fn(|cx| feed.poll_send(cx, dst, 300_000)).await? as u64;
        }
        Ok(sent)
    }

    #[tokio::test]
    async fn moves_exactly_the_body_and_leaves_what_follows() {
        let (mut origin, src) = pair().await;
        let (dst, mut client) = pair().await;
        let body: Vec<u8> = (0..3_000_001u32).map(|i| (i % 251) as u8).collect();
        let mut wire = body.clone();
        wire.extend_from_slice(b"NEXT");
        let writer = tokio::spawn(async move {
            origin.write_all(&wire).await.unwrap();
            origin
        });
        let counted = Arc::new(AtomicU64::new(0));
        let c = counted.clone();
        let on_read = Box::new(move |n: usize| {
            c.fetch_add(n as u64, Ordering::Relaxed);
        });
        let mut feed = Feed::new(src, body.len() as u64, Duration::from_secs(5), on_read);
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; 3_000_001];
            client.read_exact(&mut got).await.unwrap();
            got
        });
        assert_eq!(send_all(&mut feed, &dst).await.unwrap(), body.len() as u64);
        assert!(reader.await.unwrap() == body);
        assert_eq!(counted.load(Ordering::Relaxed), body.len() as u64);
        let _origin = writer.await.unwrap();
        let mut rest = [0u8; 4];
        feed.src
            .as_mut()
            .unwrap()
            .read_exact(&mut rest)
            .await
            .unwrap();
        assert_eq!(&rest, b"NEXT");
    }

    #[tokio::test]
    async fn an_early_close_is_an_error_naming_the_missing_bytes() {
        let (mut origin, src) = pair().await;
        let (dst, _client) = pair().await;
        origin.write_all(&[7u8; 1000]).await.unwrap();
        drop(origin);
        let mut feed = Feed::new(src, 5000, Duration::from_secs(5), Box::new(|_| {}));
        match send_all(&mut feed, &dst).await {
            Err(FeedError::UpstreamClosed { missing }) => assert_eq!(missing, 4000),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_upstream_hits_the_idle_clock() {
        let (_origin, src) = pair().await;
        let (dst, _client) = pair().await;
        let mut feed = Feed::new(src, 10, Duration::from_secs(3), Box::new(|_| {}));
        match send_all(&mut feed, &dst).await {
            Err(FeedError::UpstreamIdle(d)) => assert_eq!(d, Duration::from_secs(3)),
            other => panic!("{other:?}"),
        }
        assert_eq!(feed.waiting(), Waiting::Upstream);
    }
}
