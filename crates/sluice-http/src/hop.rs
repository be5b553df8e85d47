//! Hop-by-hop header rules (RFC 9110 §7.6.1): the headers a proxy must not forward, including every
//! header named in `Connection`. No I/O.

use http::header::{self, HeaderMap, HeaderName};

/// How many names are hop-by-hop by definition: those that describe one connection, never the
/// message (`hop_name` lists them, `proxy-connection` last).
const HOP_NAMES: usize = 9;

/// Whether `name` is hop-by-hop by definition (not counting names listed in `Connection`).
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    hop_index(name.as_str()).is_some()
}

/// Where the lower-case `name` stands among the hop-by-hop names (`hop_name`'s order). A match
/// on the text: a constant array of names would be built and dropped at every search.
fn hop_index(name: &str) -> Option<usize> {
    Some(match name {
        "connection" => 0,
        "proxy-authenticate" => 1,
        "proxy-authorization" => 2,
        "te" => 3,
        "trailer" => 4,
        "transfer-encoding" => 5,
        "upgrade" => 6,
        "keep-alive" => 7,
        "proxy-connection" => 8,
        _ => return None,
    })
}

/// The header names listed in every `Connection` header (lowercase, invalid tokens skipped).
pub fn connection_names(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect()
}

/// Removes hop-by-hop headers and those named in `Connection`. `TE: trailers` survives when
/// `keep_te_trailers` (a gRPC client must be able to tell the upstream it accepts trailers).
/// A `Content-Length` beside a `Transfer-Encoding` goes with it: the coding overrides the length
/// (RFC 9112 §6.3), which is not the message's and must not be forwarded without the coding.
///
/// One pass over the names present finds which hop-by-hop fields there are; only those (and the
/// names `Connection` lists) are then removed, each one hashed lookup. Most heads carry none, and
/// most that do carry one (`Connection: keep-alive`).
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_te_trailers: bool) {
    // Bit i: `hop_name(i)` is present.
    let mut present = 0u16;
    for name in headers.keys() {
        if let Some(i) = hop_index(name.as_str()) {
            present |= 1 << i;
        }
    }
    if present == 0 {
        return;
    }
    let te_trailers = keep_te_trailers
        && present & (1 << 3) != 0
        && headers
            .get_all(header::TE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("trailers"));
    // `Transfer-Encoding` is `hop_name(5)` (its bit may be cleared below when `Connection` lists it).
    let coded = present & (1 << 5) != 0;
    // `Connection` is `hop_name(0)`: the fields it lists go first, in its order (removing
    // moves the map's last field into the gap, so the order of removals is the order of what is
    // left). A listed name no field has (`close`, usually) costs a lookup, no allocation.
    let mut named = Vec::new();
    if present & 1 != 0 {
        for token in headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
        {
            let hop = match hop_index(token) {
                Some(i) => Some(i),
                None if token.bytes().any(|b| b.is_ascii_uppercase()) => {
                    hop_index(&token.to_ascii_lowercase())
                }
                None => None,
            };
            if let Some(i) = hop {
                if present & (1 << i) != 0 {
                    present &= !(1 << i);
                    named.push(hop_name(i));
                }
            } else if headers.contains_key(token) {
                if let Ok(name) = HeaderName::from_bytes(token.as_bytes()) {
                    named.push(name);
                }
            }
        }
    }
    for name in named {
        headers.remove(&name);
    }
    if coded {
        headers.remove(header::CONTENT_LENGTH);
    }
    for i in 0..HOP_NAMES {
        if present & (1 << i) != 0 {
            headers.remove(hop_name(i));
        }
    }
    if te_trailers {
        headers.insert(header::TE, http::HeaderValue::from_static("trailers"));
    }
}

/// The hop-by-hop name at `hop_index` `i`.
fn hop_name(i: usize) -> HeaderName {
    match i {
        0 => header::CONNECTION,
        1 => header::PROXY_AUTHENTICATE,
        2 => header::PROXY_AUTHORIZATION,
        3 => header::TE,
        4 => header::TRAILER,
        5 => header::TRANSFER_ENCODING,
        6 => header::UPGRADE,
        7 => HeaderName::from_static("keep-alive"),
        _ => HeaderName::from_static("proxy-connection"),
    }
}

/// The fields HTTP/2 and HTTP/3 messages must not carry, as they describe one connection (RFC
/// 9113 §8.2.2, RFC 9114 §4.2); `te` is allowed there, with the value `trailers` only.
pub fn connection_specific_names() -> [HeaderName; 5] {
    [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ]
}

/// The first connection-specific field in `fields` (a `te` other than `trailers` counted), if
/// any: over HTTP/2 and HTTP/3 a request that carries one is malformed.
pub fn connection_specific(fields: &HeaderMap) -> Option<HeaderName> {
    if let Some(name) = connection_specific_names()
        .into_iter()
        .find(|n| fields.contains_key(n))
    {
        return Some(name);
    }
    fields
        .get_all(header::TE)
        .iter()
        .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"trailers"))
        .then_some(header::TE)
}

/// A response's trailers as an HTTP/2 or HTTP/3 client may take them: without the
/// connection-specific fields and without `te` (an HTTP/1.1 origin may end a chunked body with
/// `Connection: close`; a client takes a trailer section carrying one as malformed and resets the
/// stream at its very end).
pub fn strip_connection_specific_trailers(fields: &mut HeaderMap) {
    if fields.is_empty() {
        return;
    }
    for name in connection_specific_names() {
        fields.remove(name);
    }
    fields.remove(header::TE);
}

/// Several `cookie` fields made one, their values joined with "; " in the order they came. HTTP/2
/// and HTTP/3 clients send each cookie as a field of its own (RFC 9113 §8.2.3, RFC 9114 §4.2.1);
/// an HTTP/1.1 origin given them as several `Cookie` lines may join them with ", " (PHP, WSGI),
/// which breaks them. A single field is left as it is.
pub fn join_cookies(fields: &mut HeaderMap) {
    let mut all = fields.get_all(header::COOKIE).iter();
    if all.next().is_none() || all.next().is_none() {
        return;
    }
    let mut joined = Vec::new();
    for v in fields.get_all(header::COOKIE) {
        if v.is_empty() {
            continue;
        }
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(v.as_bytes());
    }
    // Valid field bytes joined by "; " are valid field bytes.
    if let Ok(v) = http::HeaderValue::from_maybe_shared(bytes::Bytes::from(joined)) {
        fields.insert(header::COOKIE, v);
    }
}

/// Whether the request asks to switch protocols to `proto` (for example `websocket`): an `Upgrade`
/// naming it and `Connection` listing `upgrade`.
pub fn wants_upgrade(headers: &HeaderMap, proto: &str) -> bool {
    let listed = connection_names(headers).contains(&header::UPGRADE);
    listed
        && headers
            .get_all(header::UPGRADE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|p| {
                let p = p.trim();
                p.split('/')
                    .next()
                    .is_some_and(|n| n.eq_ignore_ascii_case(proto))
            })
}

#[cfg(test)]
mod tests {
    /// Finding (review): an answer with both `Transfer-Encoding` and `Content-Length` lost the
    /// coding here and kept the length, which is not the message's (a HEAD pass through a
    /// caching route showed it; a GET pass framed the decoded body by it).
    #[test]
    fn a_length_beside_a_coding_goes_with_it() {
        use super::*;
        for connection in [None, Some("transfer-encoding"), Some("close")] {
            let mut fields = HeaderMap::new();
            fields.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
            fields.insert(header::CONTENT_LENGTH, "5".parse().unwrap());
            fields.insert(header::ETAG, "\"a\"".parse().unwrap());
            if let Some(c) = connection {
                fields.insert(header::CONNECTION, c.parse().unwrap());
            }
            strip_hop_by_hop(&mut fields, false);
            assert_eq!(fields.len(), 1, "{connection:?}: {fields:?}");
        }
        let mut plain = HeaderMap::new();
        plain.insert(header::CONTENT_LENGTH, "5".parse().unwrap());
        plain.insert(header::CONNECTION, "keep-alive".parse().unwrap());
        strip_hop_by_hop(&mut plain, false);
        assert_eq!(plain.get(header::CONTENT_LENGTH).unwrap(), "5");
    }

    #[test]
    fn cookie_fields_are_joined_in_order_and_trailers_lose_connection_fields() {
        use super::*;
        let mut fields = HeaderMap::new();
        fields.append(header::COOKIE, "a=1".parse().unwrap());
        fields.append(header::ACCEPT, "*/*".parse().unwrap());
        fields.append(header::COOKIE, "".parse().unwrap());
        fields.append(header::COOKIE, "b=2; c=3".parse().unwrap());
        join_cookies(&mut fields);
        let cookies: Vec<_> = fields.get_all(header::COOKIE).iter().collect();
        assert_eq!(cookies, ["a=1; b=2; c=3"]);
        let mut trailers = HeaderMap::new();
        for (k, v) in [
            ("connection", "close"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("x-sum", "1"),
        ] {
            trailers.append(HeaderName::from_static(k), v.parse().unwrap());
        }
        strip_connection_specific_trailers(&mut trailers);
        assert_eq!(trailers.len(), 1);
        assert_eq!(trailers["x-sum"], "1");
    }

    use super::*;
    use http::HeaderValue;

    #[test]
    fn connection_specific_fields_are_found() {
        let mut fields = HeaderMap::new();
        fields.insert("accept", HeaderValue::from_static("*/*"));
        fields.insert("te", HeaderValue::from_static("trailers"));
        assert_eq!(connection_specific(&fields), None);
        for (name, value) in [
            ("connection", "close"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("upgrade", "websocket"),
            ("transfer-encoding", "chunked"),
            ("te", "gzip"),
        ] {
            let mut bad = fields.clone();
            bad.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
            let found = connection_specific(&bad);
            assert_eq!(found.as_ref().map(HeaderName::as_str), Some(name));
        }
    }

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn strips_standard_and_connection_named_headers() {
        let mut h = map(&[
            ("connection", "keep-alive, X-Secret , close"),
            ("connection", "x-other"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("x-other", "2"),
            ("transfer-encoding", "chunked"),
            ("te", "gzip"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic x"),
            ("proxy-connection", "keep-alive"),
            ("trailer", "x-t"),
            ("x-kept", "3"),
            ("content-type", "text/plain"),
        ]);
        strip_hop_by_hop(&mut h, true);
        let mut names: Vec<_> = h.keys().map(|k| k.as_str().to_string()).collect();
        names.sort();
        assert_eq!(names, vec!["content-type", "x-kept"]);
    }

    #[test]
    fn a_head_without_hop_by_hop_fields_is_left_as_is() {
        let mut h = map(&[
            ("host", "example.com"),
            ("accept", "*/*"),
            ("x-custom", "1"),
            ("x-custom", "2"),
        ]);
        let before = h.clone();
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h, before);
        // A field merely named like one (here in a value) does not count.
        let mut h = map(&[("x-note", "connection: close")]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.get("x-note").unwrap(), "connection: close");
    }

    #[test]
    fn te_trailers_survives_when_asked() {
        let mut h = map(&[("te", "trailers, deflate")]);
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h.get("te").unwrap(), "trailers");
        let mut h = map(&[("te", "trailers")]);
        strip_hop_by_hop(&mut h, false);
        assert!(h.get("te").is_none());
    }

    #[test]
    fn upgrade_detection() {
        assert!(wants_upgrade(
            &map(&[
                ("connection", "keep-alive, Upgrade"),
                ("upgrade", "WebSocket")
            ]),
            "websocket"
        ));
        assert!(!wants_upgrade(
            &map(&[("upgrade", "websocket")]),
            "websocket"
        ));
        assert!(!wants_upgrade(
            &map(&[("connection", "upgrade"), ("upgrade", "h2c")]),
            "websocket"
        ));
    }
}
