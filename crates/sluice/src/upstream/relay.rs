//! Upstream exchanges of any method, with a request body that is sent once (streamed) or replayed
//! across redirects (held whole), and every redirect's target put to the caller's host rules;
//! the bodiless `send` is the empty case.

use bytes::Bytes;
use http::{header, Method, StatusCode};
use url::Url;

use super::{
    guard, host_of, Upstream, UpstreamBody, UpstreamError, UpstreamRequest, UpstreamResponse,
    CREDENTIAL_FIELDS,
};
use crate::body::{self, Body};

/// The body of a relayed request.
pub enum RelayBody {
    /// No body (GET, HEAD, most DELETEs).
    Empty,
    /// A body held whole: sent again when a 307 or 308 redirect asks for it.
    Whole(Bytes),
    /// A body streamed as it arrives: it can be sent only once, so a redirect is not followed
    /// but answered as it is.
    Stream(Body),
}

/// Headers that describe a request body, dropped when a redirect turns the request into a GET.
const BODY_FIELDS: [header::HeaderName; 3] = [
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
];

impl Upstream {
    /// Sends `req` with `body`, following redirects as a browser does (303, and 301/302 after a
    /// POST, continue as a GET without the body; 307/308 keep the method and the body), except
    /// that a streamed body's redirect is answered as it is. A redirect to a URL `allowed` refuses
    /// is not followed: the answer is [`UpstreamError::RedirectRefused`] (the first URL is the
    /// caller's to check).
    pub async fn relay(
        &self,
        req: UpstreamRequest,
        body: RelayBody,
        allowed: &(dyn Fn(&Url) -> bool + Sync),
    ) -> Result<UpstreamResponse, UpstreamError> {
        let UpstreamRequest {
            mut method,
            mut url,
            mut headers,
        } = req;
        if !headers.contains_key(header::USER_AGENT) {
            headers.insert(header::USER_AGENT, self.user_agent.clone());
        }
        // Kept across redirects: a redirect back to this sluice must show it (`guard::LOOP_HEADER`).
        headers.insert(guard::LOOP_HEADER, guard::loop_mark().clone());
        let mut body = Some(body);
        let mut redirects = 0;
        // One time-to-headers deadline for every hop: reset at each redirect, a request and its
        // `max_redirects` slow hops had a header timeout each (6 × 30 s at the defaults).
        let deadline = tokio::time::Instant::now() + self.header_timeout;
        loop {
            let (this_body, replayable) = match body.take() {
                None | Some(RelayBody::Empty) => (body::empty(), true),
                Some(RelayBody::Whole(bytes)) => {
                    let once = body::full(bytes.clone());
                    body = Some(RelayBody::Whole(bytes));
                    (once, true)
                }
                Some(RelayBody::Stream(stream)) => (stream, false),
            };
            let resp = self
                .send_once(&method, &url, &headers, this_body, deadline)
                .await?;
            let next = match replayable {
                true => self.redirect_target(&url, &resp)?,
                false => None,
            };
            let Some(next) = next else {
                let host = host_of(&url);
                let (parts, incoming) = resp.into_parts();
                return Ok(UpstreamResponse {
                    status: parts.status,
                    headers: parts.headers,
                    body: UpstreamBody::new(
                        incoming,
                        self.idle_timeout,
                        host,
                        self.metrics.bytes.clone(),
                    )
                    .whole_deadline(self.whole_body_timeout),
                    final_url: url,
                });
            };
            redirects += 1;
            if redirects > self.max_redirects {
                return Err(UpstreamError::TooManyRedirects {
                    host: host_of(&url),
                    limit: self.max_redirects,
                });
            }
            if !allowed(&next) {
                return Err(UpstreamError::RedirectRefused {
                    host: host_of(&next),
                });
            }
            if becomes_get(&method, resp.status()) {
                method = Method::GET;
                body = None;
                for name in BODY_FIELDS {
                    headers.remove(name);
                }
            }
            if next.origin() != url.origin() {
                for name in CREDENTIAL_FIELDS {
                    headers.remove(name);
                }
                // A `Host` set for the first origin (an `h_host` parameter) named that origin:
                // hyper adds the new one's only when the field is absent.
                headers.remove(header::HOST);
            }
            url = next;
        }
    }
}

/// Whether a redirect with `status` turns a `method` request into a bodiless GET (RFC 9110
/// 15.4: 303 always except for HEAD, 301 and 302 after a POST, as every client does).
fn becomes_get(method: &Method, status: StatusCode) -> bool {
    match status.as_u16() {
        303 => *method != Method::HEAD && *method != Method::GET,
        301 | 302 => *method == Method::POST,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_methods() {
        let see_other = StatusCode::SEE_OTHER;
        assert!(becomes_get(&Method::POST, see_other));
        assert!(becomes_get(&Method::PUT, see_other));
        assert!(!becomes_get(&Method::HEAD, see_other));
        assert!(becomes_get(&Method::POST, StatusCode::FOUND));
        assert!(!becomes_get(&Method::PUT, StatusCode::FOUND));
        assert!(!becomes_get(&Method::POST, StatusCode::TEMPORARY_REDIRECT));
        assert!(!becomes_get(&Method::POST, StatusCode::PERMANENT_REDIRECT));
    }
}
