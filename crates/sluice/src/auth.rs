//! Who is asking: the shared password (constant-time), and the client IP believed only from trusted
//! proxies. Tokens live in `auth/token`; what a browser may do, in `auth/browser`.

pub mod browser;
pub mod config;
pub mod guesses;
pub mod reuse;
pub mod token;

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderMap;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub use config::AuthConfig;

/// The password check and the token gate of one `[auth]` section, swapped whole by a reload:
/// a changed password revokes every token minted under the old one at once.
pub struct Credentials {
    pub auth: Auth,
    /// `None` without a password.
    pub tokens: Option<Arc<token::TokenGate>>,
}

impl Credentials {
    pub fn new(config: &AuthConfig) -> Credentials {
        Credentials {
            auth: Auth::new(config),
            tokens: token::TokenGate::new(config).map(Arc::new),
        }
    }

    /// The credentials of a reloaded `[auth]`: as [`Credentials::new`], except that an unchanged
    /// password keeps `running`'s derived token key (and, key and child lifetime unchanged, the
    /// child tokens it minted) instead of deriving it again (`token::TokenGate::reloaded`).
    pub fn reloaded(config: &AuthConfig, running: &Credentials) -> Credentials {
        Credentials {
            auth: Auth::new(config),
            tokens: token::TokenGate::reloaded(config, running.tokens.as_deref()).map(Arc::new),
        }
    }
}

/// The live [`Credentials`], shared by every part that checks a password or mints a token.
#[derive(Clone)]
pub struct Keys(Arc<arc_swap::ArcSwap<Credentials>>);

impl Keys {
    pub fn new(config: &AuthConfig) -> Keys {
        Keys(Arc::new(arc_swap::ArcSwap::from_pointee(Credentials::new(
            config,
        ))))
    }

    /// The credentials now; a request keeps the ones it started with.
    pub fn load(&self) -> Arc<Credentials> {
        self.0.load_full()
    }

    /// The token gate now (`None` without a password).
    pub fn tokens(&self) -> Option<Arc<token::TokenGate>> {
        self.0.load().tokens.clone()
    }

    /// Installs a reloaded `[auth]`.
    pub fn store(&self, credentials: Credentials) {
        self.0.store(Arc::new(credentials));
    }
}

/// The credentials check.
#[derive(Clone)]
pub struct Auth {
    /// SHA-256 of the password; comparing digests keeps the comparison constant-time and length-blind.
    digest: Option<[u8; 32]>,
    password: Option<String>,
    trusted: Vec<ipnet::IpNet>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("password", &self.digest.map(|_| "********"))
            .field("trusted", &self.trusted)
            .finish()
    }
}

impl Auth {
    pub fn new(config: &AuthConfig) -> Self {
        let password = (!config.api_password.is_empty()).then(|| config.api_password.clone());
        Auth {
            digest: password.as_deref().map(digest),
            password,
            trusted: config.trusted_proxies.clone(),
        }
    }

    /// `true` when a password is configured.
    pub fn required(&self) -> bool {
        self.digest.is_some()
    }

    /// The configured password, for token encryption only (never written into a URL or a log).
    pub fn secret(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// `true` if `candidate` equals the password (always `true` when none is configured).
    pub fn check(&self, candidate: Option<&str>) -> bool {
        match (&self.digest, candidate) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(want), Some(got)) => bool::from(want.ct_eq(&digest(got))),
        }
    }

    /// `true` if `offered` equals `secret`, in time that depends on neither's content nor length:
    /// their SHA-256 digests are compared in constant time, as [`Auth::check`] does.
    pub fn same_secret(secret: &str, offered: &str) -> bool {
        bool::from(digest(secret).ct_eq(&digest(offered)))
    }

    /// Finds the password a request offers: `api_password` query parameter, `api_password` header,
    /// `api_password` cookie (players that cannot add headers), or the password of HTTP Basic
    /// credentials (a browser opening the pages). For reading only: a state-changing request
    /// takes [`Auth::offered_in_header`], which a browser never adds by itself.
    pub fn offered<'a>(query: Option<&'a str>, headers: &'a HeaderMap) -> Option<Cow<'a, str>> {
        query
            .or_else(|| Self::offered_in_header(headers))
            .or_else(|| cookie(headers, "api_password"))
            .map(Cow::Borrowed)
            .or_else(|| basic_password(headers).map(Cow::Owned))
    }

    /// The password in the `api_password` header only: a cross-site form or image cannot set a
    /// custom header, and a cross-site fetch that does needs a preflight no operator endpoint
    /// grants, so cookies and remembered Basic credentials cannot be used to forge the request.
    pub fn offered_in_header(headers: &HeaderMap) -> Option<&str> {
        headers.get("api_password").and_then(|v| v.to_str().ok())
    }

    /// The client's IP: the peer, or — only when the peer is a trusted proxy — the nearest untrusted
    /// node of the forwarding chain, read right to left: `X-Forwarded-For`'s hops, or the `for=`
    /// nodes of `Forwarded` (RFC 7239). A hop is an address, or an address with a port
    /// (`1.2.3.4:5678`, `[2001:db8::1]:443`, as some proxies write it). A hop that is neither
    /// (`unknown`, an obfuscated `_name`, garbage), a `Forwarded` that does not parse, or chains in
    /// both fields that name different clients past the trusted proxies make the client unknown
    /// (when only one reaches past them, it names the client): [`UNKNOWN_CLIENT`], which
    /// no allow-list entry but `0.0.0.0/0` holds and no token binding matches, never the trusted
    /// proxy's own address. So does an `X-Real-IP` without either field: a proxy that does not set
    /// it passes the client's own, so it is never read.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.is_trusted(peer) {
            return peer;
        }
        let from_xff = self.forwarded_for(peer, headers);
        let from_forwarded = self.forwarded(peer, headers);
        match (from_xff, from_forwarded) {
            (Some(x), Some(f)) if canonical(x.client) == canonical(f.client) => x.client,
            // Only one chain reaches past the trusted proxies: the one a trusted proxy appended
            // its client to. (A tier that writes only `X-Forwarded-For` in front of one that
            // writes both leaves `Forwarded` naming proxies alone; a client's forged field can
            // win only where the genuine one names proxies alone, which it cannot know.)
            (Some(x), Some(f)) if x.reached != f.reached => {
                if x.reached {
                    x.client
                } else {
                    f.client
                }
            }
            // Both name different clients: one forged by the client, passed by a proxy that
            // writes only the other.
            (Some(_), Some(_)) => UNKNOWN_CLIENT,
            (Some(chain), None) | (None, Some(chain)) => chain.client,
            // A `Forwarded` naming no node (`proto=https;host=...` alone) or an `X-Real-IP`
            // without a chain: never the proxy's own address.
            (None, None)
                if headers.contains_key("x-real-ip")
                    || headers.contains_key(http::header::FORWARDED) =>
            {
                UNKNOWN_CLIENT
            }
            (None, None) => peer,
        }
    }

    /// The client `X-Forwarded-For` names (`None` when it names no hop at all).
    pub(crate) fn forwarded_for(&self, peer: IpAddr, headers: &HeaderMap) -> Option<Walked> {
        let mut lines = Vec::new();
        for value in headers.get_all("x-forwarded-for") {
            let Ok(line) = value.to_str() else {
                return Some(Walked::UNREADABLE);
            };
            lines.push(line);
        }
        let hops = lines
            .iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(parse_hop)
            .collect::<Vec<_>>();
        (!hops.is_empty()).then(|| self.walk(peer, hops))
    }

    /// The client the `for=` nodes of `Forwarded` name (`None` when no element has a `for`
    /// parameter: a proxy writing only `proto` and `host` beside `X-Forwarded-For`).
    pub(crate) fn forwarded(&self, peer: IpAddr, headers: &HeaderMap) -> Option<Walked> {
        let mut nodes = Vec::new();
        let mut any_for = false;
        for value in headers.get_all(http::header::FORWARDED) {
            let Some(line) = value.to_str().ok().and_then(forwarded_nodes) else {
                return Some(Walked::UNREADABLE);
            };
            for (has_for, node) in line {
                any_for |= has_for;
                nodes.push(node);
            }
        }
        any_for.then(|| self.walk(peer, nodes))
    }

    /// Walks a chain right to left from the trusted `peer`: the first untrusted node, else the
    /// left-most; an unreadable node reached first makes the client unknown.
    fn walk(&self, peer: IpAddr, nodes: Vec<Option<IpAddr>>) -> Walked {
        let of = nodes.len();
        let mut client = peer;
        for (at, node) in nodes.into_iter().enumerate().rev() {
            let Some(ip) = node else {
                return Walked {
                    at: Some(at),
                    of,
                    ..Walked::UNREADABLE
                };
            };
            client = ip;
            if !self.is_trusted(ip) {
                return Walked {
                    client,
                    reached: true,
                    at: Some(at),
                    of,
                };
            }
        }
        Walked {
            client,
            reached: false,
            at: None,
            of,
        }
    }

    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.trusted.iter().any(|net| net.contains(&ip))
    }
}

/// Where a forwarding chain, read right to left, led.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Walked {
    client: IpAddr,
    /// Whether it reached a node that is not a trusted proxy (or one it could not read): a
    /// client rather than the left-most of the proxies.
    reached: bool,
    /// The index of the node it stopped at (the first untrusted or unreadable one from the
    /// right), out of [`Walked::of`]: the element or entry the outermost trusted proxy wrote.
    /// `None` when every node is a trusted proxy, or the field itself could not be read.
    #[cfg_attr(not(feature = "media"), allow(dead_code))]
    pub(crate) at: Option<usize>,
    /// The nodes in the chain (`X-Forwarded-For`'s non-empty hops, `Forwarded`'s non-empty
    /// elements), over every line of the field.
    #[cfg_attr(not(feature = "media"), allow(dead_code))]
    pub(crate) of: usize,
}

impl Walked {
    const UNREADABLE: Walked = Walked {
        client: UNKNOWN_CLIENT,
        reached: true,
        at: None,
        of: 0,
    };
}

/// The client address of a request whose forwarding chain is unreadable: the unspecified address.
pub const UNKNOWN_CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);

/// One `X-Forwarded-For` element: an address, `IPv4:port`, `[IPv6]` or `[IPv6]:port`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = hop.parse::<std::net::SocketAddr>() {
        return Some(sa.ip());
    }
    let v6 = hop.strip_prefix('[')?.strip_suffix(']')?;
    v6.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6)
}

/// Each element of one `Forwarded` field line, left to right: whether it has a `for` parameter,
/// and its node: `None` for an element without one, or whose node is not an address (`unknown`, an obfuscated `_name`,
/// garbage). `None` for the whole line when it does not parse: a quoted string left open or a
/// character outside one that no value holds (a client's fragment must not swallow or reshape
/// the element its proxy appended), a pair without `=`, or `for` twice in one element.
fn forwarded_nodes(line: &str) -> Option<Vec<(bool, Option<IpAddr>)>> {
    let mut nodes = Vec::new();
    for element in split_unquoted(line, b',')? {
        if element.trim().is_empty() {
            continue;
        }
        let mut node = None;
        for pair in split_unquoted(element, b';')? {
            let pair = pair.trim();
            if pair.is_empty() {
                continue;
            }
            let (name, value) = pair.split_once('=')?;
            if name.is_empty() || !name.bytes().all(is_tchar) {
                return None;
            }
            let value = match value.strip_prefix('"') {
                // (Balanced by `split_unquoted`: a quoted value is the whole value.)
                Some(quoted) => quoted.strip_suffix('"')?,
                None if !value.is_empty() && value.bytes().all(is_unquoted_byte) => value,
                None => return None,
            };
            if name.eq_ignore_ascii_case("for") {
                if node.is_some() {
                    return None;
                }
                // No address holds a quoted pair: an escape leaves the node unread.
                node = Some((!value.contains('\\')).then(|| parse_node(value)).flatten());
            }
        }
        nodes.push((node.is_some(), node.flatten()));
    }
    Some(nodes)
}

/// Splits `s` at each `delim` outside a quoted string. `None` when a quoted string is left open,
/// or a quote opens in the middle of a value (`a"b"`) or a value continues after one closes.
pub(crate) fn split_unquoted(s: &str, delim: u8) -> Option<Vec<&str>> {
    let bytes = s.as_bytes();
    let mut parts = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                // A quoted string is a whole value: it follows `=`.
                if i == 0 || bytes[i - 1] != b'=' {
                    return None;
                }
                i += 1;
                loop {
                    match bytes.get(i)? {
                        b'"' => break,
                        b'\\' => i += 2,
                        _ => i += 1,
                    }
                }
                // After the closing quote: a delimiter, blanks or the end.
                if !matches!(bytes.get(i + 1), None | Some(b',' | b';' | b' ' | b'\t')) {
                    return None;
                }
            }
            b if b == delim => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(&s[start..]);
    Some(parts)
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A byte of an unquoted value: a token's, and the `:` `[` `]` of an address with a port or an
/// IPv6 address some proxies leave unquoted.
fn is_unquoted_byte(b: u8) -> bool {
    is_tchar(b) || matches!(b, b':' | b'[' | b']')
}

/// A `Forwarded` node: an address, `IPv4:port`, `[IPv6]` or `[IPv6]:port`, the port possibly
/// obfuscated (`_name`). `unknown` and obfuscated names are no address.
fn parse_node(node: &str) -> Option<IpAddr> {
    if let Some((host, port)) = node.rsplit_once(':') {
        let obfuscated = port.strip_prefix('_').is_some_and(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        });
        if obfuscated && (host.starts_with('[') || !host.contains(':')) {
            return parse_hop(host);
        }
    }
    parse_hop(node)
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// The password of `Authorization: Basic` credentials (any user name).
fn basic_password(headers: &HeaderMap) -> Option<String> {
    use base64::Engine;
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    text.split_once(':').map(|(_, pw)| pw.to_string())
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(pw: &str, trusted: &[&str]) -> Auth {
        Auth::new(&AuthConfig {
            api_password: pw.into(),
            trusted_proxies: trusted.iter().map(|t| t.parse().unwrap()).collect(),
            ..AuthConfig::default()
        })
    }

    #[test]
    fn password_check() {
        let a = auth("s3cret", &[]);
        assert!(a.check(Some("s3cret")));
        assert!(!a.check(Some("s3cre")));
        assert!(!a.check(None));
        assert!(auth("", &[]).check(None));
        assert!(!format!("{a:?}").contains("s3cret"));
    }

    #[test]
    fn offered_sources() {
        let mut h = HeaderMap::new();
        assert_eq!(Auth::offered(Some("q"), &h).as_deref(), Some("q"));
        // "u:b" in base64.
        h.insert("authorization", "Basic dTpi".parse().unwrap());
        assert_eq!(Auth::offered(None, &h).as_deref(), Some("b"));
        h.insert("cookie", "a=1; api_password=c".parse().unwrap());
        assert_eq!(Auth::offered(None, &h).as_deref(), Some("c"));
        assert_eq!(Auth::offered_in_header(&h), None);
        h.insert("api_password", "h".parse().unwrap());
        assert_eq!(Auth::offered(None, &h).as_deref(), Some("h"));
        assert_eq!(Auth::offered_in_header(&h), Some("h"));
    }

    #[test]
    fn forwarded_for_only_from_trusted_peers() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "1.2.3.4, 10.0.0.2".parse().unwrap());
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        // Untrusted peer: its header is ignored.
        assert_eq!(auth("", &[]).client_ip(peer, &h), peer);
        // Trusted chain: the nearest untrusted hop wins.
        let a = auth("", &["10.0.0.0/8"]);
        assert_eq!(a.client_ip(peer, &h), "1.2.3.4".parse::<IpAddr>().unwrap());
        // A spoofed left-most entry cannot jump over an untrusted hop.
        h.insert("x-forwarded-for", "6.6.6.6, 5.5.5.5".parse().unwrap());
        assert_eq!(a.client_ip(peer, &h), "5.5.5.5".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn forwarded_for_hops_with_ports_or_garbage() {
        let a = auth("", &["10.0.0.0/8"]);
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let client = |xff: &str| {
            let mut h = HeaderMap::new();
            h.insert("x-forwarded-for", xff.parse().unwrap());
            a.client_ip(peer, &h)
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(client("1.2.3.4:5678"), ip("1.2.3.4"));
        assert_eq!(client("[2001:db8::1]:443"), ip("2001:db8::1"));
        assert_eq!(client("[2001:db8::1]"), ip("2001:db8::1"));
        assert_eq!(client("1.2.3.4, 10.0.0.9:80"), ip("1.2.3.4"));
        assert_eq!(client("1.2.3.4,"), ip("1.2.3.4"));
        // Never the trusted proxy itself.
        for garbage in [
            "unknown",
            "1.2.3.4:port",
            "[::1",
            "1.2.3.4, unknown",
            "_hidden",
        ] {
            assert_eq!(client(garbage), UNKNOWN_CLIENT, "{garbage}");
        }
        // Garbage left of an untrusted hop is never read.
        assert_eq!(client("unknown, 1.2.3.4"), ip("1.2.3.4"));
    }

    /// The client a trusted peer's `headers` name.
    fn trusted_client(headers: &[(&str, &str)]) -> IpAddr {
        let a = auth("", &["10.0.0.0/8"]);
        let mut h = HeaderMap::new();
        for (name, value) in headers {
            h.append(
                http::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        a.client_ip("10.0.0.1".parse().unwrap(), &h)
    }

    #[test]
    fn forwarded_nodes_read_like_forwarded_for_hops() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let client = |f: &str| trusted_client(&[("forwarded", f)]);
        for (value, want) in [
            ("for=203.0.113.7", "203.0.113.7"),
            ("For=203.0.113.7;proto=https", "203.0.113.7"),
            (
                "proto=https;FOR=\"203.0.113.7:8080\";by=10.0.0.1",
                "203.0.113.7",
            ),
            ("for=\"[2001:db8::1]\"", "2001:db8::1"),
            ("for=\"[2001:db8::1]:443\"", "2001:db8::1"),
            ("for=\"203.0.113.7:_port\"", "203.0.113.7"),
            // Unquoted, as some proxies write them.
            ("for=203.0.113.7:80", "203.0.113.7"),
            ("for=2001:db8::1", "2001:db8::1"),
            // Right to left, trusted nodes skipped, the first untrusted wins.
            ("for=6.6.6.6, for=203.0.113.7", "203.0.113.7"),
            ("for=203.0.113.7;host=a.test, for=10.0.0.9", "203.0.113.7"),
            ("for=10.0.0.8, for=10.0.0.9", "10.0.0.8"),
            // Garbage left of an untrusted node is never read.
            ("for=unknown, for=203.0.113.7", "203.0.113.7"),
            // A quoted comma or semicolon does not split.
            ("for=203.0.113.7;host=\"a,for=6.6.6.6;b\"", "203.0.113.7"),
            ("host=\"x\\\",for=6.6.6.6\";for=203.0.113.7", "203.0.113.7"),
            ("for=203.0.113.7,, ,", "203.0.113.7"),
        ] {
            assert_eq!(client(value), ip(want), "{value}");
        }
        // Never the trusted proxy itself, nor a node the value did not name.
        for garbage in [
            "for=unknown",
            "for=_hidden",
            "for=\"_hidden:80\"",
            "for=\"[2001:db8::1\"",
            "for=203.0.113.7:port",
            "for=",
            "for=\"\"",
            "proto=https",
            "for=203.0.113.7, proto=https",
            "for=10.0.0.9;for=203.0.113.7",
            "for=\"203.0.113.7",
            "for=\"6.6.6.6, for=203.0.113.7",
            "for=\"6.6.6.6\\\", for=203.0.113.7",
            "for=6.6.6.6\", for=\"203.0.113.7",
            "for=\"203.0.113.7\"x",
            "for=\"203\\.0.113.7\"",
            "for=203.0.113.7 6.6.6.6",
            "for = 203.0.113.7",
            "for=203.0.113.7;junk",
            "for=10.0.0.9, for=unknown",
        ] {
            assert_eq!(client(garbage), UNKNOWN_CLIENT, "{garbage}");
        }
        // Several field lines are one list; one that does not parse spoils it.
        let lines = [
            ("forwarded", "for=6.6.6.6"),
            ("forwarded", "for=203.0.113.7"),
        ];
        assert_eq!(trusted_client(&lines), ip("203.0.113.7"));
        let lines = [
            ("forwarded", "for=\"6.6.6.6"),
            ("forwarded", "for=203.0.113.7\""),
        ];
        assert_eq!(trusted_client(&lines), UNKNOWN_CLIENT);
        // From an untrusted peer it is not read.
        let mut h = HeaderMap::new();
        h.insert("forwarded", "for=203.0.113.7".parse().unwrap());
        let peer: IpAddr = "198.51.100.1".parse().unwrap();
        assert_eq!(auth("", &["10.0.0.0/8"]).client_ip(peer, &h), peer);
    }

    #[test]
    fn a_trusted_peer_without_a_chain_is_not_its_clients_address() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // `X-Real-IP` alone is never believed, nor taken for the proxy's own request.
        assert_eq!(
            trusted_client(&[("x-real-ip", "203.0.113.7")]),
            UNKNOWN_CLIENT
        );
        assert_eq!(trusted_client(&[("x-real-ip", "10.0.0.1")]), UNKNOWN_CLIENT);
        // No field at all: the proxy's own request.
        assert_eq!(trusted_client(&[]), ip("10.0.0.1"));
        // An empty chain is none.
        assert_eq!(trusted_client(&[("x-forwarded-for", "")]), ip("10.0.0.1"));
        assert_eq!(
            trusted_client(&[("x-forwarded-for", " , "), ("x-real-ip", "203.0.113.7")]),
            UNKNOWN_CLIENT
        );
        assert_eq!(
            trusted_client(&[("x-forwarded-for", ""), ("forwarded", "for=203.0.113.7")]),
            ip("203.0.113.7")
        );
        // With a chain, `X-Real-IP` is not read.
        assert_eq!(
            trusted_client(&[("x-forwarded-for", "203.0.113.7"), ("x-real-ip", "6.6.6.6")]),
            ip("203.0.113.7")
        );
        // Both chains: read when they agree; a client's forged one does not pass through a proxy
        // that writes only the other.
        let both =
            |xff: &str, fwd: &str| trusted_client(&[("x-forwarded-for", xff), ("forwarded", fwd)]);
        assert_eq!(both("203.0.113.7", "for=203.0.113.7"), ip("203.0.113.7"));
        assert_eq!(
            both("6.6.6.6, 203.0.113.7", "for=\"203.0.113.7:1234\""),
            ip("203.0.113.7")
        );
        assert_eq!(both("6.6.6.6", "for=203.0.113.7"), UNKNOWN_CLIENT);
        assert_eq!(both("203.0.113.7", "for=6.6.6.6"), UNKNOWN_CLIENT);
        assert_eq!(both("203.0.113.7", "for=\"203.0.113.7"), UNKNOWN_CLIENT);
        // When only one chain reaches past the trusted proxies, it names the client: a forged
        // trusted address in the other cannot pass, and a tier writing only `X-Forwarded-For` in
        // front of one writing both leaves `Forwarded` naming proxies alone.
        assert_eq!(both("10.0.0.9", "for=203.0.113.7"), ip("203.0.113.7"));
        assert_eq!(both("203.0.113.7", "for=10.0.0.9"), ip("203.0.113.7"));
        assert_eq!(
            both("203.0.113.7, 10.0.0.2", "for=10.0.0.2"),
            ip("203.0.113.7")
        );
        // Two chains of proxies alone that disagree: no client.
        assert_eq!(both("10.0.0.9", "for=10.0.0.8"), UNKNOWN_CLIENT);
        // The same address spelled IPv4-mapped in one.
        assert_eq!(
            both("::ffff:203.0.113.7", "for=203.0.113.7"),
            ip("::ffff:203.0.113.7")
        );
        // A `Forwarded` naming no node (a proxy writing `proto` and `host` beside
        // `X-Forwarded-For`) leaves the chain to `X-Forwarded-For`; alone, no client.
        assert_eq!(
            both("203.0.113.7", "proto=https;host=a.example"),
            ip("203.0.113.7")
        );
        assert_eq!(
            trusted_client(&[("forwarded", "proto=https;host=a.example")]),
            UNKNOWN_CLIENT
        );
        // One element with `for`, a later one without: the chain is unreadable from there.
        assert_eq!(
            trusted_client(&[("forwarded", "for=127.0.0.1, proto=https")]),
            UNKNOWN_CLIENT
        );
    }
}
