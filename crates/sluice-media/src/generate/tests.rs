//! Unit tests for URL generation: MediaFlow's param order, filters and URL shapes.

use super::*;
use crate::token::decrypt_token;

const IV: [u8; 16] = [7; 16];
const NOW: u64 = 1_700_000_000;

fn request(body: &str) -> GenerateUrlRequest {
    serde_json::from_str(body).unwrap()
}

#[test]
fn plain_url_keeps_mediaflow_param_order() {
    let r = request(
        r#"{"mediaflow_proxy_url":"http://h:8888","endpoint":"/proxy/stream",
            "destination_url":"https://o/v.mp4","query_params":{"z":"1","a":"2"},
            "request_headers":{"Range":"bytes=0-","h_If-Range":"x","referer":"https://o/"},
            "propagate_response_headers":{"content-type":"video/mp4"},
            "remove_response_headers":["etag","server"]}"#,
    );
    assert_eq!(
        generate_url(&r, NOW, IV).url,
        "http://h:8888/proxy/stream?z=1&a=2&d=https%3A%2F%2Fo%2Fv.mp4&h_referer=https%3A%2F%2Fo%2F\
         &rp_content-type=video%2Fmp4&x_headers=etag%2Cserver"
    );
}

#[test]
fn password_inside_query_params_stays_plain() {
    let r = request(
        r#"{"mediaflow_proxy_url":"http://h","endpoint":"proxy/stream","query_params":{"api_password":"pw"}}"#,
    );
    assert_eq!(
        generate_url(&r, NOW, IV).url,
        "http://h/proxy/stream?api_password=pw"
    );
}

#[test]
fn top_level_password_encrypts_with_claims() {
    let r = request(
        r#"{"mediaflow_proxy_url":"http://h/","endpoint":"/proxy/hls/manifest.m3u8",
            "destination_url":"https://o/m.m3u8","api_password":"pw","expiration":60,
            "ip":"2001:db8:0:0::1","filename":"a b.m3u8"}"#,
    );
    let url = generate_url(&r, NOW, IV).url;
    let path = url.strip_prefix("http://h").unwrap();
    let (token, rest) = crate::token::split_path_token(path).unwrap();
    assert_eq!(rest, "/proxy/hls/manifest.m3u8/a%20b.m3u8");
    let claims = decrypt_token(token, "pw").unwrap();
    assert_eq!(claims.param("api_password"), Some("pw"));
    assert_eq!(claims.param("d"), Some("https://o/m.m3u8"));
    assert_eq!(claims.exp, Some(NOW + 60));
    assert_eq!(claims.ip.as_deref(), Some("2001:db8::1"));
}

#[test]
fn empty_password_and_zero_expiration_mean_none() {
    let r = request(
        r#"{"mediaflow_proxy_url":"http://h","api_password":"","expiration":0,"destination_url":"x"}"#,
    );
    assert_eq!(generate_url(&r, NOW, IV).url, "http://h?d=x");
}

#[test]
fn lax_expiration_and_bad_bodies() {
    let r = request(r#"{"mediaflow_proxy_url":"h","expiration":"30"}"#);
    assert_eq!(r.expiration, Some(30));
    let r = request(r#"{"mediaflow_proxy_url":"h","expiration":30.0}"#);
    assert_eq!(r.expiration, Some(30));
    for bad in [
        r#"{"mediaflow_proxy_url":"h","expiration":1.5}"#,
        r#"{"mediaflow_proxy_url":"h","ip":"1.2.3"}"#,
        r#"{"mediaflow_proxy_url":"h","remove_response_headers":[1]}"#,
        r#"{"endpoint":"/proxy/stream"}"#,
    ] {
        assert!(
            serde_json::from_str::<GenerateUrlRequest>(bad).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn falsy_header_values_are_dropped() {
    assert_eq!(header_param("x", &serde_json::json!(0), "r_"), None);
    assert_eq!(header_param("x", &serde_json::json!([]), "r_"), None);
    assert_eq!(
        header_param("x", &serde_json::json!(5), "r_"),
        Some("r_x".into())
    );
    assert_eq!(
        header_param("R_x", &serde_json::json!("v"), "r_"),
        Some("R_x".into())
    );
    assert_eq!(header_param("h_range", &serde_json::json!("v"), "h_"), None);
}

#[test]
fn generate_urls_draws_one_iv_per_url() {
    let r: GenerateUrlsRequest = serde_json::from_str(
        r#"{"mediaflow_proxy_url":"http://h","api_password":"pw",
            "urls":[{"destination_url":"a"},{"destination_url":"b"}]}"#,
    )
    .unwrap();
    let mut n = 0u8;
    let urls = generate_urls(&r, NOW, || {
        n += 1;
        [n; 16]
    })
    .urls;
    assert_eq!(n, 2);
    assert_ne!(urls[0][..40], urls[1][..40]);
}

fn urls_request(base: &str, password: Option<&str>, items: Vec<UrlItem>) -> GenerateUrlsRequest {
    GenerateUrlsRequest {
        mediaflow_proxy_url: base.to_owned(),
        api_password: password.map(str::to_owned),
        urls: items,
        ..GenerateUrlsRequest::default()
    }
}

#[test]
fn check_size_refuses_requests_whose_answer_would_dwarf_them() {
    // The reported attack: a 130 KB base URL and ~42,000 empty items in a 256 KiB body.
    let attack = urls_request(
        &format!("http://a/{}", "A".repeat(130_000)),
        None,
        vec![UrlItem::default(); 42_000],
    );
    assert_eq!(
        check_size(&attack),
        Err(TooLarge::Shared {
            field: "mediaflow_proxy_url",
            len: 130_009
        })
    );
    // The password is copied into every MediaFlow token.
    let long_password = "p".repeat(MAX_SHARED_LEN + 1);
    let r = urls_request("http://h", Some(&long_password), vec![UrlItem::default()]);
    assert_eq!(
        check_size(&r),
        Err(TooLarge::Shared {
            field: "api_password",
            len: MAX_SHARED_LEN + 1
        })
    );
    let r = urls_request("http://h", None, vec![UrlItem::default(); MAX_URLS + 1]);
    assert_eq!(check_size(&r), Err(TooLarge::Urls(MAX_URLS + 1)));
    // Each bound alone is not enough: an 8 KiB base in 1,000 tokens is over 16 MiB.
    let base = format!("http://h/{}", "a".repeat(MAX_SHARED_LEN - 9));
    let r = urls_request(&base, Some("pw"), vec![UrlItem::default(); MAX_URLS]);
    let estimate = answer_estimate(&r);
    assert!(estimate > MAX_ANSWER_BYTES, "{estimate}");
    assert_eq!(check_size(&r), Err(TooLarge::Answer(estimate)));
    let message = TooLarge::Answer(estimate).to_string();
    assert!(message.contains("16777216"), "{message}");
}

#[test]
fn check_size_takes_ordinary_requests_and_never_underestimates() {
    let item: UrlItem = serde_json::from_str(
        r#"{"endpoint":"/proxy/hls/manifest.m3u8","destination_url":"https://cdn.example/a/b/c.m3u8?tok=0123456789abcdef",
            "request_headers":{"referer":"https://site.example/","user-agent":"Mozilla/5.0 (X11; Linux x86_64)"},
            "query_params":{"n":[1,{"k":"v\u0001"}]},"filename":"the film.m3u8"}"#,
    )
    .unwrap();
    let ordinary = urls_request(
        "http://proxy.example:8888",
        None,
        vec![item.clone(); MAX_URLS],
    );
    assert_eq!(check_size(&ordinary), Ok(()));
    // The estimate holds the real answer, plain and encrypted, and with bytes JSON escapes.
    for (base, password) in [
        ("http://proxy.example:8888/", None),
        ("http://proxy.example:8888/", Some("pw")),
        ("http://h/\u{1}\"x\\", None),
        ("http://h/\u{1}\"x\\", Some("\u{1}\u{1}")),
    ] {
        let r = urls_request(base, password, vec![item.clone(), UrlItem::default()]);
        let answer = serde_json::to_string(&generate_urls(&r, NOW, || IV)).unwrap();
        assert!(
            answer_estimate(&r) >= answer.len(),
            "{base:?}: {} < {}",
            answer_estimate(&r),
            answer.len()
        );
    }
}

#[test]
fn repeated_json_keys_behave_like_a_python_dict() {
    let o: JsonObject = serde_json::from_str(r#"{"a":1,"b":2,"a":3}"#).unwrap();
    assert_eq!(
        o.0,
        vec![
            ("a".into(), serde_json::json!(3)),
            ("b".into(), serde_json::json!(2))
        ]
    );
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_base_endpoint_and_filename_build_a_url(
            base in "\\PC{0,40}",
            endpoint in proptest::option::of("\\PC{0,30}"),
            filename in proptest::option::of("\\PC{0,20}"),
            encrypt in any::<bool>(),
        ) {
            let r = GenerateUrlRequest {
                mediaflow_proxy_url: base,
                endpoint,
                filename,
                destination_url: Some("https://o/v".into()),
                api_password: encrypt.then(|| "pw".to_owned()),
                ..GenerateUrlRequest::default()
            };
            let _ = generate_url(&r, NOW, IV);
        }
    }
}
