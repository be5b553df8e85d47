//! RTSP client-side wire format, pure: server messages and interleaved frames, SDP, the
//! `Transport` and `Session` headers, Basic/Digest credentials, and catch-up time ranges.
//!
//! # Layout
//! - `message`: splits a control-connection byte stream into responses, server requests and
//!   `$`-framed interleaved packets, with bounds on every size.
//! - `sdp`: the MPEG-TS media section of a DESCRIBE answer and its control URL.
//! - `headers`: `Transport`, `Session` and `Public` header values.
//! - `auth`: `WWW-Authenticate` challenges and the `Authorization` answer (Basic, Digest MD5).
//! - `catchup`: `playseek`/`tvdr` values (rtp2httpd's formats) turned into UTC instants, RTSP
//!   `Range: clock=` values, or the same format shifted.

pub mod auth;
pub mod catchup;
pub mod headers;
pub mod message;
pub mod sdp;

pub use message::{next_item, Item, Limits, Message, Next, RtspError};
