//! RFC 9111 storage and freshness for a shared cache: may a response be stored, for how long, how
//! old is it, and may a stored one answer a given request. No I/O: clocks come in as arguments.

use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, HeaderName, AGE, AUTHORIZATION, DATE, EXPIRES, LAST_MODIFIED, VARY};
use http::{Method, StatusCode};

use crate::cache_control::{
    parse_cache_control, parse_delta, parse_effective, CacheControl, DELTA_SECONDS_CAP,
};

/// How a client's own request directives (`no-cache`, `max-age`, `min-fresh`, `max-stale`) are used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RequestDirectives {
    /// As RFC 9111 §5.2.1 says for a shared cache: honoured.
    #[default]
    Honor,
    /// Ignored, as many CDNs do so that a reload button cannot empty the cache.
    Ignore,
}

/// Knobs of the freshness policy (one per route).
#[derive(Debug, Clone, PartialEq)]
pub struct FreshnessPolicy {
    /// Heuristic freshness as a fraction of `Date - Last-Modified` (RFC 9111 §4.2.2 suggests 10 %).
    pub heuristic_fraction: f64,
    /// Upper bound of a heuristic lifetime.
    pub heuristic_max: Duration,
    /// Lower bound of a heuristic lifetime (0: none). A front end that knows its objects (media
    /// segments that never change once listed) sets it so a just-written file is not stale at once.
    pub heuristic_min: Duration,
    /// Lifetime given to a storable response with no explicit expiration and no `Last-Modified`
    /// (0: RFC behaviour, such a response is stored only to be revalidated).
    pub default_ttl: Duration,
    /// Stale window used as both `stale-while-revalidate` and `stale-if-error` when the origin sends
    /// neither (never with `must-revalidate`, `proxy-revalidate` or `no-cache`).
    pub grace: Duration,
    pub request_directives: RequestDirectives,
    /// Whether a request carrying `Cookie` may fill the cache. Off, such a request is answered
    /// from a stored response when there is one, and otherwise passed to the origin and its
    /// answer never stored (Varnish's default): a page personalised by a cookie is not served to
    /// the next user (web cache deception).
    pub store_cookie_requests: bool,
    /// For a copy of another cache's object (a cluster node keeping what the owner sent): fresh
    /// for at most this long after it arrives, on top of the `Age` it arrives with, and never
    /// longer than its own lifetime. `None`: no cap.
    pub copy_ttl_secs: Option<std::num::NonZeroU32>,
    /// Whether an answer with `Set-Cookie` that the origin marks shared (`public`,
    /// `s-maxage`) is stored all the same (its cookie not kept). Off (reverse routes), every
    /// answer with `Set-Cookie` is passed, so the client whose request fetched it keeps its
    /// cookie. On for the media front end, which never hands an origin's `Set-Cookie` to its
    /// clients: refusing there stored nothing for them (a `public` segment behind a load
    /// balancer's cookie, AWSALB, was fetched again by every viewer, without prefetch).
    pub store_shared_set_cookie: bool,
}

impl Default for FreshnessPolicy {
    fn default() -> Self {
        FreshnessPolicy {
            heuristic_fraction: 0.1,
            heuristic_max: Duration::from_secs(24 * 3600),
            heuristic_min: Duration::ZERO,
            default_ttl: Duration::ZERO,
            grace: Duration::ZERO,
            request_directives: RequestDirectives::Honor,
            store_cookie_requests: true,
            copy_ttl_secs: None,
            store_shared_set_cookie: false,
        }
    }
}

/// Why a response is not stored; also the `Cache-Status` detail and a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotStorable {
    #[error("method")]
    Method,
    #[error("status")]
    Status,
    #[error("no-store")]
    NoStore,
    #[error("private")]
    Private,
    #[error("authorization")]
    Authorization,
    #[error("vary-star")]
    VaryStar,
    #[error("set-cookie")]
    SetCookie,
    #[error("no-lifetime")]
    NoLifetime,
    #[error("cookie")]
    Cookie,
}

/// Whether a request may fill the cache (its answer be stored) under `policy`, before any
/// response is seen: a request with `Cookie` may not unless the policy says so.
pub fn request_may_fill(
    req_headers: &HeaderMap,
    policy: &FreshnessPolicy,
) -> Result<(), NotStorable> {
    if !policy.store_cookie_requests && req_headers.contains_key(http::header::COOKIE) {
        return Err(NotStorable::Cookie);
    }
    Ok(())
}

/// What a storable response may do once stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freshness {
    /// Freshness lifetime in seconds (§4.2.1).
    pub lifetime: u64,
    /// Seconds past the lifetime it may be served while one background refresh runs.
    pub stale_while_revalidate: u64,
    /// Seconds past the lifetime it may be served when the origin fails.
    pub stale_if_error: u64,
    /// `must-revalidate` / `proxy-revalidate` / `s-maxage`: never served stale otherwise.
    pub must_revalidate: bool,
    /// `no-cache`: stored, but every use is validated first.
    pub no_cache: bool,
    /// Whether `CDN-Cache-Control` set these values.
    pub targeted: bool,
}

impl Freshness {
    /// This freshness for a stored response marked invalid (RFC 9111 §4.4, after a successful
    /// unsafe method; or a soft purge): stale, and validated with the origin before any reuse.
    /// Neither `stale-while-revalidate` nor a request's `max-stale` may serve it (they would hand
    /// the next reader the bytes the unsafe request just changed); `stale-if-error` stays, for
    /// an origin that fails that validation.
    pub fn invalidated(self) -> Freshness {
        Freshness {
            lifetime: 0,
            stale_while_revalidate: 0,
            // Read by `decide_use` for `max-stale` only: an invalidated response is never
            // served stale on the client's word.
            must_revalidate: true,
            ..self
        }
    }
}

/// Status codes a cache may store with heuristic freshness (RFC 9110 §15.1).
pub fn heuristically_cacheable(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 206 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// Status codes this cache understands well enough to store (with explicit freshness for the ones
/// outside [`heuristically_cacheable`]).
fn understood(status: StatusCode) -> bool {
    heuristically_cacheable(status) || matches!(status.as_u16(), 302 | 303 | 307 | 451)
}

/// Decides whether a response to `method` may be stored (RFC 9111 §3, §3.5), and its freshness.
/// `response_time` is when the response head arrived; an answer with `Set-Cookie` is refused
/// (passed to the client that asked, cookie and all), so one user's cookie never reaches
/// another; with [`FreshnessPolicy::store_shared_set_cookie`], only unless it says `public` or
/// `s-maxage`.
pub fn storability(
    method: &Method,
    req_headers: &HeaderMap,
    status: StatusCode,
    resp_headers: &HeaderMap,
    response_time: SystemTime,
    policy: &FreshnessPolicy,
) -> Result<Freshness, NotStorable> {
    if method != Method::GET && method != Method::HEAD {
        return Err(NotStorable::Method);
    }
    if !understood(status) {
        return Err(NotStorable::Status);
    }
    let (cc, targeted) = parse_effective(resp_headers);
    let req_cc = parse_cache_control(req_headers);
    if cc.no_store || (req_cc.no_store && policy.request_directives == RequestDirectives::Honor) {
        return Err(NotStorable::NoStore);
    }
    if cc.private {
        return Err(NotStorable::Private);
    }
    if req_headers.contains_key(AUTHORIZATION)
        && !(cc.must_revalidate || cc.public || cc.s_maxage.is_some())
    {
        return Err(NotStorable::Authorization);
    }
    if vary_names(resp_headers).is_err() {
        return Err(NotStorable::VaryStar);
    }
    let shared = cc.public || cc.s_maxage.is_some();
    if resp_headers.contains_key(http::header::SET_COOKIE)
        && !(policy.store_shared_set_cookie && shared)
    {
        // Whatever the directives (nginx's and Varnish's default): a stored answer is served
        // from its stored fields, which never hold a cookie, so the very client whose request
        // fetched it lost its `Set-Cookie`; and a cookie set on a `public` page is most often a
        // session one no second user may get.
        return Err(NotStorable::SetCookie);
    }
    let explicit = explicit_lifetime(&cc, targeted, resp_headers, response_time);
    let lifetime = match explicit {
        Some(l) => l,
        None if heuristically_cacheable(status) || cc.public => {
            heuristic_lifetime(resp_headers, response_time, policy)
                .unwrap_or(policy.default_ttl.as_secs())
        }
        None => return Err(NotStorable::Status),
    };
    let lifetime = match policy.copy_ttl_secs {
        Some(cap) => {
            let age = age_value(resp_headers);
            lifetime.min(age.saturating_add(u64::from(cap.get())))
        }
        None => lifetime,
    };
    let must_revalidate = cc.must_revalidate || cc.proxy_revalidate || cc.s_maxage.is_some();
    let strict = must_revalidate || cc.no_cache;
    let grace = if strict { 0 } else { policy.grace.as_secs() };
    let fresh = Freshness {
        lifetime,
        stale_while_revalidate: if strict {
            0
        } else {
            cc.stale_while_revalidate.unwrap_or(grace)
        },
        stale_if_error: if must_revalidate {
            0
        } else {
            cc.stale_if_error.unwrap_or(grace)
        },
        must_revalidate,
        no_cache: cc.no_cache,
        targeted,
    };
    let has_validator =
        resp_headers.contains_key(http::header::ETAG) || resp_headers.contains_key(LAST_MODIFIED);
    if fresh.lifetime == 0
        && !has_validator
        && fresh.stale_while_revalidate == 0
        && fresh.stale_if_error == 0
    {
        return Err(NotStorable::NoLifetime);
    }
    Ok(fresh)
}

/// `s-maxage`, then `max-age`, then `Expires - Date` (§4.2.1); `None` when none is given.
fn explicit_lifetime(
    cc: &CacheControl,
    targeted: bool,
    headers: &HeaderMap,
    response_time: SystemTime,
) -> Option<u64> {
    if let Some(s) = cc.s_maxage {
        return Some(s);
    }
    if let Some(m) = cc.max_age {
        return Some(m);
    }
    if targeted {
        // RFC 9213: with the targeted field, Expires is not consulted.
        return None;
    }
    let expires = headers.get(EXPIRES)?;
    // An invalid Expires (e.g. "0") means already expired (§5.3).
    let Some(expires) = http_date(expires) else {
        return Some(0);
    };
    let date = header_date(headers, DATE).unwrap_or(response_time);
    Some(secs_between(date, expires).min(DELTA_SECONDS_CAP))
}

fn heuristic_lifetime(
    headers: &HeaderMap,
    response_time: SystemTime,
    policy: &FreshnessPolicy,
) -> Option<u64> {
    let modified = header_date(headers, LAST_MODIFIED)?;
    let date = header_date(headers, DATE).unwrap_or(response_time);
    let span = secs_between(modified, date) as f64 * policy.heuristic_fraction;
    let max = policy.heuristic_max.as_secs();
    Some((span as u64).max(policy.heuristic_min.as_secs()).min(max))
}

/// The `Age` a response arrived with, in seconds: a value too large for the cache saturates at
/// [`DELTA_SECONDS_CAP`] (RFC 9111 §1.2.2: a huge age is very old, not none); absent or not
/// delta-seconds, 0.
fn age_value(headers: &HeaderMap) -> u64 {
    headers
        .get(AGE)
        .and_then(|v| parse_delta(v.to_str().ok()))
        .unwrap_or(0)
}

/// The inputs of the age calculation (§4.2.3), captured when a response arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgeClock {
    /// `corrected_initial_age` in seconds.
    pub initial_age: u64,
    /// When the response head arrived.
    pub response_time: SystemTime,
}

impl AgeClock {
    /// Computes the corrected initial age of a response requested at `request_time` and received at
    /// `response_time`.
    pub fn new(headers: &HeaderMap, request_time: SystemTime, response_time: SystemTime) -> Self {
        let age_value = age_value(headers);
        let apparent_age = header_date(headers, DATE)
            .map(|d| secs_between(d, response_time))
            .unwrap_or(0);
        let response_delay = secs_between(request_time, response_time);
        let corrected_age_value = age_value + response_delay;
        AgeClock {
            initial_age: apparent_age.max(corrected_age_value),
            response_time,
        }
    }

    /// `current_age` at `now`: the value sent in `Age`.
    pub fn current_age(&self, now: SystemTime) -> u64 {
        // Saturating: an age read back from storage is not trusted to be small.
        self.initial_age
            .saturating_add(secs_between(self.response_time, now))
    }
}

/// What a stored response may do for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Serve it as it is.
    Fresh,
    /// Serve it stale and start one background revalidation.
    StaleWhileRevalidate,
    /// Validate with the origin first; serving it stale is allowed only if the origin fails
    /// (`stale_if_error`).
    Revalidate { stale_if_error: bool },
}

/// Decides how a stored response of `current_age` seconds may answer a request with directives
/// `req_cc` (§4.2, §5.2.1, RFC 5861).
pub fn decide_use(
    fresh: &Freshness,
    current_age: u64,
    req_cc: &CacheControl,
    policy: &FreshnessPolicy,
) -> Use {
    let honor = policy.request_directives == RequestDirectives::Honor;
    let staleness = current_age.saturating_sub(fresh.lifetime);
    let is_fresh = current_age < fresh.lifetime;
    let within_error = staleness < fresh.stale_if_error;
    if fresh.no_cache || (honor && req_cc.no_cache) {
        return Use::Revalidate {
            stale_if_error: !fresh.no_cache && within_error,
        };
    }
    if honor {
        if let Some(max_age) = req_cc.max_age {
            if current_age > max_age {
                return Use::Revalidate {
                    stale_if_error: within_error,
                };
            }
        }
        if let Some(min_fresh) = req_cc.min_fresh {
            if current_age + min_fresh >= fresh.lifetime {
                return Use::Revalidate {
                    stale_if_error: within_error,
                };
            }
        }
    }
    if is_fresh {
        return Use::Fresh;
    }
    if !fresh.must_revalidate && honor {
        match req_cc.max_stale {
            Some(None) => return Use::Fresh,
            Some(Some(s)) if staleness <= s => return Use::Fresh,
            _ => {}
        }
    }
    if staleness < fresh.stale_while_revalidate {
        return Use::StaleWhileRevalidate;
    }
    Use::Revalidate {
        stale_if_error: within_error,
    }
}

/// `Vary: *`, or a `Vary` this cache cannot read (never served from cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Vary: *")]
pub struct VaryStar;

/// The request header names a response varies on, lowercase, sorted, deduplicated. A line with a
/// byte past ASCII or an item that is not a field name counts as `*`: skipping it would key the
/// object on fewer fields than the origin named, and one user's variant (`Vary: Cookie, X-\xe9`)
/// would answer everyone. Empty list items are allowed (RFC 9110 §5.6.1).
pub fn vary_names(headers: &HeaderMap) -> Result<Vec<HeaderName>, VaryStar> {
    let mut names = Vec::new();
    for value in headers.get_all(VARY) {
        let text = value.to_str().map_err(|_| VaryStar)?;
        for item in text.split(',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            if item == "*" {
                return Err(VaryStar);
            }
            names.push(HeaderName::from_bytes(item.as_bytes()).map_err(|_| VaryStar)?);
        }
    }
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    names.dedup();
    Ok(names)
}

/// The secondary key of a request for a response varying on `names` (§4.1). Only fields
/// defined as comma lists whose items' spacing means nothing ([`LIST_FIELDS`]) are normalised:
/// their lines joined by `,`, whitespace around items removed, so equivalent requests match. Any
/// other is keyed on its bytes as they came, line by line: `User-Agent`'s `(KHTML,like Gecko)` and
/// `(KHTML, like Gecko)` are two variants (an origin may tell them apart), and so are two values
/// that differ only in bytes that are not UTF-8.
pub fn variant_key(names: &[HeaderName], req_headers: &HeaderMap) -> String {
    let mut key = String::new();
    for name in names {
        key.push_str(name.as_str());
        key.push(':');
        if LIST_FIELDS.contains(&name.as_str()) {
            let (mut first, start) = (true, key.len());
            for value in req_headers.get_all(name) {
                for item in value.as_bytes().split(|&b| b == b',') {
                    if !first {
                        key.push(',');
                    }
                    first = false;
                    push_escaped(&mut key, item.trim_ascii());
                }
            }
            // A field sent empty is not a field not sent: `Accept-Encoding:` asks for identity
            // only, none at all takes any coding (RFC 9110 §12.5.3), and both wrote nothing here,
            // so a gzip variant went to a client that asked for identity. The empty one gets a
            // `\r` (which no escaped item holds); the absent one's key is as it was (objects
            // stored before still match).
            if !first && key.len() == start {
                key.push('\r');
            }
        } else {
            // Each line ends with `\r`, which no field value holds: lines cannot run into each
            // other, and an empty line is not an absent field.
            for value in req_headers.get_all(name) {
                push_escaped(&mut key, value.as_bytes().trim_ascii());
                key.push('\r');
            }
        }
        key.push('\n');
    }
    key
}

/// The request fields [`variant_key`] normalises: the content negotiation fields, each defined as
/// a comma list (RFC 9110 §12.5), where `gzip, br` and `gzip,br`, or one line per item, say the
/// same. No other field is assumed to be one.
const LIST_FIELDS: [&str; 4] = [
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
];

/// Appends `bytes` to a key: visible ASCII and spaces as they are, `%` and any other byte as
/// `%XX`, so different bytes never make the same text (a lossy UTF-8 reading made every invalid
/// byte U+FFFD) and the text never holds the `\r` and `\n` the key's layout uses.
fn push_escaped(key: &mut String, bytes: &[u8]) {
    for &b in bytes {
        if (b' '..=b'~').contains(&b) && b != b'%' {
            key.push(char::from(b));
        } else {
            key.push('%');
            key.push(char::from(HEX[usize::from(b >> 4)]));
            key.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Parses an HTTP-date header.
pub fn header_date(headers: &HeaderMap, name: HeaderName) -> Option<SystemTime> {
    http_date(headers.get(name)?)
}

fn http_date(value: &http::HeaderValue) -> Option<SystemTime> {
    httpdate::parse_http_date(value.to_str().ok()?.trim()).ok()
}

/// Whole seconds from `a` to `b`, 0 when `b` is earlier.
fn secs_between(a: SystemTime, b: SystemTime) -> u64 {
    b.duration_since(a).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests;
