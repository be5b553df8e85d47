//! Request path normalisation before routing, so a path cannot escape the route it appears to be
//! under (`/api/../admin` is routed as `/admin`). No I/O.
//!
//! Percent-encoded unreserved characters (letters, digits, `-._~`) are decoded, so `%2e%2e` is a
//! `..` segment; `.` and `..` segments are resolved; repeated slashes collapse to one. An encoded
//! slash (`%2F`), other escapes and the query are kept as they are. A `..` above the root, a NUL or
//! control byte, a malformed escape, or a path not starting with `/` is an error (400).
//! [`check_hidden_dot_segments`] then finds the `..` only an upstream would see (`..%2F`, `..;`,
//! `..%252F`, `..%20`).

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
    #[error("path contains a `..` an upstream could resolve (`..%2F`, `..;`, `..%20`)")]
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
/// between slashes, backslashes or encoded ones (`%2F`, `%5C`, any case, also encoded twice:
/// `%252F`), its name ending at a `;` (also `%3B`, `%253B`), that is two dots (plain, `%2e` or
/// `%252e`) followed by nothing but dots and spaces (plain, `%20` or `%2520`). Python's
/// `http.server` decodes `%2F` before it resolves dot segments; a server behind another that
/// decodes once more sees `%252F` as `/`; Tomcat and Jetty read `..;x` as `..` with a parameter;
/// IIS (Windows) trims a segment's trailing dots and spaces, so `..%20` and `....` are `..` to it.
/// `/docs/..%2F..%2Fsecret`, routed (and rewritten) under `/docs/`, reaches their `/secret`. nginx
/// decodes before it resolves, so its routes never see such a path either.
///
/// `path` is one [`normalize_path`] returned (no plain `..` segment left, `%2e` decoded). Kept
/// apart from it because a path after a sluice token has a refusal of its own.
pub fn check_hidden_dot_segments(path: &str) -> Result<(), PathError> {
    // Nearly every path holds none of these: one look at its bytes.
    if !path
        .bytes()
        .any(|b| matches!(b, b'%' | b';' | b'\\' | b' '))
        && !path.contains("...")
    {
        return Ok(());
    }
    let bytes = path.as_bytes();
    let mut name = Name::Dots(0);
    // Past a `;`: the piece's parameters, not its name.
    let mut params = false;
    let mut i = 0;
    loop {
        let (seen, len) = match bytes.get(i..).filter(|rest| !rest.is_empty()) {
            Some(rest) => seen(rest),
            // The end of the path ends the last piece.
            None => (Seen::Separator, 0),
        };
        match seen {
            Seen::Separator => {
                if name == Name::DotDot {
                    return Err(PathError::HiddenDotSegment);
                }
                if len == 0 {
                    return Ok(());
                }
                name = Name::Dots(0);
                params = false;
            }
            _ if params => {}
            Seen::Params => params = true,
            Seen::Dot => {
                name = match name {
                    Name::Dots(0) => Name::Dots(1),
                    Name::Dots(_) | Name::DotDot => Name::DotDot,
                    Name::Not => Name::Not,
                }
            }
            // Trimmed when trailing a `..`; anywhere else it makes the name another one.
            Seen::Space if name == Name::DotDot => {}
            Seen::Space | Seen::Other => name = Name::Not,
        }
        i += len;
    }
}

/// What an upstream may read as the name of the piece read so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Name {
    /// Only this many dots (0 or 1) so far.
    Dots(u8),
    /// Two dots, then only dots and spaces: `..` once trailing dots and spaces are trimmed.
    DotDot,
    /// Anything else.
    Not,
}

/// What a character of a path is to an upstream that decodes it once or twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Separator,
    Params,
    Dot,
    Space,
    Other,
}

/// What the first character of `rest` (not empty) is to a server that decodes the path once or
/// twice (`%2F`, `%252F`), and how many bytes it takes.
fn seen(rest: &[u8]) -> (Seen, usize) {
    let escaped = |at: usize| Some(hex(*rest.get(at)?)? * 16 + hex(*rest.get(at + 1)?)?);
    let (byte, len) = match rest[0] {
        b'%' => match escaped(1) {
            Some(b'%') => escaped(3).map_or((b'%', 3), |b| (b, 5)),
            Some(b) => (b, 3),
            None => (b'%', 1),
        },
        b => (b, 1),
    };
    let seen = match byte {
        b'/' | b'\\' => Seen::Separator,
        b';' => Seen::Params,
        b'.' => Seen::Dot,
        b' ' => Seen::Space,
        _ => Seen::Other,
    };
    (seen, len)
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
            // Encoded twice, for a server behind one more decoding step.
            "/docs/..%252F..%252Fsecret",
            "/docs/..%252f",
            "/docs/..%255Csecret",
            "/docs/%252E%252E%252Fsecret",
            "/docs/%252e.%2Fx",
            // An encoded `;`.
            "/docs/..%3B/x",
            "/docs/..%3bx/y",
            "/docs/..%253B/x",
            // Trailing spaces and dots, which IIS trims from a segment.
            "/docs/..%20%5Csecret",
            "/docs/..%20/secret",
            "/docs/.. /secret",
            "/docs/..%2520/x",
            "/docs/..%20.%20/x",
            "/docs/..../secret",
            "/docs/...",
            "/docs/...%2F",
            "/docs/%2e%2e%2e%2Fx",
            // A known refusal: an image proxy's source URL, encoded whole, with a `..` of its own.
            "/unsafe/https%3A%2F%2Fh%2Fa%2F..%2Fb.jpg",
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
            "/docs/.%2Fx",
            "/docs/.;x/a",
            "/docs/a%20b..",
            "/docs/a%252Fb",
            "/docs/100%25",
            "/docs/%2525/x",
            "/docs/.. x/y",
            "/docs/ ../x",
            "/docs/. /x",
            "/docs/a..%20/x",
            "/docs/file.txt.%20",
            "/docs/..a%3Bb",
            "/unsafe/https%3A%2F%2Fh%2Fa%2Fb.jpg",
            "/unsafe/300x200/https%3A%2F%2Fh%2Fa.b%2Fc..jpg",
        ] {
            assert_eq!(check_hidden_dot_segments(p), Ok(()), "{p}");
        }
    }

    /// A path as a server that decodes it twice (`%252F` is `/` to it), takes `\\` for `/` and
    /// `;` for the start of a segment's parameters reads it: its segments' names.
    fn upstream_view(path: &str) -> Vec<String> {
        let decoded = decode_once(&decode_once(path)).replace('\\', "/");
        decoded
            .split('/')
            .map(|seg| seg.split(';').next().unwrap_or("").to_string())
            .collect()
    }

    /// `path` with the escapes of `%`, `/`, `\\`, `.`, ` ` and `;` decoded, any case.
    fn decode_once(path: &str) -> String {
        let mut out = path.to_string();
        for (escape, plain) in [
            ("%25", "%"),
            ("%2F", "/"),
            ("%5C", "/"),
            ("%2E", "."),
            ("%20", " "),
            ("%3B", ";"),
        ] {
            out = out
                .replace(escape, plain)
                .replace(&escape.to_ascii_lowercase(), plain);
        }
        out
    }

    /// Whether a segment's name is `..` to a server that trims trailing dots and spaces (IIS).
    fn climbs(name: &str) -> bool {
        name.starts_with("..") && name.trim_end_matches(['.', ' ']).is_empty()
    }

    proptest! {
        /// A path that passes both steps has no `..` for such a server to resolve.
        #[test]
        fn no_upstream_sees_a_dot_dot_in_a_path_that_passes(
            parts in prop::collection::vec(
                prop::sample::select(vec![
                    "a", "/", ".", "..", ";", ";x", "%2F", "%2f", "%5C", "%5c", "\\", "%2e",
                    "%2E", "%41", "%25", "%252F", "%255c", "%252e", "%3B", "%253b", " ", "%20",
                    "%2520",
                ]),
                0..12,
            )
        ) {
            let s = format!("/{}", parts.concat());
            if let Ok(n) = normalize_path(&s) {
                if check_hidden_dot_segments(&n).is_ok() {
                    let view = upstream_view(&n);
                    prop_assert!(!view.iter().any(|seg| climbs(seg)), "{} -> {:?}", n, view);
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
