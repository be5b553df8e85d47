//! An extended CONNECT stream (RFC 8441, WebSocket over HTTP/2) as the byte stream a tunnel
//! copies: reads are the request's DATA, writes go out as the response's DATA through a small
//! pipe the response body drains.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use http_body::{Body as _, Frame};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::body::{BoxError, Incoming};

/// Bytes written into the tunnel and not yet taken by the connection: a writer waits past this.
const PIPE_BYTES: usize = 64 * 1024;

/// What the server puts in an extended CONNECT request's extensions: the handler that accepts
/// the tunnel takes both ends, answers with the [`TunnelBody`] and copies through the
/// [`TunnelIo`]. (Shared, because a request's extensions must be cloneable.)
#[derive(Clone)]
pub struct Tunnel(Arc<Mutex<Option<(TunnelIo, TunnelBody)>>>);

impl Tunnel {
    /// The tunnel over a request body (the client's bytes).
    pub fn new(incoming: Incoming) -> Tunnel {
        let pipe = Arc::new(Mutex::new(Pipe::default()));
        let io = TunnelIo {
            incoming,
            unread: Bytes::new(),
            pipe: pipe.clone(),
        };
        Tunnel(Arc::new(Mutex::new(Some((io, TunnelBody { pipe })))))
    }

    /// Both ends, once.
    pub fn take(&self) -> Option<(TunnelIo, TunnelBody)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tunnel")
    }
}

#[derive(Default)]
struct Pipe {
    chunks: VecDeque<Bytes>,
    bytes: usize,
    /// The writer shut down (or is gone): the body ends once drained.
    shut: bool,
    /// The body is gone (the stream closed): writes fail.
    gone: bool,
    writer: Option<Waker>,
    reader: Option<Waker>,
}

fn lock(pipe: &Mutex<Pipe>) -> std::sync::MutexGuard<'_, Pipe> {
    pipe.lock().unwrap_or_else(|p| p.into_inner())
}

/// The tunnel's end the copy reads and writes.
pub struct TunnelIo {
    incoming: Incoming,
    unread: Bytes,
    pipe: Arc<Mutex<Pipe>>,
}

impl AsyncRead for TunnelIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.unread.is_empty() {
            match Pin::new(&mut this.incoming).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                // The client ended its side: end of file.
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionReset, e)))
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        this.unread = data;
                    }
                }
            }
        }
        let n = this.unread.len().min(buf.remaining());
        buf.put_slice(&this.unread[..n]);
        this.unread.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TunnelIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        src: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut p = lock(&self.pipe);
        if p.gone || p.shut {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if p.bytes >= PIPE_BYTES {
            p.writer = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = src.len().min(PIPE_BYTES - p.bytes);
        p.chunks.push_back(Bytes::copy_from_slice(&src[..n]));
        p.bytes += n;
        if let Some(w) = p.reader.take() {
            w.wake();
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut p = lock(&self.pipe);
        p.shut = true;
        if let Some(w) = p.reader.take() {
            w.wake();
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for TunnelIo {
    fn drop(&mut self) {
        let mut p = lock(&self.pipe);
        p.shut = true;
        if let Some(w) = p.reader.take() {
            w.wake();
        }
    }
}

/// The response body of an accepted extended CONNECT: what the tunnel writes.
pub struct TunnelBody {
    pipe: Arc<Mutex<Pipe>>,
}

impl http_body::Body for TunnelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut p = lock(&self.pipe);
        if let Some(chunk) = p.chunks.pop_front() {
            p.bytes -= chunk.len();
            if let Some(w) = p.writer.take() {
                w.wake();
            }
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if p.shut {
            return Poll::Ready(None);
        }
        p.reader = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for TunnelBody {
    fn drop(&mut self) {
        let mut p = lock(&self.pipe);
        p.gone = true;
        p.chunks.clear();
        if let Some(w) = p.writer.take() {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_cross_both_ways_and_shutdown_ends_the_body() {
        let shared = super::super::recv::Shared::new(None, false);
        let incoming = Incoming::adapted(super::super::recv::RecvBody::new(
            shared.clone(),
            futures_util::task::noop_waker(),
        ));
        let (mut io, mut body) = Tunnel::new(incoming).take().unwrap();
        shared.push(Bytes::from_static(b"hello"));
        shared.end(None);
        let mut got = Vec::new();
        io.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hello");
        io.write_all(b"back").await.unwrap();
        io.shutdown().await.unwrap();
        let out = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&out[..], b"back");
        assert!(body.frame().await.is_none());
    }

    #[tokio::test]
    async fn a_full_pipe_holds_the_writer_and_a_gone_body_fails_it() {
        let incoming = Incoming::adapted(super::super::recv::NoBody);
        let (mut io, body) = Tunnel::new(incoming).take().unwrap();
        let big = vec![7u8; PIPE_BYTES];
        io.write_all(&big).await.unwrap();
        let more = tokio::time::timeout(std::time::Duration::from_millis(50), io.write(b"x")).await;
        assert!(more.is_err(), "a full pipe takes no more");
        drop(body);
        assert!(io.write(b"x").await.is_err());
    }
}
