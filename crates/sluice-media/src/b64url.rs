//! MediaFlow's destination (`d`) clean-up: base64 detection and decoding, and the `/base64/*` helpers.
//!
//! MediaFlow accepts `d` as a plain URL or as base64 of one, and repairs a few common
//! mangled forms (`https%22//`, a `&key_id=…&key=…` tail). This module reproduces that, with two
//! deliberate differences, both only accepting more:
//! - the base64url alphabet (`-`, `_`) is recognised; MediaFlow's check only knows `+/=`, so it
//!   passes its own `/base64/encode` output through undecoded whenever that contains `-` or `_`;
//! - a `d` that is still percent-encoded (`https%3A%2F%2F…`) is decoded once; no real URL starts
//!   that way.

use base64::Engine;
use percent_encoding::percent_decode_str;
use serde::Serialize;

use crate::generate::pyurl;

/// Schemes whose URLs are never taken for base64.
const URL_PREFIXES: [&str; 4] = ["http://", "https://", "ftp://", "ftps://"];

/// MediaFlow's heuristic, widened to the base64url alphabet: no URL scheme prefix, only base64
/// characters, at least 10 of them. Decoding decides the rest.
pub fn is_base64_url(s: &str) -> bool {
    !URL_PREFIXES.iter().any(|p| s.starts_with(p))
        && s.len() >= 10
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+/=-_".contains(&b))
}

/// MediaFlow's `decode_base64_url`: either alphabet, padding optional, and the result must be
/// UTF-8 with a scheme and a host. Characters outside the alphabet are skipped, as Python's
/// non-strict decoder does.
pub fn decode_url(encoded: &str) -> Option<String> {
    // Python's decoder refuses a non-ASCII string outright.
    if !encoded.is_ascii() {
        return None;
    }
    let normalized: String = encoded
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    let missing = normalized.len() % 4;
    let padded = if missing == 0 {
        normalized
    } else {
        format!("{normalized}{}", "=".repeat(4 - missing))
    };
    let bytes = decode_lenient(padded.as_bytes())?;
    let url = String::from_utf8(bytes).ok()?;
    has_scheme_and_host(&url).then_some(url)
}

/// MediaFlow's `encode_url_to_base64` (URL-safe, unpadded), used by `/base64/encode` and by
/// `base64_encode_destination`.
pub fn encode_url(url: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(url)
}

/// The destination as it was meant: base64 decoded when it is base64 of a URL, unchanged otherwise.
pub fn decode_if_base64(d: &str) -> String {
    if is_base64_url(d) {
        if let Some(url) = decode_url(d) {
            return url;
        }
    }
    d.to_owned()
}

/// `POST /base64/encode?url=…` → `{"encoded_url", "original_url"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EncodeResponse {
    pub encoded_url: String,
    pub original_url: String,
}

/// `POST /base64/decode?encoded_url=…` → `{"decoded_url", "encoded_url"}`; MediaFlow answers 400
/// `{"detail": "Invalid base64 encoded URL"}` when [`decode_response`] gives `None`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DecodeResponse {
    pub decoded_url: String,
    pub encoded_url: String,
}

/// `GET /base64/check?url=…` → `{"url", "is_base64"[, "decoded_url"]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckResponse {
    pub url: String,
    pub is_base64: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decoded_url: Option<String>,
}

pub fn encode_response(url: &str) -> EncodeResponse {
    EncodeResponse {
        encoded_url: encode_url(url),
        original_url: url.to_owned(),
    }
}

pub fn decode_response(encoded_url: &str) -> Option<DecodeResponse> {
    Some(DecodeResponse {
        decoded_url: decode_url(encoded_url)?,
        encoded_url: encoded_url.to_owned(),
    })
}

pub fn check_response(url: &str) -> CheckResponse {
    let is_base64 = is_base64_url(url);
    CheckResponse {
        url: url.to_owned(),
        is_base64,
        decoded_url: is_base64.then(|| decode_url(url)).flatten(),
    }
}

/// MediaFlow's `sanitize_url`, applied to `d` before it is fetched.
pub fn sanitize_destination(d: &str) -> String {
    let mut url = decode_if_base64(d);
    if starts_percent_encoded(&url) {
        url = percent_decode_str(&url).decode_utf8_lossy().into_owned();
    }
    // A quote that slipped in where the colon was (or after it).
    for (broken, fixed) in [
        ("https%22//", "https://"),
        ("http%22//", "http://"),
        ("https%3A%22//", "https://"),
        ("http%3A%22//", "http://"),
        ("https:\"//", "https://"),
        ("http:\"//", "http://"),
    ] {
        url = url.replace(broken, fixed);
    }
    // ClearKey params pasted onto the URL instead of the proxy query.
    if url.contains("&key_id=") && url.contains("&key=") {
        url.truncate(url.find("&key_id=").unwrap_or(url.len()));
    }
    let decoded = percent_decode_str(&url).decode_utf8_lossy();
    if decoded != url && decoded.contains(":\"/") {
        return drop_quote_after_scheme(&decoded);
    }
    url
}

fn starts_percent_encoded(url: &str) -> bool {
    let head = url.get(..14).unwrap_or(url).to_ascii_lowercase();
    head.starts_with("http%3a%2f%2f") || head.starts_with("https%3a%2f%2f")
}

/// `re.sub(r'([a-z]+):"//', r'\1://', s)`: a lowercase word, then `:"//`, loses the quote.
fn drop_quote_after_scheme(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find(":\"//") {
        let preceded_by_letter = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_lowercase());
        out.push_str(&rest[..at]);
        out.push_str(if preceded_by_letter { "://" } else { ":\"//" });
        rest = &rest[at + 4..];
    }
    out.push_str(rest);
    out
}

/// Python's `urlparse(url)` yields both a scheme and a netloc (and does not raise).
fn has_scheme_and_host(url: &str) -> bool {
    let parts = pyurl::urlsplit(url, "");
    let brackets_balanced = parts.netloc.contains('[') == parts.netloc.contains(']');
    !parts.scheme.is_empty() && !parts.netloc.is_empty() && brackets_balanced
}

/// Python's non-strict `binascii.a2b_base64`: characters outside the alphabet are skipped,
/// bytes are emitted as soon as they are complete, enough `=` after at least two data characters
/// ends the input, and input that ends inside a group without that padding is refused.
fn decode_lenient(input: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(input.len() / 4 * 3);
    let (mut quad, mut left, mut pads) = (0u8, 0u8, 0u8);
    for &c in input {
        if c == b'=' {
            if quad >= 2 {
                pads += 1;
                if quad + pads >= 4 {
                    return Some(out);
                }
            }
            continue;
        }
        let Some(v) = sextet(c) else { continue };
        pads = 0;
        match quad {
            0 => left = v,
            1 => {
                out.push((left << 2) | (v >> 4));
                left = v & 0x0f;
            }
            2 => {
                out.push((left << 4) | (v >> 2));
                left = v & 0x03;
            }
            _ => out.push((left << 6) | v),
        }
        quad = (quad + 1) % 4;
    }
    (quad == 0).then_some(out)
}

fn sextet(c: u8) -> Option<u8> {
    match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_safe_base64_is_detected_and_decoded() {
        let encoded = encode_url("https://example.com/?a=>???");
        assert!(encoded.contains('-') || encoded.contains('_'));
        assert!(is_base64_url(&encoded));
        assert_eq!(decode_if_base64(&encoded), "https://example.com/?a=>???");
    }

    #[test]
    fn double_encoded_destination_is_decoded_once() {
        assert_eq!(
            sanitize_destination("https%3A%2F%2Fexample.com%2Fa%2520b.m3u8"),
            "https://example.com/a%20b.m3u8"
        );
    }

    #[test]
    fn quote_after_scheme_is_dropped() {
        assert_eq!(
            drop_quote_after_scheme("x https:\"//h 1:\"//"),
            "x https://h 1:\"//"
        );
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn any_destination_is_handled(d in "\\PC{0,80}") {
                let _ = sanitize_destination(&d);
                let _ = check_response(&d);
            }

            #[test]
            fn encoded_urls_decode_back(path in "[ -~]{0,60}") {
                let url = format!("https://example.com/{path}");
                prop_assert_eq!(decode_if_base64(&encode_url(&url)), url);
            }
        }
    }
}
