//! `POST /generate_url`, `/generate_urls`, the deprecated `/generate_encrypted_or_encoded_url`, and
//! `/base64/{encode,decode,check}`: MediaFlow's URL helpers. They fetch nothing, so like MediaFlow's
//! they need no password; an encrypted URL is sealed with the password given in the request body.

use crate::body::Incoming;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde::Serialize;
use sluice_media::{b64url, generate};

use crate::body::{self, Body};
use crate::error::ProxyError;
use crate::request::RequestContext;

/// Largest JSON body accepted.
const BODY_LIMIT: usize = 256 * 1024;

/// Paths served here.
pub fn serves(path: &str) -> bool {
    matches!(
        path,
        "/generate_url"
            | "/generate_urls"
            | "/generate_encrypted_or_encoded_url"
            | "/proxy/generate_url"
            | "/base64/encode"
            | "/base64/decode"
            | "/base64/check"
    )
}

/// Serves one of [`serves`]' paths.
pub async fn handle(
    req: Request<Incoming>,
    ctx: &RequestContext,
) -> Result<Response<Body>, ProxyError> {
    let method = req.method().clone();
    match ctx.path.as_str() {
        "/base64/check" => Ok(json_response(&b64url::check_response(
            ctx.query.get("url").unwrap_or(""),
        ))),
        "/base64/encode" => {
            require(&method, Method::POST)?;
            let url = ctx.query.get("url").ok_or_else(|| missing("url"))?;
            Ok(json_response(&b64url::encode_response(url)))
        }
        "/base64/decode" => {
            require(&method, Method::POST)?;
            let encoded = ctx
                .query
                .get("encoded_url")
                .ok_or_else(|| missing("encoded_url"))?;
            b64url::decode_response(encoded)
                .map(|r| json_response(&r))
                .ok_or_else(|| bad("encoded_url is not base64 of a URL"))
        }
        "/generate_urls" => {
            require(&method, Method::POST)?;
            let request: generate::GenerateUrlsRequest = read_json(req).await?;
            Ok(json_response(&generate::generate_urls(
                &request,
                now(),
                random_iv,
            )))
        }
        path => {
            require(&method, Method::POST)?;
            let request: generate::GenerateUrlRequest = read_json(req).await?;
            let response = generate::generate_url(&request, now(), random_iv());
            if path == "/generate_encrypted_or_encoded_url" {
                Ok(json_response(&generate::EncodedUrlResponse::from(response)))
            } else {
                Ok(json_response(&response))
            }
        }
    }
}

pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
    req: Request<Incoming>,
) -> Result<T, ProxyError> {
    let bytes = Limited::new(req.into_body(), BODY_LIMIT)
        .collect()
        .await
        .map_err(|e| bad(&format!("cannot read the request body: {e}")))?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| {
        ProxyError::downstream(
            StatusCode::UNPROCESSABLE_ENTITY,
            "bad_request",
            format!("request body is not valid: {e}"),
        )
    })
}

pub(crate) fn json_response<T: Serialize>(value: &T) -> Response<Body> {
    let text = serde_json::to_string(value).unwrap_or_else(|_| "{}".to_string());
    let mut resp = Response::new(body::full(text));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn require(method: &Method, want: Method) -> Result<(), ProxyError> {
    if *method == want {
        Ok(())
    } else {
        Err(ProxyError::downstream(
            StatusCode::METHOD_NOT_ALLOWED,
            "method",
            format!("use {want} here"),
        ))
    }
}

fn missing(name: &str) -> ProxyError {
    bad(&format!("missing query parameter `{name}`"))
}

fn bad(message: &str) -> ProxyError {
    ProxyError::downstream(StatusCode::BAD_REQUEST, "bad_request", message.to_string())
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A fresh random IV for one token.
pub fn random_iv() -> [u8; 16] {
    let mut iv = [0u8; 16];
    getrandom::getrandom(&mut iv).expect("the OS random source is available");
    iv
}
