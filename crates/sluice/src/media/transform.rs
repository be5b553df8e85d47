//! `transformer=<name>` on the streaming endpoints: the response body rewritten as it streams.
//!
//! The one transformer is MediaFlow's `ts_stream`: fake PNG/CSS/other wrappers in front of a TS
//! segment are dropped (`sluice_media::mpegts::unwrap`). The body no longer matches the upstream's
//! byte positions, so the client's Range is not forwarded, the answer carries no
//! `Content-Length`/`Content-Range`, says `Accept-Ranges: none`, and is typed `video/mp2t`.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use crate::body::Incoming;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body::{Body as HttpBody, Frame, SizeHint};
use sluice_media::mpegts::unwrap::{self, Outcome, TsUnwrap};
use sluice_media::query::{ProxyParams, Query};

use super::stream;
use crate::body::{self, Body, BoxError};
use crate::error::ProxyError;
use crate::upstream::Upstream;

/// A body transformation a request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transformer {
    /// Strip whatever precedes the first run of aligned TS packets.
    TsStream,
}

/// The request's `transformer`, if any; an unknown name is a 400 naming the ones that exist.
pub fn parse(query: &Query) -> Result<Option<Transformer>, ProxyError> {
    match query.get("transformer").map(str::trim) {
        None | Some("") => Ok(None),
        Some("ts_stream") => Ok(Some(Transformer::TsStream)),
        Some(other) => Err(ProxyError::downstream(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("unknown transformer `{other}`: the one sluice knows is `ts_stream`"),
        )),
    }
}

/// The stream pipe with a transformer: the whole object fetched (method kept, no client Range),
/// the body transformed on the way through. Error answers pass untouched.
pub async fn pipe(
    upstream: &Upstream,
    req: &Request<Incoming>,
    params: &ProxyParams,
    transformer: Transformer,
) -> Result<Response<Body>, ProxyError> {
    let mut request = stream::fetch_request(params)?;
    request.method = req.method().clone();
    let up = upstream
        .send(request)
        .await
        .map_err(|e| ProxyError::from_upstream(&e))?;
    let resp = stream::respond(up, params, Some(content_type(transformer)))?;
    Ok(apply(resp, transformer))
}

/// Transforms an answer's body and fixes its headers; a non-2xx answer is left alone.
pub fn apply(resp: Response<Body>, transformer: Transformer) -> Response<Body> {
    if !resp.status().is_success() {
        return resp;
    }
    let (mut parts, inner) = resp.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::CONTENT_RANGE);
    parts
        .headers
        .insert(header::ACCEPT_RANGES, HeaderValue::from_static("none"));
    // A 206 the origin sent despite our whole-object GET no longer describes these bytes.
    if parts.status == StatusCode::PARTIAL_CONTENT {
        parts.status = StatusCode::OK;
    }
    let body = match transformer {
        Transformer::TsStream => body::boxed(Unwrapped {
            inner,
            unwrap: TsUnwrap::new(unwrap::DEFAULT_WINDOW),
            done: false,
        }),
    };
    Response::from_parts(parts, body)
}

/// The whole-body form, for segments the prefetcher already holds.
pub fn apply_whole(bytes: Bytes, transformer: Transformer) -> Bytes {
    match transformer {
        Transformer::TsStream => unwrap::unwrap_whole(bytes, unwrap::DEFAULT_WINDOW),
    }
}

/// What the transformed body is, whatever the upstream called it (`image/png`, `text/css`).
pub fn content_type(transformer: Transformer) -> HeaderValue {
    match transformer {
        Transformer::TsStream => HeaderValue::from_static("video/mp2t"),
    }
}

/// A body whose data frames go through [`TsUnwrap`]; trailers pass as they are.
struct Unwrapped {
    inner: Body,
    unwrap: TsUnwrap,
    done: bool,
}

impl HttpBody for Unwrapped {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        if let Some(out) = this.unwrap.push(data) {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    this.done = true;
                    let rest = this.unwrap.finish();
                    match this.unwrap.outcome() {
                        Outcome::Stripped(n) => tracing::debug!(stripped = n, "ts_stream"),
                        _ => tracing::debug!("ts_stream: no TS start found, body passed as is"),
                    }
                    if let Some(out) = rest {
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        // The length changes by however much wrapper there is.
        SizeHint::default()
    }
}
