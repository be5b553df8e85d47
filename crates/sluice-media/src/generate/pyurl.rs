//! Python's `urlsplit`/`urlunsplit`/`urljoin`, so generated proxy URLs match MediaFlow's byte for byte.
//!
//! MediaFlow joins `mediaflow_proxy_url` and `endpoint` with `urllib.parse.urljoin` and splices the
//! token into the path with `urlparse`/`urlunparse`. Those functions keep the input's spelling
//! (no host lowercasing, no percent-encoding) except for the scheme, which they lowercase; a
//! WHATWG parser such as the `url` crate would normalise more, so the RFC 3986 merge is done here.
//! Path parameters (`;x` on the last segment) are not split off: for the URLs MediaFlow builds the
//! result is the same.

/// Schemes for which `urljoin` resolves relative references (Python's `uses_relative`).
const USES_RELATIVE: &[&str] = &[
    "", "ftp", "http", "gopher", "nntp", "imap", "wais", "file", "https", "shttp", "mms",
    "prospero", "rtsp", "rtsps", "rtspu", "sftp", "svn", "svn+ssh", "ws", "wss",
];

/// Schemes that have an authority (Python's `uses_netloc`).
const USES_NETLOC: &[&str] = &[
    "", "ftp", "http", "gopher", "nntp", "telnet", "imap", "wais", "file", "mms", "https", "shttp",
    "snews", "prospero", "rtsp", "rtsps", "rtspu", "rsync", "svn", "svn+ssh", "sftp", "nfs", "git",
    "git+ssh", "ws", "wss",
];

/// The five parts of a URL as Python's `urlsplit` cuts them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct SplitUrl {
    pub scheme: String,
    pub netloc: String,
    pub path: String,
    pub query: String,
    pub fragment: String,
}

/// `urlsplit(url, default_scheme)`.
pub(crate) fn urlsplit(url: &str, default_scheme: &str) -> SplitUrl {
    // WHATWG leniency that Python applies: leading C0/space stripped, tab/CR/LF removed.
    let cleaned: String = url
        .trim_start_matches(|c: char| c <= ' ')
        .chars()
        .filter(|c| !matches!(c, '\t' | '\r' | '\n'))
        .collect();
    let mut rest = cleaned.as_str();
    let mut parts = SplitUrl {
        scheme: default_scheme.to_owned(),
        ..SplitUrl::default()
    };
    if let Some((scheme, after)) = split_scheme(rest) {
        parts.scheme = scheme.to_ascii_lowercase();
        rest = after;
    }
    if let Some(after_slashes) = rest.strip_prefix("//") {
        let end = after_slashes
            .find(['/', '?', '#'])
            .unwrap_or(after_slashes.len());
        parts.netloc = after_slashes[..end].to_owned();
        rest = &after_slashes[end..];
    }
    if let Some((before, fragment)) = rest.split_once('#') {
        parts.fragment = fragment.to_owned();
        rest = before;
    }
    if let Some((before, query)) = rest.split_once('?') {
        parts.query = query.to_owned();
        rest = before;
    }
    parts.path = rest.to_owned();
    parts
}

/// A scheme is letters, digits and `+-.` before the first `:`, starting with a letter.
fn split_scheme(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once(':')?;
    let mut chars = scheme.chars();
    let first_is_letter = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    let valid = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (first_is_letter && valid).then_some((scheme, rest))
}

/// `urlunsplit(parts)`: empty query and fragment are dropped with their delimiters.
pub(crate) fn urlunsplit(parts: &SplitUrl) -> String {
    let mut url = parts.path.clone();
    let wants_authority = !parts.scheme.is_empty()
        && USES_NETLOC.contains(&parts.scheme.as_str())
        && !url.starts_with("//");
    if !parts.netloc.is_empty() || wants_authority {
        if !url.is_empty() && !url.starts_with('/') {
            url.insert(0, '/');
        }
        url = format!("//{}{url}", parts.netloc);
    }
    if !parts.scheme.is_empty() {
        url = format!("{}:{url}", parts.scheme);
    }
    if !parts.query.is_empty() {
        url = format!("{url}?{}", parts.query);
    }
    if !parts.fragment.is_empty() {
        url = format!("{url}#{}", parts.fragment);
    }
    url
}

/// `urljoin(base, url)`: RFC 3986 reference resolution with Python's quirks (`..` above the root
/// is dropped, empty segments inside a relative merge are removed).
pub(crate) fn urljoin(base: &str, url: &str) -> String {
    if base.is_empty() {
        return url.to_owned();
    }
    if url.is_empty() {
        return base.to_owned();
    }
    let b = urlsplit(base, "");
    let mut u = urlsplit(url, &b.scheme);
    if u.scheme != b.scheme || !USES_RELATIVE.contains(&u.scheme.as_str()) {
        return url.to_owned();
    }
    if USES_NETLOC.contains(&u.scheme.as_str()) {
        if !u.netloc.is_empty() {
            return urlunsplit(&u);
        }
        u.netloc = b.netloc.clone();
    }
    if u.path.is_empty() {
        u.path = b.path;
        if u.query.is_empty() {
            u.query = b.query;
        }
        return urlunsplit(&u);
    }
    u.path = merge_paths(&b.path, &u.path);
    urlunsplit(&u)
}

fn merge_paths(base_path: &str, path: &str) -> String {
    let segments: Vec<&str> = if path.starts_with('/') {
        path.split('/').collect()
    } else {
        let mut base_parts: Vec<&str> = base_path.split('/').collect();
        // The base's last segment is a file, not a directory, unless the base ends with '/'.
        if base_parts.last().is_some_and(|last| !last.is_empty()) {
            base_parts.pop();
        }
        let all: Vec<&str> = base_parts.into_iter().chain(path.split('/')).collect();
        if all.len() < 3 {
            return resolve(&all);
        }
        // Inner empty segments would turn into '//' when joined again.
        let last = all.len() - 1;
        let inner = all[1..last].iter().copied().filter(|s| !s.is_empty());
        std::iter::once(all[0])
            .chain(inner)
            .chain([all[last]])
            .collect()
    };
    resolve(&segments)
}

/// Applies `.` and `..` segments; `..` above the root is dropped.
fn resolve(segments: &[&str]) -> String {
    let mut resolved: Vec<&str> = Vec::with_capacity(segments.len());
    for segment in segments {
        match *segment {
            ".." => {
                resolved.pop();
            }
            "." => {}
            other => resolved.push(other),
        }
    }
    if matches!(segments.last(), Some(&".") | Some(&"..")) {
        resolved.push("");
    }
    let joined = resolved.join("/");
    if joined.is_empty() {
        "/".to_owned()
    } else {
        joined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_like_python() {
        let cases = [
            ("http://h:1/mfp", "proxy/stream", "http://h:1/proxy/stream"),
            (
                "http://h:1/mfp/",
                "/proxy/stream",
                "http://h:1/proxy/stream",
            ),
            ("http://h:1", "proxy/stream", "http://h:1/proxy/stream"),
            ("http://h/a/b/", "proxy/stream", "http://h/a/b/proxy/stream"),
            (
                "http://h/a/b/",
                "../proxy/./stream",
                "http://h/a/proxy/stream",
            ),
            ("http://h", "../../x", "http://h/x"),
            ("http://h/a", "x/..", "http://h/"),
            ("HTTP://Host/x", "/y", "http://Host/y"),
            ("http://h/a?q=1", "", "http://h/a?q=1"),
            ("http://h/a?q=1", "?z", "http://h/a?z"),
            ("http://h/a", "https://o/p", "https://o/p"),
            ("http://h/a", "//o/p", "http://o/p"),
            ("localhost:8888", "/proxy/stream", "/proxy/stream"),
            ("http://h/a//b/", "c", "http://h/a/b/c"),
        ];
        for (base, url, want) in cases {
            assert_eq!(urljoin(base, url), want, "{base} + {url}");
        }
    }

    #[test]
    fn split_and_unsplit_round_trip() {
        let parts = urlsplit(" https://u:p@H:8/a/b?x=1#f", "");
        assert_eq!(parts.scheme, "https");
        assert_eq!(parts.netloc, "u:p@H:8");
        assert_eq!(parts.path, "/a/b");
        assert_eq!(parts.query, "x=1");
        assert_eq!(parts.fragment, "f");
        assert_eq!(urlunsplit(&parts), "https://u:p@H:8/a/b?x=1#f");
        assert_eq!(urlunsplit(&urlsplit("http://h/?#", "")), "http://h/");
    }
}
