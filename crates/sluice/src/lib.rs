//! sluice: one binary for five streaming proxy jobs.
//!
//! # Layout
//! - `body`: the response body type every front end returns.
//! - `error`: the proxy error that knows which side failed.
