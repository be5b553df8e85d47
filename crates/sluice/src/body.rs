//! The response body type every front end returns, and its constructors.

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty, Full};

/// Boxed error carried by streaming bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One body type for every response sluice writes.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A body with all its bytes known up front.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A body with no bytes (HEAD, 204, 304).
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// `bytes` as the answer to a request with `method`: no body for HEAD (its headers still carry
/// the length of the GET answer).
pub fn full_unless_head(method: &http::Method, bytes: impl Into<Bytes>) -> Body {
    if method == http::Method::HEAD {
        empty()
    } else {
        full(bytes)
    }
}

/// A streaming body from any `http_body::Body` whose errors convert to [`BoxError`].
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}
