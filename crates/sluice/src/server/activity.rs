//! Per-connection activity: requests in flight and when the last one ended (for the idle timeout),
//! and whether writes to the client are blocked and since when (for the send timeout).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::atomic::AtomicU64;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::runtime::recent::{self, recent};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Shared between a connection's watchdog, its socket wrapper and its requests. Every open
/// connection holds one: with its reference counts it takes 56 bytes, a 64-byte `malloc` chunk
/// (an 8-byte request counter would make it 80).
#[derive(Debug)]
pub struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    /// 0 while writes go through; otherwise 1 + milliseconds since `start` at which a write
    /// first found the client's window closed with no byte written since.
    blocked_ms: AtomicU64,
    /// Requests in flight (HTTP/2 streams are capped far below `u32::MAX`).
    in_flight: AtomicU32,
    /// A request has begun on this connection.
    began: AtomicBool,
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Activity {
            start: recent(),
            last_ms: AtomicU64::new(0),
            blocked_ms: AtomicU64::new(0),
            in_flight: AtomicU32::new(0),
            began: AtomicBool::new(false),
        })
    }

    /// Marks a request started; the guard marks it finished when dropped (body done or abandoned).
    pub fn begin(self: &Arc<Self>) -> ActivityGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.began.store(true, Ordering::Relaxed);
        ActivityGuard(self.clone())
    }

    /// Whether any request has begun on this connection.
    pub fn began(&self) -> bool {
        self.began.load(Ordering::Relaxed)
    }

    /// How long the connection has had nothing in flight, or `None` while a request is active.
    pub fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        Some(recent::since(self.start).saturating_sub(last))
    }

    /// How long writes to the client have been blocked without a byte going out, if they are.
    pub fn send_stalled_for(&self) -> Option<Duration> {
        let since = self.blocked_ms.load(Ordering::Relaxed).checked_sub(1)?;
        Some(recent::since(self.start).saturating_sub(Duration::from_millis(since)))
    }

    /// The client took bytes although no write went through: the kernel only wakes a blocked
    /// writer once a third of a (possibly multi-megabyte) send buffer has drained, so a slow
    /// reader can look blocked for seconds. Restarts the stall clock.
    pub fn drained(&self) {
        if self.blocked_ms.load(Ordering::Relaxed) != 0 {
            let now = recent::since(self.start).as_millis() as u64;
            self.blocked_ms.store(now + 1, Ordering::Relaxed);
        }
    }

    /// Bytes went out to the client.
    pub fn wrote(&self) {
        self.blocked_ms.store(0, Ordering::Relaxed);
    }

    /// A write found the client's window shut.
    pub fn write_blocked(&self) {
        if self.blocked_ms.load(Ordering::Relaxed) == 0 {
            let now = recent::since(self.start).as_millis() as u64;
            self.blocked_ms.store(now + 1, Ordering::Relaxed);
        }
    }
}

/// Bytes in a TCP socket's send queue that the peer has not acknowledged yet (`SIOCOUTQ`);
/// when it shrinks, the client is reading.
pub fn unacked_bytes(fd: std::os::fd::RawFd) -> Option<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one int; on a closed or foreign fd it fails with an error.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
    (rc == 0).then_some(n.max(0) as u64)
}

/// Ends one in-flight request when dropped.
#[derive(Debug)]
pub struct ActivityGuard(Arc<Activity>);

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        let now = recent::since(self.0.start).as_millis() as u64;
        self.0.last_ms.store(now, Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The client socket, reporting to [`Activity`] when a write is refused (the client's receive
/// window is shut) and when bytes go out again. It sits under TLS, so it sees real progress.
#[derive(Debug)]
pub struct Watched<I> {
    io: I,
    activity: Arc<Activity>,
}

impl<I> Watched<I> {
    pub fn new(io: I, activity: Arc<Activity>) -> Self {
        Self { io, activity }
    }

    /// The wrapped socket.
    pub fn get_ref(&self) -> &I {
        &self.io
    }

    /// The connection's activity record.
    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }

    fn note(&self, res: &Poll<io::Result<usize>>) {
        match res {
            Poll::Ready(Ok(n)) if *n > 0 => self.activity.wrote(),
            Poll::Pending => self.activity.write_blocked(),
            _ => {}
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.io).poll_write(cx, buf);
        self.note(&res);
        res
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.note(&res);
        res
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A writer whose window is shut until `open` is set.
    struct Gate {
        open: bool,
    }

    impl AsyncWrite for Gate {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.open {
                Poll::Ready(Ok(buf.len()))
            } else {
                Poll::Pending
            }
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn stall_clock_runs_while_blocked_and_resets_on_progress() {
        let activity = Activity::new();
        let mut io = Watched::new(Gate { open: false }, activity.clone());
        assert_eq!(activity.send_stalled_for(), None);
        let blocked = tokio::time::timeout(Duration::from_millis(10), io.write(b"x")).await;
        assert!(blocked.is_err());
        tokio::time::advance(Duration::from_secs(3)).await;
        let stalled = activity.send_stalled_for().unwrap();
        assert!(stalled >= Duration::from_secs(3), "{stalled:?}");
        // Acknowledged bytes without a write restart the clock but keep it running.
        activity.drained();
        assert!(activity.send_stalled_for().unwrap() < Duration::from_secs(1));
        io.io.open = true;
        assert_eq!(io.write(b"xy").await.unwrap(), 2);
        assert_eq!(activity.send_stalled_for(), None);
    }

    /// With `Arc`'s two counts (16 bytes) and glibc's 8-byte chunk header, 40 bytes or less
    /// takes a 64-byte chunk; 48 took an 80-byte one, per open connection.
    #[cfg(target_pointer_width = "64")]
    #[test]
    fn an_activity_record_stays_small() {
        assert!(std::mem::size_of::<Activity>() <= 40);
    }

    #[test]
    fn unacked_bytes_of_a_bad_descriptor_is_none() {
        assert!(unacked_bytes(-1).is_none());
    }
}
