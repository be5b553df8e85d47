//! Generated URLs that the server seals itself instead of in MediaFlow's format: the grant (the
//! params without the password, the one path it opens, its claims) and the URL around its token.
//!
//! No I/O and no clock, like the rest of `generate`: the caller mints the token.

use super::{destination, item_parts, pyurl, request_parts, Shared, UrlParts};
use super::{GenerateUrlRequest, GenerateUrlsRequest};
use crate::token::{self, TokenError, PATH_TOKEN_PREFIX};

/// One URL to seal: what its token must grant, and where the token goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealPlan {
    /// MediaFlow's params for this URL minus `api_password`, as a holder of MediaFlow's token
    /// would be served them (non-string JSON values in Python's `str()` form).
    pub params: Vec<(String, String)>,
    /// The path after the token, which is all the token should open; `None` when the URL has
    /// no path (`http://host`), where a scope could only open everything.
    pub path: Option<String>,
    /// Unix seconds: `now + expiration` (absent or zero `expiration`: never).
    pub exp: Option<u64>,
    /// The client address the token is bound to.
    pub ip: Option<String>,
    split: pyurl::SplitUrl,
    filename: String,
}

impl SealPlan {
    /// MediaFlow's URL shape around `token`: `scheme://host/_token_<token><path>[/<filename>]`.
    pub fn url(&self, token: &str) -> String {
        let mut split = self.split.clone();
        split.path = format!("{PATH_TOKEN_PREFIX}{token}{}", split.path);
        format!("{}{}", pyurl::urlunsplit(&split), self.filename)
    }
}

/// [`super::generate_url`]'s URL, planned for the server's own token. An error only when the
/// request's `query_params` carry an `exp` or `ip` no token could hold.
pub fn plan_url(request: &GenerateUrlRequest, now: u64) -> Result<SealPlan, TokenError> {
    let destination = destination(request);
    let shared = Shared::new(
        &request.mediaflow_proxy_url,
        None,
        request.expiration,
        request.ip,
        now,
    );
    plan(&shared, &request_parts(request, destination.as_deref()))
}

/// [`super::generate_urls`]' URLs, planned for the server's own tokens.
pub fn plan_urls(request: &GenerateUrlsRequest, now: u64) -> Result<Vec<SealPlan>, TokenError> {
    let shared = Shared::new(
        &request.mediaflow_proxy_url,
        None,
        request.expiration,
        request.ip,
        now,
    );
    request
        .urls
        .iter()
        .map(|item| plan(&shared, &item_parts(item)))
        .collect()
}

fn plan(shared: &Shared<'_>, parts: &UrlParts<'_>) -> Result<SealPlan, TokenError> {
    // The object MediaFlow would encrypt, read back as MediaFlow's token would be read: the same
    // params and claims, whatever the request put where.
    let object = shared.claimed(parts.params(None));
    let claims = token::claims_of(object.entries())?;
    let params = claims
        .params
        .into_iter()
        .filter(|(name, _)| name != "api_password")
        .collect();
    let (base, filename) = shared.locate(parts);
    let split = pyurl::urlsplit(&base, "");
    let path = Some(split.path.clone()).filter(|p| !p.trim_matches('/').is_empty());
    Ok(SealPlan {
        params,
        path,
        exp: claims.exp,
        ip: claims.ip,
        split,
        filename,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000;

    #[test]
    fn a_plan_carries_mediaflows_params_without_the_password() {
        let request: GenerateUrlRequest = serde_json::from_str(
            r#"{"mediaflow_proxy_url":"https://h:8443/","endpoint":"/proxy/stream",
                "destination_url":"https://o/v.mp4","query_params":{"z":1,"api_password":"q"},
                "request_headers":{"referer":"https://o/","range":"bytes=0-"},
                "response_headers":{"x-a":"b"},"filename":"a b.mp4","api_password":"pw",
                "expiration":60,"ip":"10.0.0.1"}"#,
        )
        .unwrap();
        let plan = plan_url(&request, NOW).unwrap();
        let pairs: Vec<(&str, &str)> = plan
            .params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("z", "1"),
                ("d", "https://o/v.mp4"),
                ("h_referer", "https://o/"),
                ("r_x-a", "b")
            ]
        );
        assert_eq!(plan.path.as_deref(), Some("/proxy/stream"));
        assert_eq!(plan.exp, Some(NOW + 60));
        assert_eq!(plan.ip.as_deref(), Some("10.0.0.1"));
        assert_eq!(
            plan.url("s1.T"),
            "https://h:8443/_token_s1.T/proxy/stream/a%20b.mp4"
        );
    }

    #[test]
    fn a_url_without_a_path_has_nothing_to_scope() {
        for base in ["http://h", "http://h/", "http://h//"] {
            let request: GenerateUrlsRequest = serde_json::from_str(&format!(
                r#"{{"mediaflow_proxy_url":"{base}","urls":[{{"destination_url":"https://o/"}}]}}"#
            ))
            .unwrap();
            let plans = plan_urls(&request, NOW).unwrap();
            assert_eq!(plans[0].path, None, "{base}");
            assert_eq!(plans[0].exp, None);
        }
    }

    #[test]
    fn a_claim_no_token_could_hold_is_an_error() {
        let request: GenerateUrlRequest = serde_json::from_str(
            r#"{"mediaflow_proxy_url":"http://h","endpoint":"/proxy/stream",
                "query_params":{"ip":5}}"#,
        )
        .unwrap();
        assert_eq!(plan_url(&request, NOW), Err(TokenError::Claim("ip")));
    }
}
