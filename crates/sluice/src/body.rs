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

/// gzip data as a body inflated while the client reads it (the guides' XML for clients that
/// take no gzip): a request holds the inflate state and one 64 KiB chunk, never a copy of the
/// whole, however slowly it reads. At most `len` bytes come out; data that fails to inflate
/// (checked when stored, so a bug) ends the body short of its length, a broken transfer.
pub fn inflated(gz: Bytes, len: usize) -> Body {
    let chunks = sluice_media::gzip::Inflater::new(gz, len).map(|chunk| {
        chunk
            .map(|c| http_body::Frame::data(Bytes::from(c)))
            .map_err(|e| std::io::Error::other(e.to_string()))
    });
    boxed(http_body_util::StreamBody::new(futures_util::stream::iter(
        chunks,
    )))
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

/// A request body as it arrives from the client: hyper's own (HTTP/1.1, HTTP/2), or one the server
/// adapts from another transport (HTTP/3). Front ends read it only through `http_body::Body`, so
/// every protocol takes the same request path.
pub enum Incoming {
    Hyper(hyper::body::Incoming),
    Adapted(std::pin::Pin<Box<dyn http_body::Body<Data = Bytes, Error = BoxError> + Send + Sync>>),
}

/// Why reading a request body failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Hyper(#[from] hyper::Error),
    /// The adapted transport's own failure (the client reset the stream, the connection closed).
    #[error("{0}")]
    Adapted(BoxError),
}

impl Incoming {
    /// A body from another transport.
    pub fn adapted<B>(body: B) -> Incoming
    where
        B: http_body::Body<Data = Bytes, Error = BoxError> + Send + Sync + 'static,
    {
        Incoming::Adapted(Box::pin(body))
    }
}

impl From<hyper::body::Incoming> for Incoming {
    fn from(body: hyper::body::Incoming) -> Incoming {
        Incoming::Hyper(body)
    }
}

impl http_body::Body for Incoming {
    type Data = Bytes;
    type Error = ReadError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, ReadError>>> {
        match self.get_mut() {
            Incoming::Hyper(b) => std::pin::Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(ReadError::Hyper))),
            Incoming::Adapted(b) => b
                .as_mut()
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(ReadError::Adapted))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Incoming::Hyper(b) => b.is_end_stream(),
            Incoming::Adapted(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            Incoming::Hyper(b) => b.size_hint(),
            Incoming::Adapted(b) => b.size_hint(),
        }
    }
}
