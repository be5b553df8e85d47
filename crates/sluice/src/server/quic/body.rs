//! An HTTP/3 request stream's receiving half as an `http_body::Body`, so the handler reads an
//! HTTP/3 request body as it reads hyper's, trailers included. A body longer or shorter than its
//! `Content-Length`, or a frame after the trailers, is malformed (RFC 9114 §4.1, §4.1.2): the
//! body ends in an error, never passed on cut to the declared length.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use h3::server::RequestStream;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;

use crate::body::BoxError;

type Recv = RequestStream<h3_quinn::RecvStream, Bytes>;

type Polled = Poll<Option<Result<Frame<Bytes>, BoxError>>>;

/// The request body of one HTTP/3 request stream.
pub struct H3Body {
    recv: Recv,
    /// A chunk read while looking for the end of the body (see [`H3Body::new`]).
    first: Option<Bytes>,
    /// The chunk that completes the declared length, held until the stream is seen to end there:
    /// a writer that frames by length stops reading once it has that many bytes, so anything
    /// past them must be found before the last bytes go out.
    last: Option<Bytes>,
    /// The DATA frames are over (the stream ended or trailers began); its end is still to be
    /// seen, and nothing but the end may follow the trailers.
    tail: bool,
    /// The stream's end has been seen.
    ended: bool,
    /// Trailers still to pass on.
    trailers: Option<HeaderMap>,
    /// A failure found before the body was read (by [`H3Body::new`] or [`H3Body::settle`]),
    /// reported at its first read.
    failed: Option<BoxError>,
    /// Bytes `Content-Length` still owes (held ones counted as given), when the client gave one.
    left: Option<u64>,
    /// Where a body refused for its framing is counted
    /// (`sluice_downstream_smuggling_refused_total`).
    refused: Counter,
}

/// A body that does not match its `Content-Length`. Reported as invalid data, as hyper reports a
/// broken HTTP/1.1 body, so the proxy books it to the client as a malformed body. (The stream is
/// not stopped from here: h3-quinn cannot stop a stream while a read is in flight. Dropping the
/// body stops it.)
fn malformed(why: &'static str) -> BoxError {
    Box::new(std::io::Error::new(std::io::ErrorKind::InvalidData, why))
}

impl H3Body {
    /// The body of a request whose head said `length`. A client that sends no body ends the
    /// stream with the head, so whatever already arrived is looked at once: a request whose
    /// stream has ended is known to be bodiless (as an HTTP/2 head with `END_STREAM`), and is
    /// forwarded without a body rather than with an empty chunked one.
    pub fn new(recv: Recv, length: Option<u64>, refused: Counter) -> H3Body {
        let mut body = H3Body {
            recv,
            first: None,
            last: None,
            tail: false,
            ended: false,
            trailers: None,
            failed: None,
            left: length,
            refused,
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match body.poll_chunk(&mut cx) {
            Poll::Ready(Ok(Some(chunk))) => body.first = Some(chunk),
            Poll::Ready(Ok(None)) => {
                body.tail = true;
                if let Poll::Ready(Err(e)) = body.poll_tail(&mut cx) {
                    body.fail_later(e);
                }
            }
            Poll::Ready(Err(e)) => body.fail_later(e),
            Poll::Pending => {}
        }
        body
    }

    /// Waits until the stream is seen to end, for a request that declares no body: its end is
    /// then known ([`Body::is_end_stream`]), or the body holds the reason it was refused (a byte
    /// where none was declared, a broken stream), reported at its first read.
    pub async fn settle(&mut self) {
        std::future::poll_fn(|cx| loop {
            let seen = self.ended && self.first.is_none() && self.last.is_none();
            if seen || self.failed.is_some() {
                return Poll::Ready(());
            }
            match std::task::ready!(Pin::new(&mut *self).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    // Trailers are kept for the request; nothing but empty data can come
                    // before a declared length of 0.
                    if let Ok(trailers) = frame.into_trailers() {
                        self.trailers = Some(trailers);
                    }
                }
                Some(Err(e)) => self.fail_later(e),
                None => return Poll::Ready(()),
            }
        })
        .await
    }

    /// Why it failed before it was read ([`H3Body::settle`]), if it did; its first read says so
    /// too.
    pub fn failure(&self) -> Option<&BoxError> {
        self.failed.as_ref()
    }

    /// The next chunk of the stream, `None` at the end of its DATA frames (the stream's end, or
    /// trailers). h3 as patched here (`vendor/h3-fixes.patch`) skips a DATA frame of
    /// no length; as released it reported one as the end.
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, BoxError>> {
        match self.recv.poll_recv_data(cx) {
            Poll::Ready(Ok(Some(mut chunk))) => {
                Poll::Ready(Ok(Some(chunk.copy_to_bytes(chunk.remaining()))))
            }
            Poll::Ready(Ok(None)) => Poll::Ready(Ok(None)),
            Poll::Ready(Err(e)) => Poll::Ready(Err(Box::new(e))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// After the DATA frames: the trailers, if any, and the stream's end. h3 answers a frame
    /// after the trailers as H3_FRAME_UNEXPECTED, an error here.
    fn poll_tail(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self.recv.poll_recv_trailers(cx) {
            Poll::Ready(Ok(trailers)) => {
                self.trailers = trailers;
                self.ended = true;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(Box::new(e))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Passes `chunk` on, unless it goes past the declared length; the chunk that reaches it is
    /// held until the stream's end is seen.
    fn data(&mut self, chunk: Bytes, cx: &mut Context<'_>) -> Polled {
        let Some(left) = &mut self.left else {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        };
        let Some(rest) = left.checked_sub(chunk.len() as u64) else {
            return self.refuse("request body longer than its Content-Length");
        };
        *left = rest;
        if rest > 0 || self.ended {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        self.last = Some(chunk);
        self.poll_last(cx)
    }

    /// With the declared length all read: the held chunk goes out once the stream ends; any
    /// byte more is refused.
    fn poll_last(&mut self, cx: &mut Context<'_>) -> Polled {
        if !self.tail {
            match self.poll_chunk(cx) {
                Poll::Ready(Ok(Some(_))) => {
                    return self.refuse("request body longer than its Content-Length")
                }
                Poll::Ready(Ok(None)) => self.tail = true,
                Poll::Ready(Err(e)) => return self.fail(e),
                Poll::Pending => return Poll::Pending,
            }
        }
        match self.poll_tail(cx) {
            Poll::Ready(Ok(())) => {
                let last = self.last.take().unwrap_or_default();
                Poll::Ready(Some(Ok(Frame::data(last))))
            }
            Poll::Ready(Err(e)) => self.fail(e),
            Poll::Pending => Poll::Pending,
        }
    }

    /// The stream ended: the trailers, then the body's end, unless the declared length is not
    /// reached.
    fn end(&mut self) -> Polled {
        if self.left.is_some_and(|n| n > 0) {
            return self.refuse("request body shorter than its Content-Length");
        }
        match self.trailers.take() {
            Some(trailers) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            None => Poll::Ready(None),
        }
    }

    fn refuse(&mut self, why: &'static str) -> Polled {
        self.refused.inc();
        self.fail(malformed(why))
    }

    fn fail(&mut self, e: BoxError) -> Polled {
        self.clear();
        Poll::Ready(Some(Err(e)))
    }

    /// As [`H3Body::fail`], the error kept for the next read: nothing is left to pass on, and
    /// no length is promised (a writer told "exactly 0 bytes" would never read the error).
    fn fail_later(&mut self, e: BoxError) {
        self.clear();
        self.failed = Some(e);
    }

    fn clear(&mut self) {
        self.tail = true;
        self.ended = true;
        self.first = None;
        self.last = None;
        self.trailers = None;
        self.left = None;
    }
}

impl Body for H3Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        if let Some(e) = self.failed.take() {
            return self.fail(e);
        }
        if self.last.is_some() {
            return self.poll_last(cx);
        }
        if let Some(first) = self.first.take() {
            return self.data(first, cx);
        }
        if !self.ended {
            if !self.tail {
                match self.poll_chunk(cx) {
                    Poll::Ready(Ok(Some(chunk))) => return self.data(chunk, cx),
                    Poll::Ready(Ok(None)) => self.tail = true,
                    Poll::Ready(Err(e)) => return self.fail(e),
                    Poll::Pending => return Poll::Pending,
                }
            }
            match self.poll_tail(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return self.fail(e),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.end()
    }

    fn is_end_stream(&self) -> bool {
        // A stream that ended short of its length is not at its end: its next poll says so.
        self.ended
            && self.failed.is_none()
            && self.first.is_none()
            && self.last.is_none()
            && self.trailers.is_none()
            && self.left.is_none_or(|n| n == 0)
    }

    fn size_hint(&self) -> SizeHint {
        if self.is_end_stream() {
            return SizeHint::with_exact(0);
        }
        let held = self.last.as_ref().map_or(0, |b| b.len() as u64);
        match self.left {
            Some(n) => SizeHint::with_exact(n + held),
            None => SizeHint::default(),
        }
    }
}
