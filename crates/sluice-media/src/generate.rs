//! The pure core of MediaFlow's `POST /generate_url`, `/generate_urls` and the deprecated
//! `/generate_encrypted_or_encoded_url`: request bodies in, proxy URLs out, byte-identical to
//! MediaFlow Proxy 2.4.9 for the same IV and clock.
//!
//! No I/O and no clock: the caller passes "now" (unix seconds) and fresh random IVs.
//!
//! [`check_size`] bounds a `/generate_urls` request before any URL is built (MediaFlow has no
//! bound): its base URL is copied into every URL, so its answer can dwarf its body.
//!
//! MediaFlow's rules, reproduced here:
//! - params are, in order: `query_params`, `api_password` (when given at the top level and not
//!   already in `query_params`), `d`, `h_*` (request headers; `range`/`if-range` and empty values
//!   dropped), `r_*`, `rp_*` (empty values dropped), `x_headers` (comma list); a name that is
//!   already prefixed keeps its spelling;
//! - base URL = `urljoin(mediaflow_proxy_url, endpoint)` minus one trailing `/`;
//! - top-level `api_password` ⇒ `scheme://host/_token_<T><path>[/<quoted filename>]`, where the
//!   token also carries `exp = now + expiration` (when non-zero) and `ip`;
//! - otherwise `<base>[/<quoted filename>]?<urlencoded params>` (no `?` when there are none).
//!
//! A server that seals its own tokens instead (sluice, when the request's password is its own)
//! takes [`plan_url`]/[`plan_urls`]: the same params without the password, the path to scope the
//! token to, its claims, and the same URL shape around whatever token it mints.

pub(crate) mod pyurl;
mod sealed;

use std::fmt;
use std::net::IpAddr;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::b64url;
use crate::token::python;
use crate::token::{OrderedMap, TokenKey, PATH_TOKEN_PREFIX};

pub use sealed::{plan_url, plan_urls, SealPlan};

/// Body of `POST /generate_url` and `POST /generate_encrypted_or_encoded_url`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GenerateUrlRequest {
    pub mediaflow_proxy_url: String,
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub destination_url: Option<String>,
    #[serde(default)]
    pub query_params: Option<JsonObject>,
    #[serde(default)]
    pub request_headers: Option<JsonObject>,
    #[serde(default)]
    pub response_headers: Option<JsonObject>,
    #[serde(default)]
    pub propagate_response_headers: Option<JsonObject>,
    #[serde(default)]
    pub remove_response_headers: Option<Vec<String>>,
    /// Seconds from now; zero or absent means the token never expires.
    #[serde(default, deserialize_with = "lax_int")]
    pub expiration: Option<i64>,
    /// Top-level password: the URL is encrypted with it.
    #[serde(default)]
    pub api_password: Option<String>,
    #[serde(default)]
    pub ip: Option<IpAddr>,
    #[serde(default)]
    pub filename: Option<String>,
    #[serde(default)]
    pub base64_encode_destination: Option<bool>,
    /// mediaflow-proxy-light's extension (→ `transformer` param); MediaFlow Proxy ignores it.
    #[serde(default)]
    pub stream_transformer: Option<String>,
}

/// One entry of `POST /generate_urls`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct UrlItem {
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub destination_url: Option<String>,
    #[serde(default)]
    pub query_params: Option<JsonObject>,
    #[serde(default)]
    pub request_headers: Option<JsonObject>,
    #[serde(default)]
    pub response_headers: Option<JsonObject>,
    #[serde(default)]
    pub propagate_response_headers: Option<JsonObject>,
    #[serde(default)]
    pub remove_response_headers: Option<Vec<String>>,
    #[serde(default)]
    pub filename: Option<String>,
    /// mediaflow-proxy-light's extension (→ `transformer` param).
    #[serde(default)]
    pub stream_transformer: Option<String>,
}

/// Body of `POST /generate_urls`: shared base URL, password, expiry and address, many items.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GenerateUrlsRequest {
    pub mediaflow_proxy_url: String,
    #[serde(default)]
    pub api_password: Option<String>,
    #[serde(default, deserialize_with = "lax_int")]
    pub expiration: Option<i64>,
    #[serde(default)]
    pub ip: Option<IpAddr>,
    /// At most [`MAX_URLS`] + 1 items when parsed ([`capped_urls`]): enough for [`check_size`]
    /// to refuse the list.
    #[serde(deserialize_with = "capped_urls")]
    pub urls: Vec<UrlItem>,
}

/// `{"url": ...}`, the answer of `/generate_url`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UrlResponse {
    pub url: String,
}

/// `{"urls": [...]}`, the answer of `/generate_urls`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UrlsResponse {
    pub urls: Vec<String>,
}

/// `{"encoded_url": ...}`, the answer of the deprecated `/generate_encrypted_or_encoded_url`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncodedUrlResponse {
    pub encoded_url: String,
}

impl From<UrlResponse> for EncodedUrlResponse {
    fn from(response: UrlResponse) -> Self {
        EncodedUrlResponse {
            encoded_url: response.url,
        }
    }
}

/// `POST /generate_url`. `iv` is used only when the URL is encrypted.
pub fn generate_url(request: &GenerateUrlRequest, now: u64, iv: [u8; 16]) -> UrlResponse {
    let destination = destination(request);
    let shared = Shared::new(
        &request.mediaflow_proxy_url,
        request.api_password.as_deref(),
        request.expiration,
        request.ip,
        now,
    );
    UrlResponse {
        url: shared.build(&request_parts(request, destination.as_deref()), iv),
    }
}

/// `POST /generate_urls`. `next_iv` is called once per encrypted URL.
pub fn generate_urls(
    request: &GenerateUrlsRequest,
    now: u64,
    mut next_iv: impl FnMut() -> [u8; 16],
) -> UrlsResponse {
    let shared = Shared::new(
        &request.mediaflow_proxy_url,
        request.api_password.as_deref(),
        request.expiration,
        request.ip,
        now,
    );
    let urls = request
        .urls
        .iter()
        .map(|item| shared.build(&item_parts(item), next_iv()))
        .collect();
    UrlsResponse { urls }
}

/// Longest `mediaflow_proxy_url` or `api_password` `/generate_urls` takes: both are copied into
/// every URL it makes, so their length multiplies by the number of items.
pub const MAX_SHARED_LEN: usize = 8 * 1024;

/// Most items one `/generate_urls` request may hold. MediaFlow sets no limit; a player or addon
/// asks for a handful of URLs at a time.
pub const MAX_URLS: usize = 1_000;

/// Largest answer `/generate_urls` makes, as [`answer_estimate`] reckons it.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// Why a `/generate_urls` request is refused before any URL is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TooLarge {
    /// A string copied into every URL is longer than [`MAX_SHARED_LEN`].
    Shared { field: &'static str, len: usize },
    /// More items than [`MAX_URLS`]: how many the request holds, or [`MAX_URLS`] + 1 for a parsed
    /// one (the parser keeps no more).
    Urls(usize),
    /// The answer would be larger than [`MAX_ANSWER_BYTES`].
    Answer(usize),
}

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TooLarge::Shared { field, len } => write!(
                f,
                "{field} is {len} bytes; at most {MAX_SHARED_LEN} are taken, as it goes into every URL"
            ),
            // Parsed lists stop at MAX_URLS + 1 items (`capped_urls`), so the count is not told.
            TooLarge::Urls(_) => write!(
                f,
                "urls holds more than {MAX_URLS} items; at most {MAX_URLS} are taken"
            ),
            TooLarge::Answer(n) => write!(
                f,
                "the answer would be about {n} bytes; at most {MAX_ANSWER_BYTES} are made: ask for fewer URLs"
            ),
        }
    }
}

impl std::error::Error for TooLarge {}

/// Refuses a `/generate_urls` request whose answer would be out of proportion to its body,
/// before any of it is built: a long base URL or password is copied into every URL, so a
/// 256 KiB body of empty items once made gigabytes. Check this before [`generate_urls`] or
/// [`plan_urls`].
pub fn check_size(request: &GenerateUrlsRequest) -> Result<(), TooLarge> {
    let shared = [
        ("mediaflow_proxy_url", request.mediaflow_proxy_url.len()),
        (
            "api_password",
            request.api_password.as_deref().map_or(0, str::len),
        ),
    ];
    if let Some(&(field, len)) = shared.iter().find(|(_, len)| *len > MAX_SHARED_LEN) {
        return Err(TooLarge::Shared { field, len });
    }
    if request.urls.len() > MAX_URLS {
        return Err(TooLarge::Urls(request.urls.len()));
    }
    match answer_estimate(request) {
        n if n > MAX_ANSWER_BYTES => Err(TooLarge::Answer(n)),
        _ => Ok(()),
    }
}

/// How many answer bytes one request byte can become inside a token: JSON escapes a control
/// character as six bytes, and base64 adds a third.
const TOKEN_GROWTH: usize = 8;

/// Per URL, beyond what the request's strings make: the token's IV, tag and claims, separators,
/// and the JSON quotes and comma around it.
const URL_OVERHEAD: usize = 256;

/// A generous upper bound on the bytes of `/generate_urls`' JSON answer, summed item by item
/// without building anything. Each URL holds the base URL and endpoint as written (JSON-escaped
/// in the answer) and, in a token, the params, the password (MediaFlow's token) and the path
/// (sluice's token scope): each request byte there counts [`TOKEN_GROWTH`] times.
pub fn answer_estimate(request: &GenerateUrlsRequest) -> usize {
    let base = &request.mediaflow_proxy_url;
    let password = request.api_password.as_deref().map_or(0, str::len);
    let shared = json_len(base)
        .saturating_add(TOKEN_GROWTH.saturating_mul(base.len().saturating_add(password)))
        .saturating_add(URL_OVERHEAD);
    request.urls.iter().fold(0usize, |total, item| {
        let endpoint = item.endpoint.as_deref().unwrap_or("");
        let own = TOKEN_GROWTH.saturating_mul(endpoint.len().saturating_add(item_len(item)));
        total
            .saturating_add(shared)
            .saturating_add(json_len(endpoint))
            .saturating_add(own)
    })
}

/// The bytes of an item's params and filename as the request wrote them (JSON values other
/// than strings in their compact form), plus a little per name for its prefix and separators.
fn item_len(item: &UrlItem) -> usize {
    let object_len = |object: &Option<JsonObject>| {
        object.as_ref().map_or(0, |o| {
            o.0.iter()
                .map(|(name, value)| name.len() + 8 + value_len(value))
                .sum::<usize>()
        })
    };
    let str_len = |s: &Option<String>| s.as_deref().map_or(0, str::len);
    let removed = item
        .remove_response_headers
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|name| name.len() + 1)
        .sum::<usize>();
    [
        str_len(&item.destination_url),
        object_len(&item.query_params),
        object_len(&item.request_headers),
        object_len(&item.response_headers),
        object_len(&item.propagate_response_headers),
        removed,
        str_len(&item.filename),
        str_len(&item.stream_transformer),
    ]
    .iter()
    .fold(0usize, |total, len| total.saturating_add(*len))
}

/// A JSON value's length: a string's bytes, anything else in compact JSON (counted, not built).
fn value_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(bytes.len());
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    match value {
        Value::String(s) => s.len(),
        other => {
            let mut count = Count(0);
            // Writing to a counter cannot fail; a failure would only make the estimate smaller.
            let _ = serde_json::to_writer(&mut count, other);
            count.0
        }
    }
}

/// A string's length once JSON-escaped in the answer: a control character takes six bytes, a
/// quote or backslash two.
fn json_len(s: &str) -> usize {
    s.bytes()
        .map(|b| match b {
            b'"' | b'\\' => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .fold(0usize, usize::saturating_add)
}

/// The destination as the URL carries it: base64url-encoded when the request asks.
fn destination(request: &GenerateUrlRequest) -> Option<String> {
    let mut destination = request.destination_url.clone();
    if request.base64_encode_destination == Some(true) {
        if let Some(url) = destination.as_mut().filter(|url| !url.is_empty()) {
            *url = b64url::encode_url(url);
        }
    }
    destination
}

fn request_parts<'a>(
    request: &'a GenerateUrlRequest,
    destination: Option<&'a str>,
) -> UrlParts<'a> {
    UrlParts {
        endpoint: request.endpoint.as_deref(),
        destination,
        query_params: request.query_params.as_ref(),
        request_headers: request.request_headers.as_ref(),
        response_headers: request.response_headers.as_ref(),
        propagate_response_headers: request.propagate_response_headers.as_ref(),
        remove_response_headers: request.remove_response_headers.as_deref(),
        filename: request.filename.as_deref(),
        stream_transformer: request.stream_transformer.as_deref(),
    }
}

fn item_parts(item: &UrlItem) -> UrlParts<'_> {
    UrlParts {
        endpoint: item.endpoint.as_deref(),
        destination: item.destination_url.as_deref(),
        query_params: item.query_params.as_ref(),
        request_headers: item.request_headers.as_ref(),
        response_headers: item.response_headers.as_ref(),
        propagate_response_headers: item.propagate_response_headers.as_ref(),
        remove_response_headers: item.remove_response_headers.as_deref(),
        filename: item.filename.as_deref(),
        stream_transformer: item.stream_transformer.as_deref(),
    }
}

/// What every URL of one request shares.
struct Shared<'a> {
    base: &'a str,
    /// Present and non-empty: encrypt with it.
    password: Option<&'a str>,
    key: Option<TokenKey>,
    exp: Option<i64>,
    /// Rust's canonical text, as Python >= 3.13 writes it; 3.11 and 3.12 spell an IPv4-mapped
    /// address in hex (`::ffff:a00:1`) instead of `::ffff:10.0.0.1`.
    ip: Option<String>,
}

impl<'a> Shared<'a> {
    fn new(
        base: &'a str,
        password: Option<&'a str>,
        expiration: Option<i64>,
        ip: Option<IpAddr>,
        now: u64,
    ) -> Self {
        let now = i64::try_from(now).unwrap_or(i64::MAX);
        let password = password.filter(|p| !p.is_empty());
        Shared {
            base,
            password,
            key: password.map(TokenKey::new),
            // Python tests `if expiration:`, so zero means "never expires".
            exp: expiration
                .filter(|&e| e != 0)
                .map(|e| now.saturating_add(e)),
            ip: ip.map(|ip| ip.to_string()),
        }
    }

    fn build(&self, parts: &UrlParts<'_>, iv: [u8; 16]) -> String {
        let params = parts.params(self.password);
        let (base, filename) = self.locate(parts);
        match &self.key {
            Some(key) => {
                let token = key.seal(self.claimed(params).entries(), iv);
                let mut split = pyurl::urlsplit(&base, "");
                split.path = format!("{PATH_TOKEN_PREFIX}{token}{}", split.path);
                format!("{}{filename}", pyurl::urlunsplit(&split))
            }
            None if params.is_empty() => format!("{base}{filename}"),
            None => format!("{base}{filename}?{}", python::urlencode(params.entries())),
        }
    }

    /// The URL without its params (`urljoin` of base and endpoint, one trailing `/` off), and the
    /// quoted `/<filename>` that follows the path (empty without one).
    fn locate(&self, parts: &UrlParts<'_>) -> (String, String) {
        let mut base = match parts.endpoint {
            None => self.base.to_owned(),
            Some(endpoint) => pyurl::urljoin(self.base, endpoint),
        };
        if base.ends_with('/') {
            base.pop();
        }
        let filename = parts
            .filename
            .filter(|f| !f.is_empty())
            .map(|f| format!("/{}", python::quote(f, b"/")))
            .unwrap_or_default();
        (base, filename)
    }

    /// The params with the `exp` and `ip` claims set, as MediaFlow's token object holds them.
    fn claimed(&self, mut params: OrderedMap<Value>) -> OrderedMap<Value> {
        if let Some(exp) = self.exp {
            params.insert("exp", Value::from(exp));
        }
        if let Some(ip) = &self.ip {
            params.insert("ip", Value::String(ip.clone()));
        }
        params
    }
}

/// The per-URL fields of either request shape.
struct UrlParts<'a> {
    endpoint: Option<&'a str>,
    destination: Option<&'a str>,
    query_params: Option<&'a JsonObject>,
    request_headers: Option<&'a JsonObject>,
    response_headers: Option<&'a JsonObject>,
    propagate_response_headers: Option<&'a JsonObject>,
    remove_response_headers: Option<&'a [String]>,
    filename: Option<&'a str>,
    stream_transformer: Option<&'a str>,
}

impl UrlParts<'_> {
    /// Params in MediaFlow's order, with Python dict semantics for repeated names. A top-level
    /// password goes right after `query_params` unless they already carry one.
    fn params(&self, api_password: Option<&str>) -> OrderedMap<Value> {
        let mut params = OrderedMap::new();
        for (name, value) in self.query_params.map(|q| &q.0[..]).unwrap_or_default() {
            params.insert(name, value.clone());
        }
        if let Some(password) = api_password.filter(|_| !params.contains("api_password")) {
            params.insert("api_password", Value::String(password.to_owned()));
        }
        if let Some(destination) = self.destination {
            params.insert("d", Value::String(destination.to_owned()));
        }
        let headers = [
            (self.request_headers, "h_"),
            (self.response_headers, "r_"),
            (self.propagate_response_headers, "rp_"),
        ];
        for (object, prefix) in headers {
            for (name, value) in object.map(|o| &o.0[..]).unwrap_or_default() {
                if let Some(name) = header_param(name, value, prefix) {
                    params.insert(&name, value.clone());
                }
            }
        }
        if let Some(remove) = self.remove_response_headers.filter(|r| !r.is_empty()) {
            params.insert("x_headers", Value::String(remove.join(",")));
        }
        if let Some(transformer) = self.stream_transformer.filter(|t| !t.is_empty()) {
            params.insert("transformer", Value::String(transformer.to_owned()));
        }
        params
    }
}

/// The param name for one header, or `None` when MediaFlow drops it: empty values, and the
/// player-driven request headers, which baked into a URL would pin every later seek to one range.
fn header_param(name: &str, value: &Value, prefix: &str) -> Option<String> {
    const PER_REQUEST_HEADERS: [&str; 2] = ["range", "if-range"];
    let lower = name.to_ascii_lowercase();
    let bare = lower.strip_prefix(prefix).unwrap_or(&lower);
    if !is_truthy(value) || (prefix == "h_" && PER_REQUEST_HEADERS.contains(&bare)) {
        return None;
    }
    Some(if lower.starts_with(prefix) {
        name.to_owned()
    } else {
        format!("{prefix}{name}")
    })
}

/// Python truthiness of a JSON value, which MediaFlow uses to drop empty header values.
fn is_truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// A JSON object that keeps its keys in document order (Python dicts do, and the order shows in
/// the generated URL). A repeated key keeps its first position and its last value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JsonObject(pub Vec<(String, Value)>);

impl<'de> Deserialize<'de> for JsonObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = JsonObject;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonObject, A::Error> {
                let mut entries = OrderedMap::new();
                while let Some((name, value)) = map.next_entry::<String, Value>()? {
                    entries.insert(&name, value);
                }
                Ok(JsonObject(entries.into_entries()))
            }
        }
        deserializer.deserialize_map(ObjectVisitor)
    }
}

/// `/generate_urls`' `urls`, keeping no more than [`MAX_URLS`] + 1 items: the rest are only
/// checked as JSON, never built. serde would otherwise build the whole list before
/// [`check_size`] ran: 256 KiB of `{},` is some 87,000 items, tens of megabytes for a moment.
/// One item past the bound still reaches `check_size`, which refuses it in its own order (a base
/// URL too long first), so the refusal is the same 413 whatever the list's length.
fn capped_urls<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<UrlItem>, D::Error> {
    struct Capped;
    impl<'de> Visitor<'de> for Capped {
        type Value = Vec<UrlItem>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of URL items")
        }

        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<UrlItem>, A::Error> {
            // The size hint is the sender's word: it sizes nothing past the bound.
            let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_URLS + 1));
            while items.len() <= MAX_URLS {
                match seq.next_element()? {
                    Some(item) => items.push(item),
                    None => return Ok(items),
                }
            }
            while seq.next_element::<de::IgnoredAny>()?.is_some() {}
            Ok(items)
        }
    }
    deserializer.deserialize_seq(Capped)
}

/// Pydantic's lax integer: an integer, an integral float, or a string of digits.
fn lax_int<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<i64>, D::Error> {
    let value = Option::<Value>::deserialize(deserializer)?;
    let int = match &value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.2e18)
                .map(|f| f as i64)
        }),
        Some(Value::String(s)) => s.trim().parse::<i64>().ok(),
        Some(_) => None,
    };
    int.map(Some)
        .ok_or_else(|| de::Error::custom("expiration must be an integer"))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod capped_urls_tests {
    use super::*;

    fn body(items: &[&str]) -> String {
        format!(
            r#"{{"mediaflow_proxy_url":"http://h/","urls":[{}]}}"#,
            items.join(",")
        )
    }

    /// 2,000 items parse into MAX_URLS + 1 and are refused; the ones past the bound are never
    /// built (an item that could not be one is not even looked at as one).
    #[test]
    fn urls_past_the_bound_are_not_built() {
        let r: GenerateUrlsRequest = serde_json::from_str(&body(&["{}"; 2_000])).unwrap();
        assert_eq!(r.urls.len(), MAX_URLS + 1);
        assert_eq!(check_size(&r), Err(TooLarge::Urls(MAX_URLS + 1)));
        let message = TooLarge::Urls(MAX_URLS + 1).to_string();
        assert_eq!(
            message,
            "urls holds more than 1000 items; at most 1000 are taken"
        );
        let mut items = vec![r#"{"endpoint":"/proxy/stream"}"#; MAX_URLS + 1];
        items.extend([r#"{"endpoint":5}"#; 5_000]);
        let r: GenerateUrlsRequest = serde_json::from_str(&body(&items)).unwrap();
        assert_eq!(r.urls.len(), MAX_URLS + 1);
        assert!(r
            .urls
            .iter()
            .all(|u| u.endpoint.as_deref() == Some("/proxy/stream")));
        // Within the bound every item is built and checked as before, and the JSON past it must
        // still be JSON.
        let r: GenerateUrlsRequest = serde_json::from_str(&body(&["{}"; MAX_URLS])).unwrap();
        assert_eq!((r.urls.len(), check_size(&r)), (MAX_URLS, Ok(())));
        assert!(
            serde_json::from_str::<GenerateUrlsRequest>(&body(&[r#"{"endpoint":5}"#])).is_err()
        );
        let mut items = vec!["{}"; MAX_URLS + 1];
        items.push("{,}");
        assert!(serde_json::from_str::<GenerateUrlsRequest>(&body(&items)).is_err());
        assert!(
            serde_json::from_str::<GenerateUrlsRequest>(r#"{"mediaflow_proxy_url":"x"}"#).is_err()
        );
    }
}
