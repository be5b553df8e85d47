//! Unit tests for tokens: round trips, hostile input, claims and both JSON shapes.

use super::*;

const IV: [u8; 16] = *b"0123456789abcdef";

fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Encrypts arbitrary plaintext bytes the way a token is built, to test the parser on any JSON.
fn seal_raw(plain: &[u8], password: &str) -> String {
    let cipher = Aes256::new(&derive_key(password).into());
    let encryptor = cbc::Encryptor::<Aes256>::inner_iv_init(cipher, &IV.into());
    let mut buf = plain.to_vec();
    buf.resize((plain.len() / 16 + 1) * 16, 0);
    let sealed = encryptor
        .encrypt_padded_mut::<Pkcs7>(&mut buf, plain.len())
        .unwrap();
    let token: Vec<u8> = IV.iter().chain(sealed.iter()).copied().collect();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token)
}

#[test]
fn key_is_space_padded_or_cut_at_32_bytes() {
    assert_eq!(&derive_key("abc")[..5], b"abc  ");
    assert_eq!(derive_key(""), [b' '; 32]);
    let long = "é".repeat(20); // 40 bytes: the cut falls inside a character
    assert_eq!(derive_key(&long)[..], long.as_bytes()[..32]);
}

#[test]
fn round_trip_keeps_order_and_claims() {
    let p = params(&[
        ("d", "https://example.com/a b.m3u8"),
        ("h_User-Agent", "Mozilla/5.0 é"),
    ]);
    let token = encrypt_token(&p, Some(1_900_000_000), Some("1.2.3.4"), "secret", IV);
    let claims = decrypt_token(&token, "secret").unwrap();
    assert_eq!(claims.params, p);
    assert_eq!(claims.exp, Some(1_900_000_000));
    assert_eq!(claims.ip.as_deref(), Some("1.2.3.4"));
    assert!(!token.contains('='));
}

#[test]
fn repeated_names_behave_like_a_python_dict() {
    let p = params(&[("a", "1"), ("b", "2"), ("a", "3"), ("exp", "x")]);
    let claims = decrypt_token(&encrypt_token(&p, Some(5), None, "k", IV), "k").unwrap();
    assert_eq!(claims.params, params(&[("a", "3"), ("b", "2")]));
    assert_eq!(claims.exp, Some(5));
}

#[test]
fn hostile_tokens_are_errors_not_panics() {
    let good = encrypt_token(&params(&[("d", "x")]), None, None, "k", IV);
    assert_eq!(decrypt_token("", "k"), Err(TokenError::Length));
    assert_eq!(decrypt_token("@@@@", "k"), Err(TokenError::Encoding));
    let cut = decrypt_token(&good[..good.len() - 3], "k");
    assert!(
        matches!(cut, Err(TokenError::Encoding | TokenError::Length)),
        "{cut:?}"
    );
    assert_eq!(decrypt_token(&good[..22], "k"), Err(TokenError::Length));
    let wrong = decrypt_token(&good, "other");
    assert!(
        matches!(wrong, Err(TokenError::Padding | TokenError::Json)),
        "{wrong:?}"
    );
    assert_eq!(
        decrypt_token(&seal_raw(b"[1,2]", "k"), "k"),
        Err(TokenError::Json)
    );
    assert_eq!(
        decrypt_token(&seal_raw(b"{\"a\":", "k"), "k"),
        Err(TokenError::Json)
    );
    assert_eq!(
        decrypt_token(&seal_raw(b"\xff\xfe", "k"), "k"),
        Err(TokenError::Json)
    );
    assert_eq!(
        decrypt_token(&seal_raw(br#"{"exp":"soon"}"#, "k"), "k"),
        Err(TokenError::Claim("exp"))
    );
    assert_eq!(
        decrypt_token(&seal_raw(br#"{"ip":null}"#, "k"), "k"),
        Err(TokenError::Claim("ip"))
    );
}

#[test]
fn every_prefix_of_a_token_is_handled() {
    let good = encrypt_token(
        &params(&[("d", "https://x/y"), ("h_a", "b")]),
        Some(9),
        None,
        "k",
        IV,
    );
    for end in 0..good.len() {
        let _ = decrypt_token(&good[..end], "k");
    }
}

#[test]
fn standard_alphabet_and_padding_are_accepted() {
    let token = encrypt_token(&params(&[("d", "https://x/?a=~~~")]), None, None, "k", IV);
    let standard: String = token
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    let padded = format!("{standard}{}", "=".repeat((4 - standard.len() % 4) % 4));
    assert_eq!(decrypt_token(&padded, "k"), decrypt_token(&token, "k"));
}

#[test]
fn non_string_values_read_as_python_str() {
    let token = seal_raw(
        br#"{"d":"u","max_res":true,"n":3,"f":1.5,"z":null,"exp":17.9}"#,
        "k",
    );
    let claims = decrypt_token(&token, "k").unwrap();
    assert_eq!(
        claims.params,
        params(&[
            ("d", "u"),
            ("max_res", "True"),
            ("n", "3"),
            ("f", "1.5"),
            ("z", "None")
        ])
    );
    assert_eq!(claims.exp, Some(17));
}

#[test]
fn check_distinguishes_expiry_from_address() {
    let claims = TokenClaims {
        params: vec![],
        exp: Some(100),
        ip: Some("1.2.3.4".into()),
    };
    let here: IpAddr = "1.2.3.4".parse().unwrap();
    let mapped: IpAddr = "::ffff:1.2.3.4".parse().unwrap();
    let elsewhere: IpAddr = "5.6.7.8".parse().unwrap();
    assert_eq!(claims.check(100, Some(here)), Ok(()));
    assert_eq!(claims.check(100, Some(mapped)), Ok(()));
    assert_eq!(claims.check(101, Some(here)), Err(TokenError::Expired));
    assert_eq!(
        claims.check(100, Some(elsewhere)),
        Err(TokenError::IpMismatch)
    );
    assert_eq!(claims.check(100, None), Err(TokenError::IpMismatch));
    assert_eq!(TokenError::IpMismatch.status(), 403);
    assert_eq!(TokenError::Expired.status(), 401);
    assert_eq!(TokenClaims::default().check(u64::MAX, None), Ok(()));
}

#[test]
fn light_shape_maps_to_flat_params() {
    let plain = br#"{"destination":"https://cdn/x.m3u8","query_params":{"api_password":"pw","d":"old"},
        "request_headers":{"User-Agent":"UA","h_referer":"https://r/"},"response_headers":{"content-type":"video/mp2t"},
        "exp":null,"ip":"10.0.0.1"}"#;
    let claims = decrypt_token(&seal_raw(plain, "pw"), "pw").unwrap();
    assert_eq!(claims.param("d"), Some("https://cdn/x.m3u8"));
    assert_eq!(claims.param("api_password"), Some("pw"));
    assert_eq!(claims.param("h_User-Agent"), Some("UA"));
    assert_eq!(claims.param("h_referer"), Some("https://r/"));
    assert_eq!(claims.param("r_content-type"), Some("video/mp2t"));
    assert_eq!(claims.exp, None);
    assert_eq!(claims.ip.as_deref(), Some("10.0.0.1"));
}

#[test]
fn a_flat_destination_param_is_not_light_shape() {
    let plain = br#"{"destination":"https://cdn/x","host":"Vavoo"}"#;
    let claims = decrypt_token(&seal_raw(plain, "pw"), "pw").unwrap();
    assert_eq!(
        claims.params,
        params(&[("destination", "https://cdn/x"), ("host", "Vavoo")])
    );
}

#[test]
fn path_token_split() {
    assert_eq!(
        split_path_token("/_token_abc/proxy/stream/a.mkv"),
        Some(("abc", "/proxy/stream/a.mkv"))
    );
    assert_eq!(split_path_token("/_token_abc"), Some(("abc", "")));
    assert_eq!(split_path_token("/_token_/proxy"), Some(("", "/proxy")));
    assert_eq!(split_path_token("/proxy/stream"), None);
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_string_is_refused_or_parsed_never_a_panic(token in "\\PC{0,200}") {
            let _ = decrypt_token(&token, "k");
        }

        #[test]
        fn any_bytes_under_the_right_key_are_refused_or_parsed(plain in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decrypt_token(&seal_raw(&plain, "k"), "k");
        }

        #[test]
        fn round_trip_of_any_params(
            map in proptest::collection::btree_map("[a-z_]{1,8}", "\\PC{0,40}", 0..8),
            exp in proptest::option::of(any::<u64>()),
            password in "\\PC{0,40}",
        ) {
            let p: Vec<(String, String)> = map.into_iter().filter(|(k, _)| k != "exp" && k != "ip").collect();
            let claims = decrypt_token(&encrypt_token(&p, exp, None, &password, IV), &password).unwrap();
            prop_assert_eq!(claims.params, p);
            prop_assert_eq!(claims.exp, exp);
        }
    }
}
