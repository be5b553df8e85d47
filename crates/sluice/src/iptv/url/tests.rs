//! Channel URL forms accepted and refused.

use super::*;

fn ok(path: &str, query: Option<&str>) -> Channel {
    parse_channel(path, query).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn accepts_every_separator() {
    for sep in [":", "%3A", "%3a", "%", "~", "+", "-", "^"] {
        let c = ok(&format!("/udp/239.1.2.3{sep}5000/"), None);
        assert_eq!(
            (c.mode, c.group, c.port),
            (Mode::Udp, "239.1.2.3".parse().unwrap(), 5000)
        );
    }
}

#[test]
fn accepts_ssm_ipv6_default_port_and_iface() {
    let c = ok("/rtp/10.0.0.1@232.1.1.1:5140", Some("token=x&iface=eth1"));
    assert_eq!(c.source, Some("10.0.0.1".parse().unwrap()));
    assert_eq!(c.interface.as_deref(), Some("eth1"));
    let c = ok("/rtp/[ff3e::1]:6000", Some("ifname=lo"));
    assert_eq!((c.group, c.port), ("ff3e::1".parse().unwrap(), 6000));
    assert_eq!(c.interface.as_deref(), Some("lo"));
    let c = ok("/rtp/[2001:db8::1]@[ff3e::1]:6000", None);
    assert_eq!(c.source, Some("2001:db8::1".parse().unwrap()));
    assert_eq!(ok("/rtp/239.0.0.1", None).port, DEFAULT_PORT);
    assert_eq!(ok("/rtp/ff3e::2", None).port, DEFAULT_PORT);
    assert_eq!(ok("/udp/@239.0.0.1:99", None).source, None);
}

#[test]
fn refuses_with_reasons() {
    let cases = [
        ("/tcp/239.1.1.1:1", UrlError::Prefix),
        ("/rtp/", UrlError::Empty),
        (
            "/rtp/10.1.1.1:5000",
            UrlError::NotMulticast("10.1.1.1".parse().unwrap()),
        ),
        ("/rtp/239.1.1.1:0", UrlError::Port("0".into())),
        ("/rtp/239.1.1.1:70000", UrlError::Port("70000".into())),
        (
            "/rtp/239.1.1:5000",
            UrlError::Address("239.1.1:5000".into()),
        ),
        ("/rtp/[ff3e::1:5000", UrlError::Bracket),
        (
            "/rtp/239.9.9.9@239.1.1.1:5",
            UrlError::BadSource("239.9.9.9".parse().unwrap()),
        ),
        (
            "/rtp/::1@239.1.1.1:5",
            UrlError::BadSource("::1".parse().unwrap()),
        ),
    ];
    for (path, want) in cases {
        assert_eq!(parse_channel(path, None), Err(want), "{path}");
    }
    assert!(matches!(
        parse_channel("/rtp/239.1.1.1:5", Some("iface=")),
        Err(UrlError::Interface(_))
    ));
}

#[test]
fn fec_port_is_parsed_and_checked() {
    let c = ok("/rtp/239.1.1.1:5000", Some("iface=lo&fec=5002"));
    assert_eq!(c.fec, Some(5002));
    assert_eq!(ok("/rtp/239.1.1.1:5000", None).fec, None);
    for bad in ["fec=0", "fec=5000", "fec=x", "fec=70000", "fec="] {
        assert!(
            matches!(
                parse_channel("/rtp/239.1.1.1:5000", Some(bad)),
                Err(UrlError::FecPort(_))
            ),
            "{bad}"
        );
    }
}

#[test]
fn fcc_server_and_type() {
    let c = ok(
        "/rtp/239.3.1.1:8000",
        Some("fcc=10.255.14.152:15970&iface=lo"),
    );
    assert_eq!(
        c.fcc,
        Some(("10.255.14.152:15970".parse().unwrap(), Flavor::Telecom))
    );
    let c = ok(
        "/rtp/239.3.1.1:8000",
        Some("fcc=10.0.0.1:8027&fcc-type=huawei"),
    );
    assert_eq!(c.fcc.map(|f| f.1), Some(Flavor::Huawei));
    let c = ok(
        "/rtp/239.3.1.1:8000",
        Some("fcc=10.0.0.1%3A8027&operator=Huawei"),
    );
    assert_eq!(c.fcc.map(|f| f.1), Some(Flavor::Huawei));
    assert_eq!(ok("/rtp/239.3.1.1:8000", Some("fcc=")).fcc, None);
    let refused = [
        ("fcc=10.0.0.1", UrlError::FccServer("10.0.0.1".into())),
        ("fcc=10.0.0.1:0", UrlError::FccServer("10.0.0.1:0".into())),
        (
            "fcc=239.1.1.1:80",
            UrlError::FccServer("239.1.1.1:80".into()),
        ),
        ("fcc=host:80", UrlError::FccServer("host:80".into())),
        (
            "fcc=10.0.0.1:80&fcc-type=nokia",
            UrlError::FccType("nokia".into()),
        ),
    ];
    for (q, want) in refused {
        assert_eq!(
            parse_channel("/rtp/239.3.1.1:8000", Some(q)),
            Err(want),
            "{q}"
        );
    }
    assert_eq!(
        parse_channel("/rtp/[ff3e::1]:8000", Some("fcc=10.0.0.1:80")),
        Err(UrlError::FccFamily)
    );
}

/// Finding (review): IPv6's permanent groups at wider scopes (site-local SSDP `ff05::c`, DHCPv6
/// servers `ff05::1:3`, NTP `ff0e::101`) were joined for any viewer, who then read the LAN's
/// announcements raw; their IPv4 equivalents were refused.
#[test]
fn control_groups_of_every_scope_are_told() {
    for control in [
        "224.0.0.251",
        "224.0.1.1",
        "239.255.255.250",
        "ff02::fb",
        "ff05::c",
        "ff05::1:3",
        "ff0e::101",
        "ff08::1",
        "ff12::1",
    ] {
        assert!(is_control_group(control.parse().unwrap()), "{control}");
    }
    for channel in [
        "239.1.1.1",
        "232.0.0.1",
        "ff1e::1",
        "ff3e::8000:1",
        "ff15::1",
    ] {
        assert!(!is_control_group(channel.parse().unwrap()), "{channel}");
    }
}

/// Finding (review): a refused address, port or interface name went back whole in the 400 (up to
/// the head limit per request); it is cut to 64 characters, as the other refusals are cut.
#[test]
fn refusals_echo_at_most_64_characters() {
    let long = "A".repeat(10_000);
    for (path, query) in [
        (format!("/rtp/{long}"), None),
        (format!("/rtp/239.1.1.1:{long}"), None),
        ("/rtp/239.1.1.1".to_string(), Some(format!("iface={long}"))),
    ] {
        let e = parse_channel(&path, query.as_deref())
            .unwrap_err()
            .to_string();
        assert!(e.len() < 200, "{} bytes: {}", e.len(), &e[..80]);
    }
}
