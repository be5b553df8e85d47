//! FCC signalling tests: exact bytes of each packet, both dialects, and round trips.

use super::*;
use proptest::prelude::*;

const GROUP: Ipv4Addr = Ipv4Addr::new(239, 3, 1, 1);

#[test]
fn telecom_request_bytes() {
    let p = request(
        Flavor::Telecom,
        SocketAddrV4::new(GROUP, 8000),
        40_000,
        Ipv4Addr::LOCALHOST,
    );
    assert_eq!(
        p,
        [
            0x82, 205, 0, 5, 0, 0, 0, 0, 239, 3, 1, 1, 0, 0, 0, 0, 0x9c, 0x40, 0x1f, 0x40, 239, 3,
            1, 1
        ]
    );
    assert!(is_feedback(&p));
    assert_eq!(
        parse_client(Flavor::Telecom, &p),
        Ok(ClientMessage::Request {
            group: SocketAddrV4::new(GROUP, 8000),
            client_port: 40_000,
            client_ip: None,
        })
    );
}

#[test]
fn huawei_request_bytes() {
    let p = request(
        Flavor::Huawei,
        SocketAddrV4::new(GROUP, 8000),
        40_000,
        Ipv4Addr::new(10, 1, 2, 3),
    );
    assert_eq!(p.len(), 32);
    assert_eq!(&p[..4], &[0x85, 205, 0, 7]);
    assert_eq!(&p[8..12], &[239, 3, 1, 1]);
    assert_eq!(&p[12..20], &[0; 8]);
    assert_eq!(
        &p[20..32],
        &[10, 1, 2, 3, 0x9c, 0x40, 0x80, 0, 0x20, 0, 0, 0]
    );
    assert_eq!(
        parse_client(Flavor::Huawei, &p),
        Ok(ClientMessage::Request {
            group: SocketAddrV4::new(GROUP, 0),
            client_port: 40_000,
            client_ip: Some(Ipv4Addr::new(10, 1, 2, 3)),
        })
    );
}

#[test]
fn terminations_carry_the_meeting_point_or_a_forced_stop() {
    let t = terminate(Flavor::Telecom, GROUP, Some(0x1234));
    assert_eq!(
        t,
        [0x85, 205, 0, 3, 0, 0, 0, 0, 239, 3, 1, 1, 0, 0, 0x12, 0x34]
    );
    let forced = terminate(Flavor::Telecom, GROUP, None);
    assert_eq!(forced[12], 1);
    let h = terminate(Flavor::Huawei, GROUP, Some(7));
    assert_eq!(&h[..4], &[0x89, 205, 0, 3]);
    assert_eq!(&h[12..16], &[1, 0, 0, 7]);
    assert_eq!(terminate(Flavor::Huawei, GROUP, None)[12], 2);
    for flavor in [Flavor::Telecom, Flavor::Huawei] {
        for seq in [Some(0), Some(65_535), None] {
            assert_eq!(
                parse_client(flavor, &terminate(flavor, GROUP, seq)),
                Ok(ClientMessage::Terminate {
                    first_multicast_seq: seq
                })
            );
        }
    }
}

#[test]
fn telecom_response_fields() {
    let mut p = header(3, 36, GROUP);
    p[12] = 0;
    p[13] = 2;
    p[14..16].copy_from_slice(&15_971u16.to_be_bytes());
    p[16..18].copy_from_slice(&15_972u16.to_be_bytes());
    p[20..24].copy_from_slice(&[10, 255, 14, 153]);
    p[28..32].copy_from_slice(&10_000_000u32.to_be_bytes());
    let ServerMessage::Response(r) = parse_server(Flavor::Telecom, &p).unwrap() else {
        panic!("not a response");
    };
    assert!(r.accepted(Flavor::Telecom));
    assert_eq!(r.action, Some(Action::Unicast));
    assert_eq!(r.signal_port, Some(15_971));
    assert_eq!(r.media_port, Some(15_972));
    assert_eq!(r.server, Some(Ipv4Addr::new(10, 255, 14, 153)));
    assert_eq!(r.burst_bps, 10_000_000);
    assert_eq!(response(Flavor::Telecom, GROUP, &r), p);
    assert_eq!(
        parse_server(Flavor::Telecom, &p[..20]),
        Err(FccError::Short {
            kind: "response",
            len: 20,
            need: 36
        })
    );
    assert_eq!(
        parse_server(Flavor::Telecom, &sync(Flavor::Telecom, GROUP)),
        Ok(ServerMessage::Sync)
    );
    // Huawei's sync is not a Telecom message.
    assert_eq!(
        parse_server(Flavor::Telecom, &sync(Flavor::Huawei, GROUP)),
        Err(FccError::Format(8))
    );
}

#[test]
fn huawei_response_fields_and_nat_probe() {
    let r = Response {
        result: 1,
        action: Some(Action::Unicast),
        media_port: Some(9000),
        server: Some(Ipv4Addr::new(10, 0, 0, 9)),
        nat_probe: true,
        session: 0xdead_beef,
        ..Response::default()
    };
    let p = response(Flavor::Huawei, GROUP, &r);
    assert_eq!(&p[..4], &[0x86, 205, 0, 8]);
    assert_eq!(p[12], 1);
    assert_eq!(&p[14..16], &[0, 2]);
    assert_eq!(p[24], 0x20);
    assert_eq!(
        &p[26..36],
        &[0x23, 0x28, 0xde, 0xad, 0xbe, 0xef, 10, 0, 0, 9]
    );
    assert_eq!(
        parse_server(Flavor::Huawei, &p),
        Ok(ServerMessage::Response(r))
    );
    // Accepted with "join now" fits in 16 bytes.
    let short = &response(
        Flavor::Huawei,
        GROUP,
        &Response {
            result: 1,
            action: Some(Action::JoinMulticast),
            ..Response::default()
        },
    )[..16];
    let ServerMessage::Response(j) = parse_server(Flavor::Huawei, short).unwrap() else {
        panic!()
    };
    assert_eq!(j.action, Some(Action::JoinMulticast));
    // The burst fields do not.
    assert!(matches!(
        parse_server(Flavor::Huawei, &p[..24]),
        Err(FccError::Short { need: 36, .. })
    ));
    assert_eq!(nat_probe(0xdead_beef), [0, 3, 0, 0, 0xde, 0xad, 0xbe, 0xef]);
}

#[test]
fn huawei_redirect_names_the_new_signalling_port() {
    let r = Response {
        result: 1,
        action: Some(Action::Redirect),
        signal_port: Some(8028),
        server: Some(Ipv4Addr::new(10, 0, 0, 2)),
        ..Response::default()
    };
    let ServerMessage::Response(back) =
        parse_server(Flavor::Huawei, &response(Flavor::Huawei, GROUP, &r)).unwrap()
    else {
        panic!()
    };
    assert_eq!(back.signal_port, Some(8028));
    assert_eq!(back.media_port, None);
    assert_eq!(back.server, r.server);
}

#[test]
fn rtp_is_not_feedback() {
    // RTP, payload type 77 with the marker: the same second byte as RTCP feedback.
    let mut rtp = vec![0x80, 0x80 | 77, 0, 1];
    rtp.extend_from_slice(&[0; 8]);
    rtp.extend_from_slice(&[0x47; 1316]);
    assert!(!is_feedback(&rtp));
    assert!(!is_feedback(&[0x83, 205, 0]));
    assert_eq!(
        parse_server(Flavor::Telecom, &[0x47; 40]),
        Err(FccError::NotFeedback)
    );
}

#[test]
fn flavor_names() {
    assert_eq!(Flavor::parse("Huawei"), Some(Flavor::Huawei));
    assert_eq!(Flavor::parse("zte"), Some(Flavor::Telecom));
    assert_eq!(Flavor::parse("fiberhome"), Some(Flavor::Telecom));
    assert_eq!(Flavor::parse("nokia"), None);
}

proptest! {
    /// Any bytes: parsing never panics, and a parsed response builds back to a packet that
    /// parses the same.
    #[test]
    fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..48), huawei in any::<bool>()) {
        let flavor = if huawei { Flavor::Huawei } else { Flavor::Telecom };
        let _ = parse_client(flavor, &bytes);
        let _ = is_feedback(&bytes);
        if let Ok(ServerMessage::Response(r)) = parse_server(flavor, &bytes) {
            let again = response(flavor, GROUP, &r);
            prop_assert_eq!(parse_server(flavor, &again), Ok(ServerMessage::Response(r)));
        }
    }
}
