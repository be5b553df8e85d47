//! Evaluates a client's `If-None-Match` / `If-Modified-Since` (and `If-Range`) against a stored
//! response (RFC 9110 §13). No I/O.

use std::time::SystemTime;

use http::header::{HeaderMap, ETAG, IF_MODIFIED_SINCE, IF_NONE_MATCH, IF_RANGE, LAST_MODIFIED};

use crate::freshness::header_date;

/// An entity tag: opaque value and whether it is weak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityTag<'a> {
    pub weak: bool,
    pub tag: &'a str,
}

/// Parses one entity-tag (`"x"` or `W/"x"`).
pub fn parse_etag(s: &str) -> Option<EntityTag<'_>> {
    let s = s.trim();
    let (weak, rest) = match s.strip_prefix("W/") {
        Some(r) => (true, r),
        None => (false, s),
    };
    let tag = rest.strip_prefix('"')?.strip_suffix('"')?;
    if tag.contains('"') {
        return None;
    }
    Some(EntityTag { weak, tag })
}

/// Whether the stored response is "not modified" for this request, so a 304 answers it
/// (§13.2.2 order: `If-None-Match` first, weak comparison; `If-Modified-Since` only without it).
pub fn not_modified(req: &HeaderMap, stored: &HeaderMap) -> bool {
    // Most requests carry neither: nothing stored is parsed for them.
    if !req.contains_key(IF_NONE_MATCH) && !req.contains_key(IF_MODIFIED_SINCE) {
        return false;
    }
    let inm: Vec<&str> = req
        .get_all(IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    if !inm.is_empty() {
        let stored_etag = stored
            .get(ETAG)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_etag);
        return inm.iter().flat_map(|v| v.split(',')).any(|item| {
            let item = item.trim();
            if item == "*" {
                return true;
            }
            match (&stored_etag, parse_etag(item)) {
                (Some(a), Some(b)) => a.tag == b.tag,
                _ => false,
            }
        });
    }
    let (Some(since), Some(modified)) = (
        header_date(req, IF_MODIFIED_SINCE),
        header_date(stored, LAST_MODIFIED),
    ) else {
        return false;
    };
    modified <= since
}

/// Whether a `Range` may be honoured given `If-Range` (§13.1.5): absent, a strong ETag equal to the
/// stored one, or a date equal to a stored `Last-Modified`. Otherwise the whole response is sent.
pub fn if_range_allows(req: &HeaderMap, stored: &HeaderMap) -> bool {
    let Some(value) = req.get(IF_RANGE).and_then(|v| v.to_str().ok()) else {
        return req.get(IF_RANGE).is_none();
    };
    if let Some(tag) = parse_etag(value) {
        let stored_tag = stored
            .get(ETAG)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_etag);
        return !tag.weak && matches!(stored_tag, Some(s) if !s.weak && s.tag == tag.tag);
    }
    let date: Option<SystemTime> = httpdate::parse_http_date(value.trim()).ok();
    matches!((date, header_date(stored, LAST_MODIFIED)), (Some(a), Some(b)) if a == b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn h(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(*k, HeaderValue::from_static(v));
        }
        m
    }

    #[test]
    fn etags() {
        assert_eq!(
            parse_etag("\"a\""),
            Some(EntityTag {
                weak: false,
                tag: "a"
            })
        );
        assert_eq!(
            parse_etag("W/\"a\""),
            Some(EntityTag {
                weak: true,
                tag: "a"
            })
        );
        assert_eq!(parse_etag("a"), None);
        assert_eq!(parse_etag("\"a\"b\""), None);
    }

    #[test]
    fn if_none_match_weak_comparison() {
        let stored = h(&[("etag", "W/\"v1\"")]);
        assert!(not_modified(
            &h(&[("if-none-match", "\"x\", \"v1\"")]),
            &stored
        ));
        assert!(not_modified(&h(&[("if-none-match", "*")]), &stored));
        assert!(!not_modified(&h(&[("if-none-match", "\"v2\"")]), &stored));
        // If-None-Match present: If-Modified-Since is ignored.
        let stored = h(&[
            ("etag", "\"v1\""),
            ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ]);
        assert!(!not_modified(
            &h(&[
                ("if-none-match", "\"v2\""),
                ("if-modified-since", "Sun, 06 Nov 2044 08:49:37 GMT")
            ]),
            &stored
        ));
    }

    #[test]
    fn if_modified_since() {
        let stored = h(&[("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT")]);
        assert!(not_modified(
            &h(&[("if-modified-since", "Sun, 06 Nov 1994 08:49:37 GMT")]),
            &stored
        ));
        assert!(!not_modified(
            &h(&[("if-modified-since", "Sat, 05 Nov 1994 08:49:37 GMT")]),
            &stored
        ));
        assert!(!not_modified(
            &h(&[("if-modified-since", "garbage")]),
            &stored
        ));
    }

    #[test]
    fn if_range() {
        let stored = h(&[
            ("etag", "\"v1\""),
            ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ]);
        assert!(if_range_allows(&HeaderMap::new(), &stored));
        assert!(if_range_allows(&h(&[("if-range", "\"v1\"")]), &stored));
        assert!(!if_range_allows(&h(&[("if-range", "W/\"v1\"")]), &stored));
        assert!(!if_range_allows(&h(&[("if-range", "\"v2\"")]), &stored));
        assert!(if_range_allows(
            &h(&[("if-range", "Sun, 06 Nov 1994 08:49:37 GMT")]),
            &stored
        ));
    }
}
