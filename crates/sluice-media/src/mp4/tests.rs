//! Unit tests for the box walker and the fragment parsers.
