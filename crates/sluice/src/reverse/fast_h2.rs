//! HTTP/2 and HTTP/3 streams on a plain reverse route through the fast path's upstream exchange:
//! a GET or HEAD without a body, on a route without a cache whose upstream is plain HTTP/1.1, is
//! written as bytes on the fast path's pooled connections (`fast::fetch`), its answer read with
//! `httparse`, and the body relayed to the HTTP/2 or HTTP/3 server as it is read, without
//! hyper's client or a second request and response. For HTTP/2 a plain answer's fields go out as
//! HPACK lines written while its head is parsed (`plain_head::write_plain_hpack`), not as a field
//! map; HTTP/3 takes the map. Server choice, retries, forwarding fields, errors and metrics are
//! `forward`'s and `fast`'s (see `docs/decisions/tls-cost.md`, "HTTP/2 streams on the fast path's
//! upstream exchange"); every other HTTP/2 and HTTP/3 request takes `forward`'s path.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::{Frame, SizeHint};
use sluice_http::response_head::{BodyLength, ResponseHead};
use sluice_http::{chunked, plain_head};
use tokio::time::Instant;

use super::access_log::Entry;
use super::body::IdleClock;
use super::fast::{self, Exchanged, FastPool, UpConn};
use super::forward::{
    hash_key, hold_server, request_target, ClientHead, Done, Downstream, FetchError, HeadClock,
};
use super::{Reverse, Route};
use crate::body::{self, Body, Incoming};
use crate::runtime::recent::{self, recent};
use crate::server::field_maps;
use crate::upstream::group::InFlight;

/// Reads of a body that did not come whole with its head ask for this much room.
const READ_CHUNK: usize = 64 * 1024;

/// Whether `req` takes this path on `route`: HTTP/2 or HTTP/3, GET or HEAD, no body (the stream
/// ended with its head, and no framing field claims otherwise), a route the fast path relays.
pub(super) fn takes(reverse: &Reverse, route: &Route, req: &Request<Incoming>) -> bool {
    use http_body::Body as _;
    reverse.settings.h2_fast_path
        && (req.version() == Version::HTTP_2 || req.version() == Version::HTTP_3)
        && (req.method() == Method::GET || req.method() == Method::HEAD)
        && req.body().is_end_stream()
        && !req.headers().contains_key(header::CONTENT_LENGTH)
        && !req.headers().contains_key(header::TRANSFER_ENCODING)
        && fast::serves(route)
}

impl Reverse {
    /// Proxies one request that [`takes`] this path, as [`Reverse::handle`] would: the same
    /// upstream head, attempts, errors and bookkeeping.
    pub(super) async fn handle_h2_fast(
        &self,
        route: &Arc<Route>,
        req: Request<Incoming>,
        path: &str,
        down: &Downstream,
    ) -> Response<Body> {
        let start = recent();
        self.budget.record_request();
        let entry = self.log_entry(
            route,
            down,
            req.method(),
            request_target(&req),
            req.version(),
            req.headers(),
        );
        let key = hash_key(route, request_target(&req), req.headers(), down);
        let (mut parts, _) = req.into_parts();
        // An HTTP/2 stream's task is woken by its connection's tick, which the polled header
        // timeout relies on; an HTTP/3 stream's (any other) has no tick and keeps a timer.
        let clock = match parts.version {
            Version::HTTP_2 => HeadClock::Polled,
            _ => HeadClock::Timer,
        };
        // The client's fields move into the upstream head: no copy of the map.
        let fields = std::mem::take(&mut parts.headers);
        // On a route without response field edits, a plain response head is passed on to the
        // HTTP/2 server as HPACK field lines (`plain_head::write_plain_hpack`); any other, and
        // every HTTP/3 one, takes the field map.
        let plain = (parts.version == Version::HTTP_2
            && route.resp_add.is_empty()
            && route.resp_remove.is_empty())
        .then_some(fast::Plain {
            via: self.settings.via,
            hpack: true,
        });
        let fetched =
            match self.upstream_head(route, ClientHead::of(&parts), fields, path, down, false) {
                Err(e) => Err(e),
                Ok(head) => {
                    let fetched =
                        fast::fetch(&self.budget, route, &head, key.as_deref(), plain, clock)
                            .await
                            .map_err(FetchError::into_proxy_error);
                    // The client's map, emptied, goes back to the thread's stock (`field_maps`)
                    // for a head that needs one: a plain answer's takes none unless it has an
                    // `Alt-Svc`.
                    field_maps::give(head.headers);
                    fetched
                }
            };
        let ttfb = recent::since(start);
        route.meters.ttfb().observe(ttfb.as_secs_f64());
        match fetched {
            Err(e) => {
                let resp = e.into_response();
                self.finish_record(route, resp.status().as_u16(), ttfb, entry);
                resp
            }
            Ok((exchanged, in_flight)) => {
                self.respond_h2_fast(route, exchanged, in_flight, start, entry)
            }
        }
    }

    /// The client's response from a server's answer: its fields as `forward` gives them, the
    /// body bytes read with the head first, the rest relayed by [`Relay`].
    fn respond_h2_fast(
        &self,
        route: &Arc<Route>,
        exchanged: Exchanged,
        in_flight: InFlight,
        start: Instant,
        mut entry: Option<Entry>,
    ) -> Response<Body> {
        let Exchanged {
            mut conn,
            head,
            body_at,
            length,
            pool,
            index,
        } = exchanged;
        let hold = hold_server(route, in_flight, &mut entry);
        let (status, headers, length, reusable, encoded) = match head {
            fast::Answer::Hpack(plain, mut encoded, map) => {
                // Plain: HTTP/1.1, counted, no field of this hop's to strip and none to edit.
                if self.settings.via {
                    let via = super::forward::via_value(Version::HTTP_11);
                    plain_head::hpack_field(&mut encoded, b"via", via.as_bytes());
                }
                (plain.status, map, length, !plain.close, Some(encoded))
            }
            fast::Answer::Map(head) => {
                let (status, headers, length, reusable) = self.map_fields(route, head, length);
                (status, headers, length, reusable, None)
            }
            fast::Answer::Plain(..) => {
                unreachable!("HTTP/2 and HTTP/3 streams ask for the HPACK form or a field map")
            }
        };
        let done = Done {
            access_log: self.access_log.clone(),
            route: route.clone(),
            start,
            status: status.as_u16(),
            entry,
            _hold: hold,
        };
        let mut up = Upstream {
            framing: match length {
                BodyLength::Exact(n) => Framing::Exact(n),
                BodyLength::Coded => Framing::Chunked(chunked::Decoder::new(), Vec::new()),
                BodyLength::UntilClose => Framing::UntilClose,
                BodyLength::Empty => Framing::Exact(0),
            },
            buf: BytesMut::new(),
            conn: None,
            pool,
            index,
            reusable,
        };
        // The body bytes that came with the head are copied out of the connection's read
        // buffer, which stays with the connection.
        let got = conn.buf.get(body_at..).unwrap_or_default();
        let taken = take(&mut up.framing, got);
        conn.buf.clear();
        conn.buf.shrink_to(fast::READ_BUF);
        up.conn = Some(conn);
        let mut relay = Relay {
            first: None,
            up: None,
            trailers: None,
            failed: None,
            idle: IdleClock::new(route.idle_timeout),
            idle_secs: route.idle_timeout.as_secs(),
            bytes: 0,
            length_in_lines: encoded.is_some(),
            done: Some(done),
        };
        match taken {
            Ok(taken) => {
                relay.first = Some(taken.data).filter(|d| !d.is_empty());
                match taken.finished {
                    Some(trailers) => {
                        up.finish(taken.clean);
                        relay.trailers = trailers;
                    }
                    None => relay.up = Some(Box::new(up)),
                }
            }
            Err(e) => relay.failed = Some(e),
        }
        let mut resp = Response::new(body::boxed(relay));
        *resp.status_mut() = status;
        *resp.headers_mut() = headers;
        if let Some(encoded) = encoded {
            resp.extensions_mut()
                .insert(h2::ext::EncodedFields(encoded));
        }
        resp
    }
}

impl Reverse {
    /// A response head read into a field map: its fields as `forward` gives them, its framing
    /// for HTTP/2 and HTTP/3, and whether the connection can be reused after its body.
    fn map_fields(
        &self,
        route: &Route,
        head: ResponseHead,
        length: BodyLength,
    ) -> (StatusCode, HeaderMap, BodyLength, bool) {
        let ResponseHead {
            status,
            mut headers,
            minor_version,
            close,
            ..
        } = head;
        // A coded body whose last coding is not `chunked` ends when the server closes
        // (RFC 9112 §6.3); a chunked one is decoded (HTTP/2 and HTTP/3 frame the body themselves).
        let length = match length {
            BodyLength::Coded if !fast::ends_chunked(fast::codings(&headers).as_ref()) => {
                BodyLength::UntilClose
            }
            other => other,
        };
        let reusable = minor_version == 1 && !close;
        let version = if minor_version == 0 {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        // A server's `Content-Length` beside its `Transfer-Encoding` goes with the coding in
        // `response_fields` (the coding wins, RFC 9112 §6.3), on a HEAD answer too.
        self.response_fields(route, &mut headers, version);
        match length {
            // The server's own single `Content-Length` is kept where it is.
            BodyLength::Exact(n) if !fast::says_length(&headers, n) => {
                headers.insert(header::CONTENT_LENGTH, n.into());
            }
            BodyLength::Coded | BodyLength::UntilClose => {
                headers.remove(header::CONTENT_LENGTH);
            }
            BodyLength::Empty => fast::bodiless_fields(status, &mut headers),
            BodyLength::Exact(_) => {}
        }
        (status, headers, length, reusable)
    }
}

/// Why a relayed body ended early.
#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error("upstream: {0}")]
    Upstream(String),
    #[error("no body bytes for {0} s")]
    Idle(u64),
}

/// How the rest of a body is delimited.
enum Framing {
    /// This many bytes still to come.
    Exact(u64),
    /// Chunked: decoded, its trailer section kept for the trailers frame.
    Chunked(chunked::Decoder, Vec<u8>),
    /// Until the server closes.
    UntilClose,
}

/// The connection a body is still being read from.
struct Upstream {
    framing: Framing,
    /// Where reads go; each read's body bytes leave as one frame without a copy (but chunked
    /// ones, which are decoded).
    buf: BytesMut,
    /// `None` once the body has ended.
    conn: Option<UpConn>,
    pool: Arc<FastPool>,
    index: usize,
    /// The server keeps the connection open after this response (HTTP/1.1, no `close`).
    reusable: bool,
}

/// What one read gave: body bytes, whether they ended the body (with its trailers, if any) and
/// whether nothing followed the body's end.
struct Taken {
    data: Bytes,
    finished: Option<Option<HeaderMap>>,
    clean: bool,
}

/// Takes the body bytes out of `got` (bytes read from the server), copied.
fn take(framing: &mut Framing, got: &[u8]) -> Result<Taken, RelayError> {
    let (data, finished, clean) = match framing {
        Framing::Exact(left) => {
            let take = usize::try_from(*left).unwrap_or(usize::MAX).min(got.len());
            *left -= take as u64;
            let data = Bytes::copy_from_slice(&got[..take]);
            (data, (*left == 0).then_some(None), take == got.len())
        }
        Framing::Chunked(decoder, trailer) => {
            let mut out = Vec::new();
            let used = decoder
                .decode_with_trailer(got, &mut out, trailer)
                .map_err(|e| RelayError::Upstream(e.to_string()))?;
            let finished = if decoder.is_done() {
                let mut fields = chunked::parse_trailer(trailer)
                    .map_err(|e| RelayError::Upstream(e.to_string()))?;
                // This hop's fields (`Connection: close`, ...) are not passed on: an HTTP/2 or
                // HTTP/3 client takes a trailer section carrying one as malformed.
                sluice_http::hop::strip_connection_specific_trailers(&mut fields);
                Some(Some(fields).filter(|f| !f.is_empty()))
            } else {
                None
            };
            (Bytes::from(out), finished, used == got.len())
        }
        Framing::UntilClose => (Bytes::copy_from_slice(got), None, false),
    };
    Ok(Taken {
        data,
        finished,
        clean,
    })
}

/// An HTTP/2 or HTTP/3 response body relayed from an upstream HTTP/1.1 connection: the bytes
/// read with the head, then one frame per read, then the trailers of a chunked body; the route's
/// idle timeout between reads. The bookkeeping (`Done`) runs when it ends or is dropped.
struct Relay {
    first: Option<Bytes>,
    /// Boxed: most bodies come whole with their head and never need it.
    up: Option<Box<Upstream>>,
    trailers: Option<HeaderMap>,
    failed: Option<RelayError>,
    idle: IdleClock,
    idle_secs: u64,
    bytes: u64,
    /// The head's HPACK lines carry its `Content-Length`: the size hint stops short of exact, or
    /// hyper's server would add a second one to the response's map.
    length_in_lines: bool,
    /// Inline, not boxed: the relay itself is boxed once as the response body.
    done: Option<Done>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            done.record(self.bytes, false);
        }
    }
}

impl http_body::Body for Relay {
    type Data = Bytes;
    type Error = RelayError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        let this = self.get_mut();
        loop {
            if let Some(data) = this.first.take() {
                this.bytes += data.len() as u64;
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            if let Some(e) = this.failed.take() {
                this.up = None;
                return Poll::Ready(Some(Err(e)));
            }
            let Some(up) = this.up.as_mut() else {
                if let Some(t) = this.trailers.take() {
                    return Poll::Ready(Some(Ok(Frame::trailers(t))));
                }
                if let Some(done) = this.done.take() {
                    done.record(this.bytes, true);
                }
                return Poll::Ready(None);
            };
            match up.poll_read(cx) {
                Poll::Ready(Ok(0)) => {
                    let until_close = matches!(up.framing, Framing::UntilClose);
                    this.up = None;
                    if !until_close {
                        this.failed = Some(RelayError::Upstream(
                            "connection closed inside the body".into(),
                        ));
                    }
                }
                Poll::Ready(Ok(_)) => {
                    this.idle.moved();
                    match up.take_read() {
                        Ok(taken) => {
                            if let Some(trailers) = taken.finished {
                                up.finish(taken.clean);
                                this.trailers = trailers;
                                this.up = None;
                            }
                            this.first = Some(taken.data).filter(|d| !d.is_empty());
                        }
                        Err(e) => this.failed = Some(e),
                    }
                }
                Poll::Ready(Err(e)) => this.failed = Some(RelayError::Upstream(e.to_string())),
                Poll::Pending => {
                    return match this.idle.poll_expired(cx) {
                        Poll::Ready(()) => {
                            this.up = None;
                            Poll::Ready(Some(Err(RelayError::Idle(this.idle_secs))))
                        }
                        Poll::Pending => Poll::Pending,
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none()
            && self.up.is_none()
            && self.trailers.is_none()
            && self.failed.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let first = self.first.as_ref().map_or(0, |d| d.len() as u64);
        let exact = match self.up.as_deref().map(|u| &u.framing) {
            None if self.trailers.is_none() => first,
            Some(Framing::Exact(left)) => first + left,
            _ => return SizeHint::default(),
        };
        if self.length_in_lines {
            let mut hint = SizeHint::new();
            hint.set_lower(exact);
            return hint;
        }
        SizeHint::with_exact(exact)
    }
}

impl Upstream {
    /// One read from the server into `buf`.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        let Some(conn) = self.conn.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        let want = match self.framing {
            Framing::Exact(left) => usize::try_from(left).unwrap_or(usize::MAX).min(READ_CHUNK),
            _ => READ_CHUNK,
        };
        // Room for the rest of a counted body (and some past it, so bytes after the body show),
        // or a chunk of any other.
        self.buf.reserve(want.max(1024));
        tokio_util::io::poll_read_buf(Pin::new(&mut conn.io), cx, &mut self.buf)
    }

    /// The body bytes of what [`Upstream::poll_read`] read: a counted or close-delimited body's
    /// split off `buf` without a copy, a chunked one's decoded.
    fn take_read(&mut self) -> Result<Taken, RelayError> {
        match &mut self.framing {
            Framing::Exact(left) => {
                let take = usize::try_from(*left)
                    .unwrap_or(usize::MAX)
                    .min(self.buf.len());
                *left -= take as u64;
                let clean = take == self.buf.len();
                Ok(Taken {
                    data: self.buf.split_to(take).freeze(),
                    finished: (*left == 0).then_some(None),
                    clean,
                })
            }
            Framing::UntilClose => Ok(Taken {
                data: self.buf.split().freeze(),
                finished: None,
                clean: false,
            }),
            Framing::Chunked(..) => {
                let got = self.buf.split();
                take(&mut self.framing, &got)
            }
        }
    }

    /// The body ended: the connection goes back to its pool when the server keeps it open and
    /// sent nothing past the body (`clean`), else it is closed.
    fn finish(&mut self, clean: bool) {
        if let Some(conn) = self.conn.take() {
            if clean && self.reusable {
                self.pool.checkin(self.index, conn);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunked body's trailers reach the client without this hop's fields: `Connection`,
    /// `Keep-Alive`, `Transfer-Encoding`, `TE`, `Upgrade` and `Proxy-Connection` are dropped,
    /// any other field is kept.
    #[test]
    fn trailers_lose_connection_specific_fields() {
        let mut framing = Framing::Chunked(chunked::Decoder::new(), Vec::new());
        let wire = b"3\r\nabc\r\n0\r\nConnection: close\r\nKeep-Alive: timeout=5\r\n\
            Transfer-Encoding: chunked\r\nTE: trailers\r\nUpgrade: h2c\r\n\
            Proxy-Connection: close\r\nx-sum: 1\r\n\r\n";
        let taken = take(&mut framing, wire).unwrap();
        assert_eq!(&taken.data[..], b"abc");
        let trailers = taken.finished.unwrap().unwrap();
        assert_eq!(trailers.len(), 1, "{trailers:?}");
        assert_eq!(trailers["x-sum"], "1");
        // Nothing but this hop's fields: no trailers at all.
        let mut framing = Framing::Chunked(chunked::Decoder::new(), Vec::new());
        let taken = take(&mut framing, b"0\r\nConnection: close\r\n\r\n").unwrap();
        assert!(taken.finished.unwrap().is_none());
    }
}
