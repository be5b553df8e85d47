//! MediaFlow-style query parameters (`d`, `h_*`, `r_*`, `rp_*`, `x_headers`) parsed into a typed value.
//!
//! No I/O. The wire contract is MediaFlow Proxy's: every proxy endpoint takes the upstream URL in `d`
//! (plain, percent-encoded or base64), upstream request headers as `h_<name>`, response headers as
//! `r_<name>` (this response only) and `rp_<name>` (propagated to child segments), and a comma list of
//! response headers to remove in `x_headers`.

use url::Url;

/// Why a query could not be turned into proxy parameters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("missing required parameter `d` (the upstream URL)")]
    MissingDestination,
    #[error("parameter `d` is not an http(s) URL: {0}")]
    BadDestination(String),
    #[error("header name in `{0}` is not a valid HTTP header name")]
    BadHeaderName(String),
    #[error("value of `{0}` is not a valid HTTP header value")]
    BadHeaderValue(String),
    #[error("`{0}` may not be set: it is a framing or hop-by-hop header the proxy owns")]
    ForbiddenHeader(String),
}

/// Headers that frame a message or concern one connection hop. A client may not set them through
/// `h_*`, `r_*` or `rp_*`: on a pooled keep-alive connection a forged `Content-Length` or
/// `Transfer-Encoding` makes the upstream read the next user's request as this one's body.
pub fn is_forbidden_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    matches!(
        name.as_str(),
        "content-length"
            | "transfer-encoding"
            | "connection"
            | "keep-alive"
            | "te"
            | "trailer"
            | "upgrade"
            | "expect"
            | "http2-settings"
    ) || name.starts_with("proxy-")
}

/// Response headers no `r_*`/`rp_*` parameter may set: the proxy's answers share the origin of its
/// pages, so a link could otherwise plant a cookie, lift the sandbox, open CORS, pin HSTS, wipe
/// site data, redirect, or register a service worker there. Nor the fields a web server in front
/// of the proxy acts on (nginx's `X-Accel-Redirect` and other `X-Accel-*`, `X-Sendfile`,
/// lighttpd's `X-Lighttpd-Send-File`): they would have it serve an internal location or a file.
pub fn is_forbidden_response_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    matches!(
        name.as_str(),
        "set-cookie"
            | "set-cookie2"
            | "content-security-policy"
            | "content-security-policy-report-only"
            | "x-content-type-options"
            | "x-frame-options"
            | "strict-transport-security"
            | "clear-site-data"
            | "refresh"
            | "location"
            | "link"
            | "service-worker-allowed"
            | "permissions-policy"
            | "feature-policy"
            | "origin-agent-cluster"
            | "www-authenticate"
            | "alt-svc"
            | "nel"
            | "report-to"
            | "reporting-endpoints"
            | "x-xss-protection"
            | "x-permitted-cross-domain-policies"
            | "timing-allow-origin"
            | "x-sendfile"
            | "x-lighttpd-send-file"
    ) || name.starts_with("access-control-")
        || name.starts_with("cross-origin-")
        || name.starts_with("x-accel-")
}

/// All query pairs of a request, in order, percent-decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    /// Parses a raw query string (without the leading `?`).
    pub fn parse(raw: &str) -> Self {
        let pairs = url::form_urlencoded::parse(raw.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        Query { pairs }
    }

    /// Builds a query from pairs (for example the claims of a decrypted token).
    pub fn from_pairs(pairs: Vec<(String, String)>) -> Self {
        Query { pairs }
    }

    /// The first value for `name`, if present.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// `true` for `1`, `true`, `yes`, `on` (case-insensitive).
    pub fn flag(&self, name: &str) -> bool {
        self.get(name).is_some_and(parse_bool)
    }

    /// Every pair, in request order.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    /// Adds pairs whose names are not present yet (token claims merged under explicit params).
    pub fn merge_missing(&mut self, extra: Vec<(String, String)>) {
        for (k, v) in extra {
            if self.get(&k).is_none() {
                self.pairs.push((k, v));
            }
        }
    }

    /// Removes every pair named `name`.
    pub fn remove(&mut self, name: &str) {
        self.pairs.retain(|(k, _)| k != name);
    }

    /// Serializes back to a query string.
    pub fn encode(&self) -> String {
        let mut out = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in &self.pairs {
            out.append_pair(k, v);
        }
        out.finish()
    }
}

/// Parses MediaFlow's boolean spellings.
pub fn parse_bool(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

/// The parameters every proxy endpoint shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyParams {
    /// The upstream URL from `d`.
    pub destination: Url,
    /// `h_<name>`: headers added to the upstream request (names lowercased).
    pub request_headers: Vec<(String, String)>,
    /// `r_<name>`: headers added to this response.
    pub response_headers: Vec<(String, String)>,
    /// `rp_<name>`: headers added to this response and carried to child segments.
    pub propagate_headers: Vec<(String, String)>,
    /// `x_headers`: upstream response headers to drop (lowercased).
    pub strip_headers: Vec<String>,
}

impl ProxyParams {
    /// Extracts the shared proxy parameters from a query.
    pub fn from_query(query: &Query) -> Result<Self, QueryError> {
        let raw = query.get("d").ok_or(QueryError::MissingDestination)?;
        let destination = parse_destination(raw)?;
        let mut params = ProxyParams {
            destination,
            request_headers: Vec::new(),
            response_headers: Vec::new(),
            propagate_headers: Vec::new(),
            strip_headers: Vec::new(),
        };
        for (key, value) in query.pairs() {
            if let Some(name) = key.strip_prefix("h_") {
                params.request_headers.push(header_pair(key, name, value)?);
            } else if let Some(name) = key.strip_prefix("rp_") {
                params
                    .propagate_headers
                    .push(response_pair(key, name, value)?);
            } else if let Some(name) = key.strip_prefix("r_") {
                params
                    .response_headers
                    .push(response_pair(key, name, value)?);
            } else if key == "x_headers" {
                params.strip_headers.extend(
                    value
                        .split(',')
                        .map(|h| h.trim().to_ascii_lowercase())
                        .filter(|h| !h.is_empty()),
                );
            }
        }
        Ok(params)
    }
}

fn response_pair(key: &str, name: &str, value: &str) -> Result<(String, String), QueryError> {
    let pair = header_pair(key, name, value)?;
    if is_forbidden_response_header(&pair.0) {
        return Err(QueryError::ForbiddenHeader(key.to_string()));
    }
    Ok(pair)
}

fn header_pair(key: &str, name: &str, value: &str) -> Result<(String, String), QueryError> {
    let mut name = name.trim().to_ascii_lowercase();
    // MediaFlow accepts the dictionary spelling and sends the HTTP one.
    if name == "referrer" {
        name = "referer".to_string();
    }
    let valid_name = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !valid_name {
        return Err(QueryError::BadHeaderName(key.to_string()));
    }
    if is_forbidden_header(&name) {
        return Err(QueryError::ForbiddenHeader(key.to_string()));
    }
    if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
        return Err(QueryError::BadHeaderValue(key.to_string()));
    }
    Ok((name, value.to_string()))
}

/// Decodes `d` (plain, still percent-encoded, or base64 of a URL; MediaFlow's repairs applied) and
/// accepts only absolute http(s) URLs with a host.
pub fn parse_destination(raw: &str) -> Result<Url, QueryError> {
    let candidate = crate::b64url::sanitize_destination(raw.trim());
    let url = Url::parse(&candidate).map_err(|e| QueryError::BadDestination(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(QueryError::BadDestination(format!(
            "scheme `{}` is not http or https",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(QueryError::BadDestination("URL has no host".to_string()));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    #[test]
    fn destination_forms() {
        let plain = parse_destination("https://cdn.example/a b.mp4?x=1").unwrap();
        assert_eq!(plain.as_str(), "https://cdn.example/a%20b.mp4?x=1");
        let encoded = parse_destination("https%3A%2F%2Fcdn.example%2Fv.mp4").unwrap();
        assert_eq!(encoded.as_str(), "https://cdn.example/v.mp4");
        let b64 =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("http://cdn.example/v.mp4?a=b");
        assert_eq!(
            parse_destination(&b64).unwrap().as_str(),
            "http://cdn.example/v.mp4?a=b"
        );
        let padded = base64::engine::general_purpose::STANDARD.encode("https://h.example/x");
        assert_eq!(
            parse_destination(&padded).unwrap().as_str(),
            "https://h.example/x"
        );
        assert_eq!(
            parse_destination("https%22//h.example/x").unwrap().as_str(),
            "https://h.example/x"
        );
    }

    #[test]
    fn destination_rejects() {
        assert!(matches!(
            parse_destination("ftp://h/x"),
            Err(QueryError::BadDestination(_))
        ));
        assert!(matches!(
            parse_destination("not a url"),
            Err(QueryError::BadDestination(_))
        ));
        assert!(matches!(
            parse_destination("file:///etc/passwd"),
            Err(QueryError::BadDestination(_))
        ));
        assert!(parse_destination("").is_err());
    }

    #[test]
    fn headers_split_by_prefix() {
        let q = Query::parse(
            "d=http%3A%2F%2Fh%2Fv&h_Referrer=http%3A%2F%2Fr&h_user-agent=UA&r_content-type=video%2Fmp4\
             &rp_x-a=1&x_headers=Server,%20ETag&api_password=pw",
        );
        let p = ProxyParams::from_query(&q).unwrap();
        assert_eq!(p.destination.as_str(), "http://h/v");
        assert_eq!(
            p.request_headers,
            vec![
                ("referer".into(), "http://r".into()),
                ("user-agent".into(), "UA".into())
            ]
        );
        assert_eq!(
            p.response_headers,
            vec![("content-type".into(), "video/mp4".into())]
        );
        assert_eq!(p.propagate_headers, vec![("x-a".into(), "1".into())]);
        assert_eq!(p.strip_headers, vec!["server", "etag"]);
    }

    #[test]
    fn framing_and_hop_by_hop_refused() {
        for key in [
            "h_content-length",
            "h_Content-Length",
            "h_transfer-encoding",
            "h_connection",
            "h_keep-alive",
            "h_te",
            "h_trailer",
            "h_upgrade",
            "h_expect",
            "h_proxy-authorization",
            "h_proxy-connection",
            "r_transfer-encoding",
            "rp_content-length",
        ] {
            let q = Query::parse(&format!("d=http://h/v&{key}=5"));
            assert_eq!(
                ProxyParams::from_query(&q),
                Err(QueryError::ForbiddenHeader(key.into())),
                "{key}"
            );
        }
        let q = Query::parse("d=http://h/v&h_host=h2&h_range=bytes%3D0-1&h_authorization=x");
        assert!(ProxyParams::from_query(&q).is_ok());
    }

    #[test]
    fn front_server_fields_refused_as_response_headers() {
        for key in [
            "r_x-accel-redirect",
            "r_X-Accel-Buffering",
            "rp_x-accel-expires",
            "r_x-sendfile",
            "rp_X-Lighttpd-Send-File",
        ] {
            let q = Query::parse(&format!("d=http://h/v&{key}=%2Finternal"));
            assert_eq!(
                ProxyParams::from_query(&q),
                Err(QueryError::ForbiddenHeader(key.into())),
                "{key}"
            );
        }
        // Upstream request headers of those names are the origin's business.
        let q = Query::parse("d=http://h/v&h_x-accel-redirect=1&r_x-accelerated=1");
        assert!(ProxyParams::from_query(&q).is_ok());
    }

    #[test]
    fn header_injection_refused() {
        let q = Query::parse("d=http://h/v&h_x=a%0d%0aEvil:%201");
        assert_eq!(
            ProxyParams::from_query(&q),
            Err(QueryError::BadHeaderValue("h_x".into()))
        );
        let q = Query::parse("d=http://h/v&h_bad%20name=1");
        assert_eq!(
            ProxyParams::from_query(&q),
            Err(QueryError::BadHeaderName("h_bad name".into()))
        );
    }

    #[test]
    fn missing_destination() {
        assert_eq!(
            ProxyParams::from_query(&Query::parse("h_a=1")),
            Err(QueryError::MissingDestination)
        );
    }

    #[test]
    fn query_round_trip_and_merge() {
        let mut q = Query::parse("a=1&b=x%20y");
        q.merge_missing(vec![("a".into(), "2".into()), ("c".into(), "3".into())]);
        assert_eq!(q.encode(), "a=1&b=x+y&c=3");
        q.remove("a");
        assert_eq!(q.get("a"), None);
        assert!(Query::parse("f=TRUE").flag("f"));
        assert!(!Query::parse("f=0").flag("f"));
    }
}
