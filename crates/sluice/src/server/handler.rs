//! What the server hands its requests to: a handler given to it at start-up by the composition
//! root, which owns the route table and the front ends. The server knows none of them; it calls
//! one entry per request, and on the HTTP/1.1 fast path one per simple request head.

use std::future::Future;
use std::net::SocketAddr;

use crate::body::Incoming;
use http::{HeaderMap, Method, Request, Response};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use super::activity::ActivityGuard;
use crate::body::Body;
use crate::metrics::HttpMetrics;

/// Which listener accepted a request's connection (an index into
/// `ServerConfig::listener_names`), put in the request's extensions by the server for every
/// listener but the main one: a request without one came from `ListenerId(0)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenerId(pub usize);

/// The dispatch above the server. Generic (not a trait object) in the server, so a request costs
/// no dynamic call and no allocation for reaching it.
pub trait Handler: Send + Sync + 'static {
    /// Serves one request (its extensions carry the [`ListenerId`], but the main listener's);
    /// `guard` is held until the response body ends, so the connection counts the request as in
    /// flight.
    fn handle(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
        guard: ActivityGuard,
    ) -> impl Future<Output = Response<Body>> + Send;

    /// A connection was accepted.
    fn connection_accepted(&self);

    /// The connection-level metrics (send and handshake timeouts, smuggling).
    fn http_metrics(&self) -> &HttpMetrics;

    /// The acceptor's families (pauses at the connection limit, connections open), registered
    /// with the others by whoever builds the handler ([`super::listener::AcceptMetrics::register`]).
    fn accept_metrics(&self) -> &super::listener::AcceptMetrics;

    /// Whether plain HTTP/1.1 connections offer handlers a splice tap (`spliced`).
    fn splices_streams(&self) -> bool;

    /// The certificates automatic HTTPS keeps, for the SNI resolver (`None`: certificate files
    /// only).
    #[cfg(feature = "tls")]
    fn managed_certs(&self) -> Option<super::tls::Managed> {
        None
    }

    /// Automatic HTTPS that completes TLS handshakes itself, reading the ClientHello first (for
    /// on-demand issuance, and TLS-ALPN-01 validations of other nodes' orders).
    #[cfg(feature = "acme")]
    fn acme_acceptor(&self) -> Option<std::sync::Arc<crate::acme::Acme>> {
        None
    }

    /// What [`Handler::fast_route`] found for a simple head, handed back to
    /// [`Handler::serve_fast`].
    #[cfg(feature = "reverse")]
    type FastRoute: Send + Sync;

    /// Whether any request could be served on the fast path now (else plain connections go
    /// straight to hyper).
    #[cfg(feature = "reverse")]
    fn has_fast_routes(&self) -> bool;

    /// Whether the fast path serves a simple GET or HEAD for `host` and the normalised `path` on
    /// `listener`; `None`: the connection goes to hyper.
    #[cfg(feature = "reverse")]
    fn fast_route(&self, listener: ListenerId, host: &str, path: &str) -> Option<Self::FastRoute>;

    /// Serves one simple request found by [`Handler::fast_route`], writing the response to
    /// `client`.
    #[cfg(feature = "reverse")]
    #[allow(clippy::too_many_arguments)]
    fn serve_fast<W: FastClient + Send + Sync>(
        &self,
        route: Self::FastRoute,
        req: FastRequest<'_>,
        path: &str,
        host: &str,
        peer: SocketAddr,
        client: &mut W,
        guard: ActivityGuard,
    ) -> impl Future<Output = Served> + Send;
}

/// The client connection the fast path writes to: a byte sink, and, where it is a plain TCP
/// socket, that socket, into which a large body is spliced past the writer (which then hears of
/// the progress through `wrote` and `write_blocked`, for the connection's send timeout).
pub trait FastClient: AsyncWrite + Unpin {
    /// The plain TCP socket under the writer; `None` where bytes must go through the writer.
    fn socket(&self) -> Option<&TcpStream>;
    /// Body bytes reached the socket past the writer.
    fn wrote(&self);
    /// A splice found the client's window shut.
    fn write_blocked(&self);
}

/// The client request the fast path serves: a GET or HEAD with no body, origin-form target.
pub struct FastRequest<'a> {
    pub method: Method,
    /// The path and query as the client sent them.
    pub target: &'a str,
    /// `target` parsed (its bytes shared with the head's field values).
    pub path_and_query: http::uri::PathAndQuery,
    pub headers: HeaderMap,
    /// The client asked for `Connection: close`, or the server is shutting down: the response
    /// says `Connection: close` and the connection ends after it.
    pub close: bool,
    /// The request came over TLS (`https`).
    pub secure: bool,
    /// The listener's `Alt-Svc` (HTTP/3 on the same port), for every response that has none.
    pub alt_svc: Option<http::HeaderValue>,
}

/// What happened to one fast-path request, for the connection and the server-level metrics.
#[derive(Debug, Clone, Copy)]
pub struct Served {
    pub status: u16,
    /// The response was delimited and complete: the client connection may carry another request.
    pub reusable: bool,
}
