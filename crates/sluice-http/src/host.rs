//! `Host` and `:authority` checks (RFC 9110 §7.2, RFC 9112 §3.2, RFC 9113 §8.3.1): a request
//! names exactly one host, in a shape that no router, cache key or origin can read two ways. No
//! I/O.
//!
//! The grammar is RFC 3986's `host [ ":" port ]`, narrowed the way nginx narrows it: a name is
//! letters, digits, `-`, `_`, `~` and dots between non-empty labels (an optional final dot), an
//! IPv6 literal is in brackets, a port is 1 to 5 digits up to 65535. Percent-encoding, sub-delims
//! (`!$&'()*+,;=`), `@` (user info), `/`, `#`, `?`, `|`, `\`, spaces and controls are refused: they
//! are legal in some URI parts but no DNS name holds them, and each has been used to make a proxy
//! route one host while the origin reads another.

use http::header::{HeaderMap, HOST};
use http::Version;

/// Longest host (without the port) accepted: a DNS name is at most 253 characters.
pub const MAX_HOST: usize = 255;

/// Why a request's host is refused (each is a 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("an HTTP/1.1 request needs a Host field")]
    Missing,
    #[error("more than one Host field")]
    Repeated,
    #[error("the Host field is not a valid host")]
    Invalid,
    #[error("the request target's authority is not a valid host")]
    InvalidAuthority,
    #[error("the Host field does not name the :authority of the request")]
    Mismatch,
}

/// A valid `host [ ":" port ]`, split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostPort<'a> {
    /// The host as written (an IPv6 literal keeps its brackets).
    pub host: &'a str,
    pub port: Option<u16>,
}

/// Parses a `Host` value or an authority without user info.
pub fn parse_host(value: &[u8]) -> Result<HostPort<'_>, HostError> {
    let text = std::str::from_utf8(value).map_err(|_| HostError::Invalid)?;
    parse_host_text(text)
}

/// [`parse_host`] for a value already known to be text.
pub fn parse_host_text(text: &str) -> Result<HostPort<'_>, HostError> {
    let (host, port) = if text.starts_with('[') {
        let close = text.find(']').ok_or(HostError::Invalid)?;
        let literal = &text[1..close];
        if literal.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(HostError::Invalid);
        }
        let rest = &text[close + 1..];
        let port = match rest {
            "" => None,
            r => Some(r.strip_prefix(':').ok_or(HostError::Invalid)?),
        };
        (&text[..=close], port)
    } else {
        // The first `:`, found by byte (it is ASCII, so both halves stay text).
        match text.bytes().position(|b| b == b':') {
            Some(at) => (&text[..at], Some(&text[at + 1..])),
            None => (text, None),
        }
    };
    if !valid_name(host) && !host.starts_with('[') {
        return Err(HostError::Invalid);
    }
    let port = match port {
        None => None,
        Some(p) => Some(parse_port(p).ok_or(HostError::Invalid)?),
    };
    Ok(HostPort { host, port })
}

/// A registered name or IPv4 address: non-empty labels of `[A-Za-z0-9_~-]` separated by single
/// dots, an optional final dot. One pass over the bytes.
fn valid_name(host: &str) -> bool {
    if host.is_empty() || host.len() > MAX_HOST {
        return false;
    }
    let body = host.strip_suffix('.').unwrap_or(host);
    // The length of the label being read.
    let mut label = 0usize;
    for b in body.bytes() {
        if b == b'.' {
            if label == 0 {
                return false;
            }
            label = 0;
        } else if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~') {
            label += 1;
        } else {
            return false;
        }
    }
    label > 0
}

/// 1 to 5 digits, at most 65535.
fn parse_port(p: &str) -> Option<u16> {
    if p.is_empty() || p.len() > 5 {
        return None;
    }
    let mut n = 0u32;
    for b in p.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u32::from(b - b'0');
    }
    u16::try_from(n).ok()
}

/// Checks the host of a request: its `Host` fields (`headers`) and the authority of its target
/// (`authority`: an absolute-form target's, or HTTP/2's `:authority`).
///
/// - more than one `Host` field, or an invalid one, or an invalid authority: refused;
/// - HTTP/1.1 without `Host`: refused, even in absolute form (RFC 9112 §3.2); HTTP/1.0 may omit it;
/// - HTTP/2 and HTTP/3: `Host` beside `:authority` must name the same host and port (RFC 9113
///   §8.3.1); a request with neither is refused.
///
/// In HTTP/1.1 absolute form the target's authority wins over `Host` (RFC 9112 §3.2.2), so the two
/// may differ there.
pub fn check_request_host(
    version: Version,
    headers: &HeaderMap,
    authority: Option<&str>,
) -> Result<(), HostError> {
    let mut fields = headers.get_all(HOST).iter();
    let host = fields.next();
    if fields.next().is_some() {
        return Err(HostError::Repeated);
    }
    let host = host
        .map(|v| parse_host(v.as_bytes()))
        .transpose()
        .map_err(|_| HostError::Invalid)?;
    let authority = authority
        .map(|a| parse_host(a.as_bytes()))
        .transpose()
        .map_err(|_| HostError::InvalidAuthority)?;
    match version {
        Version::HTTP_11 if host.is_none() => Err(HostError::Missing),
        Version::HTTP_2 | Version::HTTP_3 => match (host, authority) {
            (None, None) => Err(HostError::Missing),
            (Some(h), Some(a)) if !same(h, a) => Err(HostError::Mismatch),
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

fn same(a: HostPort<'_>, b: HostPort<'_>) -> bool {
    a.host.eq_ignore_ascii_case(b.host) && a.port == b.port
}

/// Whether `name` is one label under a wildcard's `suffix` (`.example.com` for
/// `*.example.com`): a wildcard covers one label only (RFC 6125 §6.4.3), so `a.b.example.com` is
/// not under it, and neither is `example.com`. Both lowercase (compared byte for byte).
pub fn under_wildcard(name: &str, suffix: &str) -> bool {
    name.len() > suffix.len()
        && name.ends_with(suffix)
        && !name[..name.len() - suffix.len()].contains('.')
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    /// The label and port checks as they were first written (split on dots, `str::parse`),
    /// which the one-pass versions must agree with.
    fn reference(text: &str) -> Option<(String, Option<u16>)> {
        let (host, port) = if text.starts_with('[') {
            return parse_host_text(text)
                .ok()
                .map(|h| (h.host.to_string(), h.port));
        } else {
            match text.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (text, None),
            }
        };
        let body = host.strip_suffix('.').unwrap_or(host);
        let name_ok = !host.is_empty()
            && host.len() <= MAX_HOST
            && !body.is_empty()
            && body.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~'))
            });
        if !name_ok {
            return None;
        }
        let port = match port {
            None => None,
            Some(p) if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) => {
                return None
            }
            Some(p) => Some(p.parse::<u16>().ok()?),
        };
        Some((host.to_string(), port))
    }

    proptest::proptest! {
        #[test]
        fn one_pass_checks_agree_with_the_reference(text in "[a-z0-9._~:|-]{0,12}|[a-z.]{0,6}:[0-9]{0,7}") {
            let got = parse_host_text(&text).ok().map(|h| (h.host.to_string(), h.port));
            proptest::prop_assert_eq!(got, reference(&text));
        }
    }

    fn ok(v: &str) -> bool {
        parse_host(v.as_bytes()).is_ok()
    }

    #[test]
    fn shapes() {
        for good in [
            "example.com",
            "EXAMPLE.com:8080",
            "a.wild.example.com",
            "example.com.",
            "127.0.0.1",
            "127.0.0.1:80",
            "[::1]",
            "[2001:db8::1]:443",
            "under_score.example",
            "x",
        ] {
            assert!(ok(good), "{good}");
        }
        for bad in [
            "",
            "evil.com/.wild.example.com",
            "evil.com#.wild.example.com",
            "evil.com?.wild.example.com",
            "a..wild.example.com",
            ".example.com",
            "example.com..",
            "user@example.com",
            "a|b.example.com",
            "example.com:",
            "example.com:65536",
            "example.com:80:80",
            "example.com:-1",
            "ex ample.com",
            "ex%41mple.com",
            "a,b.example.com",
            "[::1",
            "[::1]x",
            "[zz::1]",
            "[::1]:",
            "exa\\mple.com",
            "é.example",
        ] {
            assert!(!ok(bad), "{bad:?}");
        }
        assert!(!ok(&"a".repeat(256)));
        assert_eq!(
            parse_host(b"[::1]:8080"),
            Ok(HostPort {
                host: "[::1]",
                port: Some(8080)
            })
        );
    }

    fn with(hosts: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in hosts {
            h.append(HOST, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn request_rules() {
        let v11 = Version::HTTP_11;
        assert_eq!(check_request_host(v11, &with(&["a.test"]), None), Ok(()));
        assert_eq!(
            check_request_host(v11, &with(&[]), None),
            Err(HostError::Missing)
        );
        assert_eq!(
            check_request_host(v11, &with(&[]), Some("a.test")),
            Err(HostError::Missing)
        );
        assert_eq!(
            check_request_host(Version::HTTP_10, &with(&[]), None),
            Ok(())
        );
        assert_eq!(
            check_request_host(v11, &with(&["a.test", "a.test"]), None),
            Err(HostError::Repeated)
        );
        assert_eq!(
            check_request_host(v11, &with(&["evil.com/.a.test"]), None),
            Err(HostError::Invalid)
        );
        assert_eq!(
            check_request_host(v11, &with(&["a.test"]), Some("b.test")),
            Ok(())
        );
        let v2 = Version::HTTP_2;
        assert_eq!(check_request_host(v2, &with(&[]), Some("a.test")), Ok(()));
        assert_eq!(
            check_request_host(v2, &with(&["A.test"]), Some("a.test")),
            Ok(())
        );
        assert_eq!(
            check_request_host(v2, &with(&["b.test"]), Some("a.test")),
            Err(HostError::Mismatch)
        );
        assert_eq!(
            check_request_host(v2, &with(&["a.test:81"]), Some("a.test")),
            Err(HostError::Mismatch)
        );
        assert_eq!(
            check_request_host(v2, &with(&[]), None),
            Err(HostError::Missing)
        );
        assert_eq!(
            check_request_host(v2, &with(&[]), Some("u@a.test")),
            Err(HostError::InvalidAuthority)
        );
    }

    proptest! {
        /// Any bytes: no panic, and what passes is made only of the characters the grammar allows
        /// and splits back into exactly what was given.
        #[test]
        fn any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(hp) = parse_host(&bytes) {
                let text = std::str::from_utf8(&bytes).unwrap();
                prop_assert!(text.bytes().all(|b| b.is_ascii_alphanumeric()
                    || b"-._~:[]".contains(&b)));
                prop_assert!(!text.contains(".."));
                let joined = match hp.port {
                    Some(p) => format!("{}:{p}", hp.host),
                    None => hp.host.to_string(),
                };
                // A port may be written with leading zeros; the host part is always as given.
                prop_assert!(text.starts_with(hp.host));
                prop_assert_eq!(parse_host(joined.as_bytes()), Ok(hp));
            }
        }

        /// A valid name with a suffix that changes where a URL parser says the host ends is
        /// refused.
        #[test]
        fn confusing_suffixes(name in "[a-z]{1,10}(\\.[a-z]{1,10}){0,3}", c in "[/#?@|\\\\ %,;]") {
            let confusing = format!("{name}{c}.wild.example.com");
            prop_assert!(parse_host(confusing.as_bytes()).is_err());
        }
    }

    #[test]
    fn a_wildcard_covers_one_label() {
        assert!(under_wildcard("a.example.com", ".example.com"));
        assert!(!under_wildcard("a.b.example.com", ".example.com"));
        assert!(!under_wildcard("example.com", ".example.com"));
        assert!(!under_wildcard(".example.com", ".example.com"));
        assert!(!under_wildcard("aexample.com", ".example.com"));
    }
}
