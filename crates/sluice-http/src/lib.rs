//! Pure HTTP and L4 logic for sluice. No I/O, no async runtime: bytes and headers in, typed values
//! out, so every parser here is unit-tested, property-tested and fuzzed without sockets.
//!
//! # Layout
//! (each module adds its line here as it lands)
//! - `proxy_protocol`: PROXY protocol v1/v2 headers: parse (with an "incomplete" case) and encode.
//! - `client_hello`: the SNI and ALPN of a TLS ClientHello, peeked without terminating TLS.

pub mod client_hello;
pub mod proxy_protocol;
