//! Pure HTTP and L4 logic for sluice. No I/O, no async runtime: bytes and headers in, typed values
//! out, so every parser here is unit-tested, property-tested and fuzzed without sockets.
//!
//! # Layout
//! (each module adds its line here as it lands)
