//! The proxy error: which side failed (downstream, upstream, internal), the status it maps to, and a
//! short JSON body a user can act on. Messages never carry secrets or full upstream URLs.

pub mod upstream;

use http::{header, Response, StatusCode};

use crate::body::{self, Body};
use crate::logging::WarnLimit;
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
    ///
    /// At most one warning a second ([`FAILURE_WARNINGS`]), the others at debug: a token holder
    /// asking for streams that do not exist makes one per request, at whatever rate it sends.
    pub fn unnamed(self, upstream: &str) -> Self {
        // An origin's own error status (a provider's 404 for a stream id a client made up: as many
        // as a client asks for) has a limit of its own, so it cannot hold back the first warning
        // of an origin that fails.
        let limit = match self.kind {
            "upstream_status" if self.status.is_client_error() => &STATUS_WARNINGS,
            _ => &FAILURE_WARNINGS,
        };
        self.unnamed_limited(upstream, limit)
    }

    /// [`ProxyError::unnamed`], its warnings kept to what `limit` allows.
    fn unnamed_limited(mut self, upstream: &str, limit: &WarnLimit) -> Self {
        if self.unnamed || (self.upstream.is_none() && self.side != Side::Upstream) {
            return self;
        }
        let host = self.upstream.as_deref().unwrap_or("");
        match limit.allow_now() {
            Some(suppressed) => tracing::warn!(
                upstream = host,
                kind = self.kind,
                error = %self.message,
                suppressed,
                "upstream request failed"
            ),
            None => tracing::debug!(
                upstream = host,
                kind = self.kind,
                error = %self.message,
                "upstream request failed"
            ),
        }
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

/// The "upstream request failed" warning of [`ProxyError::unnamed`], shared by every upstream
/// and kind: at most one a second, the count of those held back in the next.
static FAILURE_WARNINGS: WarnLimit = WarnLimit::new(1000);

/// The same for an origin's error status (`upstream_status`).
static STATUS_WARNINGS: WarnLimit = WarnLimit::new(1000);

/// Left on error responses so the server can count them by side and kind.
#[derive(Debug, Clone, Copy)]
pub struct ErrorMark {
    pub side: Side,
    pub kind: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Keeps the level of each event logged while it is the default subscriber.
    struct Levels(Arc<Mutex<Vec<tracing::Level>>>);

    impl tracing::Subscriber for Levels {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            self.0.lock().unwrap().push(*event.metadata().level());
        }
    }

    /// A burst of failures (a token holder asking for 100 streams the provider does not have)
    /// is one warning, the other 99 at debug: every one was a warning, at whatever rate the
    /// client sent. The limit's window never ends here (no clock in the test).
    #[test]
    fn a_burst_of_failures_is_one_warning() {
        let limit = WarnLimit::new(u64::MAX);
        let levels = Arc::new(Mutex::new(Vec::new()));
        let guard = tracing::subscriber::set_default(Levels(Arc::clone(&levels)));
        for _ in 0..100 {
            let e =
                ProxyError::upstream_status(StatusCode::NOT_FOUND, "provider.example", "a stream");
            let e = e.unnamed_limited("the XC provider", &limit);
            assert_eq!(e.message, "the XC provider answered 404");
            assert!(e.upstream.is_none());
        }
        drop(guard);
        let levels = levels.lock().unwrap();
        let count = |level| levels.iter().filter(|l| **l == level).count();
        assert_eq!(count(tracing::Level::WARN), 1, "{levels:?}");
        assert_eq!(count(tracing::Level::DEBUG), 99, "{levels:?}");
    }

    /// An unusable redirect's `Location` (the origin's, up to a header block) is kept masked and
    /// cut to 256 bytes in the error, which goes to the log and the client: it was kept whole,
    /// its credentials with it.
    #[test]
    fn a_bad_redirect_keeps_its_location_masked_and_cut() {
        let long = format!(
            "gopher://user:secret@evil.example/{}?token=abc&x=1",
            "a".repeat(64 * 1024)
        );
        let e = UpstreamError::bad_redirect("h.example".into(), long.as_bytes());
        let UpstreamError::BadRedirect { location, .. } = &e else {
            panic!("{e:?}")
        };
        assert!(
            location.len() <= upstream::REDIRECT_SHOWN,
            "{}",
            location.len()
        );
        assert!(
            location.starts_with("gopher://user:****@evil.example/aaa"),
            "{location}"
        );
        assert!(location.ends_with("..."), "{location}");
        let text = ProxyError::from_upstream(&e).message;
        assert!(!text.contains("secret"), "{text}");
        assert!(text.len() < 400, "{}", text.len());

        // A short one is masked and kept whole; a cut never splits a character.
        let e = UpstreamError::bad_redirect("h".into(), b"ftp://h/x?token=abc");
        assert!(e.to_string().ends_with(": ftp://h/x?token=****"), "{e}");
        let wide = "\u{e9}".repeat(300);
        let e = UpstreamError::bad_redirect("h".into(), wide.as_bytes());
        let UpstreamError::BadRedirect { location, .. } = &e else {
            panic!("{e:?}")
        };
        assert!(location.len() <= upstream::REDIRECT_SHOWN);
        assert!(location.starts_with("\u{e9}\u{e9}") && location.ends_with("..."));
    }
}
