//! `/proxy/stream[/{filename}]` and the byte pipe it shares with the HLS endpoints.
//!
//! One upstream URL: Range and If-Range go upstream, the status and `Content-Range` come back as
//! they are, HEAD stays HEAD, and the body streams with backpressure (dropping the client drops
//! the upstream request), or is spliced socket to socket where both sides allow it (`spliced`).

use crate::atomic::Counter;
use crate::body::Incoming;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use sluice_media::query::ProxyParams;

use crate::body::{self, Body};
use crate::error::ProxyError;
use crate::request::RequestContext;
use crate::upstream::{Upstream, UpstreamRequest, UpstreamResponse};

/// Upstream response headers a player needs; everything else (hop-by-hop, cookies, server identity)
/// stays behind.
const MIRRORED: &[HeaderName] = &[
    header::ACCEPT_RANGES,
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::CONTENT_RANGE,
    header::CONTENT_ENCODING,
    header::LAST_MODIFIED,
    header::ETAG,
    header::CACHE_CONTROL,
    header::EXPIRES,
];

/// Client request headers that go upstream.
const FORWARDED: &[HeaderName] = &[header::RANGE, header::IF_RANGE];

/// Proxies one stream; with `splice` (counting spliced bodies), plain HTTP/1.1 bodies of known
/// length may be spliced (`spliced`).
pub async fn serve(
    upstream: &Upstream,
    req: &Request<Incoming>,
    ctx: &RequestContext,
    filename: Option<&str>,
    splice: Option<&Counter>,
) -> Result<Response<Body>, ProxyError> {
    let params = parse_params(ctx)?;
    let mut resp = match super::transform::parse(&ctx.query)? {
        Some(t) => super::transform::pipe(upstream, req, &params, t).await?,
        None => match splice.and_then(|c| Some((c, super::spliced::tap_for(req, &params)?))) {
            Some((counter, tap)) => {
                // One time-to-headers deadline for the spliced try and the streamed one after it
                // (a redirect, a body that cannot be spliced): a header timeout each was twice
                // the wait for a viewer.
                let deadline = upstream.header_deadline();
                let spliced =
                    super::spliced::serve(upstream, req, &params, tap, counter, deadline).await?;
                match spliced {
                    Some(resp) => resp,
                    None => {
                        let up = upstream
                            .send_by(upstream_request(req, &params)?, deadline)
                            .await
                            .map_err(|e| ProxyError::from_upstream(&e))?;
                        respond(up, &params, None)?
                    }
                }
            }
            None => pipe(upstream, req, &params, None).await?,
        },
    };
    if let Some(name) = filename {
        resp.headers_mut()
            .insert(header::CONTENT_DISPOSITION, content_disposition(name));
    }
    // Any URL can be piped here, an attacker's HTML page included, and it would run on the proxy's
    // origin, where the password cookie lives. A sandbox policy gives the page an opaque origin
    // and no scripts. Set on every answer (media ignores it) because a type-based rule could be
    // dodged by an origin that lies about its Content-Type; `r_*` cannot override it.
    resp.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox"),
    );
    Ok(resp)
}

/// The shared proxy parameters of the request, or a 400 naming the bad one.
pub fn parse_params(ctx: &RequestContext) -> Result<ProxyParams, ProxyError> {
    ProxyParams::from_query(&ctx.query)
        .map_err(|e| ProxyError::downstream(StatusCode::BAD_REQUEST, "bad_request", e.to_string()))
}

/// The byte pipe every streaming endpoint shares: one upstream exchange, its status and player
/// headers mirrored, `content_type` (if any) in place of the upstream's, then the params applied.
pub async fn pipe(
    upstream: &Upstream,
    req: &Request<Incoming>,
    params: &ProxyParams,
    content_type: Option<HeaderValue>,
) -> Result<Response<Body>, ProxyError> {
    let up = upstream
        .send(upstream_request(req, params)?)
        .await
        .map_err(|e| ProxyError::from_upstream(&e))?;
    respond(up, params, content_type)
}

/// Turns an upstream response into the client's: status, mirrored headers, streaming body.
pub fn respond(
    up: UpstreamResponse,
    params: &ProxyParams,
    content_type: Option<HeaderValue>,
) -> Result<Response<Body>, ProxyError> {
    let mut resp = Response::new(body::boxed(up.body));
    *resp.status_mut() = up.status;
    let headers = resp.headers_mut();
    mirror_headers(&up.headers, headers);
    // An upstream error page keeps its own type.
    if let Some(value) = content_type.filter(|_| up.status.is_success()) {
        headers.insert(header::CONTENT_TYPE, value);
    }
    apply_params(params, headers)?;
    Ok(resp)
}

/// The upstream request: method kept, range headers forwarded, `h_*` applied.
pub fn upstream_request(
    req: &Request<Incoming>,
    params: &ProxyParams,
) -> Result<UpstreamRequest, ProxyError> {
    build_request(req.method().clone(), Some(req.headers()), params)
}

/// A GET of the destination with only the `h_*` headers: for bodies the proxy reads whole
/// (playlists), where the client's Range is meaningless.
pub fn fetch_request(params: &ProxyParams) -> Result<UpstreamRequest, ProxyError> {
    build_request(Method::GET, None, params)
}

fn build_request(
    method: Method,
    client: Option<&HeaderMap>,
    params: &ProxyParams,
) -> Result<UpstreamRequest, ProxyError> {
    let mut headers = HeaderMap::new();
    for name in FORWARDED {
        if let Some(v) = client.and_then(|h| h.get(name)) {
            headers.insert(name.clone(), v.clone());
        }
    }
    for (name, value) in &params.request_headers {
        let (name, value) = header_pair(name, value)?;
        headers.insert(name, value);
    }
    Ok(UpstreamRequest {
        method,
        url: params.destination.clone(),
        headers,
    })
}

/// Copies the [`MIRRORED`] fields of the upstream's head. A `Content-Length` sent beside
/// `Transfer-Encoding` is not the body's length (the encoding frames the body, RFC 9112 6.3, and
/// hyper keeps both fields in the head it hands over): mirrored, it would cut the client's body
/// short or leave it waiting for bytes that never come.
pub fn mirror_headers(from: &HeaderMap, to: &mut HeaderMap) {
    let encoded = from.contains_key(header::TRANSFER_ENCODING);
    for name in MIRRORED {
        if encoded && *name == header::CONTENT_LENGTH {
            continue;
        }
        for value in from.get_all(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

/// `x_headers` removes, then `r_*` and `rp_*` set response headers; last, `nosniff`, which no
/// parameter can remove: every `/proxy/*` answer ends here, and browsers must take its type as
/// given instead of guessing HTML from the bytes of a "video".
pub fn apply_params(params: &ProxyParams, headers: &mut HeaderMap) -> Result<(), ProxyError> {
    for name in &params.strip_headers {
        headers.remove(name.as_str());
    }
    for (name, value) in params
        .response_headers
        .iter()
        .chain(&params.propagate_headers)
    {
        let (name, value) = header_pair(name, value)?;
        headers.insert(name, value);
    }
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    Ok(())
}

fn header_pair(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), ProxyError> {
    let bad = || {
        ProxyError::downstream(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("header `{name}` is not valid"),
        )
    };
    let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?;
    let value = HeaderValue::from_str(value).map_err(|_| bad())?;
    Ok((name, value))
}

/// `attachment; filename="..."`, with an RFC 5987 `filename*` when the name is not plain ASCII.
fn content_disposition(name: &str) -> HeaderValue {
    let ascii: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut value = format!("attachment; filename=\"{ascii}\"");
    if ascii != name {
        let encoded =
            percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC);
        value.push_str(&format!("; filename*=UTF-8''{encoded}"));
    }
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("attachment"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disposition_quotes_and_utf8() {
        assert_eq!(
            content_disposition("movie.mkv"),
            "attachment; filename=\"movie.mkv\""
        );
        assert_eq!(
            content_disposition("a\"b.mp4"),
            "attachment; filename=\"a_b.mp4\"; filename*=UTF-8''a%22b%2Emp4"
        );
        assert_eq!(
            content_disposition("été.mp4"),
            "attachment; filename=\"_t_.mp4\"; filename*=UTF-8''%C3%A9t%C3%A9%2Emp4"
        );
    }
}
