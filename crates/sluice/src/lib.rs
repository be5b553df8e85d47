//! sluice: one binary for five streaming proxy jobs.
//!
//! # Layout
//! - `body`: the response body type every front end returns.


pub mod body;
