//! Dispatch: each request through the route table to a user route or a built-in, metered from
//! arrival to the end of its body; the built-ins by path behind the authorization gate.

use std::net::SocketAddr;

use crate::body::Incoming;
use http::{Request, Response, StatusCode};
use sluice_media::query::Query;
use sluice_media::token::split_path_token;

#[cfg(feature = "iptv")]
use super::endpoints::is_channel_path;
use super::endpoints::{allow_any_origin, json, not_found, preflight, sandboxed};
use super::gate::{
    changes_state, cross_site, cross_site_refused, local_host, local_only, misdirected, page_login,
};
use super::metering::{effective_path, endpoint_label, EndpointSeries, Finish, Metered};
use super::routes::Dispatch;
use super::App;
use crate::auth::{browser, token, Auth};
use crate::body::{self, Body};
use crate::error::{ErrorMark, ProxyError};
#[cfg(feature = "iptv")]
use crate::iptv::Iptv;
#[cfg(feature = "media")]
use crate::media::Media;
use crate::metrics::EndpointLabels;
#[cfg(feature = "reverse")]
use crate::reverse::forward::{ClientHost, Downstream};
use crate::runtime::recent::{self, recent};
use crate::server::activity::ActivityGuard;

impl App {
    /// Serves one request and meters it from arrival to the end of its body.
    pub async fn handle(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
        guard: ActivityGuard,
    ) -> Response<Body> {
        let start = recent();
        // In-flight requests keep the table they started with; a reload only affects new ones.
        let routing = self.routing.load_full();
        let dispatch = routing.dispatch(&req);
        let endpoint = match &dispatch {
            #[cfg(feature = "reverse")]
            Dispatch::Proxy(..) => "reverse",
            _ => endpoint_label(effective_path(req.uri().path())),
        };
        let labels = EndpointLabels { endpoint };
        let series = if endpoint == "reverse" {
            self.proxy_series
                .get_or_init(|| EndpointSeries::of(&self.metrics, &labels))
                .clone()
        } else {
            EndpointSeries::of(&self.metrics, &labels)
        };
        let active = series.active;
        active.inc();
        let resp = match dispatch {
            #[cfg(feature = "reverse")]
            Dispatch::Proxy(route, path) => {
                let (client_ip, trusted) = {
                    let keys = self.keys.load();
                    let auth = &keys.auth;
                    (
                        auth.client_ip(peer.ip(), req.headers()),
                        auth.is_trusted(peer.ip()),
                    )
                };
                let down = Downstream {
                    peer,
                    client_ip,
                    trusted,
                    secure,
                    host: ClientHost::of_request(&req),
                };
                // A path already normal is the target's own: its bytes shared, not copied.
                let target = match path {
                    Some(_) => None,
                    None => req.uri().path_and_query().cloned(),
                };
                let path = match (&path, &target) {
                    (Some(p), _) => p.as_str(),
                    (None, Some(t)) => t.path(),
                    // (A normal path starts with `/`: the target has one.)
                    (None, None) => "/",
                };
                routing.reverse.handle(&route, req, path, &down).await
            }
            Dispatch::Refused(e) => e.into_response(),
            Dispatch::Builtin(_) => {
                if crate::upstream::guard::is_own_loop(req.headers()) {
                    // An origin sent one of this sluice's own upstream requests back to it.
                    let resp = ProxyError::downstream(
                        StatusCode::LOOP_DETECTED,
                        "loop",
                        "this request came from this sluice itself (an origin redirected it back \
                         here); refused so the chain cannot grow",
                    )
                    .into_response();
                    self.count_response(
                        endpoint,
                        resp.status().as_u16(),
                        resp.extensions().get::<ErrorMark>(),
                    );
                    active.dec();
                    return resp;
                }
                let guarded = self.keys.load().auth.required();
                let cors = guarded && browser::is_player_path(effective_path(req.uri().path()));
                if !guarded && !routing.builtin_host_pinned && !local_host(&req) {
                    // Without a password only this machine may ask, by a loopback name: a page
                    // on another site, or a DNS name rebound to 127.0.0.1, is refused here.
                    misdirected()
                } else if req.method() == http::Method::OPTIONS {
                    preflight(cors)
                } else {
                    // Boxed: the built-in front ends' future (media, IPTV, ...) is the largest
                    // part of this one, and every request's future (reverse routes' too) was
                    // as large as it, which hyper moves per HTTP/2 stream.
                    let mut resp =
                        crate::server::boxed_in_place(|| self.route(req, peer, secure)).await;
                    // Token refusals stay identical whatever the path (no CORS on any of them).
                    let refused_token = resp
                        .extensions()
                        .get::<ErrorMark>()
                        .is_some_and(|m| m.kind == "token");
                    if cors && !refused_token {
                        allow_any_origin(resp.headers_mut());
                    }
                    resp
                }
            }
        };
        series
            .first_byte
            .observe(recent::since(start).as_secs_f64());
        self.count_response(
            endpoint,
            resp.status().as_u16(),
            resp.extensions().get::<ErrorMark>(),
        );
        let finish = Finish {
            start,
            total: series.total,
            active,
            _guard: guard,
        };
        let sent = series.sent;
        resp.map(|inner| {
            body::boxed(Metered {
                inner,
                sent,
                finish: Some(finish),
            })
        })
    }

    pub(super) async fn route(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
    ) -> Response<Body> {
        // A token is a credential as a password is: a network past its wrong passwords gets the
        // 429 before its token is opened, and a forged one (made under a guessed password) is
        // booked as a wrong password.
        let client_ip = self.keys.load().auth.client_ip(peer.ip(), req.headers());
        if carries_token(&req) {
            if let Err(limited) = self.token_limited(client_ip) {
                return limited.into_response();
            }
        }
        // A MediaFlow token's claims, as opened: its in-flight share keys on them.
        #[cfg_attr(not(feature = "media"), allow(unused_variables))]
        let (ctx, claims) = match self.context(&req, peer, client_ip, secure) {
            Ok(opened) => opened,
            Err(why) => {
                tracing::debug!(reason = %why, "token refused");
                self.charge_refused_token(client_ip, &offered_token(&req), &why);
                return token_refused();
            }
        };
        let password_free = {
            let keys = self.keys.load();
            (!keys.auth.required()).then(|| forwarded_by_untrusted(&keys.auth, peer, &req))
        };
        if let Some(forwarded) = password_free {
            if (forwarded || !ctx.client_ip.is_loopback()) && !open_to_any_client(&ctx.path) {
                // No password: the pages, the admin endpoints and everything that fetches or
                // mints on a client's behalf are this machine's only. A client elsewhere reaching
                // them through a trusted front proxy (which may well send a loopback `Host`) is
                // refused: otherwise `/proxy/*` would be an open proxy for the whole internet.
                // So is one through a front proxy not listed as trusted: its loopback address
                // says nothing of the client, and the forwarding header it adds says it relays.
                return if forwarded {
                    untrusted_forward_refused()
                } else {
                    local_only()
                };
            }
        }
        if operator(&ctx.path) && ctx.token.is_some() {
            // The operator's own views need the password itself: a token (a MediaFlow one
            // carries the password, but it is a link handed to players) opens streams, not the
            // status, the metrics or the pages.
            tracing::debug!("token refused on an operator path");
            return token_refused();
        }
        if changes_state(&ctx.path) && cross_site(&req) {
            // A form or fetch from a page on another site (in a browser on this machine, for a
            // password-free server) is refused before anything runs.
            return cross_site_refused();
        }
        if browser::is_page(&ctx.path) {
            let offered = Auth::offered(ctx.query.get("api_password"), req.headers());
            match self.password_ok(ctx.client_ip, offered.as_deref()) {
                Ok(true) => {}
                Ok(false) => return page_login(),
                Err(limited) => return limited.into_response(),
            }
        }
        let result = match ctx.path.as_str() {
            "/health" => Ok(json(StatusCode::OK, r#"{"status":"healthy"}"#)),
            "/admin/reload" => self.admin_reload(&req, ctx.client_ip).await,
            "/metrics" => self.serve_metrics(&req, &ctx),
            #[cfg(feature = "media")]
            p if Media::serves_open(p) && self.media.is_some() => match &self.media {
                Some(media) => {
                    // The URL generators compare a password from the body: under the limit.
                    let mut req = req;
                    let attempt = self.guess_attempt(ctx.client_ip);
                    req.extensions_mut().insert(attempt);
                    media.handle_open(req, &ctx).await
                }
                None => Err(not_found(p)),
            },
            #[cfg(feature = "media")]
            p if Media::serves_page(p) && self.media.is_some() => match &self.media {
                Some(media) => media.handle_page(&req, &ctx, &self.home.load()),
                None => Err(not_found(p)),
            },
            #[cfg(feature = "media")]
            crate::media::playlist::PLAYLIST_PATH => match &self.media {
                // A merge fetches up to 16 sources: it holds places like `/proxy/*`.
                Some(media) => match self
                    .authorize(&req, &ctx)
                    .and_then(|()| self.media_places(&req, &ctx, claims.as_ref()))
                {
                    Ok(places) => media
                        .handle_playlist(req, &ctx)
                        .await
                        .map(|r| crate::media::limit::hold(r, places)),
                    Err(e) => Err(e),
                },
                None => Err(not_found(&ctx.path)),
            },
            #[cfg(feature = "media")]
            crate::media::playlist::LINK_PATH => match &self.media {
                // Minting needs the password itself, in a header: never a token (a token holder
                // may not widen what it holds) nor a query parameter (which ends up in logs).
                Some(media) => match ctx.token.is_none().then(|| {
                    self.password_ok(ctx.client_ip, Auth::offered_in_header(req.headers()))
                }) {
                    Some(Ok(true)) => media.handle_playlist_link(req, &ctx).await,
                    Some(Err(limited)) => Err(limited),
                    Some(Ok(false)) | None => Err(ProxyError::downstream(
                        StatusCode::FORBIDDEN,
                        "auth",
                        "minting a playlist URL needs the password in the api_password header",
                    )),
                },
                None => Err(not_found(&ctx.path)),
            },
            #[cfg(feature = "iptv")]
            p if Iptv::serves(p) => match self.authorize(&req, &ctx) {
                Ok(()) if is_channel_path(p) => Ok(sandboxed(
                    self.iptv.handle(self.iptv_parts(req, &ctx)).await,
                )),
                Ok(()) => Ok(self.iptv.handle(self.iptv_parts(req, &ctx)).await),
                Err(e) => Err(e),
            },
            #[cfg(feature = "media")]
            p if Media::serves_extractor(p) => match &self.media {
                Some(media) => match self
                    .authorize(&req, &ctx)
                    .and_then(|()| self.media_places(&req, &ctx, claims.as_ref()))
                {
                    Ok(places) => media
                        .handle_extractor(req, &ctx)
                        .await
                        .map(|r| crate::media::limit::hold(sandboxed(r), places)),
                    Err(e) => Err(e),
                },
                None => Err(not_found(p)),
            },
            #[cfg(feature = "media")]
            p if p.starts_with("/proxy/") => match &self.media {
                Some(media) => match self
                    .authorize(&req, &ctx)
                    .and_then(|()| self.media_places(&req, &ctx, claims.as_ref()))
                {
                    Ok(places) => media
                        .handle(req, &ctx)
                        .await
                        .map(|r| crate::media::limit::hold(sandboxed(r), places)),
                    Err(e) => Err(e),
                },
                None => Err(not_found(p)),
            },
            #[cfg(feature = "media")]
            p if crate::media::xtream::Xtream::serves(p) => match &self.media {
                // XC players cannot add `api_password`: the credential rides in the username.
                Some(media) => {
                    // A sealed username is opened in the XC handler: under the limit too.
                    let mut req = req;
                    let attempt = self.guess_attempt(ctx.client_ip);
                    req.extensions_mut().insert(attempt);
                    // Only a MediaFlow token (which carries the password) stands for it here: a
                    // sealed token is scoped to other paths (a playlist link's token opens
                    // `/playlist/playlist`, which the short form `/{user}/{pass}/{id}` also parses).
                    // A network past its wrong passwords gets the limit's 429 for the refusal
                    // the XC handler makes of the uncompared password.
                    let limited = std::sync::Mutex::new(None);
                    let password_ok = |offered: Option<&str>| {
                        super::gate::token_proves_password(ctx.token.as_ref())
                            || self
                                .password_ok(ctx.client_ip, offered)
                                .unwrap_or_else(|e| {
                                    *limited.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                                    false
                                })
                    };
                    let result = match self.media_places(&req, &ctx, claims.as_ref()) {
                        Ok(places) => media
                            .handle_xtream(req, &ctx, &password_ok)
                            .await
                            .map(|r| crate::media::limit::hold(sandboxed(r), places)),
                        Err(e) => Err(e),
                    };
                    let limited = limited.lock().unwrap_or_else(|p| p.into_inner()).take();
                    match (result, limited) {
                        (Err(_), Some(limited)) => Err(limited),
                        (result, _) => result,
                    }
                }
                None => Err(not_found(p)),
            },
            p => Err(not_found(p)),
        };
        // A token hides its destination: its holder's errors name no upstream host.
        let mut resp = match (result, &ctx.token) {
            (Err(e), Some(_)) => e.unnamed("the upstream").into_response(),
            (result, _) => result.unwrap_or_else(ProxyError::into_response),
        };
        if self.keys.load().auth.required() && own_answer(&ctx.path) {
            keep_private(resp.headers_mut());
        }
        resp
    }
}

/// The one answer to every token failure, marked so no CORS is added to it.
fn token_refused() -> Response<Body> {
    let mut resp = token::refusal();
    resp.extensions_mut().insert(ErrorMark {
        side: crate::error::Side::Downstream,
        kind: "token",
    });
    resp
}

/// The token `req` carries, as [`App::context`] finds it (the path's, else the query's), for
/// telling one refused token from another; empty when there is none.
fn offered_token(req: &Request<Incoming>) -> String {
    let uri = req.uri();
    match split_path_token(uri.path()) {
        Some((token, _)) => token.to_string(),
        None => uri
            .query()
            .and_then(|q| Query::parse(q).get("token").map(str::to_string))
            .unwrap_or_default(),
    }
}

/// Whether `req` carries a token where [`App::context`] looks for one: a `/_token_` path prefix
/// or a `token` query parameter.
fn carries_token(req: &Request<Incoming>) -> bool {
    let uri = req.uri();
    split_path_token(uri.path()).is_some()
        // Parsed as `context` parses it (`%74oken` is `token` too).
        || uri
            .query()
            .is_some_and(|q| Query::parse(q).get("token").is_some())
}

/// Whether `req` came through a front proxy not listed in `auth.trusted_proxies`: the peer is
/// untrusted yet the request carries `X-Forwarded-For`, `Forwarded` or `X-Real-IP`. Its client
/// address is the proxy's (loopback, for one on this host), which must not pass for local.
fn forwarded_by_untrusted(auth: &Auth, peer: SocketAddr, req: &Request<Incoming>) -> bool {
    const FORWARDING: [&str; 3] = ["x-forwarded-for", "forwarded", "x-real-ip"];
    !auth.is_trusted(peer.ip()) && FORWARDING.iter().any(|h| req.headers().contains_key(*h))
}

/// The local-only refusal for a request relayed by an untrusted front proxy, telling the
/// operator how to have its clients' addresses believed.
fn untrusted_forward_refused() -> Response<Body> {
    ProxyError::downstream(
        StatusCode::FORBIDDEN,
        "auth",
        "this sluice has no password, so its pages, admin endpoints and proxy endpoints answer \
         only clients on this machine, and this request came through a front proxy not listed \
         in auth.trusted_proxies; list your front proxy there, or set auth.api_password",
    )
    .into_response()
}

/// The operator's paths: the pages (status included), `/admin/*` and `/metrics`.
fn operator(path: &str) -> bool {
    browser::is_page(path) || path.starts_with("/admin/") || path == "/metrics"
}

/// Whether a password-free server answers `path` to a client elsewhere (through a trusted front
/// proxy): `/health` and the IPTV gateway's channels, playlist and guide, which the operator
/// serves to the network by choice. Everything else (the operator's paths, and every media
/// endpoint: `/proxy/*`, `/extractor/*`, `/playlist/*`, the URL generators, Xtream Codes) fetches
/// or mints on the client's behalf, and is this machine's only.
fn open_to_any_client(path: &str) -> bool {
    if path == "/health" {
        return true;
    }
    #[cfg(feature = "iptv")]
    if Iptv::serves(path) && !operator(path) {
        return true;
    }
    false
}

/// Whether the answer on built-in `path` is this server's own, made for a client that proved the
/// password or holds a token (pages, status, metrics, playlists with a token per entry, the
/// guide): not the open health check, nor a stream or an origin's answer relayed (proxied media,
/// extractor, Xtream Codes), which keep the caching fields they came with.
fn own_answer(path: &str) -> bool {
    if path == "/health" || browser::is_player_path(path) {
        return false;
    }
    #[cfg(feature = "media")]
    if Media::serves_extractor(path) || crate::media::xtream::Xtream::serves(path) {
        return false;
    }
    true
}

/// Keeps an own answer out of shared caches: a front cache keyed on the URL alone (not on the
/// cookie or header the password came in) would otherwise hand one viewer's page, or playlist
/// of tokens, to the next client. Without a `Cache-Control`: `private, no-store`. One the
/// handler set keeps its freshness (a guide's `max-age` for the player's own cache), with
/// `public` made `private`, or `private` added.
fn keep_private(headers: &mut http::HeaderMap) {
    use http::header::{HeaderValue, CACHE_CONTROL};
    let Some(set) = headers.get(CACHE_CONTROL).and_then(|v| v.to_str().ok()) else {
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("private, no-store"));
        return;
    };
    let mut private = false;
    let mut directives: Vec<&str> = Vec::new();
    for d in set.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let name = d.split('=').next().unwrap_or(d).trim();
        if name.eq_ignore_ascii_case("public") {
            continue;
        }
        private |= name.eq_ignore_ascii_case("private") || name.eq_ignore_ascii_case("no-store");
        directives.push(d);
    }
    if !private {
        directives.insert(0, "private");
    }
    if let Ok(v) = HeaderValue::from_str(&directives.join(", ")) {
        headers.insert(CACHE_CONTROL, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(set: Option<&str>) -> String {
        let mut h = http::HeaderMap::new();
        if let Some(v) = set {
            h.insert(http::header::CACHE_CONTROL, v.parse().unwrap());
        }
        keep_private(&mut h);
        h[http::header::CACHE_CONTROL].to_str().unwrap().to_string()
    }

    #[test]
    fn own_answers_are_kept_out_of_shared_caches() {
        assert_eq!(kept(None), "private, no-store");
        assert_eq!(kept(Some("public, max-age=300")), "private, max-age=300");
        assert_eq!(kept(Some("no-cache")), "private, no-cache");
        assert_eq!(kept(Some("no-cache, no-store")), "no-cache, no-store");
        assert_eq!(kept(Some("private, max-age=5")), "private, max-age=5");
        for open in [
            "/health",
            "/proxy/stream",
            "/rtp/239.1.2.3:5000",
            "/hls/1/x.m3u8",
        ] {
            assert!(!own_answer(open), "{open}");
        }
        for own in [
            "/status",
            "/status.json",
            "/playlist.m3u",
            "/epg.xml",
            "/metrics",
            "/",
        ] {
            assert!(own_answer(own), "{own}");
        }
    }
}
