//! A redirect's `Location` resolved against the URI that answered (RFC 3986 §5.2, RFC 9110
//! §10.2.2), for an upstream client that follows redirects to `http` and `https` only. No I/O.

use http::uri::{Authority, PathAndQuery, Scheme, Uri};

/// Why a `Location` cannot be followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocationError {
    #[error("the request URI is not absolute")]
    BaseNotAbsolute,
    #[error("not a valid URI reference")]
    Malformed,
    #[error("redirects only to http or https")]
    Scheme,
}

/// `location` resolved against `base` (an absolute `http`/`https` URI). A fragment is
/// dropped (it never goes on the wire); dot segments are removed.
pub fn resolve(base: &Uri, location: &str) -> Result<Uri, LocationError> {
    let (Some(scheme), Some(authority)) = (base.scheme(), base.authority()) else {
        return Err(LocationError::BaseNotAbsolute);
    };
    let location = location.trim();
    let location = location.split('#').next().unwrap_or("");
    if location.bytes().any(|b| b <= b' ' || b >= 0x7f) {
        return Err(LocationError::Malformed);
    }
    if let Some(colon) = location.find(':') {
        let name = &location[..colon];
        let is_scheme = !name.is_empty()
            && name.as_bytes()[0].is_ascii_alphabetic()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
        if is_scheme {
            if !(name.eq_ignore_ascii_case("http") || name.eq_ignore_ascii_case("https")) {
                return Err(LocationError::Scheme);
            }
            let uri: Uri = location.parse().map_err(|_| LocationError::Malformed)?;
            if uri.host().is_none_or(str::is_empty) {
                return Err(LocationError::Malformed);
            }
            return normalized(uri);
        }
    }
    if let Some(rest) = location.strip_prefix("//") {
        let uri: Uri = format!("{scheme}://{rest}")
            .parse()
            .map_err(|_| LocationError::Malformed)?;
        if uri.host().is_none_or(str::is_empty) {
            return Err(LocationError::Malformed);
        }
        return normalized(uri);
    }
    let base_path = base.path();
    let (path, query) = match location.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (location, None),
    };
    let merged = if path.is_empty() {
        base_path.to_string()
    } else if path.starts_with('/') {
        path.to_string()
    } else {
        let dir = &base_path[..base_path.rfind('/').map_or(0, |i| i + 1)];
        let dir = if dir.is_empty() { "/" } else { dir };
        format!("{dir}{path}")
    };
    // An empty reference keeps the base's query; any other keeps only its own.
    let query = match (path.is_empty(), query) {
        (_, Some(q)) => Some(q.to_string()),
        (true, None) => base.query().map(str::to_string),
        (false, None) => None,
    };
    build(scheme.clone(), authority.clone(), &merged, query.as_deref())
}

fn normalized(uri: Uri) -> Result<Uri, LocationError> {
    let parts = uri.into_parts();
    let (Some(scheme), Some(authority)) = (parts.scheme, parts.authority) else {
        return Err(LocationError::Malformed);
    };
    let (path, query) = match &parts.path_and_query {
        Some(pq) => (pq.path().to_string(), pq.query().map(str::to_string)),
        None => ("/".to_string(), None),
    };
    build(scheme, authority, &path, query.as_deref())
}

fn build(
    scheme: Scheme,
    authority: Authority,
    path: &str,
    query: Option<&str>,
) -> Result<Uri, LocationError> {
    let mut target = remove_dot_segments(path);
    if let Some(q) = query {
        target.push('?');
        target.push_str(q);
    }
    let pq: PathAndQuery = target.parse().map_err(|_| LocationError::Malformed)?;
    Uri::builder()
        .scheme(scheme)
        .authority(authority)
        .path_and_query(pq)
        .build()
        .map_err(|_| LocationError::Malformed)
}

/// RFC 3986 §5.2.4 on an absolute path; the result starts with `/`.
fn remove_dot_segments(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *seg {
            "." | ".." => {
                if *seg == ".." {
                    out.pop();
                }
                // `a/..` and `a/.` name a directory: keep the trailing slash.
                if last {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    format!("/{}", out.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Uri {
        "http://a.example:8080/b/c/d;p?q".parse().unwrap()
    }

    #[test]
    fn resolves_references_as_rfc_3986_does() {
        for (reference, want) in [
            ("g", "http://a.example:8080/b/c/g"),
            ("./g", "http://a.example:8080/b/c/g"),
            ("g/", "http://a.example:8080/b/c/g/"),
            ("/g", "http://a.example:8080/g"),
            ("//g.example/x", "http://g.example/x"),
            ("?y", "http://a.example:8080/b/c/d;p?y"),
            ("g?y", "http://a.example:8080/b/c/g?y"),
            ("#s", "http://a.example:8080/b/c/d;p?q"),
            ("", "http://a.example:8080/b/c/d;p?q"),
            (".", "http://a.example:8080/b/c/"),
            ("..", "http://a.example:8080/b/"),
            ("../g", "http://a.example:8080/b/g"),
            ("../../../g", "http://a.example:8080/g"),
            ("/./g/../h", "http://a.example:8080/h"),
            ("https://other.example", "https://other.example/"),
            (
                "HTTP://other.example:81/p?x=1#f",
                "http://other.example:81/p?x=1",
            ),
        ] {
            assert_eq!(
                resolve(&base(), reference).unwrap().to_string(),
                want,
                "{reference}"
            );
        }
    }

    #[test]
    fn refuses_other_schemes_and_garbage() {
        for (reference, want) in [
            ("ftp://x/y", LocationError::Scheme),
            ("file:///etc/passwd", LocationError::Scheme),
            ("javascript:alert(1)", LocationError::Scheme),
            ("http://", LocationError::Malformed),
            ("http:///x", LocationError::Malformed),
            ("/a b", LocationError::Malformed),
            ("/\u{e9}", LocationError::Malformed),
            ("http://h\r\nx/", LocationError::Malformed),
        ] {
            assert_eq!(resolve(&base(), reference), Err(want), "{reference}");
        }
        let relative: Uri = "/only/path".parse().unwrap();
        assert_eq!(resolve(&relative, "x"), Err(LocationError::BaseNotAbsolute));
    }
}
