//! `/proxy/stream` with the body spliced: when the client is plain HTTP/1.1 (its connection
//! offers a splice tap), the request a plain GET without Range, and the upstream plain HTTP/1.1
//! answering with a `Content-Length`, the head is built as for the streamed path and the body
//! goes from the upstream socket to the client's with `splice(2)` (`server::spliced`).
//! Everything else takes the streamed path (a close-delimited body is read from the same socket).

use crate::atomic::Counter;
use crate::body::Incoming;
use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap};
use http::{Method, Request, Response};
use http_body::Frame;
use http_body_util::StreamBody;
use sluice_http::response_head::BodyLength;
use sluice_media::query::ProxyParams;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

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
        let counter = upstream.clone();
        let mut feed = Feed::new(
            raw.socket,
            rest,
            upstream.idle_read_timeout(),
            Box::new(move |n| counter.count_received(n)),
        );
        // The pipe before the answer: once the head (and its Content-Length) is out, a feed
        // without one could only cut the body short. Without one (descriptor limit) the body is
        // read through user space from the same socket, as a streamed one is.
        match feed.take_pipe() {
            Ok(()) => {
                spliced.inc();
                if let Some(give_back) = returner {
                    feed = feed.on_done(give_back);
                }
                body::boxed(tap.0.install(feed, early, rest))
            }
            Err(e) => {
                tracing::debug!(error = %e, "no pipe to splice the body, streaming it");
                let give_back = returner.map(|f| Box::new(f) as GiveBack);
                read_through(upstream, feed.into_socket(), early, Some(rest), give_back)
            }
        }
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
    upstream.count_received(raw.early.len());
    let body = read_through(upstream, raw.socket, raw.early, None, None);
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    Ok(resp)
}

/// Takes an upstream socket back once its body has been read to the end (keep-alive).
type GiveBack = Box<dyn FnOnce(TcpStream) + Send + Sync>;

/// A body read from the raw upstream socket through user space (with the upstream idle clock):
/// `first` (already counted), then the next `left` bytes, or everything until the origin closes
/// (`None`). A body of known length never reads past its end, and its socket goes to `give_back`
/// once read whole; an origin that closes before the end is an error, so the client's connection
/// is cut rather than its body taken as complete.
fn read_through(
    upstream: &Upstream,
    socket: TcpStream,
    first: Bytes,
    left: Option<u64>,
    give_back: Option<GiveBack>,
) -> Body {
    struct State {
        socket: Option<TcpStream>,
        buf: BytesMut,
        first: Option<Bytes>,
        left: Option<u64>,
        give_back: Option<GiveBack>,
        done: bool,
    }
    let idle = upstream.idle_read_timeout();
    let counter = upstream.clone();
    let state = State {
        socket: Some(socket),
        buf: BytesMut::new(),
        first: (!first.is_empty()).then_some(first),
        left,
        give_back,
        done: false,
    };
    let chunks = futures_util::stream::unfold(state, move |mut st| {
        let counter = counter.clone();
        async move {
            if let Some(bytes) = st.first.take() {
                return Some((Ok(Frame::data(bytes)), st));
            }
            if st.done || st.left == Some(0) {
                return None;
            }
            let socket = st.socket.as_mut()?;
            // Reuses the allocation once the previous chunks have been written out.
            st.buf.reserve(UNTIL_CLOSE_READ);
            let limit = st.left.unwrap_or(u64::MAX);
            let read = {
                let mut body = AsyncReadExt::take(socket, limit);
                tokio::time::timeout(idle, body.read_buf(&mut st.buf)).await
            };
            match read {
                Ok(Ok(0)) => match st.left {
                    None => None,
                    Some(missing) => {
                        st.done = true;
                        let e = format!(
                            "upstream closed the connection {missing} bytes before the end of the body"
                        );
                        Some((Err(BoxError::from(e)), st))
                    }
                },
                Ok(Ok(n)) => {
                    counter.count_received(n);
                    if let Some(left) = st.left.as_mut() {
                        *left -= n as u64;
                        if *left == 0 {
                            // Read whole: the socket can serve the next request now.
                            if let (Some(socket), Some(give_back)) =
                                (st.socket.take(), st.give_back.take())
                            {
                                give_back(socket);
                            }
                        }
                    }
                    let chunk = st.buf.split().freeze();
                    Some((Ok(Frame::data(chunk)), st))
                }
                Ok(Err(e)) => {
                    st.done = true;
                    Some((Err(BoxError::from(e)), st))
                }
                Err(_) => {
                    st.done = true;
                    let e = format!("upstream sent nothing for {idle:?}");
                    Some((Err(BoxError::from(e)), st))
                }
            }
        }
    });
    body::boxed(StreamBody::new(chunks))
}

/// Read size for a body read through user space (the streamed path's upstream buffer size).
const UNTIL_CLOSE_READ: usize = 96 * 1024;
