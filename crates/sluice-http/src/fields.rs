//! Request fields a proxy does not pass on by default: names with an underscore (CGI, WSGI and
//! Rack turn `X_Forwarded_For` and `X-Forwarded-For` into the same variable, so the twin of a
//! field this proxy sets would override it, as nginx's `underscores_in_headers off` prevents), and
//! the method and URL overrides (`X-HTTP-Method-Override`, `X-Original-URL`...) that frameworks
//! obey but no cache key includes. No I/O.

use http::header::{HeaderMap, HeaderName};

/// Fields that make a framework read another method or URL than the request line's.
pub const OVERRIDE_FIELDS: [HeaderName; 5] = [
    HeaderName::from_static("x-original-url"),
    HeaderName::from_static("x-rewrite-url"),
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// Removes every field whose name holds `_`; returns how many names went. Heads without one (the
/// usual case) cost one pass over the names and no allocation.
pub fn strip_underscored(headers: &mut HeaderMap) -> usize {
    let underscored = |n: &HeaderName| n.as_str().contains('_');
    if !headers.keys().any(underscored) {
        return 0;
    }
    let names: Vec<HeaderName> = headers.keys().filter(|n| underscored(n)).cloned().collect();
    for name in &names {
        headers.remove(name);
    }
    names.len()
}

/// Removes the method and URL override fields. One pass over the names present finds them (a
/// head rarely has any), instead of a hashed lookup per override name.
pub fn strip_overrides(headers: &mut HeaderMap) {
    // A match on the text: searching the constant array would build and drop it at every use.
    remove_listed(headers, &OVERRIDE_FIELDS, |name| match name {
        "x-original-url" => Some(0),
        "x-rewrite-url" => Some(1),
        "x-http-method-override" => Some(2),
        "x-http-method" => Some(3),
        "x-method-override" => Some(4),
        _ => None,
    });
}

/// Removes the `fields` present in `headers`, where `index` gives a name's place in `fields`
/// (at most 8): one pass over the names finds them, and a head with none costs nothing more.
pub(crate) fn remove_listed(
    headers: &mut HeaderMap,
    fields: &[HeaderName],
    index: impl Fn(&str) -> Option<usize>,
) {
    debug_assert!(fields.len() <= 8);
    // Bit i: `fields[i]` is present.
    let mut present = 0u8;
    for name in headers.keys() {
        if let Some(i) = index(name.as_str()) {
            present |= 1 << i;
        }
    }
    if present == 0 {
        return;
    }
    for (i, name) in fields.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn underscores_and_overrides_go() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("x-forwarded-for", "1.1.1.1"),
            ("x_forwarded_for", "6.6.6.6"),
            ("transfer_encoding", "chunked"),
            ("content_length", "5"),
            ("x_forwarded_for", "7.7.7.7"),
            ("x-http-method-override", "DELETE"),
            ("x-original-url", "/admin"),
            ("accept", "*/*"),
        ] {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_static(v),
            );
        }
        assert_eq!(strip_underscored(&mut h), 3);
        strip_overrides(&mut h);
        let names: Vec<&str> = h.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["x-forwarded-for", "accept"]);
        assert_eq!(strip_underscored(&mut h), 0);
    }
}
