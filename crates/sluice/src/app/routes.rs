//! The one route table every request goes through: user `[[routes]]` and the built-in endpoints
//! (`/proxy/*`, `/rtp/`, `/udp/`, `/rtsp/`, `/playlist.m3u`, `/status`, `/health`, `/metrics`), matched by host
//! and longest path prefix with the precedence of `sluice_http::route`. Rebuilt whole on reload.

#[cfg(feature = "reverse")]
use std::sync::Arc;

use sluice_http::route::{HostPattern, RouteTable};

#[cfg(feature = "reverse")]
use crate::reverse::{Reverse, Route};
pub use crate::server::EndpointsConfig;
pub use crate::server::ListenerId;

/// A built-in endpoint family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    Media,
    Iptv,
    Health,
    Metrics,
    Admin,
}

impl Builtin {
    fn label(self) -> &'static str {
        match self {
            Builtin::Media => "media",
            Builtin::Iptv => "iptv",
            Builtin::Health => "health",
            Builtin::Metrics => "metrics",
            Builtin::Admin => "admin",
        }
    }
}

/// What a table entry leads to.
#[derive(Clone)]
pub enum Target {
    Builtin(Builtin),
    #[cfg(feature = "reverse")]
    Proxy(Arc<Route>),
}

/// The prefixes each built-in owns.
const BUILTINS: &[(Builtin, &[&str])] = &[
    (
        Builtin::Media,
        &[
            "/proxy/",
            "/extractor/",
            "/generate_url",
            "/generate_urls",
            "/generate_encrypted_or_encoded_url",
            "/base64/",
            "/playlist/",
            "/playlist_builder.html",
            "/url-generator",
            "/url_generator.html",
            "/pages/",
        ],
    ),
    (
        Builtin::Iptv,
        &[
            "/rtp/",
            "/udp/",
            "/rtsp/",
            // HLS output of the channels above (iptv::hls).
            "/hls/",
            // The page playing them (iptv::player).
            "/player",
            "/playlist.m3u",
            "/epg.xml",
            "/epg.xml.gz",
            "/status",
            "/status.json",
        ],
    ),
    (Builtin::Health, &["/health"]),
    (Builtin::Metrics, &["/metrics"]),
    (Builtin::Admin, &["/admin/"]),
];

/// The tables plus the reverse proxy they point into.
pub struct Routing {
    /// One table per listener, by listener id: what a connection accepted there can reach.
    tables: Vec<RouteTable<Target>>,
    /// The listeners' names, by id (for `describe`, and to refuse a reload that changes them).
    listeners: Vec<String>,
    #[cfg(feature = "reverse")]
    pub reverse: Reverse,
    /// Where the media built-ins answer, when they are on: Xtream Codes paths (`/player_api.php`,
    /// `/live/...`, the short `/{user}/{pass}/{id}`) and the home page `/` have no prefix of their
    /// own, so they are served only where no route or other built-in claims the path.
    #[cfg_attr(not(feature = "media"), allow(dead_code))]
    xtream_host: Option<(usize, HostPattern)>,
    /// `endpoints.host` names the built-ins' host: the table already refuses every other `Host`.
    pub builtin_host_pinned: bool,
}

impl Routing {
    /// User routes first, then built-ins: on an exact tie (same host pattern and prefix) the user's
    /// route wins, so a built-in path can be taken over deliberately. Each listener gets the
    /// entries that name it (`main` for those naming none).
    pub fn new(
        #[cfg(feature = "reverse")] reverse: Reverse,
        endpoints: &EndpointsConfig,
        media_on: bool,
        listeners: Vec<String>,
    ) -> anyhow::Result<Routing> {
        let builtin_host = HostPattern::parse(&endpoints.host)
            .map_err(|e| anyhow::anyhow!("endpoints.host: {e}"))?;
        let id_of = |name: Option<&str>, what: &str| -> anyhow::Result<usize> {
            match name {
                None | Some("") => Ok(0),
                Some(n) => listeners
                    .iter()
                    .position(|l| l == n)
                    .ok_or_else(|| anyhow::anyhow!("{what}: no listener is named {n:?}")),
            }
        };
        let builtin_listener = id_of(Some(&endpoints.listener), "endpoints.listener")?;
        let mut entries: Vec<(usize, HostPattern, String, Target)> = Vec::new();
        #[cfg(feature = "reverse")]
        for r in reverse.routes() {
            let id = id_of(r.config.listener.as_deref(), &format!("route {}", r.name))?;
            entries.push((
                id,
                r.host.clone(),
                r.config.path.clone(),
                Target::Proxy(r.clone()),
            ));
        }
        for (builtin, prefixes) in BUILTINS {
            let on = match builtin {
                Builtin::Media => endpoints.media && media_on,
                Builtin::Iptv => endpoints.iptv,
                Builtin::Health => endpoints.health,
                Builtin::Metrics => endpoints.metrics,
                Builtin::Admin => endpoints.admin,
            };
            if on {
                for p in *prefixes {
                    entries.push((
                        builtin_listener,
                        builtin_host.clone(),
                        p.to_string(),
                        Target::Builtin(*builtin),
                    ));
                }
            }
        }
        let tables = (0..listeners.len())
            .map(|id| {
                RouteTable::build(
                    entries
                        .iter()
                        .filter(|e| e.0 == id)
                        .map(|(_, h, p, t)| (h.clone(), p.clone(), t.clone())),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let builtin_host_pinned = builtin_host != HostPattern::Any;
        let xtream_host = (endpoints.media && media_on).then_some((builtin_listener, builtin_host));
        Ok(Routing {
            tables,
            listeners,
            #[cfg(feature = "reverse")]
            reverse,
            xtream_host,
            builtin_host_pinned,
        })
    }

    /// The listeners' names, by id.
    pub fn listeners(&self) -> &[String] {
        &self.listeners
    }

    /// The target for a host and normalised path, on a listener.
    pub fn lookup(&self, listener: ListenerId, host: Option<&str>, path: &str) -> Option<&Target> {
        self.tables.get(listener.0)?.lookup(host, path)
    }

    /// An Xtream Codes path or the home page on the media built-ins' host (see `xtream_host`).
    fn serves_xtream(&self, listener: ListenerId, host: Option<&str>, path: &str) -> bool {
        #[cfg(feature = "media")]
        if let Some((on, pattern)) = &self.xtream_host {
            if *on != listener.0 {
                return false;
            }
            let host = host.map(sluice_http::route::normalize_host);
            let on_host = match pattern {
                HostPattern::Any => true,
                HostPattern::Exact(h) => host.as_deref() == Some(h.as_str()),
                HostPattern::Wildcard(suffix) => host.is_some_and(|h| h.ends_with(suffix.as_str())),
            };
            // The home page has no prefix of its own either.
            return on_host && (path == "/" || crate::media::xtream::Xtream::serves(path));
        }
        let _ = (listener, host, path);
        false
    }

    /// Whether a route on this listener names this host explicitly (for refusing absolute-form
    /// requests).
    pub fn serves_host(&self, listener: ListenerId, host: &str) -> bool {
        self.tables
            .get(listener.0)
            .is_some_and(|t| t.serves_host(host))
    }

    /// The effective table in precedence order, one line per entry (for `sluice check-config`).
    pub fn describe(&self) -> String {
        #[cfg(feature = "reverse")]
        return self.describe_with(&|_| String::new());
        #[cfg(not(feature = "reverse"))]
        self.describe_with()
    }

    /// [`Routing::describe`], with `note` appended to each user route's line.
    pub fn describe_with(
        &self,
        #[cfg(feature = "reverse")] note: &dyn Fn(&crate::reverse::RouteConfig) -> String,
    ) -> String {
        let mut out = String::from("# effective route table per listener, in precedence order\n");
        for (id, table) in self.tables.iter().enumerate() {
            let listener = &self.listeners[id];
            for (host, prefix, target) in table.entries() {
                let what = match target {
                    Target::Builtin(b) => format!("built-in {}", b.label()),
                    #[cfg(feature = "reverse")]
                    Target::Proxy(r) => {
                        let mut s = format!("upstream {:?}", r.config.upstream);
                        if r.config.strip_prefix {
                            s.push_str(" (strip prefix)");
                        }
                        if let Some(rw) = &r.config.rewrite {
                            s.push_str(&format!(" (rewrite to {rw})"));
                        }
                        s.push_str(&note(&r.config));
                        s
                    }
                };
                out.push_str(&format!(
                    "{:<10} {:<24} {:<32} -> {}\n",
                    listener,
                    host.to_string(),
                    prefix,
                    what
                ));
            }
        }
        out
    }
}

/// Where one request goes.
pub enum Dispatch {
    /// A user route; the normalised path it matched, when that is not the target's own path
    /// (`None`: it is, and is read from the request without a copy).
    #[cfg(feature = "reverse")]
    Proxy(Arc<Route>, Option<String>),
    /// A built-in endpoint (it parses its own path and token).
    Builtin(Builtin),
    /// Refused before any front end: bad path, misdirected, no route.
    Refused(crate::error::ProxyError),
}

/// The host a request names: the authority of an HTTP/2 or absolute-form request, else `Host`.
/// Borrowed: routing reads it without a copy; only a proxied request keeps one.
pub fn request_host<B>(req: &http::Request<B>) -> Option<&str> {
    match req.uri().authority() {
        Some(a) => Some(a.as_str()),
        None => req
            .headers()
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok()),
    }
}

/// The longest authority [`check_host`] remembers.
const REMEMBERED_AUTHORITY: usize = 255;

thread_local! {
    /// The last authority [`check_host`] found valid on this thread.
    static VALID_AUTHORITY: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// [`sluice_http::host::check_request_host`], skipping the parse for an HTTP/2 or HTTP/3 request
/// that names only an authority (no `Host` field) equal to the last one found valid on this
/// thread: such a request passes or fails by that text alone, and a client names the same
/// authority on every stream of a connection.
fn check_host(
    version: http::Version,
    headers: &http::HeaderMap,
    authority: Option<&str>,
) -> Result<(), sluice_http::host::HostError> {
    use sluice_http::host::check_request_host;
    let Some(authority) = authority.filter(|a| {
        version >= http::Version::HTTP_2
            && !a.is_empty()
            && a.len() <= REMEMBERED_AUTHORITY
            && !headers.contains_key(http::header::HOST)
    }) else {
        return check_request_host(version, headers, authority);
    };
    if VALID_AUTHORITY.with(|last| *last.borrow() == authority) {
        return Ok(());
    }
    check_request_host(version, headers, Some(authority))?;
    VALID_AUTHORITY.with(|last| {
        let mut last = last.borrow_mut();
        last.clear();
        last.push_str(authority);
    });
    Ok(())
}

impl Routing {
    /// Routes one request. A path carrying a sluice token (`/_token_<T>/...`) is routed by the rest
    /// of the path and only ever reaches a built-in.
    pub fn dispatch<B>(&self, req: &http::Request<B>) -> Dispatch {
        use crate::error::ProxyError;
        use http::StatusCode;
        // One valid host, or nothing is routed by it (RFC 9112 §3.2).
        let authority = req.uri().authority().map(|a| a.as_str());
        if let Err(e) = check_host(req.version(), req.headers(), authority) {
            return Dispatch::Refused(ProxyError::downstream(
                StatusCode::BAD_REQUEST,
                "bad_host",
                e.to_string(),
            ));
        }
        let raw = req.uri().path();
        let (tokened, rest) = match sluice_media::token::split_path_token(raw) {
            Some((_, rest)) => (true, rest),
            None => (false, raw),
        };
        // A `..` that only a server decoding `%2F` or reading `;` as parameters would resolve
        // (`/docs/..%2F..%2Fsecret`) is refused for every route. A tokened path reaches only
        // built-ins, whose token check gives such a path the token's one refusal.
        let path = match sluice_http::path::normalize_path(rest).and_then(|p| {
            if !tokened {
                sluice_http::path::check_hidden_dot_segments(&p)?;
            }
            Ok(p)
        }) {
            Ok(p) => p,
            Err(e) => {
                return Dispatch::Refused(ProxyError::downstream(
                    StatusCode::BAD_REQUEST,
                    "bad_path",
                    e.to_string(),
                ))
            }
        };
        let host = request_host(req);
        let listener = req
            .extensions()
            .get::<ListenerId>()
            .copied()
            .unwrap_or_default();
        // An absolute-form target (`GET http://other/ HTTP/1.1`) names the host it wants; sluice is
        // not an open proxy, so a host no route names is misdirected.
        if req.version() <= http::Version::HTTP_11 && req.uri().authority().is_some() {
            let named = host.is_some_and(|h| self.serves_host(listener, h));
            if !named {
                return Dispatch::Refused(ProxyError::downstream(
                    StatusCode::MISDIRECTED_REQUEST,
                    "misdirected",
                    "this server does not serve that host",
                ));
            }
        }
        // Only user routes care: a tokened path is never proxied.
        #[cfg(not(feature = "reverse"))]
        let _ = tokened;
        match self.lookup(listener, host, &path) {
            #[cfg(feature = "reverse")]
            Some(Target::Proxy(route)) if !tokened => {
                let normalised = match path {
                    std::borrow::Cow::Borrowed(_) => None,
                    std::borrow::Cow::Owned(p) => Some(p),
                };
                Dispatch::Proxy(route.clone(), normalised)
            }
            Some(Target::Builtin(b)) => Dispatch::Builtin(*b),
            None if self.serves_xtream(listener, host, &path) => Dispatch::Builtin(Builtin::Media),
            _ => {
                let shown: String = rest.chars().take(200).collect();
                Dispatch::Refused(ProxyError::downstream(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    format!("no route for {shown}"),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue, Version};

    #[test]
    fn a_remembered_authority_is_still_checked_against_host() {
        let none = HeaderMap::new();
        assert!(check_host(Version::HTTP_2, &none, Some("example.com:8443")).is_ok());
        // Remembered now; the same text passes again, a bad one still fails.
        assert!(check_host(Version::HTTP_2, &none, Some("example.com:8443")).is_ok());
        assert!(check_host(Version::HTTP_2, &none, Some("bad host")).is_err());
        assert!(check_host(Version::HTTP_2, &none, Some("")).is_err());
        assert!(check_host(Version::HTTP_2, &none, None).is_err());
        // A `Host` field beside it is compared every time.
        let mut other = HeaderMap::new();
        other.insert(
            http::header::HOST,
            HeaderValue::from_static("other.example"),
        );
        assert!(check_host(Version::HTTP_2, &other, Some("example.com:8443")).is_err());
        // HTTP/1.1 absolute form: the `Host` field is required whatever was remembered.
        assert!(check_host(Version::HTTP_11, &none, Some("example.com:8443")).is_err());
    }
}
