//! `/proxy/stream` with the body spliced: when the client is plain HTTP/1.1 (its connection
//! offers a splice tap), the request a plain GET without Range, and the upstream plain HTTP/1.1
//! answering with a `Content-Length`, the head is built as for the streamed path and the body
//! goes from the upstream socket to the client's with `splice(2)` (`server::spliced`).
//! Everything else takes the streamed path (a close-delimited body is read from the same socket).

use crate::atomic::Counter;
use crate::body::Incoming;
use bytes::BytesMut;
use http::header::{self, HeaderMap};
use http::{Method, Request, Response};
use http_body::Frame;
use http_body_util::StreamBody;
use sluice_http::response_head::BodyLength;
use sluice_media::query::ProxyParams;
use tokio::io::AsyncReadExt;

use crate::body::{self, Body, BoxError};
use crate::error::ProxyError;
use crate::net::splice::feed::Feed;
use crate::server::spliced::SpliceTap;
use crate::upstream::Upstream;

/// Response fields a parameter must not touch for the body to be spliced: they frame it.
const FRAMING: &[&str] = &["content-length", "transfer-encoding", "connection"];

/// The connection's splice tap when this request may be spliced at all.
pub fn tap_for<'r>(req: &'r Request<Incoming>, params: &ProxyParams) -> Option<&'r SpliceTap> {
    let tap = req.extensions().get::<SpliceTap>()?;
    let plain = req.method() == Method::GET
        && params.destination.scheme() == "http"
        && !req.headers().contains_key(header::RANGE)
        && !req.headers().contains_key(header::IF_RANGE);
    let touches_framing = params
        .response_headers
        .iter()
        .chain(&params.propagate_headers)
        .map(|(n, _)| n.as_str())
        .chain(params.strip_headers.iter().map(String::as_str))
        .any(|n| FRAMING.iter().any(|f| f.eq_ignore_ascii_case(n)));
    (plain && !touches_framing).then_some(tap)
}

/// Tries the spliced exchange, its response head by `deadline`; `Ok(None)` when the upstream's
/// answer cannot be spliced (a redirect, a chunked body, no body), in which case the caller
/// streams it instead (a second request, by the same `deadline`: such answers are rare for
/// media files, and small). A body that runs until the origin closes is streamed from the same
/// connection.
pub async fn serve(
    upstream: &Upstream,
    req: &Request<Incoming>,
    params: &ProxyParams,
    tap: &SpliceTap,
    spliced: &Counter,
    deadline: tokio::time::Instant,
) -> Result<Option<Response<Body>>, ProxyError> {
    let up_req = super::stream::upstream_request(req, params)?;
    let raw = upstream
        .send_raw(&up_req, deadline)
        .await
        .map_err(|e| ProxyError::from_upstream(&e))?;
    let head = &raw.head;
    let len = match head.body_length(false) {
        _ if head.status.is_redirection() && head.headers.contains_key(header::LOCATION) => {
            return Ok(None)
        }
        Ok(BodyLength::Exact(n)) if n > 0 => n,
        Ok(BodyLength::UntilClose) => {
            // A live stream without a length (typical of MPEG-TS origins): read it from this
            // socket rather than ask the origin a second time.
            return Ok(Some(until_close(upstream, raw, params)?));
        }
        Ok(_) | Err(_) => {
            tracing::debug!(status = %head.status, "upstream body not spliceable, streaming it");
            return Ok(None);
        }
    };
    // Compared in u64: on a 32-bit target `len as usize` keeps the low 32 bits of a length past
    // 4 GiB, which would cut the early bytes short.
    let take = usize::try_from(len).map_or(raw.early.len(), |len| raw.early.len().min(len));
    let early = raw.early.slice(..take);
    let rest = len - early.len() as u64;
    upstream.count_received(early.len());
    let mut headers = HeaderMap::new();
    super::stream::mirror_headers(&head.headers, &mut headers);
    super::stream::apply_params(params, &mut headers)?;
    let status = head.status;
    let returner = raw.returner();
    let body = if rest == 0 {
        // All of it came with the head: nothing left to splice, and the socket can go back now
        // (unless the origin sent more than it announced).
        if let Some(give_back) = returner.filter(|_| raw.early.len() as u64 == len) {
            give_back(raw.socket);
        }
        body::full(early)
    } else {
        spliced.inc();
        let counter = upstream.clone();
        let mut feed = Feed::new(
            raw.socket,
            rest,
            upstream.idle_read_timeout(),
            Box::new(move |n| counter.count_received(n)),
        );
        if let Some(give_back) = returner {
            feed = feed.on_done(give_back);
        }
        body::boxed(tap.0.install(feed, early, rest))
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    Ok(Some(resp))
}

/// The answer for a body delimited by the origin closing the connection: streamed from the raw
/// socket (with the upstream idle clock), not spliced, since its length is unknown.
fn until_close(
    upstream: &Upstream,
    raw: crate::upstream::raw::RawResponse,
    params: &ProxyParams,
) -> Result<Response<Body>, ProxyError> {
    let mut headers = HeaderMap::new();
    super::stream::mirror_headers(&raw.head.headers, &mut headers);
    super::stream::apply_params(params, &mut headers)?;
    let status = raw.head.status;
    let idle = upstream.idle_read_timeout();
    let counter = upstream.clone();
    counter.count_received(raw.early.len());
    let first = (!raw.early.is_empty()).then_some(raw.early);
    let chunks = futures_util::stream::unfold(
        (raw.socket, BytesMut::new(), first, false),
        move |(mut socket, mut buf, first, done)| {
            let counter = counter.clone();
            async move {
                if let Some(bytes) = first {
                    return Some((Ok(Frame::data(bytes)), (socket, buf, None, false)));
                }
                if done {
                    return None;
                }
                // Reuses the allocation once the previous chunks have been written out.
                buf.reserve(UNTIL_CLOSE_READ);
                match tokio::time::timeout(idle, socket.read_buf(&mut buf)).await {
                    Ok(Ok(0)) => None,
                    Ok(Ok(n)) => {
                        counter.count_received(n);
                        let chunk = buf.split().freeze();
                        Some((Ok(Frame::data(chunk)), (socket, buf, None, false)))
                    }
                    Ok(Err(e)) => Some((Err(BoxError::from(e)), (socket, buf, None, true))),
                    Err(_) => Some((
                        Err(BoxError::from(format!(
                            "upstream sent nothing for {idle:?}"
                        ))),
                        (socket, buf, None, true),
                    )),
                }
            }
        },
    );
    let mut resp = Response::new(body::boxed(StreamBody::new(chunks)));
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    Ok(resp)
}

/// Read size for a close-delimited body (the streamed path's upstream buffer size).
const UNTIL_CLOSE_READ: usize = 96 * 1024;
