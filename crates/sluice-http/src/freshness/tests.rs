//! Unit and property tests of the freshness policy, one RFC 9111 section at a time.

use super::*;
use crate::cache_control::parse_str;
use http::HeaderValue;
use std::time::UNIX_EPOCH;

fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

fn date(secs: u64) -> HeaderValue {
    HeaderValue::from_str(&httpdate::fmt_http_date(t(secs))).unwrap()
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

fn store(req: &HeaderMap, status: u16, resp: &HeaderMap) -> Result<Freshness, NotStorable> {
    storability(
        &Method::GET,
        req,
        StatusCode::from_u16(status).unwrap(),
        resp,
        t(0),
        &FreshnessPolicy::default(),
    )
}

#[test]
fn s3_methods_and_status() {
    let resp = headers(&[("cache-control", "max-age=60")]);
    let p = FreshnessPolicy::default();
    assert_eq!(
        storability(
            &Method::POST,
            &HeaderMap::new(),
            StatusCode::OK,
            &resp,
            t(0),
            &p
        ),
        Err(NotStorable::Method)
    );
    assert_eq!(
        store(&HeaderMap::new(), 500, &resp),
        Err(NotStorable::Status)
    );
    assert_eq!(store(&HeaderMap::new(), 200, &resp).unwrap().lifetime, 60);
    // 302 only with explicit freshness.
    assert_eq!(
        store(&HeaderMap::new(), 302, &HeaderMap::new()),
        Err(NotStorable::Status)
    );
    assert_eq!(store(&HeaderMap::new(), 302, &resp).unwrap().lifetime, 60);
}

#[test]
fn s3_no_store_private_set_cookie_vary_star() {
    let none = HeaderMap::new();
    assert_eq!(
        store(
            &none,
            200,
            &headers(&[("cache-control", "no-store, max-age=9")])
        ),
        Err(NotStorable::NoStore)
    );
    assert_eq!(
        store(
            &none,
            200,
            &headers(&[("cache-control", "private, max-age=9")])
        ),
        Err(NotStorable::Private)
    );
    assert_eq!(
        store(
            &none,
            200,
            &headers(&[("cache-control", "max-age=9"), ("vary", "accept, *")])
        ),
        Err(NotStorable::VaryStar)
    );
    assert_eq!(
        store(
            &none,
            200,
            &headers(&[("cache-control", "max-age=9"), ("set-cookie", "a=b")])
        ),
        Err(NotStorable::SetCookie)
    );
    // Not even `public` or `s-maxage`: the client whose request fetched it gets its cookie
    // only from an answer passed on as the origin sent it.
    for cc in ["public, max-age=9", "s-maxage=9"] {
        assert_eq!(
            store(
                &none,
                200,
                &headers(&[("cache-control", cc), ("set-cookie", "a=b")])
            ),
            Err(NotStorable::SetCookie)
        );
    }
    // A request's no-store, honoured by default.
    let req = headers(&[("cache-control", "no-store")]);
    assert_eq!(
        store(&req, 200, &headers(&[("cache-control", "max-age=9")])),
        Err(NotStorable::NoStore)
    );
}

/// The media front end's rule (`store_shared_set_cookie`): an answer with `Set-Cookie` is
/// stored when the origin marks it shared, refused otherwise; the default refuses it whatever.
#[test]
fn s3_set_cookie_on_a_shared_answer_is_stored_where_the_policy_says() {
    let media = FreshnessPolicy {
        store_shared_set_cookie: true,
        ..FreshnessPolicy::default()
    };
    let with = |policy: &FreshnessPolicy, cc: &str| {
        storability(
            &Method::GET,
            &HeaderMap::new(),
            StatusCode::OK,
            &headers(&[("cache-control", cc), ("set-cookie", "AWSALB=x")]),
            t(0),
            policy,
        )
    };
    for cc in ["public, max-age=9", "s-maxage=9"] {
        assert_eq!(with(&media, cc).map(|f| f.lifetime), Ok(9), "{cc}");
        assert_eq!(
            with(&FreshnessPolicy::default(), cc),
            Err(NotStorable::SetCookie),
            "{cc}"
        );
    }
    assert_eq!(with(&media, "max-age=9"), Err(NotStorable::SetCookie));
}

#[test]
fn s3_5_authorization() {
    let req = headers(&[("authorization", "Bearer x")]);
    assert_eq!(
        store(&req, 200, &headers(&[("cache-control", "max-age=9")])),
        Err(NotStorable::Authorization)
    );
    for ok in [
        "public, max-age=9",
        "s-maxage=9",
        "must-revalidate, max-age=9",
    ] {
        assert!(
            store(&req, 200, &headers(&[("cache-control", ok)])).is_ok(),
            "{ok}"
        );
    }
}

#[test]
fn s4_2_1_lifetime_order() {
    let none = HeaderMap::new();
    let f = store(
        &none,
        200,
        &headers(&[("cache-control", "max-age=10, s-maxage=20")]),
    )
    .unwrap();
    assert_eq!(f.lifetime, 20);
    assert!(f.must_revalidate, "s-maxage implies proxy-revalidate");
    let mut h = headers(&[]);
    h.insert(DATE, date(0));
    h.insert(EXPIRES, date(300));
    assert_eq!(store(&none, 200, &h).unwrap().lifetime, 300);
    h.insert(EXPIRES, HeaderValue::from_static("0"));
    h.insert(http::header::ETAG, HeaderValue::from_static("\"v\""));
    assert_eq!(store(&none, 200, &h).unwrap().lifetime, 0);
}

#[test]
fn s4_2_2_heuristic_with_cap() {
    let none = HeaderMap::new();
    let mut h = HeaderMap::new();
    h.insert(DATE, date(1000));
    h.insert(LAST_MODIFIED, date(0));
    assert_eq!(store(&none, 200, &h).unwrap().lifetime, 100);
    let mut h = HeaderMap::new();
    h.insert(DATE, date(100 * 24 * 3600));
    h.insert(LAST_MODIFIED, date(0));
    assert_eq!(store(&none, 200, &h).unwrap().lifetime, 24 * 3600);
    // Nothing at all: not worth storing.
    assert_eq!(
        store(&none, 200, &HeaderMap::new()),
        Err(NotStorable::NoLifetime)
    );
}

#[test]
fn heuristic_floor_for_objects_a_front_end_knows() {
    let none = HeaderMap::new();
    let p = FreshnessPolicy {
        heuristic_min: Duration::from_secs(60),
        heuristic_max: Duration::from_secs(60),
        ..FreshnessPolicy::default()
    };
    let at = |modified: u64, now: u64| {
        let mut h = HeaderMap::new();
        h.insert(DATE, date(now));
        h.insert(LAST_MODIFIED, date(modified));
        storability(&Method::GET, &none, StatusCode::OK, &h, t(now), &p)
            .unwrap()
            .lifetime
    };
    // Written just now: the floor, not 0.
    assert_eq!(at(1000, 1000), 60);
    // Old: still capped.
    assert_eq!(at(0, 100_000), 60);
    // Explicit freshness is not touched by the floor.
    let h = headers(&[("cache-control", "max-age=5")]);
    let f = storability(&Method::GET, &none, StatusCode::OK, &h, t(0), &p).unwrap();
    assert_eq!(f.lifetime, 5);
}

#[test]
fn rfc9213_targeted_field_wins_and_ignores_expires() {
    let none = HeaderMap::new();
    let mut h = headers(&[
        ("cache-control", "no-store"),
        ("cdn-cache-control", "max-age=77"),
    ]);
    h.insert(EXPIRES, date(5));
    assert_eq!(store(&none, 200, &h).unwrap().lifetime, 77);
    let mut h = headers(&[
        ("cdn-cache-control", "no-store"),
        ("cache-control", "max-age=77"),
    ]);
    h.insert(EXPIRES, date(5));
    assert_eq!(store(&none, 200, &h), Err(NotStorable::NoStore));
}

#[test]
fn s4_2_3_age() {
    let mut h = headers(&[("age", "30")]);
    h.insert(DATE, date(0));
    // Requested at 2, received at 5: response_delay 3, apparent_age 5, corrected 33.
    let clock = AgeClock::new(&h, t(2), t(5));
    assert_eq!(clock.initial_age, 33);
    assert_eq!(clock.current_age(t(15)), 43);
    // A Date in the future never makes the age negative.
    let mut h = HeaderMap::new();
    h.insert(DATE, date(100));
    assert_eq!(AgeClock::new(&h, t(0), t(0)).initial_age, 0);
}

/// RFC 9111 §1.2.2: an `Age` too large for the cache saturates (very old), never counts as 0.
#[test]
fn s1_2_2_a_huge_age_saturates() {
    let huge = headers(&[("age", "99999999999999999999999")]);
    let clock = AgeClock::new(&huge, t(0), t(0));
    assert_eq!(clock.initial_age, crate::cache_control::DELTA_SECONDS_CAP);
    let f = store(
        &HeaderMap::new(),
        200,
        &headers(&[("cache-control", "max-age=60")]),
    )
    .unwrap();
    assert!(matches!(
        decide_use(
            &f,
            clock.current_age(t(0)),
            &CacheControl::default(),
            &FreshnessPolicy::default()
        ),
        Use::Revalidate { .. }
    ));
    // A copy's lifetime cap counts from the saturated age too (not 30 s from 0).
    let p = FreshnessPolicy {
        copy_ttl_secs: std::num::NonZeroU32::new(30),
        ..FreshnessPolicy::default()
    };
    let mut h = headers(&[("cache-control", "max-age=1000000000000")]);
    h.insert(AGE, HeaderValue::from_static("99999999999999999999999"));
    let f = storability(
        &Method::GET,
        &HeaderMap::new(),
        StatusCode::OK,
        &h,
        t(0),
        &p,
    )
    .unwrap();
    assert_eq!(f.lifetime, crate::cache_control::DELTA_SECONDS_CAP);
    // Not delta-seconds: absent.
    let bad = headers(&[("age", "-5")]);
    assert_eq!(AgeClock::new(&bad, t(0), t(0)).initial_age, 0);
}

#[test]
fn rfc5861_and_grace() {
    let none = HeaderMap::new();
    let f = store(
        &none,
        200,
        &headers(&[(
            "cache-control",
            "max-age=10, stale-while-revalidate=5, stale-if-error=60",
        )]),
    )
    .unwrap();
    let p = FreshnessPolicy::default();
    let cc = CacheControl::default();
    assert_eq!(decide_use(&f, 9, &cc, &p), Use::Fresh);
    assert_eq!(decide_use(&f, 12, &cc, &p), Use::StaleWhileRevalidate);
    assert_eq!(
        decide_use(&f, 20, &cc, &p),
        Use::Revalidate {
            stale_if_error: true
        }
    );
    assert_eq!(
        decide_use(&f, 80, &cc, &p),
        Use::Revalidate {
            stale_if_error: false
        }
    );
    let p = FreshnessPolicy {
        grace: Duration::from_secs(30),
        ..FreshnessPolicy::default()
    };
    let f = storability(
        &Method::GET,
        &none,
        StatusCode::OK,
        &headers(&[("cache-control", "max-age=10")]),
        t(0),
        &p,
    )
    .unwrap();
    assert_eq!((f.stale_while_revalidate, f.stale_if_error), (30, 30));
    let f = storability(
        &Method::GET,
        &none,
        StatusCode::OK,
        &headers(&[(
            "cache-control",
            "max-age=10, must-revalidate, stale-while-revalidate=9",
        )]),
        t(0),
        &p,
    )
    .unwrap();
    assert_eq!((f.stale_while_revalidate, f.stale_if_error), (0, 0));
}

/// RFC 9111 §4.4: a response invalidated by an unsafe method is validated before reuse: no
/// `stale-while-revalidate`, no `max-stale`, even inside their windows; `stale-if-error` stays.
#[test]
fn s4_4_an_invalidated_response_is_validated_before_reuse() {
    let f = store(
        &HeaderMap::new(),
        200,
        &headers(&[(
            "cache-control",
            "max-age=60, stale-while-revalidate=600, stale-if-error=600",
        )]),
    )
    .unwrap();
    let p = FreshnessPolicy::default();
    let inv = f.invalidated();
    for cc in [
        CacheControl::default(),
        parse_str("max-stale"),
        parse_str("max-stale=3600"),
    ] {
        assert_eq!(
            decide_use(&inv, 1, &cc, &p),
            Use::Revalidate {
                stale_if_error: true
            },
            "{cc:?}"
        );
    }
    // The same response, not invalidated, is fresh.
    assert_eq!(decide_use(&f, 1, &CacheControl::default(), &p), Use::Fresh);
}

#[test]
fn s5_2_1_request_directives_by_policy() {
    let none = HeaderMap::new();
    let f = store(&none, 200, &headers(&[("cache-control", "max-age=100")])).unwrap();
    let honor = FreshnessPolicy::default();
    let ignore = FreshnessPolicy {
        request_directives: RequestDirectives::Ignore,
        ..honor.clone()
    };
    let no_cache = parse_str("no-cache");
    assert!(matches!(
        decide_use(&f, 1, &no_cache, &honor),
        Use::Revalidate { .. }
    ));
    assert_eq!(decide_use(&f, 1, &no_cache, &ignore), Use::Fresh);
    assert!(matches!(
        decide_use(&f, 50, &parse_str("max-age=10"), &honor),
        Use::Revalidate { .. }
    ));
    assert!(matches!(
        decide_use(&f, 50, &parse_str("min-fresh=60"), &honor),
        Use::Revalidate { .. }
    ));
    assert_eq!(
        decide_use(&f, 150, &parse_str("max-stale=60"), &honor),
        Use::Fresh
    );
    assert!(matches!(
        decide_use(&f, 150, &parse_str("max-stale=10"), &honor),
        Use::Revalidate { .. }
    ));
    // A response no-cache always revalidates.
    let f = store(
        &none,
        200,
        &headers(&[
            ("cache-control", "no-cache, max-age=100"),
            ("etag", "\"a\""),
        ]),
    )
    .unwrap();
    assert!(matches!(
        decide_use(&f, 1, &CacheControl::default(), &ignore),
        Use::Revalidate { .. }
    ));
}

#[test]
fn s4_1_vary() {
    let h = headers(&[
        ("vary", "Accept-Encoding, accept-language"),
        ("vary", "accept-encoding"),
    ]);
    let names = vary_names(&h).unwrap();
    assert_eq!(names.len(), 2);
    let a = variant_key(
        &names,
        &headers(&[("accept-encoding", "gzip,  br"), ("accept-language", "en")]),
    );
    let b = variant_key(
        &names,
        &headers(&[
            ("accept-encoding", "gzip"),
            ("accept-encoding", "br"),
            ("accept-language", "en"),
        ]),
    );
    let c = variant_key(
        &names,
        &headers(&[("accept-encoding", "br"), ("accept-language", "en")]),
    );
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(vary_names(&headers(&[("vary", "*")])), Err(VaryStar));
}

/// Finding: a `Vary` line with a byte past ASCII was skipped whole, and an item that is not a
/// field name dropped, so `Vary: Cookie, X-\xe9` stored the object with no `Vary`: one user's
/// variant answered everyone. Either now makes the answer unstorable, as `Vary: *` does.
#[test]
fn an_unreadable_vary_is_not_stored() {
    let lifetime = ("cache-control", "public, max-age=60");
    let mut non_ascii = headers(&[lifetime]);
    non_ascii.append(VARY, HeaderValue::from_bytes(b"Cookie, X-\xe9").unwrap());
    let mut split = headers(&[lifetime, ("vary", "accept")]);
    split.append(
        VARY,
        HeaderValue::from_bytes(b"Authorization, \xff").unwrap(),
    );
    let bad_item = headers(&[lifetime, ("vary", "Authorization, X(y)")]);
    let spaced = headers(&[lifetime, ("vary", "Cookie, Accept Language")]);
    for resp in [&non_ascii, &split, &bad_item, &spaced] {
        assert_eq!(vary_names(resp), Err(VaryStar), "{resp:?}");
        assert_eq!(
            store(&HeaderMap::new(), 200, resp),
            Err(NotStorable::VaryStar),
            "{resp:?}"
        );
    }
    // Empty list items are allowed, and the names that are there are all kept.
    let sparse = headers(&[lifetime, ("vary", ", Cookie,,accept ,"), ("vary", "")]);
    assert_eq!(
        vary_names(&sparse).unwrap(),
        vec![HeaderName::from_static("accept"), http::header::COOKIE]
    );
    assert!(store(&HeaderMap::new(), 200, &sparse).is_ok());
}

#[test]
fn a_copy_of_another_caches_object_is_capped_after_its_age() {
    let copy = FreshnessPolicy {
        copy_ttl_secs: std::num::NonZeroU32::new(10),
        ..FreshnessPolicy::default()
    };
    let life = |resp: &HeaderMap| {
        storability(
            &Method::GET,
            &HeaderMap::new(),
            StatusCode::OK,
            resp,
            t(0),
            &copy,
        )
        .map(|f| f.lifetime)
    };
    // 3600 s at the owner, 50 s old when it arrives: fresh here until 60 s of age.
    assert_eq!(
        life(&headers(&[
            ("cache-control", "max-age=3600"),
            ("age", "50")
        ])),
        Ok(60)
    );
    // Never beyond its own lifetime.
    assert_eq!(life(&headers(&[("cache-control", "max-age=5")])), Ok(5));
    assert_eq!(life(&headers(&[("cache-control", "max-age=3600")])), Ok(10));
}

proptest::proptest! {
    #[test]
    fn fresh_only_below_lifetime(lifetime in 1u64..10_000, age in 0u64..20_000) {
        let f = Freshness { lifetime, stale_while_revalidate: 0, stale_if_error: 0, must_revalidate: false, no_cache: false, targeted: false };
        let u = decide_use(&f, age, &CacheControl::default(), &FreshnessPolicy::default());
        proptest::prop_assert_eq!(u == Use::Fresh, age < lifetime);
    }
}

/// Finding: every `Vary` field was read as a comma list, through a lossy UTF-8 reading: two
/// `User-Agent`s that differ in a comma's spacing, and two values that differ in bytes that are
/// not UTF-8, shared a variant. Only the content negotiation lists are normalised now.
#[test]
fn only_list_fields_are_normalised_in_the_variant_key() {
    let ua = vec![http::header::USER_AGENT];
    let key = |name: &[HeaderName], values: &[&[u8]]| {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(name[0].clone(), HeaderValue::from_bytes(v).unwrap());
        }
        variant_key(name, &h)
    };
    assert_ne!(
        key(&ua, &[b"Mozilla/5.0 (KHTML,like Gecko)"]),
        key(&ua, &[b"Mozilla/5.0 (KHTML, like Gecko)"])
    );
    assert_ne!(key(&ua, &[b"a\xff"]), key(&ua, &[b"a\xfe"]));
    assert_ne!(key(&ua, &[b"a\xff"]), key(&ua, &[b"a%FF"]));
    assert_ne!(key(&ua, &[b"a, b"]), key(&ua, &[b"a", b"b"]));
    assert_ne!(key(&ua, &[b"a"]), key(&ua, &[b"a", b""]));
    assert_ne!(key(&ua, &[]), key(&ua, &[b""]));
    assert_eq!(key(&ua, &[b"a"]), key(&ua, &[b"a"]));
    // Origin, Cookie...: not lists either.
    let origin = vec![HeaderName::from_static("origin")];
    assert_ne!(
        key(&origin, &[b"https://a.test,x"]),
        key(&origin, &[b"https://a.test, x"])
    );
    // The negotiation lists: spacing and lines do not matter; bytes still do.
    for name in [
        "accept",
        "accept-encoding",
        "accept-language",
        "accept-charset",
    ] {
        let n = vec![HeaderName::from_static(name)];
        assert_eq!(key(&n, &[b"x, y"]), key(&n, &[b"x,y"]), "{name}");
        assert_eq!(key(&n, &[b"x, y"]), key(&n, &[b"x", b"y"]), "{name}");
        assert_ne!(key(&n, &[b"x\xff"]), key(&n, &[b"x\xfe"]), "{name}");
    }
    // Keys of ASCII list values are as they were (objects stored before still match).
    let ae = vec![http::header::ACCEPT_ENCODING];
    assert_eq!(key(&ae, &[b"gzip,  br"]), "accept-encoding:gzip,br\n");
}

/// Finding: an empty `Accept-Encoding` (identity only, RFC 9110 §12.5.3) and none at all (any
/// coding) made the same variant key, so a gzip body stored for a client that sent none was
/// served to one that asked for identity. They differ now; the usual keys are as they were.
#[test]
fn an_empty_negotiation_field_is_not_an_absent_one() {
    let ae = vec![http::header::ACCEPT_ENCODING];
    let none = variant_key(&ae, &HeaderMap::new());
    let empty = variant_key(&ae, &headers(&[("accept-encoding", "")]));
    let blank = variant_key(&ae, &headers(&[("accept-encoding", "  ")]));
    assert_ne!(none, empty);
    assert_eq!(empty, blank);
    // The absent field's key, and a listed one's, as stored objects have them.
    assert_eq!(none, "accept-encoding:\n");
    assert_eq!(
        variant_key(&ae, &headers(&[("accept-encoding", "gzip, br")])),
        "accept-encoding:gzip,br\n"
    );
    // The empty one takes no other request's variant: not `identity`, nor `gzip`.
    for other in ["identity", "gzip", ",", "%0D"] {
        assert_ne!(
            empty,
            variant_key(&ae, &headers(&[("accept-encoding", other)])),
            "{other}"
        );
    }
    for name in ["accept", "accept-language", "accept-charset"] {
        let n = vec![HeaderName::from_static(name)];
        assert_ne!(
            variant_key(&n, &HeaderMap::new()),
            variant_key(&n, &headers(&[(name, "")])),
            "{name}"
        );
    }
}
