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
    let r = get(&format!("{url}?d={}", enc(&origin.url("/big")))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), "hello", "the token's d wins");
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
