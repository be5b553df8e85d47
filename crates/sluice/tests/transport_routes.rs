//! Outgoing proxy routes against a real SOCKS server: SOCKS5 and SOCKS4 with names resolved by
//! sluice or by the proxy (socks5h, socks4a), MediaFlow's `transport_routes` spelling read from
//! its environment variables, and the address guard through every kind.
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

#[tokio::test]
async fn mediaflow_environment_routes_through_socks_with_a_direct_exception() {
    let origin = Origin::start().await;
    let port = origin.addr.port();
    let proxy = Socks::start(&[("origin.test", LOOPBACK)]).await;
    // Light's issue, as its user configured it: everything through the proxy, one host direct.
    let env = |k: &str, v: String| (k.to_string(), v);
    let t = sluice::dropin::translate(&[
        env(
            "APP__PROXY__PROXY_URL",
            format!("socks5h://localhost:{}", proxy.addr.port()),
        ),
        env("APP__PROXY__ALL_PROXY", "true".into()),
        env(
            "APP__PROXY__TRANSPORT_ROUTES",
            format!(r#"{{"http://127.0.0.1:{port}": {{"proxy": false}}}}"#),
        ),
    ]);
    assert!(t.notes.is_empty(), "{:?}", t.notes);
    let (_, value) = t
        .set
        .iter()
        .find(|(k, _)| k == "SLUICE_UPSTREAM_ROUTES")
        .unwrap();
    let table: toml::Table = format!("routes = {value}").parse().unwrap();
    let routes: Vec<RouteConfig> = table["routes"].clone().try_into().unwrap();
    let s = start(routes, true).await;

    let r = get(&stream(&s, &format!("http://origin.test:{port}/small"))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), Bytes::from("hello"));
    // The exception goes direct: the proxy hears of nothing more.
    let r = get(&stream(&s, &format!("http://127.0.0.1:{port}/small"))).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        proxy.asked(),
        vec![(5, Asked::Name("origin.test".into(), port))]
    );
    assert_eq!(origin.seen_path("/small").len(), 2);
}
