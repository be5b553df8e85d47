//! Exact-output tests of `rewrite_playlist` and the classification helpers.
