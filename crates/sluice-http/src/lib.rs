//! Pure HTTP and L4 logic for sluice. No I/O, no async runtime: bytes and headers in, typed values
//! out, so every parser here is unit-tested, property-tested and fuzzed without sockets.
//!
//! # Layout
//! - `route`: host pattern + longest path prefix → target; the route table, built once from config.
//! - `path`: request path normalisation (dot segments, encoded dots) before routing.
//! - `host`: `Host` / `:authority` validation (one host, no shape two parsers read differently).
//! - `fields`: request fields not passed on by default (underscore twins, method/URL overrides).
//! - `hop`: hop-by-hop headers, including those named in `Connection`; upgrade detection.
//! - `forwarded`: `X-Forwarded-*`, `Forwarded` and `Via` with trusted-proxy semantics.
//! - `framing`: request framing checks against smuggling (CL+TE, duplicate CL, bad TE).
//! - `h1screen`: follows an HTTP/1.1 request stream head to body to head; refuses ambiguous framing.
//! - `proxy_protocol`: PROXY protocol v1/v2 headers: parse (with an "incomplete" case) and encode.
//! - `client_hello`: the SNI and ALPN of a TLS ClientHello, peeked without terminating TLS.
//! - `cache_control`: `Cache-Control` / `CDN-Cache-Control` directives (RFC 9111 §5.2, RFC 9213).
//! - `freshness`: may a response be stored, for how long, its age, `Vary` (RFC 9111, RFC 5861).
//! - `cache_status`: the `Cache-Status` response field (RFC 9211).
//! - `conditional`: `If-None-Match` / `If-Modified-Since` against a stored response (→ 304).
//! - `coding`: which content codings a client accepts (`Accept-Encoding`).
//! - `range`: `Range` sets, `Content-Range`, and the aligned slices that cover them.
//! - `response_head`: an HTTP/1.x response head off a raw socket and how its body is delimited.
//! - `plain_head`: an HTTP/1.1 response head passed on as it came, when nothing in it needs editing.
//! - `wire`: field names and values from a parsed HTTP/1 head, without a second check.
//! - `chunked`: a chunked response body decoded incrementally, its end found exactly.
//! - `location`: a redirect's `Location` resolved against the URI that answered.

pub mod cache_control;
pub mod cache_status;
pub mod chunked;
pub mod client_hello;
pub mod coding;
pub mod conditional;
pub mod fields;
pub mod forwarded;
pub mod framing;
pub mod freshness;
pub mod h1screen;
pub mod hop;
pub mod host;
pub mod location;
pub mod path;
pub mod plain_head;
pub mod proxy_protocol;
pub mod range;
pub mod response_head;
pub mod route;
pub mod wire;
