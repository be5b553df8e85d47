//! Does sluice treat a `d` destination as MediaFlow Proxy 2.4.9 does (base64 detection, decoding,
//! repairs)? Vectors come from MediaFlow's own functions (`scripts/mediaflow-token-vectors.py`).

use serde::Deserialize;
use sluice_media::b64url::{decode_url, encode_url, is_base64_url, sanitize_destination};

#[derive(Deserialize)]
struct Vector {
    input: String,
    is_base64: bool,
    decoded: Option<String>,
    encoded: String,
    sanitized: String,
}

fn vectors() -> Vec<Vector> {
    serde_json::from_str(include_str!("fixtures/base64.json")).expect("base64.json")
}

/// Where sluice deliberately accepts more than MediaFlow (see `b64url`'s module docs).
fn sluice_sanitized(v: &Vector) -> String {
    let url_safe = v.input.contains(['-', '_']);
    match &v.decoded {
        Some(decoded) if url_safe => decoded.clone(),
        _ if v.input.starts_with("https%3A%2F%2F") => "https://example.com/a.m3u8".into(),
        _ => v.sanitized.clone(),
    }
}

#[test]
fn decode_and_encode_match_mediaflow() {
    for v in vectors() {
        assert_eq!(decode_url(&v.input), v.decoded, "{}", v.input);
        assert_eq!(encode_url(&v.input), v.encoded, "{}", v.input);
    }
}

#[test]
fn detection_matches_mediaflow_plus_the_url_safe_alphabet() {
    for v in vectors() {
        let url_safe = v.input.len() >= 10
            && v.input.contains(['-', '_'])
            && !v.input.contains("://")
            && v.input
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+/=-_".contains(&b));
        assert_eq!(
            is_base64_url(&v.input),
            v.is_base64 || url_safe,
            "{}",
            v.input
        );
    }
}

#[test]
fn sanitize_matches_mediaflow_except_documented_widenings() {
    for v in vectors() {
        assert_eq!(
            sanitize_destination(&v.input),
            sluice_sanitized(&v),
            "{}",
            v.input
        );
    }
}
