//! Encrypted tokens and the URL generators against a running sluice: path and query tokens, expiry,
//! IP binding (spoof-proof), and tokens that cannot be re-pointed.

mod support;

use support::*;

async fn post_json(url: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    post_json_with(url, &[], body).await
}

/// [`post_json`] with `fields` in the request head too.
async fn post_json_with(
    url: &str,
    fields: &[(&str, &str)],
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let mut req = http::Request::post(url).header("content-type", "application/json");
    for (name, value) in fields {
        req = req.header(*name, *value);
    }
    let req = req
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

/// Behind a trusted front proxy that rewrites `Host` to reach sluice, a link for the public name
/// (the one the proxy forwards in `X-Forwarded-Host` or `Forwarded: host=`) is this server's and
/// gets the sealed token, which opens the stream here. From a peer that is not a trusted proxy
/// the forwarded host is not believed: the link is another server's, in MediaFlow's format.
/// Before, only `Host` was compared, and every link behind such a proxy came out in MediaFlow's;
/// then, behind two proxies that each write a host, the hosts differed and none was taken.
#[tokio::test]
async fn a_link_for_the_host_a_trusted_proxy_forwards_is_sealed() {
    use sluice_media::token::sealed::SEALED_PREFIX;
    let origin = Origin::start().await;
    let mut config = test_config();
    config.auth.api_password = "server-pw".into();
    config.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    let behind = Sluice::start(config).await;
    let direct = sluice_with_password().await;
    let body = serde_json::json!({
        "mediaflow_proxy_url": "https://media.example",
        "endpoint": "/proxy/stream",
        "destination_url": origin.url("/small"),
        "api_password": "server-pw",
    });
    let forwarded: [&[(&str, &str)]; 4] = [
        &[("x-forwarded-host", "media.example")],
        &[(
            "forwarded",
            "for=203.0.113.7;host=media.example;proto=https",
        )],
        // Two trusted proxies that each write the host they were asked for (Apache in front of
        // Apache; RFC 7239 proxies, one element each): the outermost one's is the public host.
        &[
            ("x-forwarded-for", "203.0.113.7, 127.0.0.1"),
            ("x-forwarded-host", "media.example, p2.internal"),
        ],
        &[(
            "forwarded",
            "for=203.0.113.7;host=media.example;proto=https, for=127.0.0.1;host=p2.internal",
        )],
    ];
    for chain in forwarded {
        // The Host the proxy rewrote: sluice's own address on its network.
        let mut fields = vec![("host", "10.0.0.5:8888")];
        fields.extend_from_slice(chain);
        let (status, json) =
            post_json_with(&behind.url("/generate_url"), &fields, body.clone()).await;
        assert_eq!(status, 200, "{json}");
        let url = json["url"].as_str().unwrap();
        let (base, token, path) = split_url(url);
        assert_eq!(base, "https://media.example", "{url}");
        assert!(token.starts_with(SEALED_PREFIX), "{chain:?}: {url}");
        let r = get(&behind.url(&format!("/_token_{token}{path}"))).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body.unwrap(), "hello");
        let (status, json) =
            post_json_with(&direct.url("/generate_url"), &fields, body.clone()).await;
        assert_eq!(status, 200, "{json}");
        let url = json["url"].as_str().unwrap();
        assert!(
            !split_url(url).1.starts_with(SEALED_PREFIX),
            "{chain:?}: {url}"
        );
    }
    // The forwarded host must be the link's: another name behind the same proxy is another
    // server's.
    let fields = [
        ("host", "10.0.0.5:8888"),
        ("x-forwarded-host", "other.example"),
    ];
    let (status, json) = post_json_with(&behind.url("/generate_url"), &fields, body).await;
    assert_eq!(status, 200, "{json}");
    let url = json["url"].as_str().unwrap();
    assert!(!split_url(url).1.starts_with(SEALED_PREFIX), "{url}");
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

/// `POST` of raw JSON text: `(status, body bytes, seconds taken)`.
async fn post_raw(url: &str, body: String) -> (u16, bytes::Bytes, f64) {
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let started = std::time::Instant::now();
    let resp = client.request(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, bytes, started.elapsed().as_secs_f64())
}

/// A JSON endpoint's body declared past its 256 KiB limit is refused on the head: before, the
/// refusal came only after the body, so a client declaring 10 MB and sending nothing held its
/// connection until the idle deadline and got a 408 instead of the size refusal.
#[tokio::test]
async fn a_json_body_declared_too_large_is_refused_on_its_head() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = sluice_with_password().await;
    for path in ["/generate_url", "/generate_urls", "/playlist/link"] {
        let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\napi_password: server-pw\r\n\
             Content-Type: application/json\r\n\
             Content-Length: 10000000\r\n\r\n"
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        let mut answer = vec![0u8; 4096];
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), tcp.read(&mut answer))
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer within 5 s"))
            .unwrap();
        let text = String::from_utf8_lossy(&answer[..n]);
        assert!(text.starts_with("HTTP/1.1 400"), "{path}: {text}");
        assert!(text.contains("larger than 262144 bytes"), "{path}: {text}");
    }
}

#[tokio::test]
async fn generate_urls_refuses_answers_out_of_proportion_to_the_request() {
    let s = sluice_with_password().await;
    let refused = |status: u16, body: &bytes::Bytes, secs: f64, wants: &str| {
        let head = String::from_utf8_lossy(&body[..body.len().min(200)]);
        assert_eq!(status, 413, "{} bytes: {head}", body.len());
        assert!(body.len() < 512, "{} bytes", body.len());
        let json: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(json["kind"], "request_too_large");
        let error = json["error"].as_str().unwrap();
        assert!(error.contains(wants), "{error}");
        assert!(!error.contains("server-pw"), "{error}");
        assert!(secs < 5.0, "{secs} s");
    };
    // Under each bound alone, over the answer's: an 8,000-byte base in 1,000 URLs (8 MB
    // plain). First, so that without the bounds the test fails here, not on gigabytes.
    let base = format!("http://a/{}", "A".repeat(7_990));
    let body = format!(
        r#"{{"mediaflow_proxy_url":"{base}","api_password":"server-pw","urls":[{}]}}"#,
        vec!["{}"; 1_000].join(",")
    );
    let (status, bytes, secs) = post_raw(&s.url("/generate_urls"), body.clone()).await;
    refused(status, &bytes, secs, "16777216");
    let plain = body.replace(r#""api_password":"server-pw","#, "");
    let (status, bytes, secs) = post_raw(&s.url("/generate_urls"), plain).await;
    refused(status, &bytes, secs, "16777216");
    // Too many items, each tiny.
    let body = format!(
        r#"{{"mediaflow_proxy_url":"http://a/","urls":[{}]}}"#,
        vec!["{}"; 1_001].join(",")
    );
    let (status, bytes, secs) = post_raw(&s.url("/generate_urls"), body).await;
    refused(status, &bytes, secs, "1000");
    // The reported attack, under the 256 KiB body limit: a 130 KB base and 42,000 empty items
    // (5.5 GB of URLs), without a password and with this server's (sealed tokens).
    let items = vec!["{}"; 42_000].join(",");
    let base = format!("http://a/{}", "A".repeat(130_000));
    for password in ["", r#""api_password":"server-pw","#] {
        let body = format!(r#"{{"mediaflow_proxy_url":"{base}",{password}"urls":[{items}]}}"#);
        assert!(body.len() <= 256 * 1024, "{}", body.len());
        let (status, bytes, secs) = post_raw(&s.url("/generate_urls"), body).await;
        refused(status, &bytes, secs, "mediaflow_proxy_url");
    }
    // Ordinary use still works, byte for byte, and so do 1,000 URLs.
    let (status, json) = post_json(
        &s.url("/generate_urls"),
        serde_json::json!({"mediaflow_proxy_url": "http://proxy.example:8888/",
            "urls": [
                {"endpoint": "/proxy/stream", "destination_url": "https://cdn.example/v.mp4",
                 "request_headers": {"referer": "https://site.example/"}, "filename": "a b.mp4"},
                {"endpoint": "/proxy/hls/manifest.m3u8", "destination_url": "https://cdn.example/m.m3u8",
                 "query_params": {"z": "1"}, "response_headers": {"x-a": "b"}},
                {}]}),
    )
    .await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(
        json,
        serde_json::json!({"urls": [
            "http://proxy.example:8888/proxy/stream/a%20b.mp4?d=https%3A%2F%2Fcdn.example%2Fv.mp4&h_referer=https%3A%2F%2Fsite.example%2F",
            "http://proxy.example:8888/proxy/hls/manifest.m3u8?z=1&d=https%3A%2F%2Fcdn.example%2Fm.m3u8&r_x-a=b",
            "http://proxy.example:8888"]})
    );
    let item = serde_json::json!({"endpoint": "/proxy/stream", "destination_url": "https://cdn.example/v.mp4"});
    // This server's own URL (a long path below it): its password seals the links.
    let request = serde_json::json!({"mediaflow_proxy_url": s.url("/a/long/base/path"),
        "api_password": "server-pw", "urls": vec![item; 1_000]});
    let (status, json) = post_json(&s.url("/generate_urls"), request.clone()).await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["urls"].as_array().unwrap().len(), 1_000);
    assert!(
        json["urls"][0].as_str().unwrap().contains("s1."),
        "{}",
        json["urls"][0]
    );
    // The estimate the bound is checked against holds sluice's sealed answer too (each token
    // repeats the path it opens).
    let estimate =
        sluice_media::generate::answer_estimate(&serde_json::from_value(request).unwrap());
    assert!(
        json.to_string().len() <= estimate,
        "{} > {estimate}",
        json.to_string().len()
    );
}

/// An HLS origin for the child-reuse test: `/master.m3u8` names `/v.m3u8`, which lists `/s.ts`;
/// the first `hang` requests for `/s.ts` never answer, later ones are `segment`.
async fn reuse_origin(hang: usize) -> std::net::SocketAddr {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let segments = std::sync::Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let segments = segments.clone();
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let segments = segments.clone();
                    async move {
                        let (kind, body) = match req.uri().path() {
                        "/master.m3u8" => (
                            "application/vnd.apple.mpegurl",
                            "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=100000\nv.m3u8\n",
                        ),
                        "/v.m3u8" => (
                            "application/vnd.apple.mpegurl",
                            "#EXTM3U\n#EXT-X-TARGETDURATION:4\n#EXTINF:4,\ns.ts\n#EXT-X-ENDLIST\n",
                        ),
                        _ => {
                            if segments.fetch_add(1, Ordering::SeqCst) < hang {
                                tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
                            }
                            ("video/mp2t", "segment")
                        }
                    };
                        let resp = http::Response::builder()
                            .header("content-type", kind)
                            .body(http_body_util::Full::new(bytes::Bytes::from(body)));
                        Ok::<_, std::convert::Infallible>(resp.unwrap())
                    }
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc),
            );
        }
    });
    addr
}

/// GET `url` (on sluice, at 127.0.0.1) from the loopback address `source`: status and body.
async fn get_from(source: &str, url: &str) -> (u16, String) {
    use http_body_util::BodyExt;
    let uri: http::Uri = url.parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let to = uri.authority().unwrap().as_str().parse().unwrap();
    let stream = socket.connect(to).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake::<
        _,
        http_body_util::Empty<bytes::Bytes>,
    >(hyper_util::rt::TokioIo::new(stream))
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get(uri.path_and_query().unwrap().as_str())
        .header("host", uri.authority().unwrap().as_str())
        .body(http_body_util::Empty::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The one URI line of a rewritten playlist.
fn only_uri(playlist: &str) -> String {
    let uris: Vec<&str> = playlist
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(uris.len(), 1, "{playlist}");
    uris[0].to_string()
}

#[tokio::test]
async fn child_tokens_are_per_viewer_so_one_cannot_fill_anothers_request_cap() {
    const CAP: usize = 4;
    let origin = reuse_origin(CAP).await;
    let mut config = test_config();
    config.auth.api_password = "server-pw".into();
    config.media.max_requests_per_token = CAP;
    // Every segment GET reaches the origin (no cache to answer or join it, nothing prefetched).
    config.media.cache = false;
    config.media.prefetch_segments = 0;
    let s = Sluice::start(config).await;
    let (a, b) = ("127.0.0.1", "127.0.0.2");
    let master = format!("http://{origin}/master.m3u8");
    let by_password = s.url(&format!(
        "/proxy/hls/manifest.m3u8?d={}&api_password=server-pw",
        enc(&master)
    ));
    // Viewer `who` loads the master and its variant: (variant URL, segment URL).
    let children = |who: &'static str, master_url: String| async move {
        let (status, body) = get_from(who, &master_url).await;
        assert_eq!(status, 200, "{body}");
        let variant = only_uri(&body);
        let (status, body) = get_from(who, &variant).await;
        assert_eq!(status, 200, "{body}");
        (variant, only_uri(&body))
    };
    let (variant_a, segment_a) = children(a, by_password.clone()).await;
    let (variant_b, segment_b) = children(b, by_password.clone()).await;
    // Viewer A holds CAP slow requests on its segment URL: its own next one is refused...
    let mut held = Vec::new();
    for _ in 0..CAP {
        let url = segment_a.clone();
        held.push(tokio::spawn(async move { get_from(a, &url).await }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (status, body) = get_from(a, &segment_a).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("max_requests_per_token"), "{body}");
    // ...and viewer B's segment is not.
    let (status, body) = get_from(b, &segment_b).await;
    assert_eq!((status, body.as_str()), (200, "segment"));
    for h in held {
        assert!(!h.is_finished());
        h.abort();
    }
    // Each viewer keeps its URLs across reloads; no two viewers share one.
    assert_ne!(variant_a, variant_b);
    assert_ne!(segment_a, segment_b);
    assert_eq!(
        children(a, by_password.clone()).await,
        (variant_a, segment_a)
    );
    assert_eq!(children(b, by_password).await, (variant_b, segment_b));
    // The same for token parents with the same grant (generated without `ip`, as playlist entries
    // are): one per viewer.
    let mut parents = Vec::new();
    for _ in 0..2 {
        let (status, json) = post_json(
            &s.url("/generate_url"),
            serde_json::json!({"mediaflow_proxy_url": s.url(""), "api_password": "server-pw",
                               "endpoint": "/proxy/hls/manifest.m3u8", "destination_url": master}),
        )
        .await;
        assert_eq!(status, 200, "{json}");
        parents.push(json["url"].as_str().unwrap().to_string());
    }
    let by_token_a = children(a, parents[0].clone()).await;
    let by_token_b = children(b, parents[1].clone()).await;
    assert_ne!(by_token_a.0, by_token_b.0);
    assert_ne!(by_token_a.1, by_token_b.1);
    assert_eq!(children(a, parents[0].clone()).await, by_token_a);
}

/// `/generate_urls` is open without a password, and its body was read with no deadline (the
/// connection's idle timeout does not run while a request is in flight): a client declaring
/// 1,000 bytes and sending 8 held the task and the connection for ever. Now the body has 10 s
/// without a byte (and 30 s in all) and the answer is the client's 408.
#[tokio::test]
async fn a_silent_generate_urls_body_ends_as_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = sluice_with_password().await;
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let started = std::time::Instant::now();
    conn.write_all(
        b"POST /generate_urls HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
          Content-Length: 1000\r\n\r\n{\"urls\":",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let read = async {
        let mut chunk = [0u8; 4096];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let waited = tokio::time::timeout(std::time::Duration::from_secs(15), read).await;
    let took = started.elapsed();
    assert!(waited.is_ok(), "no answer in {took:?}");
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(
        took >= std::time::Duration::from_secs(10) && took < std::time::Duration::from_secs(13),
        "{took:?}"
    );
}

/// serde built the whole `urls` list before `check_size` counted it (256 KiB of `{},` is some
/// 87,000 items, tens of megabytes): items past the bound are now skipped unbuilt, which shows as
/// an item that could not be one (`"endpoint": 5`) past the bound no longer making a 422.
#[tokio::test]
async fn generate_urls_past_the_bound_is_413_without_building_the_rest() {
    let s = sluice_with_password().await;
    let refused = |status: u16, body: &bytes::Bytes| {
        assert_eq!(status, 413, "{}", String::from_utf8_lossy(body));
        let json: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(json["kind"], "request_too_large");
        let error = json["error"].as_str().unwrap();
        assert!(error.contains("more than 1000 items"), "{error}");
    };
    let body = format!(
        r#"{{"mediaflow_proxy_url":"http://a/","urls":[{}]}}"#,
        vec!["{}"; 2_000].join(",")
    );
    let (status, bytes, _) = post_raw(&s.url("/generate_urls"), body).await;
    refused(status, &bytes);
    let mut items = vec!["{}"; 1_001];
    items.extend(vec![r#"{"endpoint":5}"#; 1_000]);
    let body = format!(
        r#"{{"mediaflow_proxy_url":"http://a/","urls":[{}]}}"#,
        items.join(",")
    );
    let (status, bytes, _) = post_raw(&s.url("/generate_urls"), body).await;
    refused(status, &bytes);
    // Within the bound such an item is still the 422 it always was.
    let body = r#"{"mediaflow_proxy_url":"http://a/","urls":[{},{"endpoint":5}]}"#;
    let (status, _, _) = post_raw(&s.url("/generate_urls"), body.to_string()).await;
    assert_eq!(status, 422);
}
