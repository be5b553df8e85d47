//! Any text through `path::normalize_path`, then `check_hidden_dot_segments` on what it returns,
//! as the router does. A normalised path starts with `/`, has no `.`, `..` or empty segment
//! (but a trailing slash), is its own normal form and is borrowed exactly when it was already
//! normal; a path both steps pass holds no `..` for a server that decodes it once or twice, reads
//! `\` as `/`, cuts a segment's name at `;` and trims its trailing dots and spaces.
#![no_main]

use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;
use sluice_http::path::{check_hidden_dot_segments, normalize_path};

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Every valid `%XX` escape decoded (any byte), everything else as it is.
fn decode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            if let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            ) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// Whether a segment's name (before any `;`) is `..` once trailing dots and spaces are trimmed.
fn climbs(segment: &[u8]) -> bool {
    let name = segment.split(|&b| b == b';').next().unwrap_or_default();
    name.starts_with(b"..") && name.iter().all(|&b| b == b'.' || b == b' ')
}

fn has_dot_dot(view: &[u8]) -> bool {
    view.split(|&b| b == b'/' || b == b'\\').any(climbs)
}

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    // The raw path too: never a panic, and the same answer twice.
    assert_eq!(
        check_hidden_dot_segments(raw),
        check_hidden_dot_segments(raw)
    );
    let normal = normalize_path(raw);
    assert_eq!(normal, normalize_path(raw));
    let Ok(n) = normal else {
        return;
    };
    assert!(n.starts_with('/'));
    let segments: Vec<&str> = n[1..].split('/').collect();
    for (i, seg) in segments.iter().enumerate() {
        assert!(*seg != "." && *seg != "..", "{n:?}");
        // Empty only as the last one (a trailing slash), or the root's.
        assert!(!seg.is_empty() || i + 1 == segments.len(), "{n:?}");
    }
    // No control byte passes, and every escape left is a reserved byte's, in upper case.
    assert!(!n.bytes().any(|b| b.is_ascii_control()));
    let bytes = n.as_bytes();
    for (i, _) in n.match_indices('%') {
        let (h, l) = (bytes[i + 1], bytes[i + 2]);
        assert!(!h.is_ascii_lowercase() && !l.is_ascii_lowercase(), "{n:?}");
        let v = hex(h).unwrap() * 16 + hex(l).unwrap();
        assert!(
            !(v.is_ascii_alphanumeric() || b"-._~".contains(&v)),
            "{n:?}"
        );
    }
    // Its own normal form; borrowed only when the input was already normal.
    assert_eq!(normalize_path(&n), Ok(n.clone()));
    if matches!(n, Cow::Borrowed(_)) {
        assert_eq!(*n, *raw);
    }
    let checked = check_hidden_dot_segments(&n);
    assert_eq!(checked, check_hidden_dot_segments(&n));
    if checked.is_ok() {
        let once = decode(n.as_bytes());
        let twice = decode(&once);
        for view in [n.as_bytes(), &once, &twice] {
            assert!(
                !has_dot_dot(view),
                "{n:?} passed, but reads as {:?}",
                String::from_utf8_lossy(view)
            );
        }
    }
});
