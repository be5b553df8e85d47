//! An HTTP/3 request stream's receiving half as an `http_body::Body`, so the handler reads an
//! HTTP/3 request body as it reads hyper's.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use h3::server::RequestStream;
use http_body::{Body, Frame, SizeHint};

use crate::body::BoxError;

type Recv = RequestStream<h3_quinn::RecvStream, Bytes>;

/// The request body of one HTTP/3 request stream.
pub struct H3Body {
    recv: Recv,
    /// A chunk read while looking for the end of the body (see [`H3Body::new`]).
    first: Option<Bytes>,
    ended: bool,
    /// `Content-Length`, when the client gave one.
    length: Option<u64>,
}

impl H3Body {
    /// The body of a request whose head said `length`. A client that sends no body ends the
    /// stream with the head, so whatever already arrived is looked at once: a request whose
    /// stream has ended is known to be bodiless (as an HTTP/2 head with `END_STREAM`), and is
    /// forwarded without a body rather than with an empty chunked one.
    pub fn new(mut recv: Recv, length: Option<u64>) -> H3Body {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let (first, ended) = match recv.poll_recv_data(&mut cx) {
            Poll::Ready(Ok(Some(mut chunk))) => {
                (Some(chunk.copy_to_bytes(chunk.remaining())), false)
            }
            Poll::Ready(Ok(None)) => (None, true),
            // An error is reported on the first read; pending means more is coming.
            Poll::Ready(Err(_)) | Poll::Pending => (None, false),
        };
        H3Body {
            recv,
            first,
            ended,
            length,
        }
    }
}

impl Body for H3Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(first) = self.first.take() {
            self.length = self.length.map(|n| n.saturating_sub(first.len() as u64));
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        if self.ended {
            return Poll::Ready(None);
        }
        match self.recv.poll_recv_data(cx) {
            Poll::Ready(Ok(Some(mut chunk))) => {
                let bytes = chunk.copy_to_bytes(chunk.remaining());
                self.length = self.length.map(|n| n.saturating_sub(bytes.len() as u64));
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
            Poll::Ready(Ok(None)) => {
                self.ended = true;
                Poll::Ready(None)
            }
            Poll::Ready(Err(e)) => {
                self.ended = true;
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.first.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.is_end_stream() {
            return SizeHint::with_exact(0);
        }
        match self.length {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
