//! `PURGE`: by URL (every variant), by key prefix, or by tag (`Surrogate-Key` / `Cache-Tag`), hard
//! (dropped) or soft (marked stale, revalidated on next use). Only from `purge_allow` addresses and
//! with the purge key or the API password; every refusal is the same 403. A key offered from a
//! `purge_allow` address is a password guess like any other (`auth::guesses`): a wrong one is
//! charged to the client's network, and a network past its wrong guesses is refused (429) before
//! any key it offers is compared, the right one included. From any other address no key is
//! compared nor charged (no key could purge from there).
//!
//! Request headers: `X-Purge-Key: <key>` or `Authorization: Bearer <key>`; `X-Purge-Mode: url`
//! (default), `prefix` or `tag`; `X-Purge-Tag: a b` (tag mode, at most [`MAX_TAGS`] tags separated
//! by spaces or commas); `X-Purge-Soft: 1`. Every mode stays within the route and host the
//! `PURGE` was sent to ([`key_scope`]): a tag purge too.

use std::collections::HashSet;
use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;
use http::{Response, StatusCode};

use std::time::{Duration, UNIX_EPOCH};

use super::cluster::purge_log::PurgeOrder;
use super::index::Primaries;
use super::object::ObjectMeta;
use super::{CacheKey, Inner};
use crate::body::{self, Body};

/// Tags one purge may name. Each is matched against every object under the lock, and each order
/// is kept in the cluster's purge log: a bound on both.
pub const MAX_TAGS: usize = 64;

/// What a purge removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurgeScope {
    Url,
    Prefix,
    Tags(Vec<String>),
}

fn json(status: StatusCode, text: String) -> Response<Body> {
    let mut resp = Response::new(body::full(text));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn forbidden(text: &'static str) -> Response<Body> {
    json(
        StatusCode::FORBIDDEN,
        serde_json::json!({ "error": text }).to_string(),
    )
}

/// Whether `offered` is the purge key `secret`: SHA-256 digests compared in constant time (as
/// `Auth::check` does), so neither a byte nor the key's length shows in the timing.
fn key_matches(secret: &str, offered: &str) -> bool {
    crate::auth::Auth::same_secret(secret, offered)
}

fn offered_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get("x-purge-key").and_then(|v| v.to_str().ok()) {
        return Some(v.trim());
    }
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().strip_prefix("Bearer "))
        .map(str::trim)
}

fn scope(headers: &HeaderMap) -> Result<PurgeScope, &'static str> {
    let mode = headers
        .get("x-purge-mode")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("url")
        .trim()
        .to_ascii_lowercase();
    match mode.as_str() {
        "url" => Ok(PurgeScope::Url),
        "prefix" => Ok(PurgeScope::Prefix),
        "tag" => {
            // One past the bound is enough to refuse: a long header is not split further.
            let tags: Vec<String> = headers
                .get_all("x-purge-tag")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split([' ', ',']))
                .filter(|t| !t.is_empty())
                .take(MAX_TAGS + 1)
                .map(str::to_string)
                .collect();
            if tags.is_empty() {
                Err("X-Purge-Mode: tag needs X-Purge-Tag")
            } else if tags.len() > MAX_TAGS {
                Err("X-Purge-Tag names more than 64 tags: send several purges")
            } else {
                Ok(PurgeScope::Tags(tags))
            }
        }
        _ => Err("X-Purge-Mode must be url, prefix or tag"),
    }
}

/// The part of a cache key that names the route and host (or whatever else the front end scoped
/// it by), with the `|` that ends it: what every key of that route and host starts with. A
/// reverse route's key is `<len>:<route><len>:<host>|<target>` (lengths in bytes), read by its
/// lengths so a `|` in the host cannot move the end; any other key's scope ends at its first `|`
/// (`media|...`); a key without one is its own scope.
pub fn key_scope(key: &str) -> &str {
    fn field(rest: &str) -> Option<&str> {
        let (len, rest) = rest.split_once(':')?;
        if len.is_empty() || len.len() > 10 || !len.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        rest.get(len.parse::<usize>().ok()?..)
    }
    let routed = field(key)
        .and_then(field)
        .filter(|rest| rest.starts_with('|'))
        .map(|rest| key.len() - rest.len() + 1);
    match routed.or_else(|| key.find('|').map(|i| i + 1)) {
        Some(end) => &key[..end],
        None => key,
    }
}

/// Why a purge is refused.
pub(super) enum Refusal {
    /// Not from an allowed address with the key. The text depends on the configuration alone
    /// (what to set when no purge key is), so every refused client sees the same answer.
    Forbidden(&'static str),
    Bad(&'static str),
    /// The client's network is past its wrong guesses (`auth::guesses`): no key was compared.
    Limited(crate::auth::guesses::Limited),
}

impl Refusal {
    fn into_response(self) -> Response<Body> {
        match self {
            Refusal::Forbidden(text) => forbidden(text),
            Refusal::Limited(limited) => crate::error::ProxyError::from(limited).into_response(),
            Refusal::Bad(msg) => json(StatusCode::BAD_REQUEST, format!("{{\"error\":\"{msg}\"}}")),
        }
    }
}

/// The purge key, the addresses purges come from and the API password, as the last reload left
/// them (`[cache]` sizes and tiers need a restart; these do not).
#[derive(Debug, Clone)]
pub struct PurgeSecrets {
    purge_key: String,
    purge_allow: Vec<ipnet::IpNet>,
    api_password: Option<String>,
}

impl PurgeSecrets {
    /// The 403's text: plain `forbidden` once a purge key is set; before that, what to set.
    fn refusal_text(&self) -> &'static str {
        match (self.purge_key.is_empty(), self.api_password.is_some()) {
            (false, _) => "forbidden",
            (true, false) => {
                "forbidden: PURGE is off until cache.purge_key is set; then send that key in \
                 X-Purge-Key from an address in cache.purge_allow"
            }
            (true, true) => {
                "forbidden: no cache.purge_key is set; send the API password in X-Purge-Key \
                 from an address in cache.purge_allow, or set cache.purge_key"
            }
        }
    }

    pub fn new(config: &super::CacheConfig, api_password: Option<&str>) -> PurgeSecrets {
        PurgeSecrets {
            purge_key: config.purge_key.clone(),
            purge_allow: config.purge_allow.clone(),
            api_password: api_password.filter(|p| !p.is_empty()).map(str::to_string),
        }
    }
}

impl super::Cache {
    /// Handles a `PURGE` for `key` from `peer` on every node of the cluster: here, then each
    /// peer (the answer lists each one's result; a peer that misses it pulls it from this node's
    /// purge log when it is back). Without a cluster, as [`super::Cache::purge`].
    pub async fn purge_everywhere(
        &self,
        parts: &Parts,
        key: &CacheKey,
        peer: IpAddr,
    ) -> Response<Body> {
        let Some(cluster) = self.inner.cluster.clone() else {
            return self.inner.handle_purge(parts, key, peer);
        };
        let order = match self.inner.purge_order(parts, key, peer) {
            Ok(o) => o,
            Err(refusal) => return refusal.into_response(),
        };
        let n = self.inner.apply_order(&order, false);
        let mut peers = serde_json::Map::new();
        for (addr, result) in cluster.fan_out(&order).await {
            let v = match result {
                Ok(n) => serde_json::json!({ "purged": n }),
                Err(e) => serde_json::json!({ "error": e }),
            };
            peers.insert(addr, v);
        }
        let body = serde_json::json!({
            "purged": n,
            "soft": order.soft,
            "node": cluster.self_addr(),
            "peers": peers,
        });
        json(StatusCode::OK, body.to_string())
    }

    /// Installs a reloaded purge key, `purge_allow` and API password: the old ones stop working.
    pub fn set_purge(&self, secrets: PurgeSecrets) {
        self.inner.purge.store(std::sync::Arc::new(secrets));
    }

    /// Charges wrong purge keys to `guesses` (the server's limiter, where the API password's
    /// other checks charge theirs) instead of the cache's own.
    pub fn share_guesses(&self, guesses: std::sync::Arc<crate::auth::guesses::Guesses>) {
        self.inner.guesses.store(guesses);
    }
}

impl Inner {
    /// Whether the purge is allowed; `Err` when the client's network is past its wrong guesses
    /// (its key not compared). From a `purge_allow` address a wrong key offered is charged
    /// there: the API password is accepted as a purge key, and a 200 tells a right one from a
    /// wrong one. From any other address every answer is the same 403 whatever the key, so it
    /// is neither compared nor charged: charged, 20 wrong `PURGE`s a minute from any visitor
    /// (all of them, behind a balancer without `trusted_proxies`) locked that address out of
    /// the API password everywhere.
    fn purge_allowed(
        &self,
        headers: &HeaderMap,
        peer: IpAddr,
    ) -> Result<bool, crate::auth::guesses::Limited> {
        let secrets = self.purge.load();
        // An unknown client (an unreadable forwarding chain) is in no allow-list.
        let from_allowed =
            !peer.is_unspecified() && secrets.purge_allow.iter().any(|n| n.contains(&peer));
        let keys: Vec<&str> = [
            Some(secrets.purge_key.as_str()),
            secrets.api_password.as_deref(),
        ]
        .into_iter()
        .flatten()
        .filter(|s| !s.is_empty())
        .collect();
        if keys.is_empty() || !from_allowed {
            // Purging is off, or no key could purge from here: no key is compared, so none is a
            // guess.
            return Ok(false);
        }
        let offered = offered_key(headers).filter(|k| !k.is_empty());
        self.guesses.load().attempt(peer, offered, |offered| {
            let offered = offered.unwrap_or("");
            let mut ok = false;
            for secret in &keys {
                ok |= key_matches(secret, offered);
            }
            ok
        })
    }

    pub(super) fn handle_purge(
        &self,
        parts: &Parts,
        key: &CacheKey,
        peer: IpAddr,
    ) -> Response<Body> {
        match self
            .purge_order(parts, key, peer)
            .map_err(Refusal::into_response)
        {
            Ok(order) => {
                let n = self.apply_order(&order, false);
                json(
                    StatusCode::OK,
                    format!("{{\"purged\":{n},\"soft\":{}}}", order.soft),
                )
            }
            Err(resp) => resp,
        }
    }

    /// The purge a client asks for, once it is allowed; the refusal otherwise.
    pub(super) fn purge_order(
        &self,
        parts: &Parts,
        key: &CacheKey,
        peer: IpAddr,
    ) -> Result<PurgeOrder, Refusal> {
        match self.purge_allowed(&parts.headers, peer) {
            Ok(true) => {}
            Ok(false) => return Err(Refusal::Forbidden(self.purge.load().refusal_text())),
            Err(limited) => return Err(Refusal::Limited(limited)),
        }
        let scope = scope(&parts.headers).map_err(Refusal::Bad)?;
        let soft = parts
            .headers
            .get("x-purge-soft")
            .is_some_and(|v| matches!(v.as_bytes(), b"1" | b"true" | b"yes"));
        let (mode, tags) = match scope {
            PurgeScope::Url => ("url", vec![]),
            PurgeScope::Prefix => ("prefix", vec![]),
            PurgeScope::Tags(tags) => ("tag", tags),
        };
        Ok(PurgeOrder {
            mode: mode.into(),
            key: key.0.clone(),
            scope: key_scope(&key.0).to_string(),
            tags,
            soft,
            at_ms: super::cluster::purge_log::now_ms(),
        })
    }

    /// Applies a purge; returns how many objects it touched. A replayed one (from a peer's log,
    /// missed while this node was away) spares objects fetched after it was made.
    pub(crate) fn apply_order(&self, order: &PurgeOrder, replay: bool) -> usize {
        // Clocks of two nodes differ a little: a replay errs on the side of purging.
        const SKEW: Duration = Duration::from_secs(2);
        let made = UNIX_EPOCH + Duration::from_millis(order.at_ms) + SKEW;
        let older = |_: &str, m: &ObjectMeta| !replay || m.clock.response_time < made;
        match order.mode.as_str() {
            "url" => self.purge_in(Primaries::Key(&order.key), older, order.soft),
            "prefix" => self.purge_in(Primaries::Prefix(&order.key), older, order.soft),
            "tag" => {
                // An order from a node that predates scopes has none: it is scoped as its key
                // says (such nodes always sent the key the PURGE was sent to). Never wider.
                let scope = match order.scope.as_str() {
                    "" => key_scope(&order.key),
                    s => s,
                };
                if scope.is_empty() {
                    return 0;
                }
                let wanted: HashSet<&str> = order.tags.iter().map(String::as_str).collect();
                self.purge_in(
                    Primaries::Prefix(scope),
                    |k, m| m.tags.iter().any(|t| wanted.contains(t.as_str())) && older(k, m),
                    order.soft,
                )
            }
            _ => 0,
        }
    }

    /// Purges the objects of the keys `which` names that `matches`; returns how many.
    pub(super) fn purge_in(
        &self,
        which: Primaries<'_>,
        matches: impl Fn(&str, &ObjectMeta) -> bool,
        soft: bool,
    ) -> usize {
        let affected = self.index.purge(which, matches, soft);
        for meta in &affected {
            if soft {
                if let Some(disk) = &self.disk {
                    disk.write_meta(meta.clone());
                }
            } else {
                self.drop_objects(std::slice::from_ref(meta));
            }
        }
        affected.len()
    }
}

/// The keys a successful unsafe request invalidates (RFC 9111 §4.4): its target, and the
/// `Location` / `Content-Location` of the answer when they name the same host. `host` is the
/// request's authority (the `Host` header).
///
/// A reference names the same host when its host is `host`'s and its port the one `host` names
/// (none: its own scheme's default port), so it holds for a route on any scheme. The base used
/// to be `http://{host}`, whose default port (80) a route on https compared with its own
/// absolute references' (443): `https://shop.example/items/7` was taken for another origin and
/// left fresh. The scheme is not part of the key either (the route's scope and the path are),
/// so the reference's key is the request's whatever scheme it names.
pub fn invalidation_keys(
    scope: &str,
    host: &str,
    target: &http::Uri,
    status: StatusCode,
    resp_headers: &HeaderMap,
) -> Vec<CacheKey> {
    if !(status.is_success() || status.is_redirection()) {
        return Vec::new();
    }
    let mut keys = vec![CacheKey::new(scope, target)];
    let base = format!(
        "http://{host}{}",
        target.path_and_query().map(|p| p.as_str()).unwrap_or("/")
    );
    // The base only resolves relative references (their scheme does not matter: the authority
    // is compared as `host` names it).
    let Ok(base) = url::Url::parse(&base) else {
        return keys;
    };
    let Ok(authority) = host.parse::<http::uri::Authority>() else {
        return keys;
    };
    let same_host = |u: &url::Url| {
        u.host_str()
            .is_some_and(|h| h.eq_ignore_ascii_case(authority.host()))
            && match authority.port_u16() {
                None => u.port().is_none(),
                Some(port) => u.port_or_known_default() == Some(port),
            }
    };
    for name in [header::LOCATION, header::CONTENT_LOCATION] {
        let Some(v) = resp_headers.get(&name).and_then(|v| v.to_str().ok()) else {
            continue;
        };
        let Ok(u) = base.join(v) else { continue };
        if !same_host(&u) {
            continue;
        }
        let pq = match u.query() {
            Some(q) => format!("{}?{q}", u.path()),
            None => u.path().to_string(),
        };
        if let Ok(uri) = pq.parse::<http::Uri>() {
            let key = CacheKey::new(scope, &uri);
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_key_comparison_is_by_digest() {
        let key = "purge-key-0123456789";
        assert!(key_matches(key, key));
        // Same length, one byte off; shorter; longer; empty.
        assert!(!key_matches(key, "purge-key-0123456788"));
        assert!(!key_matches(key, "purge-key"));
        assert!(!key_matches(key, "purge-key-0123456789-and-more"));
        assert!(!key_matches(key, ""));
    }

    #[test]
    fn unsafe_methods_invalidate_target_and_same_host_locations() {
        let mut h = HeaderMap::new();
        h.insert(header::LOCATION, HeaderValue::from_static("/items/7?x=1"));
        h.insert(
            header::CONTENT_LOCATION,
            HeaderValue::from_static("http://elsewhere.example/items/7"),
        );
        let target: http::Uri = "/items".parse().unwrap();
        let keys = invalidation_keys("r", "shop.example", &target, StatusCode::CREATED, &h);
        assert_eq!(
            keys,
            vec![
                CacheKey("r|/items".into()),
                CacheKey("r|/items/7?x=1".into())
            ]
        );
        assert!(
            invalidation_keys("r", "shop.example", &target, StatusCode::BAD_REQUEST, &h).is_empty()
        );
    }

    /// Finding: the base references were resolved and compared against was `http://{host}`
    /// whatever the route's scheme, so on an https route the answer's absolute `Location`
    /// (`https://shop.example/...`, port 443 against the base's 80) was taken for another host
    /// and its object stayed fresh.
    #[test]
    fn locations_of_the_same_host_invalidate_on_any_scheme() {
        let target: http::Uri = "/items".parse().unwrap();
        let keys = |host: &str, location: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::LOCATION, HeaderValue::from_static(location));
            invalidation_keys("r", host, &target, StatusCode::CREATED, &h)
        };
        let both = vec![CacheKey("r|/items".into()), CacheKey("r|/items/7".into())];
        let target_only = vec![CacheKey("r|/items".into())];
        // An https route's own absolute references, with and without the default port.
        assert_eq!(keys("shop.example", "https://shop.example/items/7"), both);
        assert_eq!(
            keys("shop.example", "https://shop.example:443/items/7"),
            both
        );
        assert_eq!(keys("Shop.Example", "https://shop.example/items/7"), both);
        // Relative and scheme-relative ones, and a plain http route's.
        assert_eq!(keys("shop.example", "/items/7"), both);
        assert_eq!(keys("shop.example", "//shop.example/items/7"), both);
        assert_eq!(keys("shop.example", "http://shop.example/items/7"), both);
        // A port the Host names.
        assert_eq!(
            keys("shop.example:8443", "https://shop.example:8443/items/7"),
            both
        );
        assert_eq!(
            keys("shop.example:443", "https://shop.example/items/7"),
            both
        );
        assert_eq!(keys("[::1]:8443", "https://[::1]:8443/items/7"), both);
        // Another host or port is another origin's.
        assert_eq!(
            keys("shop.example", "https://other.example/items/7"),
            target_only
        );
        assert_eq!(
            keys("shop.example", "https://shop.example:8443/items/7"),
            target_only
        );
        assert_eq!(
            keys("shop.example:8443", "https://shop.example/items/7"),
            target_only
        );
        assert_eq!(
            keys("shop.example:80", "https://shop.example/items/7"),
            target_only
        );
    }

    #[test]
    fn scopes_and_keys() {
        let mut h = HeaderMap::new();
        assert_eq!(scope(&h), Ok(PurgeScope::Url));
        h.insert("x-purge-mode", HeaderValue::from_static("tag"));
        assert!(scope(&h).is_err());
        h.insert("x-purge-tag", HeaderValue::from_static("a, b c"));
        assert_eq!(
            scope(&h),
            Ok(PurgeScope::Tags(vec!["a".into(), "b".into(), "c".into()]))
        );
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        assert_eq!(offered_key(&h), Some("k"));
    }

    #[test]
    fn at_most_64_tags() {
        let tags = |n: usize| {
            let mut h = HeaderMap::new();
            h.insert("x-purge-mode", HeaderValue::from_static("tag"));
            let list: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
            h.insert("x-purge-tag", list.join(" ").parse().unwrap());
            scope(&h)
        };
        assert!(matches!(tags(64), Ok(PurgeScope::Tags(t)) if t.len() == 64));
        assert_eq!(
            tags(65),
            Err("X-Purge-Tag names more than 64 tags: send several purges")
        );
        assert!(tags(20_000).is_err());
    }

    #[test]
    fn the_scope_is_the_route_and_host_part_of_the_key() {
        assert_eq!(key_scope("3:web9:a.example|/x|y"), "3:web9:a.example|");
        // A `|` in the host does not end the scope early; the lengths decide.
        assert_eq!(key_scope("3:web3:a|b|/x"), "3:web3:a|b|");
        assert_eq!(key_scope("0:0:|/"), "0:0:|");
        assert_eq!(key_scope("media|abc|http://o/seg.ts"), "media|");
        assert_eq!(key_scope("test|/p/a"), "test|");
        assert_eq!(key_scope("9:web|/x"), "9:web|");
        assert_eq!(key_scope("nobar"), "nobar");
        assert_eq!(key_scope(""), "");
        // Lengths past the key, or not digits, fall back to the first `|`.
        assert_eq!(key_scope("99:web|/x"), "99:web|");
        assert_eq!(key_scope("1:\u{e9}1:a|/x"), "1:\u{e9}1:a|");
    }
}
