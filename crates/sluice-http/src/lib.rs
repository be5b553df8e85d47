//! Pure HTTP and L4 logic for sluice. No I/O, no async runtime: bytes and headers in, typed values
//! out, so every parser here is unit-tested, property-tested and fuzzed without sockets.
//!
//! # Layout
//! - `route`: host pattern + longest path prefix → target; the route table, built once from config.
//! - `path`: request path normalisation (dot segments, encoded dots) before routing.
//! - `hop`: hop-by-hop headers, including those named in `Connection`; upgrade detection.
//! - `forwarded`: `X-Forwarded-*`, `Forwarded` and `Via` with trusted-proxy semantics.
//! - `framing`: request framing checks against smuggling (CL+TE, duplicate CL, bad TE).
//! - `proxy_protocol`: PROXY protocol v1/v2 headers: parse (with an "incomplete" case) and encode.
//! - `client_hello`: the SNI and ALPN of a TLS ClientHello, peeked without terminating TLS.

pub mod client_hello;
pub mod forwarded;
pub mod framing;
pub mod hop;
pub mod path;
pub mod proxy_protocol;
pub mod route;
