//! `POST /generate_url`, `/generate_urls`, the deprecated `/generate_encrypted_or_encoded_url`, and
//! `/base64/{encode,decode,check}`: MediaFlow's URL helpers. They fetch nothing, so like MediaFlow's
//! they need no password. A body whose `api_password` is this server's gets sluice's sealed token,
//! scoped to the URL's one path and holding no password; any other `api_password` gets MediaFlow's
//! token, byte for byte (it may be for another MediaFlow server, and opens nothing here).
//!
//! The two answers can be told apart, so the endpoint says whether a password is this server's:
//! no more than `/proxy/stream?api_password=` already says (403 or not), one guess per request,
//! and the password is compared in constant time (`auth::Auth::check`).
//!
//! `/generate_urls` is bounded before it builds anything (`generate::check_size`): 413 past 1,000
//! items, a base URL or password over 8 KiB, or an answer estimated over 16 MiB.

use std::sync::Arc;

use crate::body::Incoming;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde::Serialize;
use sluice_media::generate::SealPlan;
use sluice_media::{b64url, generate};

use crate::auth::token::{self, TokenGate, TokenScope};
use crate::auth::Keys;
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

/// Serves one of [`serves`]' paths; `keys` decide whose token a generated URL gets.
pub async fn handle(
    req: Request<Incoming>,
    ctx: &RequestContext,
    keys: &Keys,
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
            // Before anything is built: the base URL is copied into every URL, so an unbounded
            // request made gigabytes on this runtime worker.
            generate::check_size(&request).map_err(too_large)?;
            let now = token::now();
            let response = match own_gate(keys, request.api_password.as_deref()) {
                Some(gate) => generate::UrlsResponse {
                    urls: generate::plan_urls(&request, now)
                        .map_err(unsealable)?
                        .iter()
                        .map(|plan| seal(&gate, plan, now))
                        .collect(),
                },
                None => generate::generate_urls(&request, now, random_iv),
            };
            Ok(json_response(&response))
        }
        path => {
            require(&method, Method::POST)?;
            let request: generate::GenerateUrlRequest = read_json(req).await?;
            let now = token::now();
            let response = match own_gate(keys, request.api_password.as_deref()) {
                Some(gate) => generate::UrlResponse {
                    url: seal(
                        &gate,
                        &generate::plan_url(&request, now).map_err(unsealable)?,
                        now,
                    ),
                },
                None => generate::generate_url(&request, now, random_iv()),
            };
            if path == "/generate_encrypted_or_encoded_url" {
                Ok(json_response(&generate::EncodedUrlResponse::from(response)))
            } else {
                Ok(json_response(&response))
            }
        }
    }
}

/// The token gate when `offered` is this server's password (compared in constant time), so the
/// URL gets sluice's sealed token; `None` (MediaFlow's format) for any other password or none.
fn own_gate(keys: &Keys, offered: Option<&str>) -> Option<Arc<TokenGate>> {
    let credentials = keys.load();
    let offered = offered.filter(|p| !p.is_empty())?;
    let own = credentials.auth.required() && credentials.auth.check(Some(offered));
    credentials.tokens.clone().filter(|_| own)
}

/// The planned URL under a sealed token that opens its one path (nothing when it has none), with
/// the request's expiry and address, and no expiry of its own beyond that.
fn seal(gate: &TokenGate, plan: &SealPlan, now: u64) -> String {
    let limit = TokenScope {
        exp: plan.exp,
        ip: plan.ip.clone(),
        paths: None,
    };
    let scope: Vec<&str> = plan.path.as_deref().into_iter().collect();
    plan.url(&gate.mint(&plan.params, &scope, Some(&limit), false, now))
}

fn unsealable(e: sluice_media::token::TokenError) -> ProxyError {
    ProxyError::downstream(
        StatusCode::UNPROCESSABLE_ENTITY,
        "bad_request",
        format!("query_params cannot go into a token: {e}"),
    )
}

fn too_large(e: generate::TooLarge) -> ProxyError {
    ProxyError::downstream(
        StatusCode::PAYLOAD_TOO_LARGE,
        "request_too_large",
        e.to_string(),
    )
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

/// A fresh random IV for one token.
pub fn random_iv() -> [u8; 16] {
    let mut iv = [0u8; 16];
    getrandom::getrandom(&mut iv).expect("the OS random source is available");
    iv
}
