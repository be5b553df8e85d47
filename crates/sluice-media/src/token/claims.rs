//! Token plaintext → flat params plus `exp`/`ip` claims, for both MediaFlow JSON shapes.

use std::fmt;
use std::net::IpAddr;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;

use super::{ip_matches, python, OrderedMap, TokenError};

/// What a token grants: query params to merge over the request's own, and the claims that bound it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenClaims {
    /// Flat params in token order, values as MediaFlow would put them in a query string
    /// (Python `str()` of non-string JSON values, e.g. `True`).
    pub params: Vec<(String, String)>,
    /// Unix seconds after which the token is refused.
    pub exp: Option<u64>,
    /// Client address the token is bound to.
    pub ip: Option<String>,
}

impl TokenClaims {
    /// Refuses an expired token (401) or one bound to another address (403). A token bound to
    /// an address is refused when the client address is unknown.
    pub fn check(&self, now: u64, client_ip: Option<IpAddr>) -> Result<(), TokenError> {
        if self.exp.is_some_and(|exp| exp < now) {
            return Err(TokenError::Expired);
        }
        match &self.ip {
            Some(ip) if !ip_matches(ip, client_ip) => Err(TokenError::IpMismatch),
            _ => Ok(()),
        }
    }

    /// The value of the first param called `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Decrypted bytes → claims. A UTF-8 byte-order mark is tolerated, as Python's `json.loads` does.
pub(super) fn parse(plain: &[u8]) -> Result<TokenClaims, TokenError> {
    let plain = plain.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(plain);
    let OrderedObject(entries) = serde_json::from_slice(plain).map_err(|_| TokenError::Json)?;
    if is_light_shape(&entries) {
        from_light(entries)
    } else {
        from_flat(entries)
    }
}

/// MediaFlow Proxy's shape: every key is a query param except `exp` and `ip`.
fn from_flat(entries: Vec<(String, Value)>) -> Result<TokenClaims, TokenError> {
    let mut claims = TokenClaims::default();
    for (name, value) in entries {
        match name.as_str() {
            "exp" => claims.exp = Some(parse_exp(&value)?),
            // Python compares the claim with a string, so a non-string never matches.
            "ip" => claims.ip = Some(value.as_str().ok_or(TokenError::Claim("ip"))?.to_owned()),
            _ => claims.params.push((name, python::to_str(&value))),
        }
    }
    Ok(claims)
}

const LIGHT_KEYS: [&str; 6] = [
    "destination",
    "query_params",
    "request_headers",
    "response_headers",
    "exp",
    "ip",
];

/// mediaflow-proxy-light always writes all six keys; a flat token could carry a `destination`
/// param, so the shape is recognised only when nothing else is present and a Light-only key is.
fn is_light_shape(entries: &[(String, Value)]) -> bool {
    let has = |key: &str| entries.iter().any(|(n, _)| n == key);
    entries
        .iter()
        .all(|(n, _)| LIGHT_KEYS.contains(&n.as_str()))
        && entries
            .iter()
            .any(|(n, v)| n == "destination" && v.is_string())
        && (has("query_params") || has("request_headers") || has("response_headers"))
}

/// Light's shape → flat params: `query_params` as is, then `d`, then `h_*` and `r_*` headers.
fn from_light(entries: Vec<(String, Value)>) -> Result<TokenClaims, TokenError> {
    let field = |key: &str| entries.iter().find(|(n, _)| n == key).map(|(_, v)| v);
    let mut params = OrderedMap::new();
    for (name, value) in object_field(field("query_params"), "query_params")? {
        params.insert(name, python::to_str(value));
    }
    if let Some(destination) = field("destination").and_then(Value::as_str) {
        if !destination.is_empty() {
            params.insert("d", destination.to_owned());
        }
    }
    let headers = [("request_headers", "h_"), ("response_headers", "r_")];
    for (key, prefix) in headers {
        for (name, value) in object_field(field(key), key)? {
            let name = if name.to_ascii_lowercase().starts_with(prefix) {
                name.clone()
            } else {
                format!("{prefix}{name}")
            };
            params.insert(&name, python::to_str(value));
        }
    }
    let mut claims = TokenClaims {
        params: params.into_entries(),
        ..TokenClaims::default()
    };
    claims.exp = match field("exp") {
        None | Some(Value::Null) => None,
        Some(exp) => Some(parse_exp(exp)?),
    };
    claims.ip = match field("ip") {
        None | Some(Value::Null) => None,
        Some(ip) => Some(ip.as_str().ok_or(TokenError::Claim("ip"))?.to_owned()),
    };
    Ok(claims)
}

/// A Light field that must be an object or null; yields its entries.
fn object_field<'a>(
    value: Option<&'a Value>,
    key: &'static str,
) -> Result<Vec<(&'a String, &'a Value)>, TokenError> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(map)) => Ok(map.iter().collect()),
        Some(_) => Err(TokenError::Claim(key)),
    }
}

/// `exp` is an integer in practice; Python also compares floats, and anything below zero has
/// long expired.
fn parse_exp(value: &Value) -> Result<u64, TokenError> {
    if let Some(exp) = value.as_u64() {
        return Ok(exp);
    }
    match value.as_f64() {
        // `as` saturates, and flooring keeps `exp < now` identical for integral `now`.
        Some(exp) => Ok(exp.max(0.0).floor() as u64),
        None => Err(TokenError::Claim("exp")),
    }
}

/// A JSON object with its keys in document order; a repeated key keeps its first position and
/// its last value, as Python's `json.loads` builds a dict.
struct OrderedObject(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for OrderedObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(OrderedVisitor)
    }
}

struct OrderedVisitor;

impl<'de> Visitor<'de> for OrderedVisitor {
    type Value = OrderedObject;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OrderedObject, A::Error> {
        let mut entries = OrderedMap::new();
        while let Some((name, value)) = map.next_entry::<String, Value>()? {
            entries.insert(&name, value);
        }
        Ok(OrderedObject(entries.into_entries()))
    }
}
