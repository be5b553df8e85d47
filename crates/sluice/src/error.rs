//! The proxy error: which side failed (downstream, upstream, internal), the status it maps to, and a
//! short JSON body a user can act on. Messages never carry secrets or full upstream URLs.

pub mod upstream;

use http::{header, Response, StatusCode};

use crate::body::{self, Body};
use upstream::{ConnectError, UpstreamError};

/// What a request body whose framing breaks its own head (a length it does not keep) is answered
/// with, by the proxy as it forwards and by the HTTP/3 server before it does: one wording.
pub const MALFORMED_BODY: &str = "the request body's framing is invalid";

/// The side of the proxy that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Downstream,
    Upstream,
    Internal,
}

impl Side {
    pub fn label(self) -> &'static str {
        match self {
            Side::Downstream => "downstream",
            Side::Upstream => "upstream",
            Side::Internal => "internal",
        }
    }
}

/// A failed request, ready to become a response.
#[derive(Debug, Clone)]
pub struct ProxyError {
    pub side: Side,
    pub status: StatusCode,
    /// Stable machine-readable kind, also the metric label.
    pub kind: &'static str,
    pub message: String,
    /// The upstream host concerned, if any.
    pub upstream: Option<String>,
    /// Seconds after which a retry can succeed (`Retry-After` on the answer).
    pub retry_after: Option<u64>,
    /// Already rewritten by [`ProxyError::unnamed`]: a second call (an XC request under a path
    /// token goes through two) neither logs it again nor rewords it.
    unnamed: bool,
}

impl ProxyError {
    pub fn new(
        side: Side,
        status: StatusCode,
        kind: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ProxyError {
            side,
            status,
            kind,
            message: message.into(),
            upstream: None,
            retry_after: None,
            unnamed: false,
        }
    }

    /// Tells the client when to retry (a `Retry-After` header in seconds).
    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// Appends a detail to the message.
    pub fn with_detail(mut self, detail: impl std::fmt::Display) -> Self {
        self.message = format!("{}: {detail}", self.message);
        self
    }

    /// A client error: bad request, bad credentials.
    pub fn downstream(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self::new(Side::Downstream, status, kind, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            Side::Internal,
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            message,
        )
    }

    /// Maps an upstream failure: unreachable → 502, timeouts → 504, refused by the guard → 403.
    pub fn from_upstream(e: &UpstreamError) -> Self {
        let (side, status, kind) = match e {
            UpstreamError::Connect(ConnectError::Refused { .. }) => (
                Side::Downstream,
                StatusCode::FORBIDDEN,
                "upstream_not_allowed",
            ),
            UpstreamError::Connect(ConnectError::Timeout { .. }) => (
                Side::Upstream,
                StatusCode::GATEWAY_TIMEOUT,
                "connect_timeout",
            ),
            UpstreamError::Connect(ConnectError::Dns { .. }) => {
                (Side::Upstream, StatusCode::BAD_GATEWAY, "dns")
            }
            UpstreamError::Connect(ConnectError::Tls { .. }) => {
                (Side::Upstream, StatusCode::BAD_GATEWAY, "tls")
            }
            UpstreamError::Connect(ConnectError::Proxy { .. }) => {
                (Side::Upstream, StatusCode::BAD_GATEWAY, "outgoing_proxy")
            }
            UpstreamError::Connect(_) => (Side::Upstream, StatusCode::BAD_GATEWAY, "connect"),
            UpstreamError::HeaderTimeout { .. } => (
                Side::Upstream,
                StatusCode::GATEWAY_TIMEOUT,
                "header_timeout",
            ),
            UpstreamError::TooManyRedirects { .. } | UpstreamError::BadRedirect { .. } => {
                (Side::Upstream, StatusCode::BAD_GATEWAY, "redirect")
            }
            UpstreamError::Protocol { .. } => (Side::Upstream, StatusCode::BAD_GATEWAY, "protocol"),
            UpstreamError::RedirectRefused { .. } => (
                Side::Downstream,
                StatusCode::FORBIDDEN,
                "redirect_not_allowed",
            ),
        };
        ProxyError {
            side,
            status,
            kind,
            message: e.to_string(),
            upstream: e.host().map(str::to_string),
            retry_after: None,
            unnamed: false,
        }
    }

    /// An upstream answered without success where the proxy needs the body: a 4xx/5xx status is
    /// passed on (players react to 403 or 404), anything else becomes 502.
    pub fn upstream_status(status: StatusCode, host: &str, what: &str) -> Self {
        let mapped = if status.is_client_error() || status.is_server_error() {
            status
        } else {
            StatusCode::BAD_GATEWAY
        };
        let mut e = Self::new(
            Side::Upstream,
            mapped,
            "upstream_status",
            format!("upstream {host} answered {status} for {what}"),
        );
        e.upstream = Some(host.to_string());
        e
    }

    /// The error as a client that may not learn the upstream's address sees it (the holder of a
    /// token, which hides its destination): an error about `upstream` (`"the XC provider"`,
    /// `"the upstream"`) keeps its status, side and kind and names no host; the full error is
    /// logged here, for the operator. Any other error (a bad parameter) is left as it is, and so
    /// is one already unnamed: the first wording (`"the XC provider"`) stands, logged once.
    pub fn unnamed(mut self, upstream: &str) -> Self {
        if self.unnamed || (self.upstream.is_none() && self.side != Side::Upstream) {
            return self;
        }
        tracing::warn!(
            upstream = self.upstream.as_deref().unwrap_or(""),
            kind = self.kind,
            error = %self.message,
            "upstream request failed"
        );
        self.message = match self.kind {
            "upstream_status" => format!("{upstream} answered {}", self.status.as_u16()),
            kind => format!("{upstream} request failed ({kind})"),
        };
        self.upstream = None;
        self.unnamed = true;
        self
    }

    /// The JSON error response.
    pub fn into_response(self) -> Response<Body> {
        let mut json = serde_json::json!({
            "error": self.message,
            "kind": self.kind,
            "side": self.side.label(),
        });
        if let Some(host) = &self.upstream {
            json["upstream"] = serde_json::Value::String(host.clone());
        }
        let mut resp = Response::new(body::full(json.to_string()));
        *resp.status_mut() = self.status;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
        resp.extensions_mut().insert(ErrorMark {
            side: self.side,
            kind: self.kind,
        });
        resp
    }
}

/// Left on error responses so the server can count them by side and kind.
#[derive(Debug, Clone, Copy)]
pub struct ErrorMark {
    pub side: Side,
    pub kind: &'static str,
}
