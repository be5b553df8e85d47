//! Unit and property tests for the PROXY protocol parser and encoder.

use super::*;
use proptest::prelude::*;

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn complete(buf: &[u8]) -> Header {
    match parse(buf).unwrap() {
        Parsed::Complete(h) => h,
        other => panic!("expected a complete header, got {other:?}"),
    }
}

#[test]
fn v1_tcp4_with_payload_after() {
    let buf = b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET / HTTP/1.1\r\n";
    let h = complete(buf);
    assert_eq!(h.version, Version::V1);
    assert_eq!(h.len, 45);
    assert_eq!(
        h.addresses,
        Addresses::Tcp {
            source: sa("192.0.2.1:56324"),
            destination: sa("198.51.100.2:443"),
        }
    );
    assert_eq!(&buf[h.len..], b"GET / HTTP/1.1\r\n");
}

#[test]
fn v1_tcp6_and_unknown() {
    let h = complete(b"PROXY TCP6 2001:db8::1 ::1 1 65535\r\n");
    assert_eq!(
        h.addresses,
        Addresses::Tcp {
            source: sa("[2001:db8::1]:1"),
            destination: sa("[::1]:65535"),
        }
    );
    assert_eq!(complete(b"PROXY UNKNOWN\r\n").addresses, Addresses::Unknown);
    assert_eq!(
        complete(b"PROXY UNKNOWN ffff::1 ::1 1 2\r\n").addresses,
        Addresses::Unknown
    );
}

#[test]
fn v1_incomplete_then_complete() {
    let full = b"PROXY TCP4 10.0.0.1 10.0.0.2 1000 2000\r\n";
    for cut in 0..full.len() {
        assert!(
            matches!(parse(&full[..cut]), Ok(Parsed::Incomplete { .. })),
            "prefix of {cut} bytes"
        );
    }
    assert_eq!(complete(full).len, full.len());
}

#[test]
fn v1_malformed() {
    for bad in [
        &b"GET / HTTP/1.1\r\n"[..],
        b"PROXY TCP4 10.0.0.1 10.0.0.2 1000\r\n",
        b"PROXY TCP4 10.0.0.1 10.0.0.2 1000 2000 extra\r\n",
        b"PROXY TCP4 ::1 10.0.0.2 1000 2000\r\n",
        b"PROXY TCP6 10.0.0.1 ::1 1000 2000\r\n",
        b"PROXY TCP4 10.0.0.1 10.0.0.2 01000 2000\r\n",
        b"PROXY TCP4 10.0.0.1 10.0.0.2 65536 2000\r\n",
        b"PROXY TCP4 10.0.0.1 10.0.0.2 -1 2000\r\n",
        b"PROXY UDP4 10.0.0.1 10.0.0.2 1 2\r\n",
        b"PROXY TCP4 10.0.0.1  10.0.0.2 1 2\r\n",
        b"PROXY TCP4 10.0.0.1 10.0.0.2 1 2\n",
    ] {
        assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
    }
    let long = [b"PROXY ".as_slice(), &[b'A'; 200]].concat();
    assert_eq!(parse(&long), Err(Error::V1TooLong));
}

#[test]
fn v2_tcp4_known_bytes() {
    let mut buf = V2_SIGNATURE.to_vec();
    buf.extend_from_slice(&[0x21, 0x11, 0x00, 0x0C]);
    buf.extend_from_slice(&[192, 0, 2, 1, 198, 51, 100, 2, 0xDC, 0x04, 0x01, 0xBB]);
    buf.extend_from_slice(b"payload");
    let h = complete(&buf);
    assert_eq!(h.version, Version::V2);
    assert_eq!(h.len, 28);
    assert_eq!(
        h.addresses,
        Addresses::Tcp {
            source: sa("192.0.2.1:56324"),
            destination: sa("198.51.100.2:443"),
        }
    );
    assert_eq!(
        buf[..28],
        encode_v2(sa("192.0.2.1:56324"), sa("198.51.100.2:443"))[..]
    );
}

#[test]
fn v2_local_tlvs_and_errors() {
    let h = complete(&encode_v2_local());
    assert_eq!((h.addresses, h.len), (Addresses::Unknown, 16));
    // TLVs after the addresses are skipped by length.
    let mut buf = encode_v2(sa("10.0.0.1:1"), sa("10.0.0.2:2"));
    buf[15] = 12 + 5;
    buf.extend_from_slice(&[0x04, 0x00, 0x02, b'h', b'i']);
    assert_eq!(complete(&buf).len, 16 + 17);
    // Short for its family, bad version, bad command.
    let mut short = V2_SIGNATURE.to_vec();
    short.extend_from_slice(&[0x21, 0x11, 0x00, 0x04, 1, 2, 3, 4]);
    assert_eq!(parse(&short), Err(Error::V2ShortAddresses));
    let mut v3 = V2_SIGNATURE.to_vec();
    v3.push(0x31);
    assert_eq!(parse(&v3), Err(Error::V2Version(3)));
    let mut cmd = V2_SIGNATURE.to_vec();
    cmd.push(0x2F);
    assert_eq!(parse(&cmd), Err(Error::V2Command(15)));
    let mut wrong = V2_SIGNATURE.to_vec();
    wrong[5] = b'X';
    assert_eq!(parse(&wrong), Err(Error::NoSignature));
}

#[test]
fn v2_incomplete_reports_needed() {
    let full = encode_v2(sa("[2001:db8::1]:80"), sa("[::1]:8080"));
    assert_eq!(full.len(), 52);
    assert_eq!(parse(&full[..5]), Ok(Parsed::Incomplete { needed: 16 }));
    assert_eq!(parse(&full[..20]), Ok(Parsed::Incomplete { needed: 52 }));
}

#[test]
fn mixed_families_become_tcp6() {
    let line = encode_v1(sa("10.0.0.1:5"), sa("[::1]:6"));
    assert_eq!(line, b"PROXY TCP6 ::ffff:10.0.0.1 ::1 5 6\r\n");
    // An IPv4-mapped client on a dual-stack listener is written as plain TCP4.
    let line = encode_v1(sa("[::ffff:10.0.0.1]:5"), sa("[::ffff:10.0.0.2]:6"));
    assert_eq!(line, b"PROXY TCP4 10.0.0.1 10.0.0.2 5 6\r\n");
}

fn any_addr() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::from((ip, p))),
        (any::<[u8; 16]>(), any::<u16>())
            .prop_map(|(ip, p)| SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)).to_canonical(), p)),
    ]
}

proptest! {
    #[test]
    fn encode_then_parse_roundtrips(s in any_addr(), d in any_addr(), tail in proptest::collection::vec(any::<u8>(), 0..32)) {
        let (us, ud) = unify(s, d);
        for (bytes, version) in [(encode_v1(s, d), Version::V1), (encode_v2(s, d), Version::V2)] {
            let n = bytes.len();
            let mut buf = bytes.clone();
            buf.extend_from_slice(&tail);
            let h = match parse(&buf).unwrap() { Parsed::Complete(h) => h, other => panic!("{other:?}") };
            prop_assert_eq!(h.len, n);
            prop_assert_eq!(h.version, version);
            prop_assert_eq!(h.addresses, Addresses::Tcp { source: us, destination: ud });
            // Every strict prefix is incomplete, never an error.
            for cut in 0..n {
                let incomplete = matches!(parse(&bytes[..cut]), Ok(Parsed::Incomplete { .. }));
                prop_assert!(incomplete, "prefix {} not incomplete", cut);
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(Parsed::Complete(h)) = parse(&buf) {
            prop_assert!(h.len <= buf.len());
        }
    }
}
