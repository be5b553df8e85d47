//! Outgoing proxy routes against a real SOCKS server: SOCKS5 and SOCKS4 with names resolved by
//! sluice or by the proxy (socks5h, socks4a), MediaFlow's `transport_routes` spelling read from
//! sluice's TOML and from MediaFlow's environment variables, and the address guard through every
//! kind.
//!
//! MediaFlow Light's "SOCKS5 routes give 502 in Docker": a proxy container (a VPN's, say) knows
//! names the host's resolver does not, and a socks5h route must hand the name to the proxy
//! instead of failing to resolve it locally. Here the target `origin.test` exists only in the
//! proxy's own table, and the proxy itself is named by a host name, as in a compose file.

mod socks_support;
mod support;

use std::net::IpAddr;

use bytes::Bytes;
use sluice::config::{Config, RouteConfig};
use socks_support::{Asked, Socks};
use support::*;

const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

fn route(pattern: &str, proxy: String) -> RouteConfig {
    RouteConfig {
        pattern: pattern.into(),
        proxy,
        verify_tls: true,
    }
}

fn stream(s: &Sluice, d: &str) -> String {
    s.url(&format!("/proxy/stream?d={}", enc(d)))
}

async fn start(routes: Vec<RouteConfig>, allow_private: bool) -> Sluice {
    let mut config: Config = test_config();
    config.upstream.allow_private = allow_private;
    config.upstream.routes = routes;
    Sluice::start(config).await
}

#[tokio::test]
async fn names_only_the_proxy_knows_go_through_socks5h_and_socks4a() {
    let origin = Origin::start().await;
    let port = origin.addr.port();
    for scheme in ["socks5h", "socks4a"] {
        let proxy = Socks::start(&[("origin.test", LOOPBACK)]).await;
        // The guard stays on (a public server's setting): the origin is reached because the
        // proxy, not sluice, resolves and connects.
        let s = start(
            vec![route(
                "all://*.test",
                format!("{scheme}://localhost:{}", proxy.addr.port()),
            )],
            false,
        )
        .await;
        let r = get(&stream(&s, &format!("http://origin.test:{port}/small"))).await;
        assert_eq!(r.status, 200, "{scheme}: {:?}", r.body);
        assert_eq!(r.body.unwrap(), Bytes::from("hello"));
        let version = if scheme == "socks5h" { 5 } else { 4 };
        assert_eq!(
            proxy.asked(),
            vec![(version, Asked::Name("origin.test".into(), port))],
            "{scheme}"
        );
    }
}

#[tokio::test]
async fn the_address_guard_holds_through_remote_dns() {
    let origin = Origin::start().await;
    let port = origin.addr.port();
    let proxy = Socks::start(&[("origin.test", LOOPBACK)]).await;
    let s = start(
        vec![route(
            "all",
            format!("socks5h://127.0.0.1:{}", proxy.addr.port()),
        )],
        false,
    )
    .await;
    for d in [
        format!("http://127.0.0.1:{port}/small"),
        format!("http://[::ffff:127.0.0.1]:{port}/small"),
        format!("http://localhost:{port}/small"),
        format!("http://a.localhost:{port}/small"),
    ] {
        let r = get(&stream(&s, &d)).await;
        assert_eq!(r.status, 403, "{d}");
    }
    assert!(proxy.asked().is_empty(), "{:?}", proxy.asked());
    assert!(origin.seen_path("/small").is_empty());
}

#[tokio::test]
async fn socks5_and_socks4_with_local_names_carry_addresses() {
    let origin = Origin::start().await;
    let port = origin.addr.port();
    for (scheme, version) in [("socks5", 5), ("socks4", 4)] {
        let proxy = Socks::start(&[]).await;
        let s = start(
            vec![route(
                "all",
                format!("{scheme}://127.0.0.1:{}", proxy.addr.port()),
            )],
            true,
        )
        .await;
        let r = get(&stream(&s, &format!("http://localhost:{port}/big"))).await;
        assert_eq!(r.status, 200, "{scheme}");
        assert_eq!(sha256(&r.body.unwrap()), sha256(&origin.big), "{scheme}");
        let asked = proxy.asked();
        assert_eq!(asked.len(), 1, "{asked:?}");
        assert_eq!(asked[0].0, version);
        assert!(
            matches!(asked[0].1, Asked::Addr(a) if a.ip().is_loopback() && a.port() == port),
            "{asked:?}"
        );
    }
}

/// One routing in the three ways it can be written: sluice's `[[upstream.routes]]`, MediaFlow's
/// `transport_routes` as a TOML table (Light's file), and MediaFlow's environment variables (the
/// drop-in translation, then `Config::load` as at start-up). Each must send a name only the
/// proxy knows through SOCKS5 with remote names (socks5h), a local name through plain SOCKS5 as
/// an address, and one origin direct; the proxy sees exactly the same requests.
#[tokio::test]
async fn sluice_toml_mediaflow_toml_and_mediaflow_environment_route_alike() {
    for spelling in ["sluice", "transport_routes table", "environment"] {
        let origin = Origin::start().await;
        let port = origin.addr.port();
        let proxy = Socks::start(&[("origin.test", LOOPBACK)]).await;
        let socks5 = format!("socks5://127.0.0.1:{}", proxy.addr.port());
        let socks5h = format!("socks5h://localhost:{}", proxy.addr.port());
        let direct = format!("http://127.0.0.1:{port}");
        let mut config = match spelling {
            "sluice" => {
                let mut c = Config::default();
                c.upstream.routes = vec![
                    route("*.test", socks5h.clone()),
                    route("localhost", socks5.clone()),
                    route(&direct, String::new()),
                ];
                c
            }
            "transport_routes table" => Config::parse_file(&format!(
                r#"
                [upstream]
                proxy_url = "{socks5}"
                [upstream.transport_routes."all://*.test"]
                proxy_url = "{socks5h}"
                [upstream.transport_routes."all://localhost"]
                proxy = true
                [upstream.transport_routes."{direct}"]
                proxy = false
                "#
            ))
            .unwrap(),
            _ => {
                let json = format!(
                    r#"{{"all://*.test": {{"proxy_url": "{socks5h}"}}, "all://localhost": {{}},
                        "{direct}": {{"proxy": false}}}}"#
                );
                let t = sluice::dropin::translate(&[
                    ("APP__PROXY__PROXY_URL".to_string(), socks5.clone()),
                    ("APP__PROXY__TRANSPORT_ROUTES".to_string(), json),
                ]);
                assert!(t.notes.is_empty(), "{:?}", t.notes);
                Config::load(None, t.set, &Default::default()).unwrap()
            }
        };
        config.server.listen.clear();
        config.upstream.allow_private = true;
        config.upstream.connect_timeout_secs = 2;
        config.upstream.header_timeout_secs = 2;
        let s = Sluice::start(config).await;

        for host in ["origin.test", "localhost", "127.0.0.1"] {
            let r = get(&stream(&s, &format!("http://{host}:{port}/small"))).await;
            assert_eq!(r.status, 200, "{spelling}, {host}: {:?}", r.body);
            assert_eq!(r.body.unwrap(), Bytes::from("hello"), "{spelling}, {host}");
        }
        let asked = proxy.asked();
        assert_eq!(asked.len(), 2, "{spelling}: {asked:?}");
        assert_eq!(
            asked[0],
            (5, Asked::Name("origin.test".into(), port)),
            "{spelling}"
        );
        assert!(
            matches!(asked[1], (5, Asked::Addr(a)) if a.ip().is_loopback() && a.port() == port),
            "{spelling}: {asked:?}"
        );
        assert_eq!(origin.seen_path("/small").len(), 3, "{spelling}");
    }
}

/// MediaFlow's `TRANSPORT_ROUTES` that is not a JSON object, or that names a pattern sluice's own
/// routes already name, stops the start with a message: its hosts would otherwise go direct,
/// outside the proxy the operator meant them to use.
#[test]
fn unreadable_transport_routes_stop_the_start() {
    let load = |pairs: &[(&str, &str)]| {
        let env: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::load(None, env, &Default::default())
    };
    let e = load(&[("SLUICE_UPSTREAM_TRANSPORT_ROUTES", "{not json")]).unwrap_err();
    assert!(format!("{e:#}").contains("not a JSON object"), "{e:#}");
    let e = load(&[(
        "SLUICE_UPSTREAM_TRANSPORT_ROUTES",
        r#"{"ftp://h.example": {"proxy": false}}"#,
    )])
    .unwrap_err();
    assert!(format!("{e:#}").contains("ftp"), "{e:#}");
    let e = load(&[
        (
            "SLUICE_UPSTREAM_ROUTES",
            r#"[{ pattern = "*.example.com", proxy = "" }]"#,
        ),
        (
            "SLUICE_UPSTREAM_TRANSPORT_ROUTES",
            r#"{"all://*.example.com": {"proxy": false}}"#,
        ),
    ])
    .unwrap_err();
    assert!(format!("{e:#}").contains("in both"), "{e:#}");
}
