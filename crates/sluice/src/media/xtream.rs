//! The Xtream Codes proxy: MediaFlow's stateless XC URL contract, each request resolved to a
//! provider account, API answers rewritten to point back here, streams through the byte pipe.
//!
//! The username says which provider to use. On input it may be MediaFlow's base64 or colon form,
//! which carries the API password in clear; everything sluice writes back (the login answer, the
//! stream lists, the M3U) carries instead a sealed token scoped to XC requests only
//! ([`XC_SCOPE`]) that names the provider and user, so the API password never appears in a URL.

use crate::body::Incoming;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use sluice_media::query::{ProxyParams, Query};
use sluice_media::token::sealed;
use sluice_media::xtream::rewrite::Rewriter;
use sluice_media::xtream::{self, Api, XcPath};
use url::Url;

use super::stream;
use crate::auth::token;
use crate::auth::Keys;
use crate::body::{self, Body};
use crate::error::{ProxyError, Side};
use crate::request::RequestContext;
use crate::upstream::{Upstream, UpstreamRequest};

/// The scope of an XC username token. It starts with no `/`, so it opens no path as a
/// `/_token_` prefix; only this module accepts it, and only as an XC username.
pub const XC_SCOPE: &str = "xtream:";

/// Token params naming the provider and the user there.
const SERVER_PARAM: &str = "xc_server";
const USER_PARAM: &str = "xc_user";

/// Query names that stay here instead of going to the provider.
const LOCAL_PARAMS: [&str; 3] = ["username", "api_password", "token"];

/// The XC front end.
pub struct Xtream {
    upstream: Upstream,
    keys: Keys,
    /// Largest API answer read for rewriting (stream lists of big providers run to megabytes).
    max_response_bytes: usize,
}

/// A provider account a request resolved to.
struct Resolved {
    /// `scheme://host[:port][/path]`, no trailing slash.
    server: String,
    user: String,
}

impl Xtream {
    pub fn new(upstream: Upstream, keys: Keys, max_response_bytes: usize) -> Self {
        Xtream {
            upstream,
            keys,
            max_response_bytes,
        }
    }

    /// Whether `path` is an XC path this front end serves.
    pub fn serves(path: &str) -> bool {
        xtream::parse_path(path).is_some()
    }

    /// Serves an XC request. `password_ok` checks an API password offered inside a MediaFlow
    /// username (or, for `/hls/`, in the query) against the server's.
    pub async fn handle(
        &self,
        req: &Request<Incoming>,
        ctx: &RequestContext,
        password_ok: &(dyn Fn(Option<&str>) -> bool + Sync),
    ) -> Result<Response<Body>, ProxyError> {
        self.serve(req, ctx, password_ok).await.map_err(unnamed)
    }

    async fn serve(
        &self,
        req: &Request<Incoming>,
        ctx: &RequestContext,
        password_ok: &(dyn Fn(Option<&str>) -> bool + Sync),
    ) -> Result<Response<Body>, ProxyError> {
        let Some(path) = xtream::parse_path(&ctx.path) else {
            return Err(ProxyError::downstream(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such XC endpoint",
            ));
        };
        super::require_get_or_head(req.method())?;
        match &path {
            XcPath::Api(api) => {
                let raw_user = ctx
                    .query
                    .get("username")
                    .ok_or_else(|| bad("missing username"))?;
                let account = self.resolve(raw_user, ctx, password_ok)?;
                self.api(req, ctx, *api, &account).await
            }
            XcPath::Stream { user, .. } => {
                let account = self.resolve(user, ctx, password_ok)?;
                let url = upstream_url(&account.server, &path.upstream_path(&account.user), ctx)?;
                self.stream(req, ctx, url).await
            }
            XcPath::HlsSession { .. } => {
                if !password_ok(ctx.query.get("api_password")) {
                    return Err(refusal());
                }
                let server = ctx
                    .query
                    .get("upstream")
                    .and_then(sluice_media::b64url::decode_url)
                    .ok_or_else(|| {
                        bad("missing or bad `upstream` (base64 of the XC server URL)")
                    })?;
                let url = upstream_url(server.trim_end_matches('/'), &path.upstream_path(""), ctx)?;
                Ok(self.to_hls(ctx, url))
            }
        }
    }

    /// The account behind an XC username: a token this server minted, or MediaFlow's formats
    /// with the API password checked. Every failure is the same refusal.
    fn resolve(
        &self,
        raw: &str,
        ctx: &RequestContext,
        password_ok: &(dyn Fn(Option<&str>) -> bool + Sync),
    ) -> Result<Resolved, ProxyError> {
        if let Some(gate) = self.keys.tokens().filter(|_| sealed::is_sealed(raw)) {
            let opened = gate.open(raw, ctx.client_ip, token::now()).map_err(|why| {
                tracing::debug!(reason = %why, "XC username token refused");
                refusal()
            })?;
            if opened.scope.paths.as_deref() != Some(&[XC_SCOPE.to_string()][..]) {
                return Err(refusal());
            }
            let param = |name: &str| {
                opened
                    .params
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            };
            return match (param(SERVER_PARAM), param(USER_PARAM)) {
                (Some(server), Some(user)) => Ok(Resolved { server, user }),
                _ => Err(refusal()),
            };
        }
        let account = xtream::parse_username(raw).map_err(|e| bad(&e.to_string()))?;
        if !password_ok(account.api_password.as_deref()) {
            return Err(refusal());
        }
        Ok(Resolved {
            server: account.server,
            user: account.username,
        })
    }

    /// The username written into everything sent back: a sealed XC-only token, or (with no
    /// server password to protect) MediaFlow's base64 form without a password.
    fn public_user(&self, account: &Resolved) -> String {
        match &self.keys.tokens() {
            Some(gate) => gate.mint(
                &[
                    (SERVER_PARAM.to_string(), account.server.clone()),
                    (USER_PARAM.to_string(), account.user.clone()),
                ],
                &[XC_SCOPE],
                None,
                false,
                token::now(),
            ),
            None => xtream::encode_username(&account.server, &account.user),
        }
    }

    async fn api(
        &self,
        req: &Request<Incoming>,
        ctx: &RequestContext,
        api: Api,
        account: &Resolved,
    ) -> Result<Response<Body>, ProxyError> {
        let mut url = upstream_url(&account.server, api.script(), ctx)?;
        // The provider's own username first, as XC panels expect.
        let mut pairs: Vec<(String, String)> = vec![("username".into(), account.user.clone())];
        pairs.extend(
            url.query_pairs()
                .map(|(k, v)| (k.into_owned(), v.into_owned())),
        );
        url.set_query(None);
        url.query_pairs_mut().extend_pairs(pairs);
        match api {
            // Streams and EPGs go straight through: nothing in them names the provider's users.
            Api::Xmltv | Api::Timeshift => self.stream(req, ctx, url).await,
            Api::Player | Api::Panel | Api::Playlist => {
                self.rewritten(ctx, api, account, url).await
            }
        }
    }

    /// Fetches an API answer whole and rewrites every stream URL in it.
    async fn rewritten(
        &self,
        ctx: &RequestContext,
        api: Api,
        account: &Resolved,
        url: Url,
    ) -> Result<Response<Body>, ProxyError> {
        let host = url.host_str().unwrap_or_default().to_string();
        let up = self
            .upstream
            .send(UpstreamRequest::get(url))
            .await
            .map_err(|e| ProxyError::from_upstream(&e))?;
        if !up.status.is_success() {
            return Err(ProxyError::upstream_status(
                up.status,
                &host,
                "an XC API call",
            ));
        }
        let content_type = up.headers.get(header::CONTENT_TYPE).cloned();
        let bytes = up
            .body
            .collect_limited(self.max_response_bytes)
            .await
            .map_err(|e| {
                ProxyError::new(
                    crate::error::Side::Upstream,
                    StatusCode::BAD_GATEWAY,
                    "xtream",
                    format!("XC answer from {host}: {e}"),
                )
            })?;
        let text = String::from_utf8_lossy(&bytes);
        let public_user = self.public_user(account);
        let origin = Url::parse(&account.server)
            .map(|u| u.origin().ascii_serialization())
            .unwrap_or_default();
        let public_origin = public_origin(ctx);
        let rewriter = Rewriter {
            upstream_origin: &origin,
            real_user: &account.user,
            public_origin: &public_origin,
            public_user: &public_user,
        };
        let login = api == Api::Player && ctx.query.get("action").is_none();
        let out = if login {
            rewriter.rewrite_login(&text)
        } else {
            rewriter.rewrite_text(&text)
        };
        let mut resp = Response::new(body::full(out));
        let default = if api == Api::Playlist {
            "audio/x-mpegurl"
        } else {
            "application/json"
        };
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            content_type.unwrap_or(HeaderValue::from_static(default)),
        );
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        Ok(resp)
    }

    /// A stream: HLS playlists go to the HLS proxy (which rewrites their segments), everything
    /// else through the byte pipe with Range and HEAD intact.
    async fn stream(
        &self,
        req: &Request<Incoming>,
        ctx: &RequestContext,
        url: Url,
    ) -> Result<Response<Body>, ProxyError> {
        let ext = xtream::extension(url.path()).unwrap_or_default();
        if ext == "m3u8" || ext == "m3u" {
            return Ok(self.to_hls(ctx, url));
        }
        let params =
            ProxyParams::from_query(&Query::from_pairs(vec![("d".to_string(), url.to_string())]))
                .map_err(|e| bad(&e.to_string()))?;
        stream::pipe(&self.upstream, req, &params, None).await
    }

    /// A redirect to `/proxy/hls/manifest.m3u8` for `url`, under a sealed token scoped to the HLS
    /// endpoints when there is a password (never the password itself).
    fn to_hls(&self, ctx: &RequestContext, url: Url) -> Response<Body> {
        let params = vec![("d".to_string(), url.to_string())];
        let origin = public_origin(ctx);
        let location = match &self.keys.tokens() {
            Some(gate) => {
                let t = gate.mint(&params, &["/proxy/hls/"], None, true, token::now());
                format!("{origin}/_token_{t}/proxy/hls/manifest.m3u8")
            }
            None => format!(
                "{origin}/proxy/hls/manifest.m3u8?{}",
                Query::from_pairs(params).encode()
            ),
        };
        let mut resp = Response::new(body::empty());
        *resp.status_mut() = StatusCode::FOUND;
        if let Ok(v) = HeaderValue::from_str(&location) {
            resp.headers_mut().insert(header::LOCATION, v);
        }
        resp
    }
}

/// `server/path` with the request's query minus what stays here.
fn upstream_url(server: &str, path: &str, ctx: &RequestContext) -> Result<Url, ProxyError> {
    let mut url = Url::parse(&format!("{server}/{path}"))
        .map_err(|e| bad(&format!("upstream XC URL: {e}")))?;
    let forwarded: Vec<(String, String)> = ctx
        .query
        .pairs()
        .iter()
        .filter(|(k, _)| !LOCAL_PARAMS.contains(&k.as_str()) && k != "upstream")
        .cloned()
        .collect();
    if !forwarded.is_empty() {
        url.query_pairs_mut().extend_pairs(forwarded);
    }
    Ok(url)
}

/// `scheme://host[:port]` as the client addressed us.
fn public_origin(ctx: &RequestContext) -> String {
    let scheme = if ctx.secure { "https" } else { "http" };
    match &ctx.host {
        Some(host) => format!("{scheme}://{host}"),
        None => format!("{scheme}://{}", ctx.peer),
    }
}

fn bad(message: &str) -> ProxyError {
    ProxyError::downstream(StatusCode::BAD_REQUEST, "bad_request", message.to_string())
}

/// An XC request's error as its client sees it: a holder of an XC username token may not learn
/// the provider's address (its token hides it), so an error about the provider (its status, an
/// unreachable or refused host, a broken answer) names no host; the full error is logged here.
fn unnamed(mut e: ProxyError) -> ProxyError {
    if e.upstream.is_none() && e.side != Side::Upstream {
        return e;
    }
    tracing::warn!(
        upstream = e.upstream.as_deref().unwrap_or(""),
        kind = e.kind,
        error = %e.message,
        "XC provider request failed"
    );
    e.message = match e.kind {
        "upstream_status" => format!("the XC provider answered {}", e.status.as_u16()),
        kind => format!("the XC provider request failed ({kind})"),
    };
    e.upstream = None;
    e
}

/// The one answer to a wrong or missing API password, whatever form it came in.
fn refusal() -> ProxyError {
    ProxyError::downstream(StatusCode::FORBIDDEN, "auth", "wrong api_password")
}
