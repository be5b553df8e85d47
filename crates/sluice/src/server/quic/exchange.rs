//! One HTTP/3 request stream: the request head and body handed to the handler as any other
//! request, the response head and body written back, with the send timeout HTTP/2 streams have.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use h3::error::Code;
use h3::server::{RequestResolver, RequestStream};
use http::{header, HeaderMap, Method, Request, Response};
use http_body_util::BodyExt;
use sluice_http::framing::{check_request, padded, FramingError};

use super::body::H3Body;
use super::conn::{Handshake, Shared};
use crate::body::Incoming;
use crate::server::handler::{Handler, ListenerId};

type Responder = RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;

/// Serves one request stream to its end.
/// `head_place`: held while the head is read (`conn::HEADS_AT_ONCE`).
pub async fn serve<H: Handler>(
    resolver: Box<RequestResolver<h3_quinn::Connection, Bytes>>,
    head_place: tokio::sync::OwnedSemaphorePermit,
    shared: std::sync::Arc<Shared<H>>,
    peer: SocketAddr,
) {
    let began = tokio::time::Instant::now();
    let mut going_away = shared.going_away.clone();
    let resolved = resolve(resolver, shared.header_read, &mut going_away).await;
    drop(head_place);
    let (mut req, mut stream) = match resolved {
        Ok(r) => r,
        // A malformed head: h3 has already answered with the stream or connection error.
        Err(Some(e)) => {
            tracing::debug!(%peer, error = %e, "HTTP/3 request refused");
            return;
        }
        Err(None) => {
            tracing::debug!(%peer, "HTTP/3 request head not complete in time, or draining: stream reset");
            return;
        }
    };
    let early = match early_data(&req, shared.handshake.as_ref(), &mut going_away).await {
        Early::Go(early) => early,
        // The handshake never finished: the connection is closing.
        Early::Closed => return,
        Early::Rejected => {
            // Not processed (RFC 9114 §4.1.1): the client may send it again elsewhere.
            stream.stop_stream(Code::H3_REQUEST_REJECTED);
            stream.stop_sending(Code::H3_REQUEST_REJECTED);
            tracing::debug!(%peer, "HTTP/3 early request waiting for its handshake rejected by the drain");
            return;
        }
    };
    if early {
        req.headers_mut()
            .insert(EARLY_DATA, http::HeaderValue::from_static("1"));
    }
    let (mut send, recv) = stream.split();
    if let Some(name) = sluice_http::hop::connection_specific(req.headers()) {
        // RFC 9114 §4.2: malformed, as HTTP/2 holds it (RFC 9113 §8.2.2).
        shared.requests.inc();
        tracing::debug!(%peer, field = %name, "HTTP/3 request with a connection-specific field refused");
        send.stop_stream(Code::H3_MESSAGE_ERROR);
        return;
    }
    // One `cookie` field, as HTTP/2's requests have it (RFC 9114 §4.2.1).
    sluice_http::hop::join_cookies(req.headers_mut());
    // Read as the proxy reads it (one number per field, the same in every field), so the length
    // held to here is the one forwarded; anything else, a list inside one field or a value with
    // a space at either end included, is malformed (RFC 9114 §4.1.2, §10.3).
    let lengths = req.headers().get_all(header::CONTENT_LENGTH);
    let checked = if lengths.iter().any(|v| padded(v.as_bytes())) {
        Err(FramingError::BadLength)
    } else {
        check_request(req.headers(), false)
    };
    let length = match checked {
        Ok(sluice_http::framing::Framing::Length(n)) => Some(n),
        Ok(_) if req.headers().contains_key(header::CONTENT_LENGTH) => Some(0),
        Ok(_) => None,
        Err(e) => {
            shared.requests.inc();
            shared.handler.http_metrics().smuggling_refused.inc();
            tracing::debug!(%peer, error = %e, "HTTP/3 request framing refused");
            // Reset; the receiving half stops as it is dropped.
            send.stop_stream(Code::H3_MESSAGE_ERROR);
            return;
        }
    };
    if let Some(n) = length {
        // One value on: repeated fields, or one with leading zeros, are the same length to this
        // hop (RFC 9110 §8.6), and the next may read or refuse them otherwise.
        req.headers_mut()
            .insert(header::CONTENT_LENGTH, http::HeaderValue::from(n));
    }
    let refused = shared.handler.http_metrics().smuggling_refused.clone();
    let mut body = H3Body::new(recv, length, refused);
    if length == Some(0) && !http_body::Body::is_end_stream(&body) {
        // A head that declares no body is held until the stream is seen to end there, as the
        // chunk that reaches a declared length is: an HTTP/1.1 upstream is sent no body, so a
        // byte after the head would otherwise be dropped rather than refused. Clients end such
        // a stream with its head; one that keeps it open has what is left of the header read
        // timeout.
        let left = shared.header_read.saturating_sub(began.elapsed());
        // The stream's end first: one already there is served, not rejected by a drain that
        // began a moment ago.
        let settled = tokio::select! {
            biased;
            settled = tokio::time::timeout(left, body.settle()) => settled.is_ok(),
            _ = going_away.wait_for(|gone| *gone) => {
                // Draining: not processed, so the client may send it again elsewhere.
                send.stop_stream(Code::H3_REQUEST_REJECTED);
                return;
            }
        };
        if !settled {
            send.stop_stream(Code::H3_REQUEST_INCOMPLETE);
            tracing::debug!(%peer, "HTTP/3 request declared no body and did not end: stream reset");
            return;
        }
        if let Some(e) = body.failure() {
            shared.requests.inc();
            let malformed = e
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::InvalidData);
            if malformed {
                // Refused here, before anything is forwarded: an upstream client would not read
                // the body of a GET, or of a request declared empty, to find the error in it.
                tracing::debug!(%peer, "HTTP/3 request declared no body and sent one: refused");
                let _answering = shared.activity.begin();
                let head = req.method() == Method::HEAD;
                refuse_bad_body(&shared, &mut send, head).await;
            } else {
                // The stream or the connection is gone (reset, a frame error): no one to answer.
                tracing::debug!(%peer, error = %e, "HTTP/3 request ended before its head did");
            }
            return;
        }
    }
    // The connection counts this stream in flight from here until its response is sent (the
    // handler's own guard may end with the response head), so neither the idle timeout nor a
    // drain closes the connection under a body still going out. Until here (the head, the end
    // of a head that declares no body) it was only a head, rejected if a drain began: a client
    // opening stream after stream that never gets this far does not keep a connection open.
    let _stream = shared.activity.begin();
    // A HEAD's answer is its head alone (RFC 9110 §9.3.2), whatever body the handler gives it
    // (`/metrics`, `/health`, the status page and its endless event stream, every error): the
    // vendored h3 does not track the method, so `respond` leaves the body out, as the HTTP/2
    // server (`Framing::head`) and hyper's HTTP/1.1 do.
    let head = req.method() == Method::HEAD;
    let mut req: Request<Incoming> = req.map(|()| Incoming::adapted(body));
    // As over TCP: none for the main listener (see `ListenerId`).
    if shared.listener != ListenerId::default() {
        req.extensions_mut().insert(shared.listener);
    }
    shared.requests.inc();
    let guard = shared.activity.begin();
    // Built in a box of its own, as on the HTTP/1.1 and HTTP/2 path: `Box::pin(handle(..))`
    // builds the handler's large future on the stack and then copies it into the box.
    let handling = crate::server::boxed_in_place(|| shared.handler.handle(req, peer, true, guard));
    // A client that cancels the request (STOP_SENDING on the response, RFC 9114 §4.1.1) before
    // its head is here takes the handler's work with it (its upstream request, its place in a
    // cache fill), as an HTTP/2 stream's RST_STREAM does: nothing waits for an answer no one
    // will read. The same when the connection is gone.
    let stopped = send.transport().stopped();
    let resp = tokio::select! {
        biased;
        resp = handling => resp,
        why = stopped => {
            tracing::debug!(%peer, ?why, "HTTP/3 request cancelled before its response");
            send.stop_stream(Code::H3_REQUEST_CANCELLED);
            return;
        }
    };
    match respond(&mut send, resp, head, shared.send_timeout).await {
        Ok(()) => {}
        Err(SendError::Stalled(_)) => {
            shared.handler.http_metrics().send_timeouts.inc();
            tracing::debug!(%peer, "HTTP/3 stream not read: send timeout");
        }
        Err(e) => tracing::debug!(%peer, error = %e, "HTTP/3 response not finished"),
    }
}

/// Reads a request stream's head within `limit`. `Err(None)`: not in time, the stream reset with
/// H3_REQUEST_INCOMPLETE (a client holding streams open without a head, its connection kept up
/// by PINGs, would otherwise hold them for as long as it likes); or a drain began first, the
/// stream reset with H3_REQUEST_REJECTED (not processed: the client may send it again).
async fn resolve(
    mut resolver: Box<RequestResolver<h3_quinn::Connection, Bytes>>,
    limit: Duration,
    going_away: &mut tokio::sync::watch::Receiver<bool>,
) -> Result<
    (
        Request<()>,
        RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>,
    ),
    Option<h3::error::StreamError>,
> {
    use h3::quic::SendStream;
    let began = tokio::time::Instant::now();
    let first = std::future::poll_fn(|cx| resolver.frame_stream.poll_next(cx));
    // A head already there is served, not rejected by a drain that began a moment ago.
    let frame = tokio::select! {
        biased;
        frame = tokio::time::timeout(limit, first) => match frame {
            Ok(frame) => frame,
            Err(_) => {
                resolver.frame_stream.reset(Code::H3_REQUEST_INCOMPLETE.value());
                return Err(None);
            }
        },
        _ = going_away.wait_for(|gone| *gone) => {
            resolver.frame_stream.reset(Code::H3_REQUEST_REJECTED.value());
            return Err(None);
        }
    };
    let resolved = resolver.accept_with_frame(frame).map_err(Some)?;
    // Decoding is at once; what may wait is the 431 h3 sends for a head over the limit, which a
    // client granting no credit could hold: what is left of the same limit bounds it.
    tokio::time::timeout(limit.saturating_sub(began.elapsed()), resolved.resolve())
        .await
        .map_err(|_| None)?
        .map_err(Some)
}

/// Answers a malformed request body with the 400 the proxy gives one it finds while forwarding
/// (`bad_body`, booked to the client); to a HEAD, without its body.
async fn refuse_bad_body<H: Handler>(shared: &Shared<H>, send: &mut Responder, head: bool) {
    let e = crate::error::ProxyError::downstream(
        http::StatusCode::BAD_REQUEST,
        "bad_body",
        crate::error::MALFORMED_BODY,
    );
    shared
        .handler
        .http_metrics()
        .errors
        .get_or_create(&crate::metrics::ErrorLabels {
            side: e.side.label(),
            kind: e.kind,
        })
        .inc();
    if let Err(e) = respond(send, e.into_response(), head, shared.send_timeout).await {
        tracing::debug!(error = %e, "HTTP/3 refusal not sent");
    }
}

/// `Early-Data` (RFC 8470 §5.1).
const EARLY_DATA: http::HeaderName = http::HeaderName::from_static("early-data");

/// What becomes of a request that may have come in early data.
enum Early {
    /// It goes on; true when as early data.
    Go(bool),
    /// The handshake never finished: the connection is closing.
    Closed,
    /// The server's drain began while it waited for the handshake: rejected, not processed.
    Rejected,
}

/// A request that may have come in 0-RTT early data, which an attacker can replay: one with a
/// safe method goes on at once, marked `Early-Data: 1` for the origin (RFC 8470 §5.1, which a
/// proxy must do; the origin may answer 425 Too Early, which goes back to the client); any other
/// waits until the handshake has finished, when a replay can no longer carry it, or until the
/// connection's GOAWAY (a drain, or the idle close), which rejects it: the drain does not wait on
/// a handshake the client may never finish, and the client may send the request again.
async fn early_data(
    req: &Request<()>,
    handshake: Option<&Handshake>,
    going_away: &mut tokio::sync::watch::Receiver<bool>,
) -> Early {
    let Some(handshake) = handshake else {
        return Early::Go(false);
    };
    if handshake.finished() {
        return Early::Go(false);
    }
    if req.method().is_safe() {
        return Early::Go(true);
    }
    tokio::select! {
        biased;
        done = handshake.wait() => match done {
            true => Early::Go(false),
            false => Early::Closed,
        },
        _ = going_away.wait_for(|gone| *gone) => Early::Rejected,
    }
}

/// Why a response stopped early.
#[derive(Debug, thiserror::Error)]
enum SendError {
    #[error("stream: {0}")]
    Stream(#[from] h3::error::StreamError),
    #[error("client accepted no byte for {0:?}")]
    Stalled(Duration),
    #[error("response body: {0}")]
    Body(crate::body::BoxError),
    #[error("cancelled by the client, or the connection is gone")]
    Cancelled,
}

/// Sends `resp` on the stream and ends it. `head_only` (the answer to a HEAD): the head alone,
/// its fields as the handler set them (a `Content-Length` saying what a GET would get, as
/// RFC 9110 §8.6 allows), and the body dropped unpolled, so a producer that never ends (the
/// status page's events) stops at once rather than feeding a stream no one reads.
async fn respond(
    send: &mut Responder,
    resp: Response<crate::body::Body>,
    head_only: bool,
    limit: Duration,
) -> Result<(), SendError> {
    let (mut parts, body) = resp.into_parts();
    let mut body = if head_only {
        drop(body);
        None
    } else {
        Some(body)
    };
    strip_connection_fields(&mut parts.headers);
    // Dated as HTTP/1.1 and HTTP/2 answers are (RFC 9110 section 6.6.1).
    if !parts.headers.contains_key(header::DATE) {
        parts
            .headers
            .insert(header::DATE, crate::server::date::value());
    }
    // As for the body below: a client that grants the stream no credit is not waited on longer
    // than the send timeout, for the head or for the stream's end.
    match tokio::time::timeout(limit, send.send_response(Response::from_parts(parts, ()))).await {
        Ok(sent) => sent?,
        Err(_) => {
            send.stop_stream(Code::H3_REQUEST_CANCELLED);
            return Err(SendError::Stalled(limit));
        }
    }
    // A client that cancels once the response has begun (STOP_SENDING), or a connection that is
    // gone, ends it while it waits for the body's next piece, as an HTTP/2 stream's reset does:
    // dropping the body drops the upstream fetch behind it.
    let mut stopped = std::pin::pin!(send.transport().stopped());
    while let Some(body) = body.as_mut() {
        let frame = tokio::select! {
            biased;
            frame = body.frame() => frame,
            _ = &mut stopped => {
                send.stop_stream(Code::H3_REQUEST_CANCELLED);
                return Err(SendError::Cancelled);
            }
        };
        let Some(frame) = frame else { break };
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                // The upstream failed mid-body: the client must not take a short body as whole.
                send.stop_stream(Code::H3_INTERNAL_ERROR);
                return Err(SendError::Body(e));
            }
        };
        let written = match frame.into_data() {
            Ok(data) => tokio::time::timeout(limit, send.send_data(data)).await,
            Err(frame) => match frame.into_trailers() {
                Ok(mut trailers) => {
                    sluice_http::hop::strip_connection_specific_trailers(&mut trailers);
                    tokio::time::timeout(limit, send.send_trailers(trailers)).await
                }
                Err(_) => continue,
            },
        };
        match written {
            Ok(r) => r?,
            Err(_) => {
                // Nothing accepted for the send timeout: the stream is reset, and dropping the
                // body drops the upstream fetch behind it.
                send.stop_stream(Code::H3_REQUEST_CANCELLED);
                return Err(SendError::Stalled(limit));
            }
        }
    }
    match tokio::time::timeout(limit, send.finish()).await {
        Ok(finished) => finished?,
        Err(_) => {
            send.stop_stream(Code::H3_REQUEST_CANCELLED);
            return Err(SendError::Stalled(limit));
        }
    }
    Ok(())
}

/// HTTP/3 has no connection-specific fields (RFC 9114 §4.2): a response carrying one is
/// malformed, so the ones HTTP/1.1 responses may carry are dropped.
fn strip_connection_fields(headers: &mut HeaderMap) {
    for name in sluice_http::hop::connection_specific_names() {
        headers.remove(name);
    }
}
