//! Upgraded connections (WebSocket over HTTP/1.1 Upgrade or HTTP/2 extended CONNECT): bytes copied
//! both ways until either side closes or nothing moves for the idle timeout.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tokio_util::either::Either;

/// The client's end of a tunnel: a connection hyper upgraded (HTTP/1.1 Upgrade, or extended
/// CONNECT on hyper's HTTP/2 server), or an extended CONNECT stream of sluice's own HTTP/2 server.
pub enum Down {
    Hyper(OnUpgrade),
    Stream(crate::server::h2_tunnel::TunnelIo),
}

/// Waits for both upgrades, then copies until close or idle; `hold` (in-flight marks, metrics) is
/// released when the tunnel ends.
pub fn spawn<H: Send + 'static>(down: Down, up: OnUpgrade, idle: Duration, hold: H) {
    tokio::spawn(async move {
        let down = async move {
            match down {
                Down::Hyper(on) => on.await.map(|d| Either::Left(TokioIo::new(d))),
                Down::Stream(io) => Ok(Either::Right(io)),
            }
        };
        let (down, up) = match tokio::join!(down, up) {
            (Ok(d), Ok(u)) => (d, u),
            (d, u) => {
                tracing::debug!(down = ?d.err(), up = ?u.err(), "upgrade did not complete");
                return;
            }
        };
        let start = Instant::now();
        let last = Arc::new(AtomicU64::new(0));
        let mut down = Watched {
            io: down,
            last: last.clone(),
            start,
        };
        let mut up = Watched {
            io: TokioIo::new(up),
            last: last.clone(),
            start,
        };
        let copy = tokio::io::copy_bidirectional(&mut down, &mut up);
        tokio::pin!(copy);
        let mut tick = tokio::time::interval(idle.min(Duration::from_secs(1)));
        loop {
            tokio::select! {
                r = &mut copy => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "tunnel ended with an error");
                    }
                    break;
                }
                _ = tick.tick() => {
                    let quiet = start.elapsed().as_millis() as u64 - last.load(Ordering::Relaxed);
                    if quiet >= idle.as_millis() as u64 {
                        tracing::debug!("tunnel idle for {} s; closing", idle.as_secs());
                        break;
                    }
                }
            }
        }
        drop(hold);
    });
}

/// A stream that records when bytes last moved.
struct Watched<T> {
    io: T,
    last: Arc<AtomicU64>,
    start: Instant,
}

impl<T> Watched<T> {
    fn touch(&self) {
        self.last
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
