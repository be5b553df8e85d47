//! `Cache-Control` and `CDN-Cache-Control` directive parsing (RFC 9111 §5.2, RFC 9213). No I/O.
//!
//! Parsing never fails: unknown directives are ignored, and a directive whose delta-seconds value
//! is missing, malformed or given twice with different values is read as `0` (RFC 9111 §4.2.1 allows
//! "consider the response stale"; a shared cache should err that way). Values beyond 2^31 are capped
//! to 2^31 as §1.2.2 asks.

use http::header::{HeaderMap, HeaderName, CACHE_CONTROL};

/// The largest delta-seconds value kept (RFC 9111 §1.2.2).
pub const DELTA_SECONDS_CAP: u64 = 1 << 31;

/// `CDN-Cache-Control` (RFC 9213): the field aimed at CDNs and other shared caches.
pub static CDN_CACHE_CONTROL: HeaderName = HeaderName::from_static("cdn-cache-control");

/// The directives of one cache-control field (request or response side).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheControl {
    pub max_age: Option<u64>,
    pub s_maxage: Option<u64>,
    pub no_store: bool,
    /// `no-cache`; a qualified form (`no-cache="set-cookie"`) counts as unqualified (§5.2.2.4 allows
    /// a cache to treat it so, and it is the safe reading).
    pub no_cache: bool,
    /// `private`; qualified forms count as unqualified for a shared cache.
    pub private: bool,
    pub public: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    pub must_understand: bool,
    pub no_transform: bool,
    pub immutable: bool,
    /// RFC 5861.
    pub stale_while_revalidate: Option<u64>,
    /// RFC 5861.
    pub stale_if_error: Option<u64>,
    /// Request: `max-stale` with no value means any staleness (`Some(None)`).
    pub max_stale: Option<Option<u64>>,
    pub min_fresh: Option<u64>,
    pub only_if_cached: bool,
}

impl CacheControl {
    /// Whether any directive was seen at all.
    pub fn is_empty(&self) -> bool {
        *self == CacheControl::default()
    }
}

/// Parses every `Cache-Control` field line of `headers` as one list.
pub fn parse_cache_control(headers: &HeaderMap) -> CacheControl {
    parse_field(headers, &CACHE_CONTROL)
}

/// The directives that govern a shared cache: `CDN-Cache-Control` when the response carries it
/// (RFC 9213 §2.1: then `Cache-Control` and `Expires` are ignored), else `Cache-Control`. The flag
/// says which one won.
pub fn parse_effective(headers: &HeaderMap) -> (CacheControl, bool) {
    if headers.contains_key(&CDN_CACHE_CONTROL) {
        let cdn = parse_field(headers, &CDN_CACHE_CONTROL);
        if !cdn.is_empty() {
            return (cdn, true);
        }
    }
    (parse_cache_control(headers), false)
}

/// Parses all lines of one field. A line with bytes past ASCII (obs-text, in a quoted value
/// say) is still read for its directives: skipping it whole would lose a `private` or
/// `no-store` beside it, and a shared cache would then store a personal answer.
pub fn parse_field(headers: &HeaderMap, name: &HeaderName) -> CacheControl {
    let mut cc = CacheControl::default();
    for value in headers.get_all(name) {
        match value.to_str() {
            Ok(text) => parse_into(&mut cc, text),
            Err(_) => parse_into(&mut cc, &String::from_utf8_lossy(value.as_bytes())),
        }
    }
    cc
}

/// Parses one field value.
pub fn parse_str(text: &str) -> CacheControl {
    let mut cc = CacheControl::default();
    parse_into(&mut cc, text);
    cc
}

fn parse_into(cc: &mut CacheControl, text: &str) {
    for (name, value) in split_directives(text) {
        let name = name.to_ascii_lowercase();
        match name.as_str() {
            "max-age" => merge_delta(&mut cc.max_age, value),
            "s-maxage" => merge_delta(&mut cc.s_maxage, value),
            "stale-while-revalidate" => merge_delta(&mut cc.stale_while_revalidate, value),
            "stale-if-error" => merge_delta(&mut cc.stale_if_error, value),
            "min-fresh" => merge_delta(&mut cc.min_fresh, value),
            "max-stale" => cc.max_stale = Some(value.map(|v| parse_delta(Some(v)).unwrap_or(0))),
            "no-store" => cc.no_store = true,
            "no-cache" => cc.no_cache = true,
            "private" => cc.private = true,
            "public" => cc.public = true,
            "must-revalidate" => cc.must_revalidate = true,
            "proxy-revalidate" => cc.proxy_revalidate = true,
            "must-understand" => cc.must_understand = true,
            "no-transform" => cc.no_transform = true,
            "immutable" => cc.immutable = true,
            "only-if-cached" => cc.only_if_cached = true,
            _ => {}
        }
    }
}

/// A second, different value for the same directive makes it 0 (stale), per the module policy.
fn merge_delta(slot: &mut Option<u64>, value: Option<&str>) {
    let parsed = parse_delta(value).unwrap_or(0);
    *slot = match *slot {
        Some(prev) if prev != parsed => Some(0),
        _ => Some(parsed),
    };
}

/// delta-seconds: digits only (a quoted form is tolerated, as many origins send it); a value too
/// large saturates at [`DELTA_SECONDS_CAP`] (RFC 9111 §1.2.2), never reads as absent.
pub(crate) fn parse_delta(value: Option<&str>) -> Option<u64> {
    let v = value?.trim();
    let v = v
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(v);
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Any digit string too long for u64 is far beyond the cap.
    Some(v.parse::<u64>().unwrap_or(u64::MAX).min(DELTA_SECONDS_CAP))
}

/// Splits `a, b=1, c="x, y"` into `(name, value)` pairs, honouring quoted strings.
fn split_directives(text: &str) -> Vec<(&str, Option<&str>)> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate() {
        if in_quotes {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_quotes = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_quotes = true,
            b',' => {
                push_directive(&mut out, &text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    push_directive(&mut out, &text[start..]);
    out
}

fn push_directive<'a>(out: &mut Vec<(&'a str, Option<&'a str>)>, item: &'a str) {
    let item = item.trim();
    if item.is_empty() {
        return;
    }
    match item.split_once('=') {
        Some((name, value)) => out.push((name.trim(), Some(value.trim()))),
        None => out.push((item, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn parses_common_response_directives() {
        let cc = parse_str(
            "public, max-age=60, s-maxage=120, must-revalidate, stale-while-revalidate=30",
        );
        assert!(cc.public && cc.must_revalidate);
        assert_eq!(cc.max_age, Some(60));
        assert_eq!(cc.s_maxage, Some(120));
        assert_eq!(cc.stale_while_revalidate, Some(30));
        assert_eq!(cc.stale_if_error, None);
    }

    #[test]
    fn a_line_with_obs_text_keeps_its_directives() {
        let mut headers = HeaderMap::new();
        headers.append(
            http::header::CACHE_CONTROL,
            HeaderValue::from_bytes(b"private, no-store, x=\"\xe9\"").unwrap(),
        );
        let cc = parse_field(&headers, &http::header::CACHE_CONTROL);
        assert!(cc.private && cc.no_store);
    }

    #[test]
    fn names_are_case_insensitive_and_quotes_hold_commas() {
        let cc = parse_str(r#"Private="set-cookie, x-a", NO-STORE, Max-Age="5""#);
        assert!(cc.private && cc.no_store);
        assert_eq!(cc.max_age, Some(5));
    }

    #[test]
    fn malformed_or_conflicting_values_mean_stale() {
        assert_eq!(parse_str("max-age=abc").max_age, Some(0));
        assert_eq!(parse_str("max-age").max_age, Some(0));
        assert_eq!(parse_str("max-age=10, max-age=20").max_age, Some(0));
        assert_eq!(parse_str("max-age=10, max-age=10").max_age, Some(10));
        assert_eq!(parse_str("max-age=-1").max_age, Some(0));
    }

    #[test]
    fn huge_values_are_capped() {
        assert_eq!(
            parse_str("max-age=99999999999999999999999").max_age,
            Some(DELTA_SECONDS_CAP)
        );
    }

    #[test]
    fn request_directives() {
        let cc = parse_str("max-stale, min-fresh=5, only-if-cached, no-cache");
        assert_eq!(cc.max_stale, Some(None));
        assert_eq!(cc.min_fresh, Some(5));
        assert!(cc.only_if_cached && cc.no_cache);
        assert_eq!(parse_str("max-stale=7").max_stale, Some(Some(7)));
    }

    #[test]
    fn several_field_lines_form_one_list() {
        let mut h = HeaderMap::new();
        h.append(CACHE_CONTROL, HeaderValue::from_static("max-age=5"));
        h.append(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        let cc = parse_cache_control(&h);
        assert_eq!(cc.max_age, Some(5));
        assert!(cc.no_cache);
    }

    #[test]
    fn cdn_cache_control_wins() {
        let mut h = HeaderMap::new();
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        h.insert(&CDN_CACHE_CONTROL, HeaderValue::from_static("max-age=600"));
        let (cc, cdn) = parse_effective(&h);
        assert!(cdn);
        assert!(!cc.no_store);
        assert_eq!(cc.max_age, Some(600));
        // An empty targeted field falls back to Cache-Control.
        h.insert(&CDN_CACHE_CONTROL, HeaderValue::from_static(""));
        let (cc, cdn) = parse_effective(&h);
        assert!(!cdn && cc.no_store);
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,200}") {
            let _ = parse_str(&s);
        }

        #[test]
        fn max_age_round_trips(n in 0u64..DELTA_SECONDS_CAP) {
            let cc = parse_str(&format!("public, max-age={n}"));
            proptest::prop_assert_eq!(cc.max_age, Some(n));
        }
    }
}
