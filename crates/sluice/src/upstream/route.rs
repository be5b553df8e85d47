//! Outgoing proxy routes: which hosts go through which HTTP CONNECT, SOCKS4 or SOCKS5 proxy, and
//! TLS opt-outs. Patterns are sluice's (`all`, `host`, `*.domain`) or MediaFlow's
//! `transport_routes` keys (`all://*.domain`, `https://host`, `http://host:8080`), whose scheme
//! and port narrow the route to requests with that scheme and port.

use super::RouteConfig;

/// How a route reaches its hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    Direct,
    /// HTTP proxy, tunnelled with CONNECT.
    HttpConnect {
        addr: String,
        auth: Option<(String, String)>,
    },
    /// SOCKS5; `remote_dns` (socks5h) lets the proxy resolve names.
    Socks5 {
        addr: String,
        auth: Option<(String, String)>,
        remote_dns: bool,
    },
    /// SOCKS4 (IPv4 addresses only); `remote_dns` (socks4a) lets the proxy resolve names. The user
    /// name of the URL, if any, is SOCKS4's user id.
    Socks4 {
        addr: String,
        user: Option<String>,
        remote_dns: bool,
    },
}

impl Via {
    /// Whether the proxy resolves host names itself (socks5h, socks4a): then sluice does not
    /// resolve them, so a name only the proxy's network knows still works, and none leaks to the
    /// local resolver.
    pub fn resolves_names(&self) -> bool {
        matches!(
            self,
            Via::Socks5 {
                remote_dns: true,
                ..
            } | Via::Socks4 {
                remote_dns: true,
                ..
            }
        )
    }
}

/// Which hosts a route covers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    All,
    Exact(String),
    /// `*.example.com`: the domain itself and every subdomain.
    Domain(String),
}

/// A parsed route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pattern: Pattern,
    /// `Some(true)` for `https://` patterns, `Some(false)` for `http://`; `None` for every scheme.
    tls: Option<bool>,
    /// A pattern's `:port`: the route covers that port only.
    port: Option<u16>,
    pub via: Via,
    pub verify_tls: bool,
}

/// Why a route is unusable.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("empty pattern: use `all`, `host.example` or `*.example`")]
    EmptyPattern,
    #[error("proxy URL {0:?} is not valid: {1}")]
    BadProxy(String, String),
    #[error("proxy scheme `{0}` is not supported: use http, socks4, socks4a, socks5 or socks5h")]
    BadScheme(String),
    #[error("pattern scheme `{0}` is not one of all://, http://, https://")]
    BadPatternScheme(String),
    #[error("pattern port in {0:?} is not a port number")]
    BadPatternPort(String),
}

impl Route {
    /// Parses one `[[upstream.routes]]` entry.
    pub fn parse(config: &RouteConfig) -> Result<Route, RouteError> {
        let lower = config.pattern.trim().to_ascii_lowercase();
        // MediaFlow's `all://`, `https://host`, `http://host:port` and `all://*.domain` spellings.
        let (tls, p) = match lower.split_once("://") {
            None => (None, lower.as_str()),
            Some(("all", rest)) => (None, rest),
            Some(("http", rest)) => (Some(false), rest),
            Some(("https", rest)) => (Some(true), rest),
            Some((other, _)) => return Err(RouteError::BadPatternScheme(other.to_string())),
        };
        let p = p.trim_end_matches('/');
        let (p, port) = match p.rsplit_once(':') {
            Some((h, port)) if !h.contains(':') || h.ends_with(']') => (
                h,
                Some(
                    port.parse::<u16>()
                        .map_err(|_| RouteError::BadPatternPort(config.pattern.clone()))?,
                ),
            ),
            _ => (p, None),
        };
        // An absolute name (`cdn.example.`) is the same host: matched without its dot.
        let p = p.strip_suffix('.').unwrap_or(p);
        let pattern = match p {
            // `*.` names no domain: not every host (in `insecure_hosts` that would turn
            // verification off everywhere).
            "" | "*" if config.pattern.ends_with('.') => return Err(RouteError::EmptyPattern),
            "" => return Err(RouteError::EmptyPattern),
            "all" | "*" => Pattern::All,
            _ => match p.strip_prefix("*.") {
                Some(domain) => Pattern::Domain(domain.to_string()),
                None => Pattern::Exact(p.to_string()),
            },
        };
        let via = parse_via(&config.proxy)?;
        Ok(Route {
            pattern,
            tls,
            port,
            via,
            verify_tls: config.verify_tls,
        })
    }

    /// How specific the match for a request is: `None` when it does not match; larger is more
    /// specific. The host decides first; a scheme or port named in the pattern breaks ties.
    fn specificity(&self, host: &str, port: u16, tls: bool) -> Option<(usize, u8)> {
        if self.tls.is_some_and(|t| t != tls) || self.port.is_some_and(|p| p != port) {
            return None;
        }
        let narrowing = u8::from(self.tls.is_some()) + u8::from(self.port.is_some());
        self.host_specificity(host).map(|h| (h, narrowing))
    }

    fn host_specificity(&self, host: &str) -> Option<usize> {
        match &self.pattern {
            Pattern::All => Some(0),
            Pattern::Exact(h) => (h == host).then_some(usize::MAX),
            Pattern::Domain(d) => {
                let hit = host == d
                    || (host.len() > d.len()
                        && host.ends_with(d.as_str())
                        && host.as_bytes()[host.len() - d.len() - 1] == b'.');
                hit.then_some(d.len() + 1)
            }
        }
    }
}

/// Parses `scheme://[user[:password]@]host[:port][/]`; user and password are percent-decoded.
fn parse_via(proxy: &str) -> Result<Via, RouteError> {
    let proxy = proxy.trim();
    if proxy.is_empty() || proxy == "direct" {
        return Ok(Via::Direct);
    }
    let bad = |why: &str| RouteError::BadProxy(mask(proxy), why.to_string());
    let (scheme, rest) = proxy
        .split_once("://")
        .ok_or_else(|| bad("not scheme://host:port"))?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 8080,
        "socks5" | "socks5h" | "socks4" | "socks4a" => 1080,
        _ => return Err(RouteError::BadScheme(scheme)),
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#']) {
        return Err(bad("a proxy URL has no path or query"));
    }
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (host, port) = match hostport.strip_prefix('[') {
        Some(v6) => {
            let (ip, after) = v6.split_once(']').ok_or_else(|| bad("unclosed `[`"))?;
            ip.parse::<std::net::Ipv6Addr>()
                .map_err(|_| bad("not an IPv6 address"))?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| bad("bad port"))?),
            };
            (&hostport[..ip.len() + 2], port)
        }
        None => match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        },
    };
    let host_ok = !host.is_empty()
        && (host.starts_with('[')
            || host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')));
    if !host_ok {
        return Err(bad("no host, or a host with characters a name cannot have"));
    }
    let port = match port {
        Some(p) => p.parse::<u16>().map_err(|_| bad("bad port"))?,
        None => default_port,
    };
    // A user name is required for credentials to mean anything (RFC 1929 and Basic both
    // start from it): `socks5://:pw@h` sends none, as it did before.
    let auth = userinfo
        .filter(|u| !u.is_empty() && !u.starts_with(':'))
        .map(|u| {
            let (user, pass) = u.split_once(':').unwrap_or((u, ""));
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (decode(user), decode(pass))
        });
    let addr = format!("{host}:{port}");
    Ok(match scheme.as_str() {
        "http" => Via::HttpConnect { addr, auth },
        "socks4" | "socks4a" => Via::Socks4 {
            addr,
            user: auth.map(|(user, _)| user),
            remote_dns: scheme == "socks4a",
        },
        _ => Via::Socks5 {
            addr,
            auth,
            remote_dns: scheme == "socks5h",
        },
    })
}

fn mask(url: &str) -> String {
    crate::redact::mask_userinfo(url)
}

/// All routes, answering "which route for this host".
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    routes: Vec<Route>,
    insecure: Vec<Route>,
}

impl RouteTable {
    /// Builds the table from config; patterns were validated with the config.
    pub fn new(routes: &[RouteConfig], insecure_hosts: &[String]) -> Result<Self, RouteError> {
        let routes = routes.iter().map(Route::parse).collect::<Result<_, _>>()?;
        let insecure = insecure_hosts
            .iter()
            .map(|h| {
                Route::parse(&RouteConfig {
                    pattern: h.clone(),
                    proxy: String::new(),
                    verify_tls: false,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(RouteTable { routes, insecure })
    }

    /// The most specific route for `host`, or direct, whatever the port and scheme.
    pub fn lookup(&self, host: &str) -> (Via, bool) {
        self.lookup_for(host, 0, false)
    }

    /// The most specific route for a request to `host:port` (over TLS or not), or direct.
    pub fn lookup_for(&self, host: &str, port: u16, tls: bool) -> (Via, bool) {
        let host = match_form(host);
        let best = self
            .routes
            .iter()
            .filter_map(|r| r.specificity(&host, port, tls).map(|s| (s, r)))
            .max_by_key(|(s, _)| *s)
            .map(|(_, r)| r);
        let insecure = self
            .insecure
            .iter()
            .any(|r| r.specificity(&host, port, tls).is_some());
        match best {
            Some(r) => (r.via.clone(), r.verify_tls && !insecure),
            None => (Via::Direct, !insecure),
        }
    }
}

/// `host` as patterns are matched against: lowercase, without the trailing dot of an absolute
/// name (`cdn.example.` is `cdn.example`, and must not slip past its routes and TLS opt-outs).
pub fn match_form(host: &str) -> String {
    let host = host.strip_suffix('.').unwrap_or(host);
    host.to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(pattern: &str, proxy: &str) -> RouteConfig {
        RouteConfig {
            pattern: pattern.into(),
            proxy: proxy.into(),
            verify_tls: true,
        }
    }

    #[test]
    fn most_specific_wins() {
        let table = RouteTable::new(
            &[
                route("all", "socks5://127.0.0.1:1"),
                route("*.cdn.example", "http://u:p@127.0.0.1:2"),
                route("a.cdn.example", ""),
            ],
            &["*.selfsigned.example".into()],
        )
        .unwrap();
        assert_eq!(table.lookup("a.cdn.example").0, Via::Direct);
        assert_eq!(
            table.lookup("B.cdn.example").0,
            Via::HttpConnect {
                addr: "127.0.0.1:2".into(),
                auth: Some(("u".into(), "p".into()))
            }
        );
        assert_eq!(
            table.lookup("cdn.example").0,
            table.lookup("x.cdn.example").0
        );
        assert!(matches!(
            table.lookup("other.example").0,
            Via::Socks5 { .. }
        ));
        assert!(!table.lookup("x.selfsigned.example").1);
        assert!(table.lookup("notselfsigned.example").1);
        // `xcdn.example` is not a subdomain of `cdn.example`.
        assert!(matches!(table.lookup("xcdn.example").0, Via::Socks5 { .. }));
    }

    #[test]
    fn a_trailing_dot_matches_the_same_routes_and_opt_outs() {
        let table = RouteTable::new(
            &[
                route("*.provider.example", "socks5://127.0.0.1:1"),
                route("https://exact.example", "http://127.0.0.1:2"),
                route("dotted.example.", "socks4://127.0.0.1:3"),
            ],
            &["*.selfsigned.example".into(), "one.example".into()],
        )
        .unwrap();
        assert!(matches!(
            table.lookup("cdn.provider.example.").0,
            Via::Socks5 { .. }
        ));
        assert!(matches!(
            table.lookup("Provider.Example.").0,
            Via::Socks5 { .. }
        ));
        assert!(matches!(
            table.lookup_for("exact.example.", 443, true).0,
            Via::HttpConnect { .. }
        ));
        // A pattern written with the dot covers the host either way.
        assert!(matches!(
            table.lookup("dotted.example").0,
            Via::Socks4 { .. }
        ));
        assert!(matches!(
            table.lookup("dotted.example.").0,
            Via::Socks4 { .. }
        ));
        // TLS opt-outs too: verification is off for both spellings, and only for them.
        assert!(!table.lookup("x.selfsigned.example.").1);
        assert!(!table.lookup("one.example.").1);
        assert!(table.lookup("two.example.").1);
        // One dot only: `a.example..` is no spelling of `a.example`.
        assert_eq!(table.lookup("cdn.provider.example..").0, Via::Direct);
        assert_eq!(match_form("A.Example."), "a.example");
    }

    #[test]
    fn proxy_urls() {
        let via = |p: &str| Route::parse(&route("all", p)).map(|r| r.via);
        assert_eq!(
            via("socks5h://u%40x:p%3Aw@[::1]:9/").unwrap(),
            Via::Socks5 {
                addr: "[::1]:9".into(),
                auth: Some(("u@x".into(), "p:w".into())),
                remote_dns: true
            }
        );
        assert_eq!(
            via("HTTP://proxy.example").unwrap(),
            Via::HttpConnect {
                addr: "proxy.example:8080".into(),
                auth: None
            }
        );
        // An explicit port is kept even when it is the scheme's usual one.
        assert_eq!(
            via("http://proxy.example:80").unwrap(),
            Via::HttpConnect {
                addr: "proxy.example:80".into(),
                auth: None
            }
        );
        assert_eq!(
            via("socks5://:pw@10.0.0.1").unwrap(),
            Via::Socks5 {
                addr: "10.0.0.1:1080".into(),
                auth: None,
                remote_dns: false
            }
        );
        assert_eq!(
            via("socks5://u@10.0.0.1").unwrap(),
            Via::Socks5 {
                addr: "10.0.0.1:1080".into(),
                auth: Some(("u".into(), String::new())),
                remote_dns: false
            }
        );
        for bad in [
            "proxy:1080",
            "http://",
            "http://:8080",
            "http://h:99999",
            "http://h:x",
            "http://h/path",
            "http://[::1",
            "http://[zz]:1",
            "http://a b:1",
        ] {
            assert!(
                matches!(via(bad), Err(RouteError::BadProxy(..))),
                "{bad}: {:?}",
                via(bad)
            );
        }
        // The password never reaches the error.
        let err = via("http://u:secret@h:x").unwrap_err().to_string();
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn scheme_and_port_narrow_a_route() {
        let table = RouteTable::new(
            &[
                route("all://*.cdn.example", "socks5h://127.0.0.1:1"),
                route("https://a.cdn.example", "socks4a://me@127.0.0.1:2"),
                route("http://a.cdn.example:8080", "socks4://127.0.0.1:3"),
            ],
            &[],
        )
        .unwrap();
        let via = |port, tls| table.lookup_for("a.cdn.example", port, tls).0;
        assert_eq!(
            via(443, true),
            Via::Socks4 {
                addr: "127.0.0.1:2".into(),
                user: Some("me".into()),
                remote_dns: true
            }
        );
        assert!(matches!(
            via(8080, false),
            Via::Socks4 {
                remote_dns: false,
                ..
            }
        ));
        assert!(matches!(via(80, false), Via::Socks5 { .. }));
        assert!(via(80, false).resolves_names() && via(443, true).resolves_names());
        assert!(!via(8080, false).resolves_names());
        for bad in ["ftp://x.example", "all://x.example:http", "https://x:99999"] {
            assert!(Route::parse(&route(bad, "")).is_err(), "{bad}");
        }
    }

    #[test]
    fn mediaflow_spellings_and_errors() {
        assert!(Route::parse(&route("all://*.x.example", "socks5h://h:1")).is_ok());
        assert!(matches!(
            Route::parse(&route("x", "ftp://h:1")),
            Err(RouteError::BadScheme(_))
        ));
        assert!(matches!(
            Route::parse(&route("", "")),
            Err(RouteError::EmptyPattern)
        ));
        // `*.` (or `.`) names no domain: refused, not read as every host once its dot goes.
        for pattern in ["*.", ".", "all://*."] {
            assert!(
                matches!(
                    Route::parse(&route(pattern, "")),
                    Err(RouteError::EmptyPattern)
                ),
                "{pattern}"
            );
        }
    }
}
