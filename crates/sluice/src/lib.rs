//! sluice: one binary for five streaming proxy jobs.
//!
//! # Layout
//! - `body`: the response body type every front end returns.
//! - `iptv`: the IPTV gateway front end: multicast hubs to HTTP, playlist, status.
//! - `net`: socket services: multicast join on a named interface, batched receive.

pub mod body;
pub mod iptv;
pub mod net;
