//! Who is asking: the shared password (constant-time), and the client IP believed only from trusted
//! proxies. Tokens live in `auth/token`; what a browser may do, in `auth/browser`.

pub mod browser;
pub mod config;
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
    /// address in `X-Forwarded-For`, read right to left. A hop is an address, or an address with a
    /// port (`1.2.3.4:5678`, `[2001:db8::1]:443`, as some proxies write it). A hop that is neither
    /// (`unknown`, garbage) makes the client unknown: [`UNKNOWN_CLIENT`], which no allow-list entry
    /// but `0.0.0.0/0` holds and no token binding matches, never the trusted proxy's own address.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.is_trusted(peer) {
            return peer;
        }
        let mut client = peer;
        let hops = headers
            .get_all("x-forwarded-for")
            .iter()
            .map(|v| v.to_str().ok())
            .collect::<Option<Vec<_>>>();
        let Some(hops) = hops else {
            return UNKNOWN_CLIENT;
        };
        let hops = hops
            .iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .collect::<Vec<_>>();
        for hop in hops.iter().rev() {
            let Some(ip) = parse_hop(hop) else {
                return UNKNOWN_CLIENT;
            };
            client = ip;
            if !self.is_trusted(ip) {
                break;
            }
        }
        client
    }

    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.trusted.iter().any(|net| net.contains(&ip))
    }
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
}
