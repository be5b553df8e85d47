//! Token handling: opening a request's token (in the path or the query) into its context and
//! scope before any front end sees it, and sealing the IPTV playlist's entries.

use std::net::SocketAddr;
#[cfg(feature = "iptv")]
use std::sync::Arc;

use crate::body::Incoming;
use http::{header, Request};
use sluice_media::query::Query;
use sluice_media::token::{split_path_token, TokenClaims};

use super::App;
use crate::auth::token;
use crate::request::RequestContext;

impl App {
    /// Works out the client IP, the routing path and the effective query. A token (in the path as
    /// `/_token_<T>/...` or as `?token=`) is opened and its scope enforced here, before any front
    /// end sees the request; every token failure gets the same [`token::refusal`]. A MediaFlow
    /// token's claims come back beside the context, for its in-flight share
    /// ([`App::media_places`]): it is decrypted here and nowhere else. `client_ip` is the
    /// request's client as `auth.trusted_proxies` make it out (dispatch works it out once).
    pub(super) fn context(
        &self,
        req: &Request<Incoming>,
        peer: SocketAddr,
        client_ip: std::net::IpAddr,
        secure: bool,
    ) -> Result<(RequestContext, Option<TokenClaims>), token::TokenRefusal> {
        let raw_path = req.uri().path();
        let mut query = Query::parse(req.uri().query().unwrap_or(""));
        let (token, path) = match split_path_token(raw_path) {
            Some((token, rest)) => (Some(token.to_string()), rest.to_string()),
            None => (query.get("token").map(str::to_string), raw_path.to_string()),
        };
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri().authority().map(|a| a.as_str()))
            .filter(|h| h.bytes().all(|b| b.is_ascii_graphic()))
            .map(str::to_string);
        let mut scope = None;
        let mut claims = None;
        if let Some(token) = token {
            if !token::is_normal_path(&path) {
                // Scopes match the path as sent; a dot segment would walk out of one.
                return Err(token::TokenRefusal::UnnormalPath);
            }
            let opened = self
                .keys
                .tokens()
                .ok_or(token::TokenRefusal::NoKey)
                .and_then(|gate| gate.open(&token, client_ip, token::now()))
                .and_then(|opened| {
                    let q = token::scoped_query(&opened, &path, &query, self.seek_params())?;
                    Ok((opened, q))
                });
            match opened {
                Ok((opened, q)) => {
                    query = q;
                    scope = Some(opened.scope);
                    claims = opened.claims;
                }
                Err(why) => return Err(why),
            }
        }
        let ctx = RequestContext {
            peer,
            client_ip,
            query,
            path,
            host,
            secure,
            token: scope,
        };
        Ok((ctx, claims))
    }

    /// The names the IPTV gateway reads as catch-up times (`iptv.rtsp.seek_params`).
    #[cfg(feature = "iptv")]
    fn seek_params(&self) -> &[String] {
        self.iptv.seek_params()
    }

    #[cfg(not(feature = "iptv"))]
    fn seek_params(&self) -> &[String] {
        &[]
    }

    /// The request head as the IPTV front end sees it: the token prefix stripped from the path, and
    /// the prefix playlist entries need when a password is configured.
    #[cfg(feature = "iptv")]
    pub(super) fn iptv_parts(
        &self,
        req: Request<Incoming>,
        ctx: &RequestContext,
    ) -> http::request::Parts {
        let (mut parts, _) = req.into_parts();
        parts
            .extensions
            .insert(SocketAddr::new(ctx.client_ip, ctx.peer.port()));
        // A token's request runs with the query the token fixes (plus what its holder may add).
        let query = match &ctx.token {
            Some(_) => Some(ctx.query.encode()).filter(|q| !q.is_empty()),
            None => parts.uri.query().map(str::to_string),
        };
        let pq = match query {
            Some(q) => format!("{}?{q}", ctx.path),
            None => ctx.path.clone(),
        };
        if let Ok(uri) = pq.parse() {
            parts.uri = uri;
        }
        if let Some(gate) = self.keys.tokens() {
            // Each entry's token opens that channel alone (its path, its query fixed), with no
            // expiry of its own: a saved playlist keeps working, and cannot open other groups.
            // One client network gets the same entries at every fetch (a nonce derived from the
            // grant and the network, `TokenGate::mint_entry`): the same URLs, the same share.
            let parent = ctx.token.clone();
            let client = ctx.client_ip;
            let seal = move |path: &str, params: &[(String, String)]| {
                let token = gate.mint_entry(params, &[path], parent.as_ref(), client);
                format!("/_token_{token}")
            };
            parts
                .extensions
                .insert(crate::iptv::EntrySealer(Arc::new(seal)));
        }
        parts
    }
}
