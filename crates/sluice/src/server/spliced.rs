//! Response bodies that bypass user space: a handler hands the connection a [`Feed`] (an upstream
//! socket positioned at a body of known length) and answers with a [`SplicedBody`] of stand-in
//! chunks; when hyper writes those chunks, the connection's socket wrapper ([`Tapped`]) splices
//! the same number of bytes from the upstream instead. Plain HTTP/1.1 connections only.
//!
//! Why this seam: hyper owns the client socket and counts every body byte it writes against the
//! `Content-Length` it sent, so the head, keep-alive, limits and timeouts stay hyper's; only the
//! bytes themselves take the short way. The stand-in chunks point into one region that
//! nothing else uses, which is how the wrapper tells them from real bytes (hyper queues body
//! chunks as they are, without copying, on a socket that takes vectored writes).

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::activity::Watched;
use crate::body::BoxError;
use crate::net::splice::feed::{Feed, Waiting};

/// Largest stand-in chunk; also the size of the region every stand-in chunk points into.
const STAND_IN: usize = 1 << 20;
/// The stand-in region: allocated zeroed on the first spliced body, never read or written. A
/// zeroed heap block this size is fresh anonymous memory that stays unbacked until touched; a
/// `static` array would sit in `.rodata` and add a whole MiB to the binary file (the router
/// build's flash), every build paying for it whether it splices or not.
static STAND_IN_BYTES: std::sync::OnceLock<&'static [u8]> = std::sync::OnceLock::new();

fn stand_in_bytes() -> &'static [u8] {
    STAND_IN_BYTES.get_or_init(|| Vec::leak(vec![0; STAND_IN]))
}

/// Whether `buf` is (part of) a stand-in chunk.
fn is_stand_in(buf: &[u8]) -> bool {
    // No region yet: no stand-in chunk was ever made.
    let Some(region) = STAND_IN_BYTES.get() else {
        return false;
    };
    let start = region.as_ptr() as usize;
    let at = buf.as_ptr() as usize;
    !buf.is_empty() && at >= start && at < start + STAND_IN
}

/// The hand-over point between one connection's handlers and its socket wrapper. Feeds queue in
/// response order: hyper may answer a pipelined request while the last chunk of the previous
/// body still waits in its write buffer, and HTTP/1.1 writes bodies in request order.
#[derive(Debug, Default)]
pub struct Tap {
    feeds: Mutex<VecDeque<Feed>>,
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feed").finish_non_exhaustive()
    }
}

/// The request extension that offers a connection's tap to handlers (plain HTTP/1.1 requests
/// on connections where splicing is on).
#[derive(Debug, Clone)]
pub struct SpliceTap(pub Arc<Tap>);

impl Tap {
    /// Hands `feed` to the connection and returns the body to answer with: `head` (body bytes
    /// already read with the response head) as real bytes, then stand-ins for the feed's `len`.
    pub fn install(&self, feed: Feed, head: Bytes, len: u64) -> SplicedBody {
        self.feeds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(feed);
        SplicedBody {
            head: (!head.is_empty()).then_some(head),
            left: len,
        }
    }
}

/// A body hyper frames and counts like any other, whose bytes the socket wrapper splices.
#[derive(Debug)]
pub struct SplicedBody {
    head: Option<Bytes>,
    /// Stand-in bytes not yet yielded.
    left: u64,
}

impl http_body::Body for SplicedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(head) = self.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(STAND_IN as u64) as usize;
        self.left -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
            &stand_in_bytes()[..n],
        )))))
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none() && self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        let head = self.head.as_ref().map_or(0, |h| h.len() as u64);
        SizeHint::with_exact(head + self.left)
    }
}

/// The plain client socket under hyper: real bytes go to the socket as usual, stand-in chunks
/// become splices from the connection's current feed.
#[derive(Debug)]
pub struct Tapped {
    io: Watched<TcpStream>,
    tap: Option<Arc<Tap>>,
}

impl Tapped {
    /// `tap`: `None` where splicing is off (the wrapper then only passes bytes through).
    pub fn new(io: Watched<TcpStream>, tap: Option<Arc<Tap>>) -> Tapped {
        Tapped { io, tap }
    }

    fn poll_feed(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<io::Result<usize>> {
        let Some(tap) = &self.tap else {
            // Never write the stand-in's zeros as if they were the body.
            return Poll::Ready(Err(io::Error::other(
                "spliced body on an untapped connection",
            )));
        };
        let mut feeds = tap.feeds.lock().unwrap_or_else(|e| e.into_inner());
        let Some(feed) = feeds.front_mut() else {
            return Poll::Ready(Err(io::Error::other("spliced body without its upstream")));
        };
        match feed.poll_send(cx, self.io.get_ref(), max) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.io.activity().wrote();
                }
                if feed.is_done() {
                    // Pools the upstream socket and the (empty) pipe.
                    feeds.pop_front();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => {
                // The connection ends: no later body on it will be written.
                feeds.clear();
                tracing::debug!(error = %e, "spliced body cut");
                // hyper closes the connection on a write error: the client sees a short body.
                Poll::Ready(Err(io::Error::other(e)))
            }
            Poll::Pending => {
                if feed.waiting() == Waiting::Downstream {
                    self.io.activity().write_blocked();
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncRead for Tapped {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tapped {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if is_stand_in(buf) {
            return self.poll_feed(cx, buf.len());
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match bufs.iter().position(|b| is_stand_in(b)) {
            None => Pin::new(&mut self.io).poll_write_vectored(cx, bufs),
            // The real bytes before it (the response head) first.
            Some(i) if bufs[..i].iter().any(|b| !b.is_empty()) => {
                Pin::new(&mut self.io).poll_write_vectored(cx, &bufs[..i])
            }
            Some(i) => self.poll_feed(cx, bufs[i].len()),
        }
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
    use http_body::Body as _;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn body_yields_head_then_stand_ins_summing_to_the_length() {
        let tap = Tap::default();
        let (a, _b) = {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let (c, s) = tokio::join!(TcpStream::connect(addr), l.accept());
            (c.unwrap(), s.unwrap().0)
        };
        let feed = Feed::new(
            a,
            3 * STAND_IN as u64 + 5,
            std::time::Duration::from_secs(1),
            Box::new(|_| {}),
        );
        let mut body = tap.install(feed, Bytes::from_static(b"abc"), 3 * STAND_IN as u64 + 5);
        assert_eq!(body.size_hint().exact(), Some(3 * STAND_IN as u64 + 8));
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"abc");
        assert!(!is_stand_in(&first));
        let mut total = 0;
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            assert!(is_stand_in(&data));
            total += data.len();
        }
        assert_eq!(total, 3 * STAND_IN + 5);
        assert!(body.is_end_stream());
        assert!(!is_stand_in(&[]));
    }
}
