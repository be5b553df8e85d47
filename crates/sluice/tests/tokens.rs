//! Encrypted tokens and the URL generators against a running sluice: path and query tokens, expiry,
//! IP binding (spoof-proof), and tokens that cannot be re-pointed.

mod support;

use support::*;

async fn post_json(url: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status().as_u16();
    use http_body_util::BodyExt;
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

async fn sluice_with_password() -> Sluice {
    let mut config = test_config();
    config.auth.api_password = "server-pw".into();
    Sluice::start(config).await
}

async fn generate(s: &Sluice, origin: &Origin, extra: serde_json::Value) -> String {
    let mut body = serde_json::json!({
        "mediaflow_proxy_url": s.url(""),
        "endpoint": "/proxy/stream",
        "destination_url": origin.url("/small"),
        "api_password": "server-pw",
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (status, json) = post_json(&s.url("/generate_url"), body).await;
    assert_eq!(status, 200, "{json}");
    json["url"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn generated_path_token_streams() {
    let origin = Origin::start().await;
    let s = sluice_with_password().await;
    let url = generate(&s, &origin, serde_json::json!({"expiration": 3600})).await;
    assert!(url.contains("/_token_"), "{url}");
    assert!(!url.contains("server-pw"));
    let r = get(&url).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), "hello");
    // The same token as ?token= works too.
    let (base, rest) = url.split_once("/_token_").unwrap();
    let (token, path) = rest.split_once('/').unwrap();
    let r = get(&format!("{base}/{path}?token={token}")).await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn token_params_cannot_be_overridden() {
    let origin = Origin::start().await;
    let s = sluice_with_password().await;
    let url = generate(&s, &origin, serde_json::json!({})).await;
    // The generated token is sealed: it fixes `d`, and a request that sets it again is refused
    // (a MediaFlow token let the token's `d` win and served it).
    let r = get(&format!("{url}?d={}", enc(&origin.url("/big")))).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.body.unwrap(), r#"{"detail":"invalid token"}"#);
    assert!(origin.seen_path("/big").is_empty());
}

/// `(origin, token, path after the token)` of a generated path-token URL.
fn split_url(url: &str) -> (&str, &str, &str) {
    let (base, rest) = url.split_once("/_token_").unwrap();
    let at = rest.find('/').unwrap();
    (base, &rest[..at], &rest[at..])
}

#[tokio::test]
async fn generated_url_with_this_servers_password_is_sealed_and_scoped() {
    use sluice_media::token::sealed::{SealedKey, SEALED_PREFIX};
    let origin = Origin::start().await;
    let s = sluice_with_password().await;
    let url = generate(
        &s,
        &origin,
        serde_json::json!({
            "destination_url": origin.url("/big"),
            "filename": "movie.mp4",
            "expiration": 3600,
            "request_headers": {"X-Test": "from-token"},
            "response_headers": {"X-Shown": "yes"},
        }),
    )
    .await;
    let (base, token, path) = split_url(&url);
    assert_eq!(base, s.url(""));
    assert_eq!(path, "/proxy/stream/movie.mp4");
    // Sealed (AEAD) and not MediaFlow's format: nothing decrypts under the padded-password key.
    assert!(token.starts_with(SEALED_PREFIX), "{url}");
    let mediaflow = sluice_media::token::TokenKey::new("server-pw");
    assert!(mediaflow.decrypt(token).is_err());
    let bare = &token[SEALED_PREFIX.len()..];
    assert!(mediaflow
        .decrypt(bare)
        .map_or(true, |c| c.param("api_password").is_none()));
    // It holds the params without the password, opens this one path, and ends with `expiration`.
    let grant = SealedKey::derive("server-pw").open(token).unwrap();
    assert_eq!(grant.scope, vec!["/proxy/stream".to_string()]);
    assert!(grant
        .params
        .iter()
        .all(|(k, v)| k != "api_password" && !v.contains("server-pw")));
    let now = sluice::auth::token::now();
    assert!(grant.exp.is_some_and(|e| e > now + 3500 && e <= now + 3600));
    // It plays: the origin's bytes, with the token's request and response headers.
    let r = get(&url).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-shown"], "yes");
    assert_eq!(sha256(&r.body.unwrap()), sha256(&origin.big));
    let seen = origin.seen_path("/big");
    assert_eq!(seen.last().unwrap().headers["x-test"], "from-token");
    // `/generate_urls` and the deprecated endpoint seal the same way.
    let (status, json) = post_json(
        &s.url("/generate_urls"),
        serde_json::json!({"mediaflow_proxy_url": s.url(""), "api_password": "server-pw",
                           "urls": [{"endpoint": "/proxy/stream", "destination_url": origin.url("/small")},
                                    {"endpoint": "/proxy/stream", "destination_url": origin.url("/small")}]}),
    )
    .await;
    assert_eq!(status, 200);
    for url in json["urls"].as_array().unwrap() {
        let url = url.as_str().unwrap();
        assert!(split_url(url).1.starts_with(SEALED_PREFIX), "{url}");
        assert_eq!(get(url).await.body.unwrap(), "hello");
    }
    let (status, json) = post_json(
        &s.url("/generate_encrypted_or_encoded_url"),
        serde_json::json!({"mediaflow_proxy_url": s.url(""), "api_password": "server-pw",
                           "endpoint": "/proxy/stream", "destination_url": origin.url("/small")}),
    )
    .await;
    assert_eq!(status, 200);
    let url = json["encoded_url"].as_str().unwrap();
    assert!(split_url(url).1.starts_with(SEALED_PREFIX), "{url}");
    assert_eq!(get(url).await.body.unwrap(), "hello");
}

#[tokio::test]
async fn a_generated_url_is_refused_after_its_expiration() {
    let origin = Origin::start().await;
    let s = sluice_with_password().await;
    let url = generate(&s, &origin, serde_json::json!({"expiration": 1})).await;
    assert!(split_url(&url).1.starts_with("s1."), "{url}");
    assert_eq!(get(&url).await.status, 200);
    tokio::time::sleep(std::time::Duration::from_millis(2200)).await;
    let r = get(&url).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.body.unwrap(), r#"{"detail":"invalid token"}"#);
}

#[tokio::test]
async fn generate_url_with_another_password_keeps_mediaflows_format() {
    let origin = Origin::start().await;
    let s = sluice_with_password().await;
    let (status, json) = post_json(
        &s.url("/generate_url"),
        serde_json::json!({
            "mediaflow_proxy_url": "https://other.example",
            "endpoint": "/proxy/stream",
            "destination_url": origin.url("/small"),
            "filename": "a.mp4",
            "expiration": 60,
            "api_password": "other-server-pw",
        }),
    )
    .await;
    assert_eq!(status, 200);
    let url = json["url"].as_str().unwrap();
    let (base, token, path) = split_url(url);
    assert_eq!(
        (base, path),
        ("https://other.example", "/proxy/stream/a.mp4")
    );
    // MediaFlow's token for that server, as MediaFlow writes it: the password inside.
    let claims = sluice_media::token::decrypt_token(token, "other-server-pw").unwrap();
    assert_eq!(claims.param("api_password"), Some("other-server-pw"));
    assert_eq!(claims.param("d"), Some(origin.url("/small").as_str()));
    assert!(claims.exp.is_some());
    // It opens nothing here.
    let r = get(&s.url(&format!("/_token_{token}/proxy/stream"))).await;
    assert_eq!(r.status, 401);
    assert!(origin.seen_path("/small").is_empty());
}

#[tokio::test]
async fn expired_and_foreign_tokens_refused() {
    let origin = Origin::start().await;
    let s = sluice_with_password().await;
    // Bound to another IP: the one token refusal (401, as MediaFlow answers), also when
    // X-Forwarded-For claims that IP (the peer is not trusted).
    let url = generate(&s, &origin, serde_json::json!({"ip": "1.2.3.4"})).await;
    assert_eq!(get(&url).await.status, 401);
    let r = request("GET", &url, &[("x-forwarded-for", "1.2.3.4")]).await;
    assert_eq!(r.status, 401);
    // Bound to our IP: fine.
    let url = generate(&s, &origin, serde_json::json!({"ip": "127.0.0.1"})).await;
    assert_eq!(get(&url).await.status, 200);
    // Minted with the wrong password: 401.
    let (_, json) = post_json(
        &s.url("/generate_url"),
        serde_json::json!({
            "mediaflow_proxy_url": s.url(""),
            "endpoint": "/proxy/stream",
            "destination_url": origin.url("/small"),
            "api_password": "guess",
        }),
    )
    .await;
    let r = get(json["url"].as_str().unwrap()).await;
    assert_eq!(r.status, 401);
    // Garbage token: 401 with a JSON reason, no panic.
    let r = get(&s.url("/_token_%%%/proxy/stream")).await;
    assert_eq!(r.status, 401);
    let r = get(&s.url("/proxy/stream?token=AAAA")).await;
    assert_eq!(r.status, 401);
}

#[tokio::test]
async fn expired_token_is_401() {
    let key = sluice_media::token::TokenKey::new("server-pw");
    let origin = Origin::start().await;
    let s = sluice_with_password().await;
    let params = vec![
        ("d".to_string(), origin.url("/small")),
        ("api_password".to_string(), "server-pw".to_string()),
    ];
    let token = key.encrypt(&params, Some(1_000), None, [7; 16]);
    let r = get(&s.url(&format!("/_token_{token}/proxy/stream"))).await;
    assert_eq!(r.status, 401);
    let token = key.encrypt(&params, Some(4_000_000_000), None, [7; 16]);
    let r = get(&s.url(&format!("/_token_{token}/proxy/stream"))).await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn generate_endpoints_shapes() {
    let s = Sluice::start(test_config()).await;
    let (status, json) = post_json(
        &s.url("/generate_url"),
        serde_json::json!({
            "mediaflow_proxy_url": "http://proxy.example:8888",
            "endpoint": "/proxy/stream",
            "destination_url": "https://cdn.example/v.mp4",
            "request_headers": {"referer": "https://site.example/"},
        }),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        json["url"],
        "http://proxy.example:8888/proxy/stream?d=https%3A%2F%2Fcdn.example%2Fv.mp4&h_referer=https%3A%2F%2Fsite.example%2F"
    );
    let (status, json) = post_json(
        &s.url("/generate_encrypted_or_encoded_url"),
        serde_json::json!({"mediaflow_proxy_url": "http://p", "endpoint": "/proxy/stream",
                           "destination_url": "https://cdn.example/v.mp4"}),
    )
    .await;
    assert_eq!(status, 200);
    assert!(json["encoded_url"]
        .as_str()
        .unwrap()
        .starts_with("http://p/proxy/stream?d="));
    let (status, json) = post_json(
        &s.url("/generate_urls"),
        serde_json::json!({"mediaflow_proxy_url": "http://p", "api_password": "x",
                           "urls": [{"endpoint": "/proxy/stream", "destination_url": "https://a/1"},
                                    {"endpoint": "/proxy/stream", "destination_url": "https://a/2"}]}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(json["urls"].as_array().unwrap().len(), 2);
    let (status, _) = post_json(&s.url("/generate_url"), serde_json::json!({"nope": 1})).await;
    assert_eq!(status, 422);
}
