//! Request path normalisation before routing, so a path cannot escape the route it appears to be
//! under (`/api/../admin` is routed as `/admin`). No I/O.
//!
//! Percent-encoded unreserved characters (letters, digits, `-._~`) are decoded, so `%2e%2e` is a
//! `..` segment; `.` and `..` segments are resolved; repeated slashes collapse to one. An encoded
//! slash (`%2F`), other escapes and the query are kept as they are. A `..` above the root, a NUL or
//! control byte, a malformed escape, or a path not starting with `/` is an error (400).
//! [`check_hidden_dot_segments`] then finds the `..` only an upstream would see (`..%2F`, `..;`).

use std::borrow::Cow;

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path must start with `/`")]
    NotAbsolute,
    #[error("path climbs above the root")]
    AboveRoot,
    #[error("path contains a control byte or NUL")]
    Control,
    #[error("path contains a malformed percent escape")]
    BadEscape,
    #[error("path contains a `..` behind an encoded slash or backslash, or before `;`")]
    HiddenDotSegment,
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Normalises a request path (without the query). The result starts with `/`; a trailing slash is
/// kept, since `/dir/` and `/dir` may differ to the upstream. A path that is already normal (the
/// usual case) is returned as it is, borrowed.
pub fn normalize_path(raw: &str) -> Result<Cow<'_, str>, PathError> {
    if is_normal(raw) {
        return Ok(Cow::Borrowed(raw));
    }
    normalize_owned(raw).map(Cow::Owned)
}

/// Whether `raw` is its own normal form: starts with `/`, no escape, no control byte, no empty,
/// `.` or `..` segment (except an empty last one, the trailing slash).
fn is_normal(raw: &str) -> bool {
    let Some(rest) = raw.strip_prefix('/') else {
        return false;
    };
    if raw
        .bytes()
        .any(|b| b == b'%' || b.is_ascii_control() || b == 0x7f)
    {
        return false;
    }
    let mut segments = rest.split('/').peekable();
    while let Some(seg) = segments.next() {
        let last = segments.peek().is_none();
        if seg == "." || seg == ".." || (seg.is_empty() && !last) {
            return false;
        }
    }
    true
}

fn normalize_owned(raw: &str) -> Result<String, PathError> {
    let bytes = raw.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    // Decode unreserved escapes; keep every other escape as it was, with upper-case hex digits.
    let mut decoded = String::with_capacity(raw.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b.is_ascii_control() || b == 0x7f {
            return Err(PathError::Control);
        }
        if b == b'%' {
            let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            ) else {
                return Err(PathError::BadEscape);
            };
            let v = h * 16 + l;
            if v == 0 || v.is_ascii_control() {
                return Err(PathError::Control);
            }
            if unreserved(v) {
                decoded.push(v as char);
            } else {
                decoded.push('%');
                decoded.push(bytes[i + 1].to_ascii_uppercase() as char);
                decoded.push(bytes[i + 2].to_ascii_uppercase() as char);
            }
            i += 3;
            continue;
        }
        // Multi-byte UTF-8 is copied whole; `raw` is a str so boundaries are valid.
        let ch = raw[i..].chars().next().unwrap_or('\u{fffd}');
        decoded.push(ch);
        i += ch.len_utf8();
    }
    let trailing = decoded.ends_with('/') || decoded.ends_with("/.") || decoded.ends_with("/..");
    let mut segments: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if segments.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || trailing {
        out.push('/');
    }
    Ok(out)
}

/// Refuses a path in which an upstream could find a `..` that normalisation left alone: a piece
/// between encoded slashes or backslashes (`%2F`, `%5C`, any case) or backslashes, or before a
/// `;`, that is `..` (plain or as `%2e`). Python's `http.server` decodes `%2F` before it resolves
/// dot segments, Tomcat and Jetty read `..;x` as `..` with a parameter: `/docs/..%2F..%2Fsecret`,
/// routed (and rewritten) under `/docs/`, reaches their `/secret`. nginx decodes before it
/// resolves, so its routes never see such a path either.
///
/// `path` is one [`normalize_path`] returned (no plain `..` segment left, `%2e` decoded). Kept
/// apart from it because a path after a sluice token has a refusal of its own.
pub fn check_hidden_dot_segments(path: &str) -> Result<(), PathError> {
    // Nearly every path holds none of these: one look at its bytes.
    if !path.bytes().any(|b| matches!(b, b'%' | b';' | b'\\')) {
        return Ok(());
    }
    let bytes = path.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i <= bytes.len() {
        // Where the piece ends, and how long the separator is (0: the end of the path).
        let sep = match bytes.get(i) {
            None => 0,
            Some(b'/' | b'\\') => 1,
            Some(b'%') if encoded_separator(&bytes[i + 1..]) => 3,
            Some(_) => {
                i += 1;
                continue;
            }
        };
        // What a server taking `;` as the start of parameters reads as the piece's name.
        let piece = &path[start..i];
        let name = piece.split(';').next().unwrap_or(piece);
        if is_dot_dot(name) {
            return Err(PathError::HiddenDotSegment);
        }
        if sep == 0 {
            break;
        }
        i += sep;
        start = i;
    }
    Ok(())
}

/// Whether `rest` (what follows a `%`) starts with `2F` or `5C`, any case.
fn encoded_separator(rest: &[u8]) -> bool {
    matches!(rest, [b'2', b'f' | b'F', ..] | [b'5', b'c' | b'C', ..])
}

/// Whether `name` is `..`, its dots plain or percent-encoded.
fn is_dot_dot(name: &str) -> bool {
    name == ".."
        || (name.len() > 2
            && name.len() <= 6
            && name.to_ascii_lowercase().replace("%2e", ".").eq(".."))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_normal_path_is_borrowed() {
        for p in ["/", "/a", "/a/b/", "/a.b/c..d/.e", "/x?y"] {
            assert!(
                matches!(normalize_path(p), Ok(Cow::Borrowed(b)) if b == p),
                "{p}"
            );
        }
        for p in ["//a", "/a//b", "/a/./b", "/a/..", "/a/.", "/%41"] {
            assert!(matches!(normalize_path(p), Ok(Cow::Owned(_))), "{p}");
        }
    }

    #[test]
    fn resolves_dot_segments() {
        assert_eq!(normalize_path("/api/../admin").unwrap(), "/admin");
        assert_eq!(normalize_path("/api/./x").unwrap(), "/api/x");
        assert_eq!(normalize_path("/a/b/..").unwrap(), "/a/");
        assert_eq!(normalize_path("/").unwrap(), "/");
        assert_eq!(normalize_path("//a///b/").unwrap(), "/a/b/");
    }

    #[test]
    fn encoded_dots_are_dots() {
        assert_eq!(normalize_path("/api/%2e%2e/admin").unwrap(), "/admin");
        assert_eq!(normalize_path("/api/%2E./admin").unwrap(), "/admin");
        assert_eq!(normalize_path("/%7Euser/%41").unwrap(), "/~user/A");
    }

    #[test]
    fn encoded_slash_and_others_stay_encoded() {
        assert_eq!(normalize_path("/a%2fb/%20x").unwrap(), "/a%2Fb/%20x");
        assert_eq!(normalize_path("/a%2F..%2Fb").unwrap(), "/a%2F..%2Fb");
    }

    #[test]
    fn refusals() {
        assert_eq!(normalize_path("/../etc"), Err(PathError::AboveRoot));
        assert_eq!(
            normalize_path("/a/%2e%2e/%2e%2e/b"),
            Err(PathError::AboveRoot)
        );
        assert_eq!(normalize_path("a/b"), Err(PathError::NotAbsolute));
        assert_eq!(normalize_path(""), Err(PathError::NotAbsolute));
        assert_eq!(normalize_path("/a%00"), Err(PathError::Control));
        assert_eq!(normalize_path("/a\x01"), Err(PathError::Control));
        assert_eq!(normalize_path("/a%zz"), Err(PathError::BadEscape));
        assert_eq!(normalize_path("/a%2"), Err(PathError::BadEscape));
    }

    #[test]
    fn a_dot_dot_only_an_upstream_would_see_is_refused() {
        for p in [
            "/docs/..%2F..%2Fsecret",
            "/docs/..%2f..%2fsecret",
            "/docs/..%5Csecret",
            "/docs/..%5c",
            "/docs/..\\secret",
            "/docs/a%2F..%2F..%2F..%2Fsecret",
            "/docs/..;/..;/secret",
            "/docs/..;jsessionid=1/x",
            "/docs/.%2e%2Fx",
            "/docs/%2E%2E%2fx",
            "/docs/x%2F..",
        ] {
            // Normalisation keeps each as it is (up to the case of its escapes)...
            let n = normalize_path(p).unwrap();
            // ...and the check refuses it, raw or normalised.
            assert_eq!(
                check_hidden_dot_segments(&n),
                Err(PathError::HiddenDotSegment),
                "{p}"
            );
            assert_eq!(
                check_hidden_dot_segments(p),
                Err(PathError::HiddenDotSegment),
                "{p}"
            );
        }
        for p in [
            "/",
            "/docs/a",
            "/docs/file;jsessionid=1",
            "/docs/a;b/c;d/",
            "/docs/a%2Fb%5Cc",
            "/docs/..x%2F",
            "/docs/x..%2F",
            "/docs/...%2F",
            "/docs/.%2Fx",
            "/docs/.;x/a",
            "/docs/a%20b..",
            "/docs/%2e%2e%2e%2Fx",
        ] {
            assert_eq!(check_hidden_dot_segments(p), Ok(()), "{p}");
        }
    }

    /// A path as a server that decodes `%2F` and `%5C`, takes `\` for `/` and `;` for the start
    /// of a segment's parameters reads it: its segments' names.
    fn upstream_view(path: &str) -> Vec<String> {
        let decoded = path
            .replace("%2F", "/")
            .replace("%2f", "/")
            .replace("%5C", "/")
            .replace("%5c", "/")
            .replace('\\', "/");
        decoded
            .split('/')
            .map(|seg| seg.split(';').next().unwrap_or("").to_string())
            .collect()
    }

    proptest! {
        /// A path that passes both steps has no `..` for such a server to resolve.
        #[test]
        fn no_upstream_sees_a_dot_dot_in_a_path_that_passes(
            parts in prop::collection::vec(
                prop::sample::select(vec![
                    "a", "/", ".", "..", ";", ";x", "%2F", "%2f", "%5C", "%5c", "\\", "%2e",
                    "%2E", "%41", "%25",
                ]),
                0..12,
            )
        ) {
            let s = format!("/{}", parts.concat());
            if let Ok(n) = normalize_path(&s) {
                if check_hidden_dot_segments(&n).is_ok() {
                    let view = upstream_view(&n);
                    prop_assert!(!view.iter().any(|seg| seg == ".."), "{} -> {:?}", n, view);
                }
            }
        }

        #[test]
        fn never_panics_and_is_idempotent(s in "/[a-z./%0-9A-F]{0,40}") {
            if let Ok(n) = normalize_path(&s) {
                prop_assert!(n.starts_with('/'));
                prop_assert!(!n.split('/').any(|seg| seg == "." || seg == ".."));
                prop_assert!(!n.contains("//"));
                prop_assert_eq!(normalize_path(&n), Ok(n.clone()));
            }
        }

        #[test]
        fn any_string_is_safe(s in ".{0,60}") {
            let _ = normalize_path(&s);
        }

        /// A path kept as it came is exactly what the full normalisation makes of it.
        #[test]
        fn a_borrowed_path_is_the_normal_form(s in "/[a-z./%0-9A-F\u{e9}\x01]{0,40}") {
            let full = normalize_owned(&s);
            match normalize_path(&s) {
                Ok(Cow::Borrowed(b)) => prop_assert_eq!(Ok(b.to_string()), full),
                Ok(Cow::Owned(o)) => prop_assert_eq!(Ok(o), full),
                Err(e) => prop_assert_eq!(Err(e), full),
            }
        }
    }
}
