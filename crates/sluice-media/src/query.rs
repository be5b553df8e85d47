//! MediaFlow-style query parameters parsed into a typed value.
