//! Does sluice's `/generate_url(s)` core answer exactly what MediaFlow Proxy 2.4.9 answers for
//! the same body, IV and clock? Vectors come from MediaFlow's own endpoints
//! (`scripts/mediaflow-token-vectors.py`).

use serde::Deserialize;
use serde_json::Value;
use sluice_media::generate::{
    generate_url, generate_urls, EncodedUrlResponse, GenerateUrlRequest, GenerateUrlsRequest,
};
use sluice_media::token::{decrypt_token, split_path_token};

#[derive(Deserialize)]
struct Vector {
    path: String,
    now: u64,
    iv: String,
    /// The body as MediaFlow received it, as text so that key order survives.
    request: String,
    status: u16,
    response: Option<Value>,
}

fn vectors() -> Vec<Vector> {
    serde_json::from_str(include_str!("fixtures/generate.json")).expect("generate.json")
}

/// The answer sluice gives for one vector, or `None` when the body is refused.
fn answer(v: &Vector) -> Option<Value> {
    let iv: [u8; 16] = hex::decode(&v.iv).unwrap().try_into().unwrap();
    let json = match v.path.as_str() {
        "/generate_url" => {
            let request: GenerateUrlRequest = serde_json::from_str(&v.request).ok()?;
            serde_json::to_value(generate_url(&request, v.now, iv))
        }
        "/generate_encrypted_or_encoded_url" => {
            let request: GenerateUrlRequest = serde_json::from_str(&v.request).ok()?;
            serde_json::to_value(EncodedUrlResponse::from(generate_url(&request, v.now, iv)))
        }
        "/generate_urls" => {
            let request: GenerateUrlsRequest = serde_json::from_str(&v.request).ok()?;
            serde_json::to_value(generate_urls(&request, v.now, || iv))
        }
        other => panic!("unknown endpoint {other}"),
    };
    Some(json.unwrap())
}

#[test]
fn sluice_generates_mediaflow_urls_byte_for_byte() {
    for v in vectors() {
        let got = answer(&v);
        if v.status == 200 {
            assert_eq!(
                got.as_ref(),
                v.response.as_ref(),
                "{} {}",
                v.path,
                v.request
            );
        } else {
            assert_eq!(
                got, None,
                "MediaFlow refused {} with {}",
                v.request, v.status
            );
        }
    }
}

#[test]
fn generated_tokens_carry_password_exp_and_ip() {
    let v = &vectors()[2];
    let url = v.response.as_ref().unwrap()["url"].as_str().unwrap();
    let path = url.strip_prefix("https://mfp.example.com").unwrap();
    let (token, rest) = split_path_token(path).unwrap();
    assert_eq!(rest, "/proxy/stream/video.mp4");
    let claims = decrypt_token(token, "secret").unwrap();
    assert_eq!(claims.param("api_password"), Some("secret"));
    assert_eq!(claims.param("h_User-Agent"), Some("UA"));
    assert_eq!(claims.exp, Some(v.now + 3600));
    assert_eq!(claims.ip.as_deref(), Some("203.0.113.7"));
}
