use super::*;
use proptest::prelude::*;

fn table(routes: &[(&str, &str, u32)]) -> RouteTable<u32> {
    RouteTable::build(
        routes
            .iter()
            .map(|(h, p, t)| (HostPattern::parse(h).unwrap(), p.to_string(), *t)),
    )
    .unwrap()
}

#[test]
fn host_patterns_parse() {
    assert_eq!(HostPattern::parse("").unwrap(), HostPattern::Any);
    assert_eq!(HostPattern::parse("*").unwrap(), HostPattern::Any);
    assert_eq!(
        HostPattern::parse("Example.COM").unwrap(),
        HostPattern::Exact("example.com".into())
    );
    assert_eq!(
        HostPattern::parse("*.example.com").unwrap(),
        HostPattern::Wildcard(".example.com".into())
    );
    for bad in ["exa mple.com", "*.", "a..b", "*.*.x", "x/y", "a:80"] {
        assert!(HostPattern::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn host_patterns_match() {
    let wild = HostPattern::parse("*.debrid.example").unwrap();
    assert!(wild.matches("api.Debrid.example"));
    assert!(wild.matches("a.b.debrid.example."));
    assert!(!wild.matches("debrid.example"));
    assert!(!wild.matches("xdebrid.example"));
    let exact = HostPattern::parse("api.example").unwrap();
    assert!(exact.matches("API.example") && !exact.matches("x.api.example"));
    assert!(HostPattern::Any.matches("anything"));
}

#[test]
fn longest_prefix_wins_and_ties_go_to_the_first() {
    let t = table(&[
        ("", "/", 1),
        ("", "/api", 2),
        ("", "/api/v2/", 3),
        ("", "/api", 4),
    ]);
    assert_eq!(t.lookup(None, "/"), Some(&1));
    assert_eq!(t.lookup(None, "/x"), Some(&1));
    assert_eq!(t.lookup(None, "/api"), Some(&2));
    assert_eq!(t.lookup(None, "/api/v1"), Some(&2));
    assert_eq!(t.lookup(None, "/apix"), Some(&1));
    assert_eq!(t.lookup(None, "/api/v2/x"), Some(&3));
    assert_eq!(t.lookup(None, "/api/v2"), Some(&2));
}

#[test]
fn exact_host_beats_wildcard_beats_any_with_fallback() {
    let t = table(&[
        ("", "/", 1),
        ("*.example.com", "/", 2),
        ("*.a.example.com", "/", 3),
        ("www.example.com", "/only", 4),
    ]);
    assert_eq!(t.lookup(Some("www.example.com"), "/only/x"), Some(&4));
    // No path of the exact host matches: the wildcard serves it.
    assert_eq!(t.lookup(Some("www.example.com"), "/other"), Some(&2));
    assert_eq!(t.lookup(Some("x.a.example.com"), "/"), Some(&3));
    assert_eq!(t.lookup(Some("X.Example.Com:8080"), "/"), Some(&2));
    // The apex is not a subdomain.
    assert_eq!(t.lookup(Some("example.com"), "/"), Some(&1));
    assert_eq!(t.lookup(None, "/"), Some(&1));
    assert!(t.serves_host("b.example.com"));
    assert!(!t.serves_host("example.org"));
}

#[test]
fn no_route_is_none() {
    let t = table(&[("a.com", "/", 1), ("", "/api/", 2)]);
    assert_eq!(t.lookup(Some("b.com"), "/"), None);
    assert_eq!(t.lookup(Some("b.com"), "/api/x"), Some(&2));
}

#[test]
fn bad_prefixes_are_refused() {
    for bad in ["api", "/a/../b", "/a b", "/a?x"] {
        assert!(
            RouteTable::build([(HostPattern::Any, bad.to_string(), 0)]).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn hosts_normalise() {
    assert_eq!(normalize_host("Example.com."), "example.com");
    assert_eq!(normalize_host("example.com:443"), "example.com");
    assert_eq!(normalize_host("[::1]:80"), "::1");
}

#[test]
fn entries_are_in_precedence_order() {
    let t = table(&[("", "/", 1), ("a.com", "/", 2), ("*.b.com", "/x", 3)]);
    let order: Vec<u32> = t.entries().into_iter().map(|(_, _, t)| *t).collect();
    assert_eq!(order, vec![2, 3, 1]);
}

proptest! {
    /// The chosen route's prefix matches, and no longer matching prefix of the same host exists.
    #[test]
    fn lookup_picks_the_longest_matching_prefix(
        prefixes in proptest::collection::vec("/[ab]{0,3}/?", 1..8),
        path in "/[ab/]{0,8}",
    ) {
        let t = RouteTable::build(prefixes.iter().enumerate().map(|(i, p)| (HostPattern::Any, p.clone(), i))).unwrap();
        match t.lookup(None, &path) {
            Some(&i) => {
                prop_assert!(prefix_matches(&prefixes[i], &path));
                for p in &prefixes {
                    if prefix_matches(p, &path) {
                        prop_assert!(p.len() <= prefixes[i].len());
                    }
                }
            }
            None => prop_assert!(!prefixes.iter().any(|p| prefix_matches(p, &path))),
        }
    }
}

proptest! {
    /// The byte check in front of the slice compare changes no answer: the rule is "`path` starts
    /// with `prefix`, at a segment boundary".
    #[test]
    fn prefix_match_is_the_segment_rule(
        prefix in "/[ab/]{0,4}",
        path in "/?[ab/]{0,6}",
    ) {
        let rule = match path.strip_prefix(prefix.as_str()) {
            None => false,
            Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
        };
        prop_assert_eq!(prefix_matches(&prefix, &path), rule);
    }
}
