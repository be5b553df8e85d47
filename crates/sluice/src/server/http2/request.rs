//! A request's HEADERS frame made an `http::Request`, by RFC 9113 section 8.3's rules for its
//! pseudo-header fields and section 8.1.1's for `content-length`; pure.

use h2::frame::{Headers, Pseudo};
use http::{header, uri, HeaderMap, Method, Request, Version};

/// Why a request head was refused: the stream is reset with `PROTOCOL_ERROR`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Malformed {
    pub why: &'static str,
    /// The body's framing (`content-length`) was what was wrong: counted with HTTP/1.1's
    /// ambiguous framing (`sluice_downstream_smuggling_refused_total`).
    pub framing: bool,
}

impl Malformed {
    const fn head(why: &'static str) -> Self {
        Malformed {
            why,
            framing: false,
        }
    }

    const fn framing(why: &'static str) -> Self {
        Malformed { why, framing: true }
    }
}

/// What the connection keeps of a request to check its body against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Framing {
    /// The `content-length` the client declared, if any.
    pub length: Option<u64>,
    /// A HEAD request: the response carries no body.
    pub head: bool,
    /// An extended CONNECT (RFC 8441): the stream becomes a tunnel.
    pub connect: bool,
    /// `expect: 100-continue`: the client waits for a `100` before it sends the body.
    pub expects_continue: bool,
}

/// The request in `frame`. `extended_connect`: whether this server announced
/// `SETTINGS_ENABLE_CONNECT_PROTOCOL` (a `:protocol` is refused otherwise).
pub(super) fn build(
    frame: Headers,
    extended_connect: bool,
) -> Result<(Request<()>, Framing), Malformed> {
    let end_stream = frame.is_end_stream();
    let (pseudo, mut fields) = frame.into_parts();
    let length = content_length(&mut fields)?;
    sluice_http::hop::join_cookies(&mut fields);
    let Pseudo {
        method,
        scheme,
        authority,
        path,
        protocol,
        status,
    } = pseudo;
    let method = method.ok_or(Malformed::head("no :method"))?;
    if status.is_some() {
        return Err(Malformed::head(":status in a request"));
    }
    let connect = method == Method::CONNECT;
    let extended = protocol.is_some();
    if extended && (!connect || !extended_connect) {
        return Err(Malformed::head(":protocol not allowed"));
    }
    if connect && !extended {
        // A plain CONNECT names only an authority (section 8.5); this server proxies none, and
        // the handler answers it, but its form is checked first.
        if scheme.is_some() || path.is_some() || authority.is_none() {
            return Err(Malformed::head(
                "CONNECT with :scheme or :path, or without :authority",
            ));
        }
    } else if scheme.is_none() || path.as_ref().is_none_or(|p| p.is_empty()) {
        return Err(Malformed::head("no :scheme or no :path"));
    }
    if end_stream && length.is_some_and(|n| n > 0) {
        return Err(Malformed::framing(
            "content-length above zero on a request without a body",
        ));
    }
    let mut parts = uri::Parts::default();
    if let Some(authority) = authority {
        parts.authority = Some(
            uri::Authority::from_maybe_shared(authority.into_inner())
                .map_err(|_| Malformed::head("bad :authority"))?,
        );
    }
    if let Some(scheme) = scheme {
        let scheme: uri::Scheme = scheme.parse().map_err(|_| Malformed::head("bad :scheme"))?;
        // A URI cannot have a scheme without an authority: the scheme is checked, then dropped.
        if parts.authority.is_some() {
            parts.scheme = Some(scheme);
        }
    }
    if let Some(path) = path {
        parts.path_and_query = Some(
            uri::PathAndQuery::from_maybe_shared(path.into_inner())
                .map_err(|_| Malformed::head("bad :path"))?,
        );
    }
    let uri = uri::Uri::from_parts(parts).map_err(|_| Malformed::head("bad request target"))?;
    let mut req = Request::new(());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_2;
    *req.headers_mut() = fields;
    if let Some(protocol) = protocol {
        req.extensions_mut().insert(protocol);
    }
    let head = req.method() == Method::HEAD;
    let expects_continue = !end_stream
        && req
            .headers()
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    Ok((
        req,
        Framing {
            length,
            head,
            connect: extended,
            expects_continue,
        },
    ))
}

/// The request's `content-length`, read as every protocol sluice serves reads it (one number per
/// field, the same number in several fields that one length;
/// `sluice_http::framing::declared_length`), and left in `fields` as that one plain number: what
/// this hop holds the body to is what the next one is told. A value that starts or ends with a
/// space or tab is malformed (RFC 9113 section 8.2.1).
fn content_length(fields: &mut HeaderMap) -> Result<Option<u64>, Malformed> {
    use sluice_http::framing::{declared_length, is_plain_length, padded, FramingError};
    let mut values = fields.get_all(header::CONTENT_LENGTH).iter();
    let (first, second) = (values.next(), values.next());
    let Some(first) = first else {
        return Ok(None);
    };
    // The common case: one plain number, kept as sent.
    let b = first.as_bytes();
    if second.is_none() && is_plain_length(b) {
        let n = sluice_http::response_head::decimal(b);
        return n.map(Some).ok_or(Malformed::framing("bad content-length"));
    }
    let all = || fields.get_all(header::CONTENT_LENGTH).iter();
    if all().any(|v| padded(v.as_bytes())) {
        return Err(Malformed::framing(
            "content-length with leading or trailing whitespace",
        ));
    }
    let n = declared_length(all().map(|v| v.as_bytes())).map_err(|e| match e {
        FramingError::ConflictingLength => Malformed::framing("conflicting content-length"),
        _ => Malformed::framing("bad content-length"),
    })?;
    if let Some(n) = n {
        fields.insert(header::CONTENT_LENGTH, http::HeaderValue::from(n));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use h2::frame::StreamId;

    fn frame(pseudo: Pseudo, fields: HeaderMap, end: bool) -> Headers {
        let mut h = Headers::new(StreamId::from(1), pseudo, fields);
        if end {
            h.set_end_stream();
        }
        h
    }

    fn get(path: &str) -> Pseudo {
        let uri: http::Uri = format!("https://example.test{path}").parse().unwrap();
        Pseudo::request(Method::GET, uri, None)
    }

    #[test]
    fn a_get_becomes_a_request_with_its_target_and_fields() {
        let mut fields = HeaderMap::new();
        fields.insert("accept", "*/*".parse().unwrap());
        let (req, framing) = build(frame(get("/a?b=c"), fields, true), false).unwrap();
        assert_eq!(req.method(), Method::GET);
        assert_eq!(req.uri().path_and_query().unwrap().as_str(), "/a?b=c");
        assert_eq!(req.uri().authority().unwrap().as_str(), "example.test");
        assert_eq!(req.uri().scheme_str(), Some("https"));
        assert_eq!(req.version(), Version::HTTP_2);
        assert_eq!(req.headers()["accept"], "*/*");
        assert_eq!(
            framing,
            Framing {
                length: None,
                head: false,
                connect: false,
                expects_continue: false,
            }
        );
    }

    #[test]
    fn pseudo_field_mistakes_are_refused() {
        let mut no_method = get("/");
        no_method.method = None;
        assert!(build(frame(no_method, HeaderMap::new(), true), false).is_err());
        let mut no_path = get("/");
        no_path.path = None;
        assert!(build(frame(no_path, HeaderMap::new(), true), false).is_err());
        let mut empty_path = get("/");
        empty_path.path = Some(unsafe_str(""));
        assert!(build(frame(empty_path, HeaderMap::new(), true), false).is_err());
        let mut no_scheme = get("/");
        no_scheme.scheme = None;
        assert!(build(frame(no_scheme, HeaderMap::new(), true), false).is_err());
        let mut status = get("/");
        status.status = Some(http::StatusCode::OK);
        assert!(build(frame(status, HeaderMap::new(), true), false).is_err());
        let mut bad_authority = get("/");
        bad_authority.authority = Some(unsafe_str("exa mple"));
        let refused = build(frame(bad_authority, HeaderMap::new(), true), false).unwrap_err();
        // Not the body's framing: not counted as such.
        assert!(!refused.framing);
    }

    #[test]
    fn protocol_only_on_connect_and_only_when_announced() {
        let uri: http::Uri = "https://example.test/chat".parse().unwrap();
        let ws = || {
            Pseudo::request(
                Method::CONNECT,
                uri.clone(),
                Some(h2::ext::Protocol::from("websocket")),
            )
        };
        assert!(build(frame(ws(), HeaderMap::new(), false), false).is_err());
        let (req, framing) = build(frame(ws(), HeaderMap::new(), false), true).unwrap();
        assert!(framing.connect);
        assert_eq!(
            req.extensions()
                .get::<h2::ext::Protocol>()
                .unwrap()
                .as_str(),
            "websocket"
        );
        let get_with_protocol =
            Pseudo::request(Method::GET, uri, Some(h2::ext::Protocol::from("websocket")));
        assert!(build(frame(get_with_protocol, HeaderMap::new(), true), true).is_err());
    }

    #[test]
    fn content_length_is_checked() {
        let mut fields = HeaderMap::new();
        fields.append(header::CONTENT_LENGTH, "5".parse().unwrap());
        let (_, framing) = build(frame(get("/"), fields.clone(), false), false).unwrap();
        assert_eq!(framing.length, Some(5));
        // Declared a body, sent none.
        let refused = build(frame(get("/"), fields.clone(), true), false).unwrap_err();
        assert!(refused.framing);
        fields.append(header::CONTENT_LENGTH, "6".parse().unwrap());
        let refused = build(frame(get("/"), fields, false), false).unwrap_err();
        assert!(refused.framing);
        for bad in [
            "-1",
            "",
            "1 2",
            "+3",
            "99999999999999999999999",
            "5, 6",
            "5,",
            ",5",
            "5, 5",
            " 5",
            "5\t",
        ] {
            let mut fields = HeaderMap::new();
            fields.insert(header::CONTENT_LENGTH, bad.parse().unwrap());
            let refused = build(frame(get("/"), fields, false), false).unwrap_err();
            assert!(refused.framing, "{bad:?}");
        }
        // The same number in several fields, or with leading zeros: that one length, and the
        // request carries it as one plain value (as HTTP/1.1 and HTTP/3 do). A list inside one
        // field, among others too, is refused.
        let mut listed = HeaderMap::new();
        listed.append(header::CONTENT_LENGTH, "5".parse().unwrap());
        listed.append(header::CONTENT_LENGTH, "5, 5".parse().unwrap());
        assert!(build(frame(get("/"), listed, false), false).is_err());
        for list in [&["5", "5"][..], &["005"], &["5", "05", "5"]] {
            let mut fields = HeaderMap::new();
            for v in list {
                fields.append(header::CONTENT_LENGTH, v.parse().unwrap());
            }
            let (req, framing) = build(frame(get("/"), fields, false), false).unwrap();
            assert_eq!(framing.length, Some(5), "{list:?}");
            let values: Vec<_> = req
                .headers()
                .get_all(header::CONTENT_LENGTH)
                .iter()
                .collect();
            assert_eq!(values, ["5"], "{list:?}");
        }
        let mut zero = HeaderMap::new();
        zero.insert(header::CONTENT_LENGTH, "0".parse().unwrap());
        assert!(build(frame(get("/"), zero, true), false).is_ok());
    }

    #[test]
    fn cookie_fields_are_joined_into_one() {
        let mut fields = HeaderMap::new();
        fields.append(header::COOKIE, "a=1".parse().unwrap());
        fields.append("accept", "*/*".parse().unwrap());
        fields.append(header::COOKIE, "b=2".parse().unwrap());
        fields.append(header::COOKIE, "c=3; d=4".parse().unwrap());
        let (req, _) = build(frame(get("/"), fields, true), false).unwrap();
        let cookies: Vec<_> = req.headers().get_all(header::COOKIE).iter().collect();
        assert_eq!(cookies, ["a=1; b=2; c=3; d=4"]);
        let mut one = HeaderMap::new();
        one.append(header::COOKIE, "a=1".parse().unwrap());
        let (req, _) = build(frame(get("/"), one, true), false).unwrap();
        assert_eq!(req.headers()[header::COOKIE], "a=1");
    }

    fn unsafe_str(s: &'static str) -> h2::frame::BytesStr {
        h2::frame::BytesStr::try_from(Bytes::from_static(s.as_bytes())).unwrap()
    }
}
