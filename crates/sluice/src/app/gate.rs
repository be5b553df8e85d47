//! The authorization gate: the password (or a token opened in `tokens`) before a built-in, the
//! loopback-only answer of a server without one, the browser login, and the in-flight caps.

use crate::body::Incoming;
use http::{header, HeaderValue, Request, Response, StatusCode};
#[cfg(feature = "media")]
use sluice_media::query::Query;
#[cfg(feature = "media")]
use sluice_media::token::{split_path_token, TokenClaims};

use super::routes;
use super::App;
#[cfg(feature = "media")]
use crate::auth::guesses::Attempt;
use crate::auth::token::TokenRefusal;
use crate::auth::{browser, Auth};
use crate::body::{self, Body};
use crate::error::{ErrorMark, ProxyError};
use crate::request::RequestContext;

impl App {
    /// Places for one media request in its client's and its token's in-flight counts, or a 429
    /// naming the bound: one client (or one leaked link) cannot make sluice hold unbounded
    /// upstream fetches. `claims` are the request's MediaFlow token's, as [`App::context`] opened
    /// them (it is not decrypted again here).
    #[cfg(feature = "media")]
    pub(super) fn media_places(
        &self,
        req: &Request<Incoming>,
        ctx: &RequestContext,
        claims: Option<&TokenClaims>,
    ) -> Result<Vec<crate::media::limit::Place>, ProxyError> {
        let busy = |what: &str| {
            ProxyError::downstream(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_requests",
                format!("{what} (media.max_requests_per_client / media.max_requests_per_token)"),
            )
        };
        let mut places = Vec::with_capacity(2);
        // Counted by network, as connections are: an IPv6 host commonly holds a whole /64, and
        // keyed by address it would have a share per address it cares to use.
        places.push(
            self.in_flight
                .0
                .take(crate::net::per_ip::network_of(ctx.client_ip))
                .ok_or_else(|| busy("this client has too many requests in flight"))?,
        );
        // An XC player's token rides in its username, not in `/_token_` or `token=` (looked for
        // only when there is no such token).
        let xc_user = match ctx.token {
            None => crate::media::xtream::Xtream::sealed_user(ctx),
            Some(_) => None,
        };
        let is_xc = xc_user.is_some();
        if ctx.token.is_some() || is_xc {
            let raw = match xc_user {
                Some(user) => user,
                None => split_path_token(req.uri().path())
                    .map(|(t, _)| t.to_string())
                    .or_else(|| {
                        Query::parse(req.uri().query().unwrap_or(""))
                            .get("token")
                            .map(str::to_string)
                    })
                    .unwrap_or_default(),
            };
            // A MediaFlow token has many spellings: its base64 decodes leniently, and with no MAC
            // flipping IV bits rewrites its first JSON block while it still parses (`": "` with a
            // tab, `Http://`). It counts by what it grants, in one canonical form (tagged apart
            // from a text); failing that, by its decoded bytes. An XC username has one spelling
            // per login (each `player_api.php` seals the account under a fresh nonce), so it
            // counts by the account and limits it grants; one that does not open is refused by
            // the XC handler, and counts by its text meanwhile. Another sealed token has one
            // spelling: a `/playlist/playlist` fetch gives a client network the same entries at
            // every fetch (a nonce derived from grant and network, `TokenGate::mint_entry`), so
            // fetching the merge again is no new share. (Keying
            // entries by their grant alone made every viewer of a channel share one, the lockout
            // children and entries are minted per viewer to avoid.)
            let bytes = match (sluice_media::token::sealed::is_sealed(&raw), is_xc) {
                (true, true) => self.xtream_key(ctx, &raw),
                (true, false) => None,
                (false, _) => mediaflow_key(claims, &raw),
            }
            .unwrap_or_else(|| [b"t".as_slice(), raw.as_bytes()].concat());
            let key: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(&bytes).into();
            places.push(
                self.in_flight
                    .1
                    .take(key)
                    .ok_or_else(|| busy("this token has too many requests in flight"))?,
            );
        }
        Ok(places)
    }

    /// What an XC username token's in-flight share is keyed on: the account it grants (the
    /// provider and the user there) and its limits (expiry and address binding), tagged apart
    /// from a MediaFlow token's claims and a token's text. `None` when it does not open as an XC
    /// username here, or when the client's network is past its wrong passwords: then it is not
    /// opened at all, as the XC handler opens none for it ([`App::token_limited`]).
    #[cfg(feature = "media")]
    fn xtream_key(&self, ctx: &RequestContext, raw: &str) -> Option<Vec<u8>> {
        self.token_limited(ctx.client_ip).ok()?;
        let gate = self.keys.tokens()?;
        let account = crate::media::xtream::open_user(&gate, raw, ctx.client_ip).ok()?;
        let (exp, ip) = account.limit.map(|l| (l.exp, l.ip)).unwrap_or_default();
        let exp = exp.map(|e| e.to_string()).unwrap_or_default();
        let ip = ip.unwrap_or_default();
        let mut out = b"x".to_vec();
        for field in [&account.server, &account.user, &exp, &ip] {
            out.extend_from_slice(&(field.len() as u64).to_be_bytes());
            out.extend_from_slice(field.as_bytes());
        }
        Some(out)
    }

    /// Whether `offered` is the API password (always, without one), compared only when the
    /// client's network is not past its wrong passwords for the window
    /// ([`crate::auth::guesses`]): then a 429, whatever it offers. A wrong one is charged.
    /// Every password comparison of a request goes through here (or through
    /// [`App::guess_attempt`]'s handle, where it is compared far from dispatch).
    pub(super) fn password_ok(
        &self,
        client: std::net::IpAddr,
        offered: Option<&str>,
    ) -> Result<bool, ProxyError> {
        let credentials = self.keys.load();
        if !credentials.auth.required() {
            return Ok(true);
        }
        self.metrics
            .guesses
            .attempt(client, offered, |o| credentials.auth.check(o))
            .map_err(ProxyError::from)
    }

    /// The limit of [`App::password_ok`] for a request that carries a token, asked before the
    /// token is opened: a network past its wrong passwords gets the 429 whatever its token is, a
    /// valid one included (otherwise the answer would tell a right forged token from a wrong one).
    pub(super) fn token_limited(&self, client: std::net::IpAddr) -> Result<(), ProxyError> {
        if !self.keys.load().auth.required() {
            return Ok(());
        }
        self.metrics.guesses.check(client).map_err(ProxyError::from)
    }

    /// Books a token refusal that tested a password (a forged token,
    /// [`TokenRefusal::is_guess`]) to the client's network as a wrong password: a MediaFlow token
    /// made under a guessed password, or a sealed one under its legacy key, tells a right guess
    /// from a wrong one as surely as `api_password` does.
    pub(super) fn charge_refused_token(
        &self,
        client: std::net::IpAddr,
        token: &str,
        why: &TokenRefusal,
    ) {
        if why.is_guess() && self.keys.load().auth.required() {
            self.metrics.guesses.charge_token(client, token);
        }
    }

    /// The way to [`App::password_ok`]'s limit for a handler that compares the password itself
    /// (the URL generators), left in its request's extensions.
    #[cfg(feature = "media")]
    pub(super) fn guess_attempt(&self, client: std::net::IpAddr) -> Attempt {
        Attempt {
            guesses: self.metrics.guesses.clone(),
            client,
        }
    }

    pub(super) fn authorize(
        &self,
        req: &Request<Incoming>,
        ctx: &RequestContext,
    ) -> Result<(), ProxyError> {
        if ctx.token.is_some() {
            // Authenticated and scoped in `context`: a sealed token only reaches the paths it was
            // minted for, a MediaFlow token carries the password.
            return Ok(());
        }
        let offered = Auth::offered(ctx.query.get("api_password"), req.headers());
        if self.password_ok(ctx.client_ip, offered.as_deref())? {
            return Ok(());
        }
        let message = if offered.is_some() {
            "wrong api_password"
        } else {
            "missing api_password: pass it as the api_password query parameter or header"
        };
        Err(ProxyError::downstream(
            StatusCode::FORBIDDEN,
            "auth",
            message,
        ))
    }
}

/// What a MediaFlow token's in-flight share is keyed on: the claims it opened to, in canonical
/// form, or (without them) its decoded bytes.
#[cfg(feature = "media")]
fn mediaflow_key(claims: Option<&TokenClaims>, raw: &str) -> Option<Vec<u8>> {
    use sluice_media::token::{canonical_claims, token_bytes};
    match claims {
        Some(claims) => Some([b"c".as_slice(), &canonical_claims(claims)].concat()),
        None => token_bytes(raw)
            .ok()
            .map(|decoded| [b"m".as_slice(), &decoded].concat()),
    }
}

/// Whether a password-free server's built-in may answer `req`: a loopback `Host` (or none, which
/// no browser sends).
pub(super) fn local_host<B>(req: &Request<B>) -> bool {
    match routes::request_host(req) {
        Some(host) => browser::is_loopback_host(host),
        None => true,
    }
}

/// Operator endpoints that change state (a reload) or mint a credential (`/playlist/link`): a
/// browser may ask them only from this server's own pages.
pub(super) fn changes_state(path: &str) -> bool {
    path.starts_with("/admin/") || path == "/playlist/link"
}

/// Whether a browser sent `req` from another site: `Sec-Fetch-Site` says `cross-site` or
/// `same-site` (another port of localhost is the same site, not the same origin), or, from a
/// browser without it, an `Origin` is present that is neither this server's own (the request's
/// `Host`) nor a loopback one. A
/// password-free server takes no credential a cross-site form could lack, so this is what keeps
/// a web page in a local browser from posting `/admin/reload`. Curl and the CLI send neither.
pub(super) fn cross_site<B>(req: &Request<B>) -> bool {
    let headers = req.headers();
    if let Some(site) = headers.get("sec-fetch-site") {
        // The browser's own verdict (no page can set it) wins: `same-origin` stays so behind a
        // front proxy that rewrites `Host`.
        let site = site.to_str().unwrap_or("cross-site").trim();
        return site.eq_ignore_ascii_case("cross-site") || site.eq_ignore_ascii_case("same-site");
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    // `null` (a sandboxed frame, a redirect across origins) and garbage are another site.
    let Some((_, authority)) = origin.to_str().ok().and_then(|o| o.split_once("://")) else {
        return true;
    };
    let own = routes::request_host(req).is_some_and(|h| h.eq_ignore_ascii_case(authority));
    !(own || browser::is_loopback_host(authority))
}

/// 403 for a state-changing operator request a browser sent from another site.
pub(super) fn cross_site_refused() -> Response<Body> {
    ProxyError::downstream(
        StatusCode::FORBIDDEN,
        "auth",
        "this endpoint changes state and is not for other sites' pages (Origin or Sec-Fetch-Site \
         names another site); send it without them, as curl or `sluice reload` do",
    )
    .into_response()
}

/// 421 for a `Host` a password-free server does not answer to.
pub(super) fn misdirected() -> Response<Body> {
    ProxyError::downstream(
        StatusCode::MISDIRECTED_REQUEST,
        "host",
        "this sluice has no password, so it answers only to loopback names (localhost, \
         127.0.0.1, [::1]); set auth.api_password or endpoints.host to serve another name",
    )
    .into_response()
}

/// 403 for an operator page, or an endpoint that fetches or mints, asked from another host of a
/// password-free server.
pub(super) fn local_only() -> Response<Body> {
    ProxyError::downstream(
        StatusCode::FORBIDDEN,
        "auth",
        "this sluice has no password, so its pages, admin endpoints and proxy endpoints answer \
         only clients on this machine; set auth.api_password to use them from elsewhere",
    )
    .into_response()
}

/// 401 asking a browser for the password (HTTP Basic; any user name).
pub(super) fn page_login() -> Response<Body> {
    let mut resp = Response::new(body::full(
        "this page needs the password: sign in with any user name and the api_password\n",
    ));
    *resp.status_mut() = StatusCode::UNAUTHORIZED;
    let h = resp.headers_mut();
    h.insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"sluice\", charset=\"UTF-8\""),
    );
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp.extensions_mut().insert(ErrorMark {
        side: crate::error::Side::Downstream,
        kind: "auth",
    });
    resp
}

/// Whether the token a request came with stands for the API password where a credential is
/// checked inside the request (the XC paths): only a MediaFlow token, which carries the password,
/// does. A sealed token is scoped to the paths it was minted for and proves nothing else, even
/// where its scope happens to open a path another handler parses (a playlist link's token opens
/// `/playlist/playlist/...`, which the XC short form `/{user}/{pass}/{id}` also matches).
#[cfg(feature = "media")]
pub(super) fn token_proves_password(token: Option<&crate::auth::token::TokenScope>) -> bool {
    token.is_some_and(|t| t.paths.is_none())
}

#[cfg(all(test, feature = "media"))]
mod tests {
    use super::token_proves_password;
    use crate::auth::token::TokenScope;

    fn scope(paths: Option<&[&str]>) -> TokenScope {
        TokenScope {
            exp: None,
            ip: None,
            paths: paths.map(|p| p.iter().map(|s| s.to_string()).collect()),
        }
    }

    #[test]
    fn only_a_mediaflow_token_stands_for_the_password() {
        assert!(token_proves_password(Some(&scope(None))));
        assert!(!token_proves_password(None));
        // A playlist link's token, an HLS child's and the XC username's: scoped, so no.
        for paths in [
            &["/playlist/playlist"][..],
            &["/proxy/hls/"][..],
            &[crate::media::xtream::XC_SCOPE][..],
            &[][..],
        ] {
            assert!(
                !token_proves_password(Some(&scope(Some(paths)))),
                "{paths:?}"
            );
        }
    }
}
