//! The Xtream Codes proxy: MediaFlow's stateless XC URL contract, each request resolved to a
//! provider account, API answers rewritten to point back here, streams through the byte pipe.
//!
//! The username says which provider to use. On input it may be MediaFlow's base64 or colon form,
//! which carries the API password in clear; everything sluice writes back (the login answer, the
//! stream lists, the M3U) carries instead a sealed token scoped to XC requests only
//! ([`XC_SCOPE`]) that names the provider and user, so the API password never appears in a URL.

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::IpAddr;
use std::ops::Range;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use crate::body::Incoming;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body::{Frame, SizeHint};
use sluice_media::query::{ProxyParams, Query};
use sluice_media::token::sealed;
use sluice_media::xtream::rewrite::{text_within, Rewriter, MAX_LOGIN_BYTES};
use sluice_media::xtream::{self, Api, XcPath};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use url::Url;

use super::{cpu, stream};
use crate::auth::guesses::Attempt;
use crate::auth::token::{self, TokenScope};
use crate::auth::Keys;
use crate::body::{self, Body};
use crate::error::{ProxyError, Side};
use crate::net::per_ip::network_of;
use crate::request::RequestContext;
use crate::upstream::{CollectError, Upstream, UpstreamBody, UpstreamRequest};

/// The scope of an XC username token. It starts with no `/`, so it opens no path as a
/// `/_token_` prefix; only this module accepts it, and only as an XC username.
pub const XC_SCOPE: &str = "xtream:";

/// Token params naming the provider and the user there.
const SERVER_PARAM: &str = "xc_server";
const USER_PARAM: &str = "xc_user";

/// Query names that stay here instead of going to the provider.
const LOCAL_PARAMS: [&str; 3] = ["username", "api_password", "token"];

/// All rewrites in flight together hold at most this many largest answers' worth: one at its
/// peak (the answer and its two rewrites) and room for smaller ones beside it.
const BUDGET_ANSWERS: usize = 4;

/// One client (its address as `auth.trusted_proxies` make it out, an IPv6 one by its /64 as
/// every per-address share counts it) may hold at most this many of those answers' worth, one
/// answer or many. Three is what one largest stream list needs at its peak (the answer and its
/// rewrite, about twice its size); a client that leaves its answers unread (each holds its share
/// until it is sent, or until [`Budgeted`]'s deadline) so always leaves a largest answer's worth to
/// everyone else. A half would refuse the largest lists outright, a quarter leave no room for even
/// their rewrite. A lone answer once took the whole budget, so one slow reader starved every
/// other client; an answer whose peak needs more than the share (an M3U of short URLs near the
/// size bound that grows five-fold) is now the provider's 502.
const CLIENT_ANSWERS: usize = 3;

/// A rewrite buffer may grow to this many times its answer, plus [`GROWTH_SLACK`]: a real stream
/// list about doubles (each URL gains the public origin and a ~200-byte sealed username), an M3U
/// of short channel names and URLs grows up to about five-fold, while 64 MiB of bare short
/// `http://a/u/p/1` lines would grow fifteen-fold.
const MAX_GROWTH: usize = 8;
const GROWTH_SLACK: usize = 1024 * 1024;

/// A rewritten answer goes out in slices this big, so its budget share is held until the last.
const SLICE: usize = 64 * 1024;

/// The XC front end.
pub struct Xtream {
    upstream: Upstream,
    keys: Keys,
    /// Largest API answer read for rewriting (stream lists of big providers run to megabytes).
    max_response_bytes: usize,
    /// What all answers being read, rewritten or sent may hold at once, and each client; past
    /// it 503.
    budget: Arc<Budget>,
}

/// A provider account a request resolved to.
pub(crate) struct Resolved {
    /// `scheme://host[:port][/path]`, no trailing slash.
    pub(crate) server: String,
    pub(crate) user: String,
    /// The limits of the credential it came with (a sealed username's own, or the request's
    /// MediaFlow token's): every token minted for it inherits their expiry and address binding,
    /// so a short-lived or address-bound credential cannot be traded for a lasting one.
    pub(crate) limit: Option<TokenScope>,
}

impl Xtream {
    pub fn new(upstream: Upstream, keys: Keys, max_response_bytes: usize) -> Self {
        Xtream {
            upstream,
            keys,
            max_response_bytes,
            budget: Budget::for_answers(max_response_bytes),
        }
    }

    /// Whether `path` is an XC path this front end serves.
    pub fn serves(path: &str) -> bool {
        xtream::parse_path(path).is_some()
    }

    /// The sealed username token an XC request carries, if any: its in-flight requests count
    /// against `media.max_requests_per_token` as a path token's do.
    pub fn sealed_user(ctx: &RequestContext) -> Option<String> {
        let user = match xtream::parse_path(&ctx.path)? {
            XcPath::Api(_) => ctx.query.get("username")?.to_string(),
            XcPath::Stream { user, .. } => user,
            XcPath::HlsSession { .. } => return None,
        };
        sealed::is_sealed(&user).then_some(user)
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
                let account = self.resolve(req, raw_user, ctx, password_ok)?;
                self.api(req, ctx, *api, &account).await
            }
            XcPath::Stream { user, .. } => {
                let account = self.resolve(req, user, ctx, password_ok)?;
                let url = upstream_url(&account.server, &path.upstream_path(&account.user), ctx)?;
                self.stream(req, ctx, url, account.limit.as_ref()).await
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
                Ok(self.to_hls(ctx, url, ctx.token.as_ref()))
            }
        }
    }

    /// The account behind an XC username: a token this server minted, or MediaFlow's formats
    /// with the API password checked. Every failure is the same refusal, but for the 429 of a
    /// network past its wrong passwords (dispatch's [`Attempt`], in `req`'s extensions).
    fn resolve(
        &self,
        req: &Request<Incoming>,
        raw: &str,
        ctx: &RequestContext,
        password_ok: &(dyn Fn(Option<&str>) -> bool + Sync),
    ) -> Result<Resolved, ProxyError> {
        if let Some(gate) = self.keys.tokens().filter(|_| sealed::is_sealed(raw)) {
            // A sealed username is a credential like the password: a network past its wrong
            // passwords is refused before it is opened, and one forged under a guessed password
            // (the legacy key is a cheap HKDF of it) is booked as a wrong password.
            let attempt = req.extensions().get::<Attempt>();
            if let Some(attempt) = attempt {
                attempt.check()?;
            }
            return open_user(&gate, raw, ctx.client_ip).map_err(|why| {
                if let Some(why) = why {
                    tracing::debug!(reason = %why, "XC username token refused");
                    if let Some(attempt) = attempt.filter(|_| why.is_guess()) {
                        attempt.charge_token(raw);
                    }
                }
                refusal()
            });
        }
        let account = xtream::parse_username(raw).map_err(|e| bad(&e.to_string()))?;
        if !password_ok(account.api_password.as_deref()) {
            return Err(refusal());
        }
        // The password may have been proved by the request's MediaFlow token, whose expiry and
        // address binding then bound everything minted here.
        Ok(Resolved {
            server: account.server,
            user: account.username,
            limit: ctx.token.clone(),
        })
    }

    /// The username written into everything sent back: a sealed XC-only token, or (with no
    /// server password to protect) MediaFlow's base64 form without a password. The token keeps
    /// the expiry and address binding of the credential the request came with.
    fn public_user(&self, account: &Resolved) -> String {
        match &self.keys.tokens() {
            Some(gate) => gate.mint(
                &[
                    (SERVER_PARAM.to_string(), account.server.clone()),
                    (USER_PARAM.to_string(), account.user.clone()),
                ],
                &[XC_SCOPE],
                account.limit.as_ref(),
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
            Api::Xmltv | Api::Timeshift => self.stream(req, ctx, url, account.limit.as_ref()).await,
            Api::Player | Api::Panel | Api::Playlist => {
                self.rewritten(ctx, api, account, url).await
            }
        }
    }

    /// Fetches an API answer whole and rewrites every stream URL in it, off the runtime threads
    /// and within the budget all rewrites share.
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
        // A login answer is parsed as JSON, so it is held to what a real one needs. A login
        // object answered elsewhere is found in the answer itself (see [`rewrite`]).
        let login = api == Api::Player && ctx.query.get("action").is_none();
        let limit = match login {
            true => MAX_LOGIN_BYTES.min(self.max_response_bytes),
            false => self.max_response_bytes,
        };
        let mut held = Held::new(&self.budget, ctx.client_ip);
        let (bytes, capacity) = collect(up.body, limit, &host, &mut held).await?;
        let origin = Url::parse(&account.server)
            .map(|u| u.origin().ascii_serialization())
            .unwrap_or_default();
        let (real_user, public_user) = (account.user.clone(), self.public_user(account));
        let public_origin = public_origin(ctx);
        // The budget share goes into the job and comes back with its output: a request dropped
        // while its job runs gives back nothing before the job's buffers are freed.
        let answer = Answer { bytes, capacity };
        let mut sent = cpu::run(cpu::Lane::Document, move || {
            let rewriter = Rewriter {
                upstream_origin: &origin,
                real_user: &real_user,
                public_origin: &public_origin,
                public_user: &public_user,
            };
            rewritten_within(&rewriter, answer, login, held)
                .map_err(|e| e.unwrap_or_else(|| too_large(&host, "what its rewrite may hold")))
        })
        .await
        .map_err(|e| ProxyError::internal(format!("the XC rewrite failed: {e}")))??;
        sent.arm(self.upstream.whole_body_timeout());
        let mut resp = Response::new(body::boxed(sent));
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
        limit: Option<&TokenScope>,
    ) -> Result<Response<Body>, ProxyError> {
        let ext = xtream::extension(url.path()).unwrap_or_default();
        if ext == "m3u8" || ext == "m3u" {
            return Ok(self.to_hls(ctx, url, limit));
        }
        let params =
            ProxyParams::from_query(&Query::from_pairs(vec![("d".to_string(), url.to_string())]))
                .map_err(|e| bad(&e.to_string()))?;
        stream::pipe(&self.upstream, req, &params, None).await
    }

    /// A redirect to `/proxy/hls/manifest.m3u8` for `url`, under a sealed token scoped to the HLS
    /// endpoints when there is a password (never the password itself), within `limit` (the
    /// expiry and address binding of the credential the request came with).
    fn to_hls(&self, ctx: &RequestContext, url: Url, limit: Option<&TokenScope>) -> Response<Body> {
        let params = vec![("d".to_string(), url.to_string())];
        let origin = public_origin(ctx);
        let location = match &self.keys.tokens() {
            Some(gate) => {
                // Scoped to the manifest endpoint alone (`segment.ts` under it would hand back
                // the provider's playlist as written, real account and host included), and
                // reused for the client's network, so asking again makes no new spelling (and
                // no new share of `max_requests_per_token`).
                let scope = token::exact_scope("/proxy/hls/manifest.m3u8");
                let t = gate.mint_child(&params, &[&scope], limit, ctx.client_ip, token::now());
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

/// The account a sealed XC username grants, opened under `gate` for `client` (its expiry and
/// address binding checked) and scoped to XC alone. A refusal carries the gate's reason when the
/// gate refused it, `None` when it opened to something that is not an XC username's grant.
/// The server comes back in its one spelling ([`xtream::canonical_server`]), also from a token
/// sealed before logins wrote it so: every spelling of one account counts as one.
pub(crate) fn open_user(
    gate: &token::TokenGate,
    raw: &str,
    client: IpAddr,
) -> Result<Resolved, Option<token::TokenRefusal>> {
    let opened = gate.open(raw, client, token::now()).map_err(Some)?;
    if opened.scope.paths.as_deref() != Some(&[XC_SCOPE.to_string()][..]) {
        return Err(None);
    }
    let param = |name: &str| {
        opened
            .params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    match (param(SERVER_PARAM), param(USER_PARAM)) {
        (Some(server), Some(user)) => Ok(Resolved {
            server: xtream::canonical_server(&server).unwrap_or(server),
            user,
            limit: Some(opened.scope),
        }),
        _ => Err(None),
    }
}

/// `server/path` with the request's query minus what stays here.
fn upstream_url(server: &str, path: &str, ctx: &RequestContext) -> Result<Url, ProxyError> {
    let mut url = Url::parse(&format!("{server}/{path}"))
        .map_err(|e| bad(&format!("upstream XC URL: {e}")))?;
    // Behind `parse_path`'s refusals, a second line: the URL crate resolves dot segments (in
    // any spelling) and reads `\` as `/`, so the built path must still be the server's path and
    // then `path`, segment for segment (compared decoded, as the URL crate may escape more).
    let base = Url::parse(server)
        .map(|u| u.path().trim_end_matches('/').to_string())
        .unwrap_or_default();
    let segments = |p: &str| -> Vec<Vec<u8>> {
        p.split('/')
            .map(|s| percent_encoding::percent_decode_str(s).collect())
            .collect()
    };
    if segments(url.path()) != segments(&format!("{base}/{path}")) {
        return Err(bad("the XC path leaves the provider's XC paths"));
    }
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

/// An API answer whole, and the capacity its buffer holds: at most `limit` bytes within
/// `upstream.whole_body_timeout_secs`, each buffer growth taken from the budget first.
async fn collect(
    body: UpstreamBody,
    limit: usize,
    host: &str,
    held: &mut Held,
) -> Result<(Bytes, usize), ProxyError> {
    let mut capacity = 0;
    let grow = |cap| {
        held.reserve(cap)?;
        capacity = cap;
        Ok::<_, ProxyError>(())
    };
    match body.collect_limited_with(limit, grow).await? {
        Ok(bytes) => Ok((bytes, capacity)),
        Err(CollectError::TooLarge { limit }) => Err(too_large(host, &format!("{limit} bytes"))),
        Err(CollectError::Body(e)) => Err(ProxyError::new(
            Side::Upstream,
            StatusCode::BAD_GATEWAY,
            "xtream",
            format!("XC answer from {host}: {e}"),
        )),
    }
}

/// The slowest a client may take an XC answer, in bytes a second over each period of
/// `upstream.whole_body_timeout_secs` (128 kbit/s: a 40 MB list in 40 minutes).
const MIN_SEND_RATE: usize = 16 * 1024;

/// An API answer as collected, with the capacity of the buffer it is in (what `held` covers).
struct Answer {
    bytes: Bytes,
    capacity: usize,
}

impl Answer {
    /// The answer in a buffer of its own size, and what it held beyond it given back: a collect
    /// grows its buffer by doubling, so a 40 MB list sits in 64 MiB, and that spare room counted
    /// beside the rewrite (about twice the list) took a list the share holds past it (the
    /// provider's 502). A shrinking `realloc` gives the tail back in place (the C library's and
    /// jemalloc's large blocks); an allocator that copies holds both for a moment, as each
    /// growth of the collect did.
    fn exact(self, held: &mut Held) -> Bytes {
        let bytes = match self.capacity > self.bytes.len() {
            true => {
                // The collect's buffer itself (the `Bytes` is its only handle), not a copy.
                let mut buf = Vec::from(self.bytes);
                buf.shrink_to_fit();
                Bytes::from(buf)
            }
            false => self.bytes,
        };
        held.shrink_to(bytes.len());
        bytes
    }
}

/// `answer` rewritten within `held` (see [`rewrite`]) and ready to send, holding what it keeps
/// alive: its rewrite, or the answer itself when nothing in it changed. The answer's buffer is cut
/// to its size first ([`Answer::exact`]), so what it carries is charged, not the room it grew
/// into. Everything else is freed before its share is given back.
fn rewritten_within(
    rewriter: &Rewriter,
    answer: Answer,
    login: bool,
    mut held: Held,
) -> Result<Budgeted, Option<ProxyError>> {
    let answer = answer.exact(&mut held);
    let out = rewrite(rewriter, &answer, login, &mut held);
    let keep = match &out {
        Ok((_, true)) => answer.len(),
        Ok((out, false)) => out.len(),
        Err(_) => 0,
    };
    drop(answer);
    let (rest, _) = out?;
    held.shrink_to(keep);
    Ok(Budgeted::new(rest, held))
}

/// An answer rewritten within its budget share, which already holds the answer: a copy of it
/// when it is not UTF-8 and each rewrite buffer are charged at their exact size before they are
/// made, as is a login answer's parsed JSON. A rewrite buffer past [`MAX_GROWTH`] times the answer
/// plus [`GROWTH_SLACK`], or an answer holding more than a client's share (the most one answer may
/// hold, alone or not), is the provider's fault (`Err(None)`, a 502 like a login answer past [`MAX_LOGIN_BYTES`]); past
/// what the other answers leave, or the client's share beside its other answers, `Err(Some(503))`.
/// With whether the output is the answer itself.
///
/// `login` says the request was a login, rewritten whole (a login answer over
/// [`MAX_LOGIN_BYTES`] is not parsed: `Err(None)`). Any other answer that is a login object (see
/// [`is_login_object`]) names the provider's host, port and username just the same, so its
/// `user_info` and `server_info` get the login rewrite too (see [`rewrite_login_members`]).
fn rewrite(
    rewriter: &Rewriter,
    bytes: &Bytes,
    login: bool,
    held: &mut Held,
) -> Result<(Bytes, bool), Option<ProxyError>> {
    let cap = bytes
        .len()
        .saturating_mul(MAX_GROWTH)
        .saturating_add(GROWTH_SLACK);
    let mut total = held.bytes().max(bytes.len());
    let budget_bytes = held.budget.bytes;
    let mut busy = None;
    let mut grant = |n: usize| {
        total = total.saturating_add(n);
        if n > cap || total > budget_bytes {
            return false;
        }
        held.reserve(total).map_err(|e| busy = Some(e)).is_ok()
    };
    let out = if login {
        rewriter.rewrite_login_within(bytes, &mut grant)
    } else if is_login_object(bytes) {
        rewrite_login_members(rewriter, bytes, &mut grant)
    } else {
        rewriter.rewrite_answer_within(bytes, &mut grant)
    };
    match out {
        Some(Cow::Borrowed(_)) => Ok((bytes.clone(), true)),
        Some(Cow::Owned(out)) => Ok((Bytes::from(out), false)),
        None => Err(busy),
    }
}

/// A login object answered beside more, as `panel_api.php` answers it with every channel in
/// `available_channels` (megabytes for a provider with thousands): only its own `user_info` and
/// `server_info` values are parsed, each alone as `{"user_info":…}` through the login rewrite
/// (together at most [`MAX_LOGIN_BYTES`], past it `None`, the provider's 502), and spliced back in
/// place; the whole is then text-rewritten as any other answer (the channels' stream URLs). So the
/// parse costs what those members cost, not the channel list, and the rest goes out as the
/// provider wrote it, at any size (parsing it whole refused every such answer over 1 MiB). Every
/// buffer is asked of `grant` first. An object whose members cannot be walked to its end is not
/// JSON: it gets the whole-object login rewrite, bounded as the login's is.
fn rewrite_login_members<'a>(
    rewriter: &Rewriter,
    body: &'a [u8],
    grant: &mut dyn FnMut(usize) -> bool,
) -> Option<Cow<'a, str>> {
    let text = text_within(body, grant)?;
    let Some(members) = login_members(text.as_bytes()) else {
        drop(text);
        return rewriter.rewrite_login_within(body, grant);
    };
    // `{"name":` and `}` around each value.
    let wrapped = |m: &Member| m.name.len() + m.value.len() + 5;
    if members.iter().map(wrapped).sum::<usize>() > MAX_LOGIN_BYTES {
        return None;
    }
    let mut values = Vec::with_capacity(members.len());
    for m in &members {
        if !grant(wrapped(m)) {
            return None;
        }
        let prefix = format!("{{\"{}\":", m.name);
        let mut object = String::with_capacity(wrapped(m));
        object.push_str(&prefix);
        object.push_str(&text[m.value.clone()]);
        object.push('}');
        let changed = match rewriter.rewrite_login_within(object.as_bytes(), grant)? {
            Cow::Owned(out) => Some(out),
            Cow::Borrowed(_) => None,
        };
        let mut value = changed.unwrap_or(object);
        // What the login rewrite writes is the object it was given: its one member, by name.
        if !(value.starts_with(&prefix) && value.ends_with('}')) {
            return None;
        }
        value.truncate(value.len() - 1);
        value.drain(..prefix.len());
        values.push(value);
    }
    let old: usize = members.iter().map(|m| m.value.len()).sum();
    let new: usize = values.iter().map(String::len).sum();
    let len = (text.len() - old).saturating_add(new);
    if !grant(len) {
        return None;
    }
    let mut spliced = String::with_capacity(len);
    let mut from = 0;
    for (m, value) in members.iter().zip(&values) {
        spliced.push_str(&text[from..m.value.start]);
        spliced.push_str(value);
        from = m.value.end;
    }
    spliced.push_str(&text[from..]);
    drop((values, text));
    // The rewritten members go through the text rewrite again: they name no provider URL now.
    let changed = match rewriter.rewrite_text_within(&spliced, grant)? {
        Cow::Owned(out) => Some(out),
        Cow::Borrowed(_) => None,
    };
    Some(Cow::Owned(changed.unwrap_or(spliced)))
}

/// A login member of an object: `user_info` or `server_info`, and where its value is.
struct Member {
    name: &'static str,
    value: Range<usize>,
}

/// The `user_info` and `server_info` members among `body`'s own, in order (a key given twice is
/// two), walked as [`is_login_object`] walks them; `None` unless `body` is one object that ends
/// (white space after it only) with a value to each member.
fn login_members(body: &[u8]) -> Option<Vec<Member>> {
    let mut at = skip_space(body, 0);
    if body.get(at) != Some(&b'{') {
        return None;
    }
    let mut members = Vec::new();
    loop {
        at = skip_space(body, at + 1);
        if body.get(at) != Some(&b'"') {
            return None;
        }
        let (name, end) = login_key(body, at + 1)?;
        at = skip_space(body, end);
        if body.get(at) != Some(&b':') {
            return None;
        }
        let start = skip_space(body, at + 1);
        at = value_end(body, at + 1)?;
        let end = body[..at]
            .iter()
            .rposition(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
            .map_or(0, |i| i + 1);
        if end <= start {
            return None;
        }
        if let Some(name) = name {
            members.push(Member {
                name,
                value: start..end,
            });
        }
        if body[at] == b'}' {
            return (skip_space(body, at + 1) == body.len()).then_some(members);
        }
    }
}

/// Whether `body` is a JSON object with `user_info` or `server_info` among its own keys, compared
/// as JSON decodes them: the login object, which XC panels answer to more than the login
/// (`panel_api.php`, `player_api.php` with an empty or unknown `action`). It builds nothing, so
/// it costs nothing however large the answer: values are skipped by their strings and brackets
/// alone (an answer that is not JSON is not parsed as JSON afterwards either).
fn is_login_object(body: &[u8]) -> bool {
    let mut at = skip_space(body, 0);
    if body.get(at) != Some(&b'{') {
        return false;
    }
    loop {
        at = skip_space(body, at + 1);
        // An empty object, or not JSON.
        if body.get(at) != Some(&b'"') {
            return false;
        }
        let Some((name, end)) = login_key(body, at + 1) else {
            return false;
        };
        if name.is_some() {
            return true;
        }
        at = skip_space(body, end);
        if body.get(at) != Some(&b':') {
            return false;
        }
        match value_end(body, at + 1) {
            Some(end) if body[end] == b',' => at = end,
            _ => return false,
        }
    }
}

/// The first index at or after `at` that is not JSON white space.
fn skip_space(body: &[u8], at: usize) -> usize {
    at + body
        .get(at..)
        .unwrap_or_default()
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .count()
}

/// Which of `user_info` and `server_info` the JSON string starting after its opening quote at `at`
/// decodes to, if either, and the index after its closing quote; `None` when it does not end.
fn login_key(body: &[u8], mut at: usize) -> Option<(Option<&'static str>, usize)> {
    // Decoded into room for the longer name only: a longer key is neither.
    let mut key = [0u8; 11];
    let (mut len, mut fits) = (0, true);
    loop {
        let mut c = *body.get(at)?;
        at += 1;
        match c {
            b'"' => break,
            b'\\' => {
                c = *body.get(at)?;
                at += 1;
                c = match c {
                    b'u' => {
                        let hex = std::str::from_utf8(body.get(at..at + 4)?).ok()?;
                        at += 4;
                        // Neither name has a character past ASCII (0xFF is never in UTF-8).
                        u8::try_from(u16::from_str_radix(hex, 16).ok()?)
                            .ok()
                            .filter(u8::is_ascii)
                            .unwrap_or(0xFF)
                    }
                    b'b' => 0x08,
                    b'f' => 0x0C,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    other => other,
                };
            }
            _ => {}
        }
        match key.get_mut(len) {
            Some(slot) => {
                *slot = c;
                len += 1;
            }
            None => fits = false,
        }
    }
    let name = match &key[..len] {
        b"user_info" if fits => Some("user_info"),
        b"server_info" if fits => Some("server_info"),
        _ => None,
    };
    Some((name, at))
}

/// The index of the `,` or `}` that ends the object member's value starting at `at`, or `None`
/// when the object does not go on.
fn value_end(body: &[u8], mut at: usize) -> Option<usize> {
    let mut depth = 0usize;
    while let Some(&c) = body.get(at) {
        match c {
            b'"' => {
                // To its closing quote, stepping over each escaped character.
                at += 1;
                while *body.get(at)? != b'"' {
                    at += if body[at] == b'\\' { 2 } else { 1 };
                }
            }
            b'{' | b'[' => depth += 1,
            b',' | b'}' if depth == 0 => return Some(at),
            b'}' | b']' => depth = depth.checked_sub(1)?,
            _ => {}
        }
        at += 1;
    }
    None
}

/// `scheme://host[:port]` as the client addressed us.
fn public_origin(ctx: &RequestContext) -> String {
    let scheme = if ctx.secure { "https" } else { "http" };
    match &ctx.host {
        Some(host) => format!("{scheme}://{host}"),
        None => format!("{scheme}://{}", ctx.peer),
    }
}

/// The memory XC answers share, in KiB, and what each client's answers hold of it.
struct Budget {
    kib: Arc<Semaphore>,
    /// KiB each client's answers hold now, by [`network_of`] its address; a client leaves at zero.
    clients: Mutex<HashMap<IpAddr, usize>>,
    /// KiB one client's answers may hold together, one answer or many.
    share: usize,
    /// The most one answer may hold: what [`Budget::share`] stands for, to the byte.
    bytes: usize,
}

impl Budget {
    /// [`BUDGET_ANSWERS`] answers of `max_response_bytes`, [`CLIENT_ANSWERS`] a client's share.
    fn for_answers(max_response_bytes: usize) -> Arc<Budget> {
        // Rounded up as each answer's charge is, so what fits in the bytes fits in the KiB (an
        // answer a floor left 1 KiB short would be refused every time it is asked for), and the
        // share and what is left beside it each so, so a full share leaves a whole answer.
        let bytes = |answers: usize| max_response_bytes.saturating_mul(answers);
        let kib = |answers: usize| bytes(answers).div_ceil(1024);
        Budget::sized(
            kib(CLIENT_ANSWERS).saturating_add(kib(BUDGET_ANSWERS - CLIENT_ANSWERS)),
            kib(CLIENT_ANSWERS),
            bytes(CLIENT_ANSWERS),
        )
    }

    /// `kib` in all, `share` of them one client's.
    #[cfg(test)]
    fn new(kib: usize, share: usize) -> Arc<Budget> {
        Budget::sized(kib, share, share.saturating_mul(1024))
    }

    fn sized(kib: usize, share: usize, bytes: usize) -> Arc<Budget> {
        Arc::new(Budget {
            kib: Arc::new(Semaphore::new(kib.min(Semaphore::MAX_PERMITS))),
            clients: Mutex::new(HashMap::new()),
            share,
            bytes,
        })
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `kib` a client's answer gave back.
    fn give_back(&self, client: IpAddr, kib: usize) {
        let mut clients = self.clients();
        if let Some(held) = clients.get_mut(&client) {
            *held = held.saturating_sub(kib);
            if *held == 0 {
                clients.remove(&client);
            }
        }
    }
}

/// What one XC answer holds of the budget, in KiB; given back when dropped.
struct Held {
    budget: Arc<Budget>,
    client: IpAddr,
    permit: Option<OwnedSemaphorePermit>,
}

impl Held {
    /// An answer to `client`, counted by its /64 when it is IPv6: one host commonly has a whole
    /// /64, so counting its addresses one by one would multiply its share.
    fn new(budget: &Arc<Budget>, client: IpAddr) -> Held {
        Held {
            budget: budget.clone(),
            client: network_of(client),
            permit: None,
        }
    }

    /// Grows the share to cover `bytes`, or 503 when the other answers hold the rest, or when
    /// all this client's answers would hold more than its share (a lone answer too: one taking
    /// the whole budget while its client reads it slowly left nothing to anyone else).
    fn reserve(&mut self, bytes: usize) -> Result<(), ProxyError> {
        let have = self.permit.as_ref().map_or(0, |p| p.num_permits());
        let more = bytes.div_ceil(1024).saturating_sub(have);
        if more == 0 {
            return Ok(());
        }
        let mut clients = self.budget.clients();
        let mine = clients.get(&self.client).copied().unwrap_or(0);
        let taken = Some(more)
            .filter(|more| mine.saturating_add(*more) <= self.budget.share)
            .and_then(|more| u32::try_from(more).ok())
            .and_then(|n| self.budget.kib.clone().try_acquire_many_owned(n).ok())
            .ok_or_else(|| {
                ProxyError::new(
                    Side::Internal,
                    StatusCode::SERVICE_UNAVAILABLE,
                    "xtream_busy",
                    "the XC answers being rewritten now hold all the memory set aside for them \
                     (4 × media.xtream_max_response_bytes); try again shortly",
                )
                .with_retry_after(1)
            })?;
        *clients.entry(self.client).or_insert(0) += more;
        drop(clients);
        match &mut self.permit {
            Some(p) => p.merge(taken),
            None => self.permit = Some(taken),
        }
        Ok(())
    }

    /// The bytes held now.
    fn bytes(&self) -> usize {
        self.permit
            .as_ref()
            .map_or(0, |p| p.num_permits().saturating_mul(1024))
    }

    /// Gives back what is held beyond `bytes`.
    fn shrink_to(&mut self, bytes: usize) {
        if let Some(p) = &mut self.permit {
            let keep = bytes.div_ceil(1024).min(p.num_permits());
            let freed = p.num_permits() - keep;
            drop(p.split(freed));
            self.budget.give_back(self.client, freed);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(p) = self.permit.take() {
            self.budget.give_back(self.client, p.num_permits());
        }
    }
}

/// A rewritten answer handed out in slices, holding its budget share until the last is taken
/// (hyper asks for the next only when it has room to write it), the body is dropped, or the send
/// deadline [`Budgeted::arm`] sets passes. At the deadline the answer and its share are given back
/// at once, polled or not (hyper stops asking while the client keeps its window shut or nearly
/// so), and the body ends in an error: the client sees a cut answer, never a short one taken for
/// whole. Each slice is a copy, so what hyper still buffers pins one slice, not the answer.
struct Budgeted {
    state: Arc<Mutex<Sending>>,
    timer: Option<tokio::task::AbortHandle>,
}

/// Where a [`Budgeted`] answer is.
enum Sending {
    /// What is left to send, and the share that holds it.
    Rest { rest: Bytes, _held: Held },
    /// All sent; the answer and its share are given back.
    Done,
    /// Past its deadline; the answer and its share are given back.
    Cut,
}

impl Budgeted {
    fn new(rest: Bytes, held: Held) -> Budgeted {
        let state = match rest.is_empty() {
            true => Sending::Done,
            false => Sending::Rest { rest, _held: held },
        };
        Budgeted {
            state: Arc::new(Mutex::new(state)),
            timer: None,
        }
    }

    /// Cuts the send once a period of `within` (`upstream.whole_body_timeout_secs`, the bound
    /// its read had) passes in which the client took less than [`MIN_SEND_RATE`] of it (or less
    /// than all that was left): a client reading a large answer a byte at a time would otherwise
    /// hold its share for as long as it liked, while a 40 MB stream list to a box on weak Wi-Fi
    /// (2.7 Mbit/s: 120 s for the whole) must not be cut, as a deadline on the whole send did.
    /// The timer holds nothing of the answer alive.
    fn arm(&mut self, within: std::time::Duration) {
        let state = Arc::downgrade(&self.state);
        let floor = (within.as_secs() as usize)
            .max(1)
            .saturating_mul(MIN_SEND_RATE);
        let timer = tokio::spawn(async move {
            let left = |state: &Mutex<Sending>| match &*lock(state) {
                Sending::Rest { rest, .. } => Some(rest.len()),
                _ => None,
            };
            let Some(mut before) = state.upgrade().and_then(|s| left(&s)) else {
                return;
            };
            loop {
                tokio::time::sleep(within).await;
                let Some(state) = state.upgrade() else { return };
                let mut state = lock(&state);
                let now = match &*state {
                    Sending::Rest { rest, .. } => rest.len(),
                    _ => return,
                };
                if before - now < floor.min(before) {
                    tracing::debug!("an XC answer was not taken at the least rate");
                    *state = Sending::Cut;
                    return;
                }
                before = now;
            }
        });
        self.timer = Some(timer.abort_handle());
    }

    /// What is left to send.
    #[cfg(test)]
    fn rest(&self) -> Bytes {
        match &*lock(&self.state) {
            Sending::Rest { rest, .. } => rest.clone(),
            _ => Bytes::new(),
        }
    }
}

fn lock(state: &Mutex<Sending>) -> std::sync::MutexGuard<'_, Sending> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for Budgeted {
    fn drop(&mut self) {
        if let Some(timer) = self.timer.take() {
            timer.abort();
        }
    }
}

impl http_body::Body for Budgeted {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut state = lock(&self.state);
        let slice = match &mut *state {
            Sending::Rest { rest, .. } => {
                let slice = Bytes::copy_from_slice(&rest[..rest.len().min(SLICE)]);
                bytes::Buf::advance(rest, slice.len());
                slice
            }
            Sending::Done => return Poll::Ready(None),
            Sending::Cut => {
                return Poll::Ready(Some(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the XC answer was taken slower than 16 KiB/s over upstream.whole_body_timeout_secs",
                ))))
            }
        };
        // The last slice gives the answer and its share back.
        if matches!(&*state, Sending::Rest { rest, .. } if rest.is_empty()) {
            *state = Sending::Done;
        }
        Poll::Ready(Some(Ok(Frame::data(slice))))
    }

    fn is_end_stream(&self) -> bool {
        matches!(*lock(&self.state), Sending::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match &*lock(&self.state) {
            Sending::Rest { rest, .. } => SizeHint::with_exact(rest.len() as u64),
            _ => SizeHint::with_exact(0),
        }
    }
}

/// An answer over `limit`: the provider's fault.
fn too_large(host: &str, limit: &str) -> ProxyError {
    ProxyError::new(
        Side::Upstream,
        StatusCode::BAD_GATEWAY,
        "xtream",
        format!("XC answer from {host} is larger than {limit}"),
    )
}

fn bad(message: &str) -> ProxyError {
    ProxyError::downstream(StatusCode::BAD_REQUEST, "bad_request", message.to_string())
}

/// An XC request's error as its client sees it: a holder of an XC username token may not learn
/// the provider's address (its token hides it), so an error about the provider (its status, an
/// unreachable or refused host, a broken answer) names no host; the full error is logged.
fn unnamed(e: ProxyError) -> ProxyError {
    e.unnamed("the XC provider")
}

/// The one answer to a wrong or missing API password, whatever form it came in.
fn refusal() -> ProxyError {
    ProxyError::downstream(StatusCode::FORBIDDEN, "auth", "wrong api_password")
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;
    use http_body_util::BodyExt;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    const R: Rewriter<'static> = Rewriter {
        upstream_origin: "http://xc.example",
        real_user: "alice",
        public_origin: "https://proxy.example",
        public_user: "TOK",
    };

    #[test]
    fn an_upstream_url_that_leaves_the_xc_paths_is_refused() {
        let ctx = RequestContext {
            peer: "127.0.0.1:1".parse().unwrap(),
            client_ip: "127.0.0.1".parse().unwrap(),
            query: Query::parse("a=1&username=u"),
            path: String::new(),
            host: None,
            secure: false,
            token: None,
        };
        let url = |server, path| upstream_url(server, path, &ctx).map(|u| u.to_string());
        assert_eq!(
            url("http://xc:8080/base", "live/u/p/1.ts").unwrap(),
            "http://xc:8080/base/live/u/p/1.ts?a=1"
        );
        assert_eq!(
            url("http://xc", "player_api.php").unwrap(),
            "http://xc/player_api.php?a=1"
        );
        for (server, path) in [
            ("http://xc", "timeshift/u/p/%2e%2e/%2e%2e/admin%2Fx.php"),
            ("http://xc/base", "live/%2E%2E/%2e%2e/x/1.ts"),
            ("http://xc", "u/p/..\\..\\1"),
            ("http://xc/?q", "live/u/p/1.ts"),
        ] {
            let e = url(server, path).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{server} {path}");
        }
    }

    #[tokio::test]
    async fn the_budget_refuses_past_its_size_and_is_given_back() {
        let budget = Budget::new(10, 10);
        let mut a = Held::new(&budget, A);
        a.reserve(6 * 1024).unwrap();
        a.reserve(5000).unwrap();
        assert_eq!(budget.kib.available_permits(), 4);
        let mut b = Held::new(&budget, B);
        let e = b.reserve(5 * 1024).unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.retry_after, Some(1));
        b.reserve(4 * 1024).unwrap();
        assert_eq!(budget.kib.available_permits(), 0);
        a.shrink_to(1025);
        assert_eq!(budget.kib.available_permits(), 4);
        assert_eq!(budget.clients()[&A], 2);
        // The body sends every byte, in slices, and holds its share until the last is taken.
        let out = Bytes::from(vec![7u8; 3 * SLICE + 5]);
        let body = Budgeted::new(out.clone(), a);
        assert_eq!(body.size_hint().exact(), Some(out.len() as u64));
        let mut body = Box::pin(body);
        let mut got = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            assert!(data.len() <= SLICE);
            got.extend_from_slice(&data);
            let held = if got.len() < out.len() { 4 } else { 6 };
            assert_eq!(budget.kib.available_permits(), held);
        }
        assert_eq!(got, out);
        assert!(body.is_end_stream());
        drop(body);
        drop(b);
        assert_eq!(budget.kib.available_permits(), 10);
        assert!(budget.clients().is_empty());
    }

    /// One client's answers hold at most its share together, with the refusal every client gets
    /// when the budget is full; another client still has the rest.
    #[test]
    fn one_client_holds_at_most_its_share() {
        let budget = Budget::new(16, 12);
        let mut a1 = Held::new(&budget, A);
        a1.reserve(8 * 1024).unwrap();
        let mut a2 = Held::new(&budget, A);
        a2.reserve(4 * 1024).unwrap();
        let e = a2.reserve(5 * 1024).unwrap_err();
        let full = Held::new(&budget, B).reserve(17 * 1024).unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            (e.kind, &e.message, e.retry_after),
            (full.kind, &full.message, Some(1))
        );
        assert!(Held::new(&budget, A).reserve(1).is_err());
        let mut b = Held::new(&budget, B);
        b.reserve(4 * 1024).unwrap();
        assert_eq!(budget.kib.available_permits(), 0);
        // What one answer gives back, its client may take again.
        a1.shrink_to(7 * 1024);
        Held::new(&budget, A).reserve(1024).unwrap();
        drop((a1, a2, b));
        assert_eq!(budget.kib.available_permits(), 16);
        assert!(budget.clients().is_empty());
    }

    /// An answer sent as it came holds what it carries until it is sent: its buffer is cut to
    /// its size first, the room the collect's doubling left in it given back.
    #[tokio::test]
    async fn an_unchanged_answer_holds_what_it_carries() {
        let budget = Budget::new(1024, 1024);
        let mut held = Held::new(&budget, A);
        held.reserve(64 * 1024).unwrap();
        let mut buf = Vec::with_capacity(64 * 1024);
        buf.extend_from_slice(&b"[{\"name\":\"x\"}]".repeat(600));
        let (len, capacity) = (buf.len(), buf.capacity());
        assert!(len < 10 * 1024 && capacity == 64 * 1024);
        let answer = || Answer {
            bytes: Bytes::from(buf.clone()),
            capacity: 64 * 1024,
        };
        // The buffer itself is cut, not only its charge.
        let mut exact = Held::new(&budget, B);
        exact.reserve(64 * 1024).unwrap();
        let mut big = Vec::with_capacity(64 * 1024);
        big.extend_from_slice(&buf);
        let cut = Answer {
            bytes: Bytes::from(big),
            capacity: 64 * 1024,
        }
        .exact(&mut exact);
        assert_eq!(exact.bytes(), len.div_ceil(1024) * 1024);
        assert_eq!(Vec::from(cut).capacity(), len);
        drop(exact);
        let sent = rewritten_within(&R, answer(), false, held).unwrap();
        assert_eq!(sent.rest(), buf);
        assert_eq!(budget.kib.available_permits(), 1024 - len.div_ceil(1024));
        let got = Box::pin(sent).collect().await.unwrap().to_bytes();
        assert_eq!(got, buf);
        assert_eq!(budget.kib.available_permits(), 1024);
    }

    /// An answer whose buffer grew by doubling (a 40 MB list in 64 MiB) is served when what it
    /// carries and its rewrite fit the share, the buffer's spare room beside them or not (counted,
    /// a `get.php` list of 34 to 50 MB growing as short URLs do was the provider's 502); one
    /// whose own bytes and rewrite do not fit is still refused, and either gives its share back.
    #[test]
    fn an_answer_is_charged_what_it_carries_not_its_buffers_room() {
        let max = 64 * 1024;
        let budget = Budget::for_answers(max);
        let sealed = "T".repeat(160);
        let (rewriter, answer, out) = growing_m3u(&sealed);
        let len = answer.bytes.len();
        assert!(answer.capacity + out.len() > 3 * max, "{}", out.len());
        assert!(
            len.div_ceil(1024) * 1024 + out.len() <= 3 * max,
            "{}",
            out.len()
        );
        let mut held = Held::new(&budget, A);
        held.reserve(answer.capacity).unwrap();
        let Ok(sent) = rewritten_within(&rewriter, answer, false, held) else {
            panic!("refused, not served whole");
        };
        assert_eq!(sent.rest(), out.as_bytes());
        assert_eq!(
            budget.kib.available_permits(),
            256 - out.len().div_ceil(1024)
        );
        drop(sent);
        assert_eq!(budget.kib.available_permits(), 256);
        // Past the share by what it carries: the provider's 502, as before.
        let sealed = "T".repeat(200);
        let (rewriter, answer, out) = growing_m3u(&sealed);
        assert!(answer.bytes.len() + out.len() > 3 * max);
        let mut held = Held::new(&budget, A);
        held.reserve(answer.capacity).unwrap();
        let refused = rewritten_within(&rewriter, answer, false, held);
        assert!(matches!(refused, Err(None)));
        assert_eq!(budget.kib.available_permits(), 256);
        assert!(budget.clients().is_empty());
    }

    /// A login answer's parsed JSON is charged before it is built: 40 KB of `[0,0,...]` parses
    /// into 20,000 values of 32 bytes and more, past a budget of 300 KiB.
    #[test]
    fn a_login_answers_parsed_json_is_charged() {
        let login = format!(
            r#"{{"user_info":{{"username":"alice"}},"pad":[{}0]}}"#,
            "0,".repeat(19_999)
        );
        let answer = || Answer {
            capacity: login.len(),
            bytes: Bytes::from(login.clone()),
        };
        let budget = Budget::new(300, 300);
        let mut held = Held::new(&budget, A);
        held.reserve(login.len()).unwrap();
        let refused = rewritten_within(&R, answer(), true, held);
        assert!(matches!(refused, Err(None)));
        assert_eq!(budget.kib.available_permits(), 300);
        // With room for it, the login is rewritten and holds only what it sends.
        let budget = Budget::new(4096, 4096);
        let mut held = Held::new(&budget, A);
        held.reserve(login.len()).unwrap();
        let sent = rewritten_within(&R, answer(), true, held).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&sent.rest()).unwrap();
        assert_eq!(v["user_info"]["username"], "TOK");
        assert_eq!(
            budget.kib.available_permits(),
            4096 - sent.rest().len().div_ceil(1024)
        );
    }

    /// A login object is told by its own keys as JSON decodes them; an array, another object, a
    /// login key deeper down or inside a string, and text that is not JSON are not one.
    #[test]
    fn a_login_object_is_told_by_its_own_keys() {
        for yes in [
            r#"{"user_info":{"username":"alice"}}"#,
            r#" {"a":[1,{"b":"}]"}],"s":"x\"y,}","n":null,"server_info":{}}"#,
            r#"{"user\u005Finfo":1}"#,
            "\r\n{\t\"server_info\" :{}}",
        ] {
            assert!(is_login_object(yes.as_bytes()), "{yes}");
        }
        for no in [
            r#"[{"user_info":{}}]"#,
            r#"{"a":{"user_info":{}},"b":"\",\"server_info\":"}"#,
            r#"{"user_infos":1,"xuser_info":2,"user_info\u00e9":3}"#,
            r#"{"a":[1}],"user_info":{}}"#,
            r#"{"a":1,}"#,
            r#"{"a":"\"#,
            r#"{"user_in"#,
            "{}",
            "",
            "#EXTM3U\n{\"user_info\":{}}",
        ] {
            assert!(!is_login_object(no.as_bytes()), "{no}");
        }
        assert!(!is_login_object(b"{\"a\":\"\xff\",\"\\u00"));
    }

    /// A login object is rewritten as the login is whatever asked for it: the public host,
    /// port and username, never the provider's; an array beside it is sent as it came, and a
    /// login object past [`MAX_LOGIN_BYTES`] is not parsed but refused (a text rewrite alone
    /// would leave the host and username in it).
    #[test]
    fn a_login_object_is_rewritten_whatever_asked_for_it() {
        let budget = Budget::new(8192, 8192);
        let send = |body: String| {
            let mut held = Held::new(&budget, A);
            held.reserve(body.len()).unwrap();
            let answer = Answer {
                capacity: body.len(),
                bytes: Bytes::from(body),
            };
            rewritten_within(&R, answer, false, held).map(|sent| sent.rest())
        };
        let login = |pad: usize| {
            format!(
                r#"{{"user_info":{{"username":"alice","password":"pw"}},"server_info":{{"url":"xc.example","port":"8080"}},"available_channels":{{"1":{{"direct_source":"http:\/\/xc.example\/live\/alice\/pw\/1.ts"}}}},"pad":"{}"}}"#,
                "x".repeat(pad)
            )
        };
        let out = send(login(0)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["user_info"]["username"], "TOK");
        assert_eq!(v["server_info"]["url"], "proxy.example");
        assert_eq!(v["server_info"]["port"], "443");
        assert_eq!(
            v["available_channels"]["1"]["direct_source"],
            "https://proxy.example/live/TOK/pw/1.ts"
        );
        let text = std::str::from_utf8(&out).unwrap();
        assert!(
            !text.contains("alice") && !text.contains("xc.example"),
            "{text}"
        );
        let list = r#"[{"user_info":{"username":"alice"}}]"#.to_string();
        assert_eq!(send(list.clone()).unwrap(), list.as_bytes());
        // Past MAX_LOGIN_BYTES beside the login members it is served, the rest as it came.
        let out = send(login(MAX_LOGIN_BYTES)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["user_info"]["username"], "TOK");
        assert_eq!(v["server_info"]["url"], "proxy.example");
        assert_eq!(v["pad"].as_str().unwrap().len(), MAX_LOGIN_BYTES);
        // Past it in `user_info` itself it is not parsed but refused.
        let huge = format!(
            r#"{{"user_info":{{"username":"alice","pad":"{}"}},"server_info":{{"url":"xc.example"}}}}"#,
            "x".repeat(MAX_LOGIN_BYTES)
        );
        assert!(matches!(send(huge), Err(None)));
        assert_eq!(budget.kib.available_permits(), 8192);
    }

    /// Only a login object's own `user_info` and `server_info` are parsed and put back where they
    /// were, every one of them (an escaped key, a key given twice); the members beside them keep
    /// their bytes, and what is parsed is charged as the members' cost, not the answer's: 2 MB of
    /// `[0,0,...]` beside them (a million values if parsed) is served within an 8 MiB budget,
    /// which then holds what it sends.
    #[test]
    fn only_a_login_objects_own_members_are_parsed() {
        let body = format!(
            "{{ \"user\\u005Finfo\" : {{\"username\":\"alice\"}} ,\"a\":[{}0],\"b\":\"http:\\/\\/xc.example\\/alice\\/p\\/1\",\n\"server_info\":{{\"url\":\"xc.example\",\"port\":\"80\"}},\"user_info\":{{\"username\":\"alice\"}}\n}}\n",
            "0,".repeat(1024 * 1024)
        );
        let budget = Budget::new(8192, 8192);
        let mut held = Held::new(&budget, A);
        held.reserve(body.len()).unwrap();
        let answer = Answer {
            capacity: body.len(),
            bytes: Bytes::from(body.clone()),
        };
        let sent = rewritten_within(&R, answer, false, held).unwrap();
        let out = std::str::from_utf8(&sent.rest()).unwrap().to_string();
        let want = body
            .replacen(
                r#"{"username":"alice"}"#,
                r#"{"username":"TOK"}"#,
                2,
            )
            .replace(
                r#"{"url":"xc.example","port":"80"}"#,
                r#"{"port":"443","url":"proxy.example","https_port":"443","server_protocol":"https"}"#,
            )
            .replace(
                r#"http:\/\/xc.example\/alice\/p\/1"#,
                r#"https:\/\/proxy.example\/TOK\/p\/1"#,
            );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["server_info"]["url"], "proxy.example");
        assert_eq!(v["server_info"]["port"], "443");
        assert_eq!(v["server_info"]["https_port"], "443");
        assert!(!out.contains("alice") && !out.contains("xc.example"));
        let got: serde_json::Value = serde_json::from_str(&want).unwrap();
        assert_eq!(v, got);
        // Byte for byte the answer but for the members' values and the stream URL.
        let (head, tail) = out.split_at(out.find(",\"a\":[").unwrap());
        assert_eq!(head, r#"{ "user\u005Finfo" : {"username":"TOK"} "#);
        assert!(tail.starts_with(&body[body.find(",\"a\":[").unwrap()..][..1024]));
        assert!(tail.ends_with("\n}\n"));
        assert_eq!(
            budget.kib.available_permits(),
            8192 - sent.rest().len().div_ceil(1024)
        );
        drop(sent);
        assert_eq!(budget.kib.available_permits(), 8192);
        // A login object that does not close is not walked: it is rewritten whole, as the
        // login is (here not JSON, so its text only).
        assert!(login_members(br#"{"user_info":{}} x"#).is_none());
        assert!(login_members(br#"{"user_info":,"a":1}"#).is_none());
        let members = login_members(b"{\"a\":1,\"server_info\" :\t[1, 2] \r\n}").unwrap();
        assert_eq!(members.len(), 1);
        assert_eq!(
            (members[0].name, members[0].value.clone()),
            ("server_info", 23..29)
        );
    }

    /// Two addresses of one IPv6 /64 are one client (a host commonly has the whole /64); an
    /// IPv4-mapped address is its IPv4 one; another /64 is another client.
    #[test]
    fn a_clients_share_counts_its_whole_64() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let budget = Budget::new(16, 12);
        let mut a1 = Held::new(&budget, ip("2001:db8::1"));
        a1.reserve(8 * 1024).unwrap();
        let mut a2 = Held::new(&budget, ip("2001:db8::ffff:2"));
        a2.reserve(4 * 1024).unwrap();
        let e = a2.reserve(5 * 1024).unwrap_err();
        assert_eq!(
            (e.status, e.kind),
            (StatusCode::SERVICE_UNAVAILABLE, "xtream_busy")
        );
        assert_eq!(budget.clients()[&ip("2001:db8::")], 12);
        let mut other = Held::new(&budget, ip("2001:db8:0:1::1"));
        other.reserve(4 * 1024).unwrap();
        drop((a1, a2, other));
        let mut v4 = Held::new(&budget, A);
        v4.reserve(8 * 1024).unwrap();
        let mut mapped = Held::new(&budget, ip("::ffff:10.0.0.1"));
        assert!(mapped.reserve(5 * 1024).is_err());
        drop((v4, mapped));
        assert_eq!(budget.kib.available_permits(), 16);
        assert!(budget.clients().is_empty());
    }

    /// An M3U of 60 KiB read into a 64 KiB buffer, as a collect leaves it, and its rewrite: each
    /// short URL gains the public origin and `sealed` (with 200 bytes the answer and its rewrite
    /// need more than a client's share of three 64 KiB answers, but less than the budget of four).
    fn growing_m3u(sealed: &str) -> (Rewriter<'_>, Answer, String) {
        let rewriter = Rewriter {
            public_user: sealed,
            ..R
        };
        let entry = format!(
            "#EXTINF:-1,{}\nhttp://xc.example/live/alice/p/1.ts\n",
            "A Channel ".repeat(9)
        );
        let mut buf = Vec::with_capacity(64 * 1024);
        while buf.len() + entry.len() <= 60 * 1024 {
            buf.extend_from_slice(entry.as_bytes());
        }
        let out = rewriter.rewrite_text(std::str::from_utf8(&buf).unwrap());
        let answer = Answer {
            capacity: buf.capacity(),
            bytes: Bytes::from(buf),
        };
        (rewriter, answer, out)
    }

    /// A lone answer holds at most its client's share, as its answers together do: one whose peak
    /// needs more (an M3U that grows five-fold) is the provider's 502, where it once took the
    /// whole budget and a client reading it slowly left nothing to anyone else. Within the share
    /// it is served, beside another of its answers it gets the share's 503, and another client
    /// always has a largest answer's worth beside the fullest share.
    #[test]
    fn a_lone_answer_holds_at_most_its_share() {
        let max = 64 * 1024;
        let budget = Budget::for_answers(max);
        let mut lone = Held::new(&budget, A);
        assert!(lone.reserve(3 * max + 1).is_err());
        lone.reserve(3 * max).unwrap();
        Held::new(&budget, B).reserve(max).unwrap();
        drop(lone);
        assert_eq!(budget.kib.available_permits(), 256);
        let sealed = "T".repeat(200);
        let (rewriter, answer, out) = growing_m3u(&sealed);
        let peak = answer.bytes.len() + out.len();
        assert!(peak > 3 * max && peak <= 4 * max, "{peak}");
        let mut held = Held::new(&budget, A);
        held.reserve(answer.capacity).unwrap();
        let refused = rewritten_within(&rewriter, answer, false, held);
        assert!(matches!(refused, Err(None)));
        assert_eq!(budget.kib.available_permits(), 256);
        // A shorter username: within the share, served; another client still has its answer.
        let sealed = "T".repeat(100);
        let (rewriter, answer, out) = growing_m3u(&sealed);
        assert!(answer.bytes.len() + out.len() <= 3 * max);
        let mut held = Held::new(&budget, A);
        held.reserve(answer.capacity).unwrap();
        let sent = rewritten_within(&rewriter, answer, false, held).unwrap();
        assert_eq!(sent.rest(), out.as_bytes());
        assert!(out.contains(&format!("/{sealed}/p/1.ts")));
        Held::new(&budget, B).reserve(max).unwrap();
        drop(sent);
        assert_eq!(budget.kib.available_permits(), 256);
        // The same while the client holds another answer: the busy 503, retried later.
        let (rewriter, answer, _) = growing_m3u(&sealed);
        let mut other = Held::new(&budget, A);
        other.reserve(48 * 1024).unwrap();
        let mut held = Held::new(&budget, A);
        held.reserve(answer.capacity).unwrap();
        let e = rewritten_within(&rewriter, answer, false, held)
            .err()
            .unwrap()
            .expect("the share's 503, not the provider's 502");
        assert_eq!(
            (e.status, e.kind),
            (StatusCode::SERVICE_UNAVAILABLE, "xtream_busy")
        );
        assert_eq!(e.retry_after, Some(1));
        drop(other);
        assert_eq!(budget.kib.available_permits(), 256);
    }

    /// An answer its client stops taking (hyper then stops asking the body for more) gives its
    /// share and its bytes back at its send deadline all the same, and its body ends in an error
    /// rather than cleanly; one taken in time is unaffected. Time is the runtime's paused clock.
    #[tokio::test(start_paused = true)]
    async fn an_answer_not_taken_by_its_deadline_is_cut_and_given_back() {
        let within = std::time::Duration::from_secs(120);
        let budget = Budget::new(16, 12);
        let mut held = Held::new(&budget, A);
        held.reserve(8 * 1024).unwrap();
        let out = Bytes::from(vec![1u8; 4 * SLICE]);
        let mut body = Budgeted::new(out.clone(), held);
        body.arm(within);
        let weak = Arc::downgrade(&body.state);
        let mut body = Box::pin(body);
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.len(), SLICE);
        tokio::time::sleep(within - std::time::Duration::from_secs(1)).await;
        assert_eq!(budget.kib.available_permits(), 8);
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        assert_eq!(budget.kib.available_permits(), 16);
        assert!(budget.clients().is_empty());
        // The answer itself is freed too: the slice sent was a copy.
        assert!(matches!(*lock(&weak.upgrade().unwrap()), Sending::Cut));
        assert_eq!(body.size_hint().exact(), Some(0));
        let e = body.frame().await.unwrap().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        drop(body);
        assert!(weak.upgrade().is_none());
        // Taken in time, it ends cleanly and the timer finds nothing to cut.
        let mut held = Held::new(&budget, A);
        held.reserve(8 * 1024).unwrap();
        let mut body = Budgeted::new(out.clone(), held);
        body.arm(within);
        let got = Box::pin(body).collect().await.unwrap().to_bytes();
        assert_eq!(got, out);
        assert_eq!(budget.kib.available_permits(), 16);
        tokio::time::sleep(within * 2).await;
        assert_eq!(budget.kib.available_permits(), 16);
        // A slow client that keeps taking it (a slice every 2 s: 32 KiB/s, over the 16 KiB/s
        // floor) is not cut however long the whole takes (here 256 s, past `within`); a
        // deadline on the whole send cut a 40 MB list to a box on weak Wi-Fi.
        let mut held = Held::new(&budget, A);
        held.reserve(8 * 1024).unwrap();
        let long = Bytes::from(vec![2u8; 128 * SLICE]);
        let mut body = Budgeted::new(long.clone(), held);
        body.arm(within);
        let mut body = Box::pin(body);
        let mut got = Vec::new();
        while let Some(frame) = body.frame().await {
            got.extend_from_slice(&frame.expect("not cut").into_data().unwrap());
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        }
        assert!(got == long[..], "every byte");
    }

    /// The budget and a client's share in KiB are rounded up as each answer's charge is: an
    /// answer within their bytes is within their KiB (a floor refused it every time).
    #[test]
    fn the_budget_in_kib_covers_its_bytes() {
        // 1500-byte answers: a share of 4500 bytes (4.4 KiB), and an answer (1.5 KiB) beside a
        // full share.
        let budget = Budget::for_answers(1500);
        let mut lone = Held::new(&budget, A);
        lone.reserve(4500).unwrap();
        Held::new(&budget, B).reserve(1500).unwrap();
        drop(lone);
        let (mut a1, mut a2) = (Held::new(&budget, A), Held::new(&budget, A));
        a1.reserve(1000).unwrap();
        a2.reserve(3500).unwrap();
        assert!(Held::new(&budget, A).reserve(1).is_err());
        drop((a1, a2));
        assert_eq!(budget.kib.available_permits(), 7);
    }
}
