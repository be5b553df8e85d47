//! Pure HTTP and L4 logic for sluice. No I/O, no async runtime: bytes and headers in, typed values
//! out, so every parser here is unit-tested, property-tested and fuzzed without sockets.
//!
//! # Layout
//! (each module adds its line here as it lands)
//! - `cache_control`: `Cache-Control` / `CDN-Cache-Control` directives (RFC 9111 §5.2, RFC 9213).
//! - `freshness`: may a response be stored, for how long, its age, `Vary` (RFC 9111, RFC 5861).
//! - `cache_status`: the `Cache-Status` response field (RFC 9211).
//! - `conditional`: `If-None-Match` / `If-Modified-Since` against a stored response (→ 304).
//! - `range`: `Range` sets, `Content-Range`, and the aligned slices that cover them.

pub mod cache_control;
pub mod cache_status;
pub mod conditional;
pub mod freshness;
pub mod range;
