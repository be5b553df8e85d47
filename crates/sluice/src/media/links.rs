//! Child URLs for rewritten manifests: back through this proxy, in the parent's auth mode, with the
//! parent's parameters carried.
//!
//! When a password is configured children are sealed path tokens (`/_token_<T>/proxy/...`) scoped
//! to the child's endpoint family, expiring after `auth.child_token_ttl_secs` or with the parent,
//! and bound to the parent's address, so the password never appears in a URL and a time- or
//! IP-bound parent cannot mint unbounded children. A reload from the same client network gets the
//! same child tokens while they have half their lifetime left, so live playlists keep stable URLs
//! (`auth::reuse`). Without a password children are plain query URLs.

use std::net::IpAddr;
use std::sync::Arc;

use sluice_media::query::Query;

use crate::auth::token::{self, TokenGate, TokenScope};
use crate::request::RequestContext;

/// Builds child URLs for one parent request.
#[derive(Debug, Clone)]
pub struct Links {
    /// `scheme://host[:port]` as the client addressed us, or empty for path-absolute URLs.
    origin: String,
    gate: Option<Arc<TokenGate>>,
    parent: Option<TokenScope>,
    /// Who asked: child tokens are reused for this client's network only (`auth::reuse`).
    client: IpAddr,
}

impl Links {
    /// Links for children of the request in `ctx`.
    pub fn new(ctx: &RequestContext, gate: Option<&Arc<TokenGate>>) -> Self {
        let origin = match &ctx.host {
            Some(host) => format!("{}://{}", if ctx.secure { "https" } else { "http" }, host),
            None => String::new(),
        };
        Links {
            origin,
            gate: gate.cloned(),
            parent: ctx.token.clone(),
            client: ctx.client_ip,
        }
    }

    /// The URL of `endpoint` (a path such as `/proxy/hls/segment.ts`) with `params`.
    pub fn url(&self, endpoint: &str, params: &[(String, String)]) -> String {
        match &self.gate {
            Some(gate) => {
                let family = family(endpoint);
                let parent = self.parent.as_ref();
                let token = gate.mint_child(params, &[family], parent, self.client, token::now());
                format!("{}/_token_{token}{endpoint}", self.origin)
            }
            None => format!(
                "{}{endpoint}?{}",
                self.origin,
                Query::from_pairs(params.to_vec()).encode()
            ),
        }
    }
}

/// The endpoint family a child token opens: `/proxy/hls/segment.ts` → `/proxy/hls/`.
fn family(endpoint: &str) -> &str {
    let after = endpoint
        .strip_prefix("/proxy/")
        .map_or(0, |_| "/proxy/".len());
    match endpoint[after..].find('/') {
        Some(end) => &endpoint[..after + end + 1],
        None => endpoint,
    }
}

/// The parent's parameters that children inherit: everything except the destination, credentials,
/// LL-HLS delivery directives and the names `drop` rejects.
pub fn carried(query: &Query, drop: impl Fn(&str) -> bool) -> Vec<(String, String)> {
    query
        .pairs()
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "d" | "api_password" | "token" | "exp" | "ip"))
        // LL-HLS delivery directives name one reload of one playlist, never a child's.
        .filter(|(k, _)| !k.starts_with("_HLS_"))
        .filter(|(k, _)| !drop(k))
        .cloned()
        .collect()
}

/// Upstream headers bound to the origin of the parent's `d`: a viewer's credentials, and `Host`
/// (the virtual host asked for there). Like a redirect to another origin (`upstream::relay`), a
/// child URL on another origin never gets them: a segment on another CDN is asked for under its
/// own name, not the first origin's.
fn origin_bound() -> impl Iterator<Item = http::HeaderName> {
    crate::upstream::CREDENTIAL_FIELDS
        .into_iter()
        .chain([http::header::HOST])
}

/// Whether the query parameter `key` sets an origin-bound header upstream (`h_authorization`,
/// `h_Cookie`, `h_ proxy-authorization`, `h_host`...: the header name as `ProxyParams` reads it,
/// trimmed and lowercased; the prefix in any case).
pub fn is_credential_param(key: &str) -> bool {
    let Some(prefix) = key.get(..2) else {
        return false;
    };
    prefix.eq_ignore_ascii_case("h_")
        && origin_bound().any(|c| key[2..].trim().eq_ignore_ascii_case(c.as_str()))
}

/// `carried` for a child on another origin than the parent's `d`: without the credentials and
/// `h_host`.
pub fn without_credentials(carried: &[(String, String)]) -> Vec<(String, String)> {
    carried
        .iter()
        .filter(|(k, _)| !is_credential_param(k))
        .cloned()
        .collect()
}

/// Takes the credential headers and `Host` out of a set of upstream headers (for a fetch on
/// another origin than the one they were given for).
pub fn strip_credentials(headers: &mut http::HeaderMap) -> bool {
    let mut any = false;
    for name in origin_bound() {
        any |= headers.remove(name).is_some();
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::AuthConfig;

    fn ctx(token: Option<TokenScope>) -> RequestContext {
        RequestContext {
            peer: "127.0.0.1:5000".parse().unwrap(),
            client_ip: "127.0.0.1".parse().unwrap(),
            query: Query::parse("d=http%3A%2F%2Fo%2Fm.m3u8&h_referer=r&api_password=pw&r_x=1"),
            path: "/proxy/hls/manifest.m3u8".into(),
            host: Some("proxy.example:8888".into()),
            secure: false,
            token,
        }
    }

    #[test]
    fn plain_links_without_password() {
        let c = ctx(None);
        let carried = carried(&c.query, |k| k.starts_with("r_"));
        assert_eq!(carried, vec![("h_referer".to_string(), "r".to_string())]);
        let mut params = vec![("d".to_string(), "http://o/s 1.ts".to_string())];
        params.extend(carried);
        assert_eq!(
            Links::new(&c, None).url("/proxy/hls/segment.ts", &params),
            "http://proxy.example:8888/proxy/hls/segment.ts?d=http%3A%2F%2Fo%2Fs+1.ts&h_referer=r"
        );
    }

    #[test]
    fn credential_params_in_every_spelling() {
        for key in [
            "h_authorization",
            "h_Authorization",
            "H_AUTHORIZATION",
            "h_ cookie ",
            "h_COOKIE",
            "h_proxy-authorization",
            "h_host",
            "h_Host ",
        ] {
            assert!(is_credential_param(key), "{key}");
        }
        for key in [
            "h_referer",
            "h_x-authorization",
            "authorization",
            "h_",
            "h",
            "d",
            "r_cookie",
        ] {
            assert!(!is_credential_param(key), "{key}");
        }
        let carried = vec![
            ("h_referer".to_string(), "r".to_string()),
            ("h_Cookie".to_string(), "c".to_string()),
            ("h_HOST".to_string(), "first-origin.example".to_string()),
            ("rp_x".to_string(), "1".to_string()),
        ];
        let names: Vec<_> = without_credentials(&carried)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(names, ["h_referer", "rp_x"]);
        let mut headers = http::HeaderMap::new();
        headers.insert("authorization", "Bearer x".parse().unwrap());
        headers.insert("cookie", "a=b".parse().unwrap());
        headers.insert("referer", "r".parse().unwrap());
        headers.insert("host", "first-origin.example".parse().unwrap());
        assert!(strip_credentials(&mut headers));
        assert_eq!(headers.len(), 1);
        assert!(!strip_credentials(&mut headers));
    }

    #[test]
    fn token_links_keep_claims_and_hide_password() {
        // Long enough that a random base64url token cannot contain it by chance.
        let password = "hunter2-server-secret";
        let gate = Arc::new(
            TokenGate::new(&AuthConfig {
                api_password: password.into(),
                ..AuthConfig::default()
            })
            .unwrap(),
        );
        let c = ctx(Some(TokenScope {
            exp: Some(4_000_000_000),
            ip: Some("1.2.3.4".into()),
            paths: None,
        }));
        let params = vec![("d".to_string(), "http://o/s.ts".to_string())];
        let url = Links::new(&c, Some(&gate)).url("/proxy/hls/segment.ts", &params);
        assert!(!url.contains(password));
        let rest = url
            .strip_prefix("http://proxy.example:8888/_token_")
            .unwrap();
        let (token, endpoint) = rest.split_once('/').unwrap();
        assert_eq!(endpoint, "proxy/hls/segment.ts");
        let opened = gate
            .open(token, "1.2.3.4".parse().unwrap(), token::now())
            .unwrap();
        // The child TTL is sooner than the parent's far-away expiry.
        let exp = opened.scope.exp.unwrap();
        assert!(exp < 4_000_000_000 && exp > token::now());
        assert_eq!(opened.scope.ip.as_deref(), Some("1.2.3.4"));
        assert_eq!(opened.scope.paths, Some(vec!["/proxy/hls/".to_string()]));
        assert_eq!(opened.params, params);
        assert_eq!(family("/proxy/mpd/playlist.m3u8"), "/proxy/mpd/");
        assert_eq!(family("/proxy/stream"), "/proxy/stream");
    }
}
