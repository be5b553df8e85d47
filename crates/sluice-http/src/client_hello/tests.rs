//! Unit and property tests for the ClientHello reader: hand-built hellos, split into up to
//! `MAX_RECORDS` records and into segments every possible way.

use super::*;
use proptest::prelude::*;

/// A ClientHello handshake message (type + u24 length + body) with the given extensions.
fn hello_message(extensions: Option<Vec<u8>>) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7u8; 32]);
    body.push(32);
    body.extend_from_slice(&[9u8; 32]);
    body.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02]);
    body.extend_from_slice(&[1, 0]);
    if let Some(ext) = extensions {
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
    }
    let mut msg = vec![1];
    msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    msg.extend_from_slice(&body);
    msg
}

fn ext(kind: u16, data: &[u8]) -> Vec<u8> {
    let mut out = kind.to_be_bytes().to_vec();
    out.extend_from_slice(&(data.len() as u16).to_be_bytes());
    out.extend_from_slice(data);
    out
}

fn sni_ext(name: &[u8]) -> Vec<u8> {
    let mut entry = vec![0];
    entry.extend_from_slice(&(name.len() as u16).to_be_bytes());
    entry.extend_from_slice(name);
    let mut list = (entry.len() as u16).to_be_bytes().to_vec();
    list.extend_from_slice(&entry);
    ext(0, &list)
}

fn alpn_ext(protos: &[&[u8]]) -> Vec<u8> {
    let mut inner = Vec::new();
    for p in protos {
        inner.push(p.len() as u8);
        inner.extend_from_slice(p);
    }
    let mut list = (inner.len() as u16).to_be_bytes().to_vec();
    list.extend_from_slice(&inner);
    ext(16, &list)
}

/// Wraps a handshake message in records of at most `max` bytes each.
fn records(msg: &[u8], max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in msg.chunks(max) {
        out.extend_from_slice(&[22, 3, 1]);
        out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

fn full_hello(name: &[u8]) -> Vec<u8> {
    let mut exts = ext(0x000a, &[0, 2, 0, 0x1d]);
    exts.extend(sni_ext(name));
    exts.extend(alpn_ext(&[b"h2", b"http/1.1"]));
    records(&hello_message(Some(exts)), 16384)
}

#[test]
fn reads_sni_and_alpn() {
    let buf = full_hello(b"Db.Example.COM");
    assert_eq!(
        parse(&buf),
        Ok(Parsed::Complete(ClientHello {
            server_name: Some("db.example.com".into()),
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        }))
    );
}

#[test]
fn no_extensions_or_no_sni() {
    let buf = records(&hello_message(None), 16384);
    assert_eq!(parse(&buf), Ok(Parsed::Complete(ClientHello::default())));
    let buf = records(&hello_message(Some(alpn_ext(&[b"h2"]))), 16384);
    let Ok(Parsed::Complete(h)) = parse(&buf) else {
        panic!()
    };
    assert_eq!(h.server_name, None);
}

#[test]
fn every_prefix_is_incomplete_and_needed_is_honest() {
    let buf = full_hello(b"a.example");
    for cut in 0..buf.len() {
        match parse(&buf[..cut]) {
            Ok(Parsed::Incomplete { needed }) => {
                assert!(
                    needed > cut && needed <= buf.len(),
                    "cut {cut} needed {needed}"
                )
            }
            other => panic!("cut {cut}: {other:?}"),
        }
    }
}

#[test]
fn garbage_is_refused_early() {
    assert_eq!(parse(b"G"), Err(Error::NotTls));
    assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(Error::NotTls));
    assert_eq!(parse(&[22, 2]), Err(Error::NotTls));
    assert_eq!(parse(b"SSH-2.0-OpenSSH_9.6\r\n"), Err(Error::NotTls));
    // A handshake record that is not a ClientHello (a ServerHello).
    assert_eq!(
        parse(&[22, 3, 3, 0, 4, 2, 0, 0, 0]),
        Err(Error::NotClientHello)
    );
    assert_eq!(
        parse(&[22, 3, 1, 0, 0]),
        Err(Error::Malformed("empty handshake record"))
    );
    // A ClientHello that claims 1 MiB.
    assert_eq!(
        parse(&[22, 3, 1, 0, 4, 1, 0x10, 0, 0]),
        Err(Error::TooLarge)
    );
}

/// A server_name that is not a DNS host name (an IP literal, `*`, a space, a non-ASCII byte, an
/// empty or over-long one) is no name: the hello parses, with its ALPN, and `server_name` is
/// `None`, as without the extension. Before, it was `Malformed` and an SNI-routing `[[tcp]]`
/// listener refused the connection as `not_tls` instead of sending it to its default upstream.
#[test]
fn an_ipv6_literal_is_no_name_and_other_odd_names_are_malformed() {
    let long = vec![b'a'; 254];
    for name in [&b"fe80::1"[..], b"[2001:db8::1]", b"::ffff:192.0.2.1"] {
        let mut exts = sni_ext(name);
        exts.extend(alpn_ext(&[b"h2"]));
        let buf = records(&hello_message(Some(exts)), 16384);
        assert_eq!(
            parse(&buf),
            Ok(Parsed::Complete(ClientHello {
                server_name: None,
                alpn: vec![b"h2".to_vec()],
            })),
            "{:?}",
            String::from_utf8_lossy(name)
        );
    }
    // An IPv4 literal is made of host-name bytes: kept as the name (no route names one).
    let v4 = records(&hello_message(Some(sni_ext(b"192.0.2.1"))), 16384);
    let Ok(Parsed::Complete(h)) = parse(&v4) else {
        panic!()
    };
    assert_eq!(h.server_name.as_deref(), Some("192.0.2.1"));
    // Any other name that is not a host name is malformed, as before: a backend reading the
    // raw name its own way (`a.example:443` as `a.example`) must not get what routing could not.
    for name in [
        &b"*"[..],
        b"*.example.com",
        b"a b",
        b"a.example:443",
        b"caf\xc3\xa9.example",
        b"",
        b".",
        &long[..],
    ] {
        let buf = records(&hello_message(Some(sni_ext(name))), 16384);
        assert_eq!(
            parse(&buf),
            Err(Error::Malformed("server_name is not a DNS host name")),
            "{:?}",
            String::from_utf8_lossy(name)
        );
    }
    // Two host names are still malformed, even when the first is no name.
    let mut entries = Vec::new();
    for name in [&b"fe80::1"[..], b"b.example"] {
        entries.push(0);
        entries.extend_from_slice(&(name.len() as u16).to_be_bytes());
        entries.extend_from_slice(name);
    }
    let mut list = (entries.len() as u16).to_be_bytes().to_vec();
    list.extend_from_slice(&entries);
    let two = records(&hello_message(Some(ext(0, &list))), 16384);
    assert_eq!(parse(&two), Err(Error::Malformed("two host names")));
}

#[test]
fn malformed_names_and_lengths() {
    let mut two = sni_ext(b"a.example");
    two.extend(sni_ext(b"b.example"));
    let twice = records(&hello_message(Some(two)), 16384);
    assert_eq!(parse(&twice), Err(Error::Malformed("server_name twice")));
    // Extension length running past the end.
    let mut msg = hello_message(Some(sni_ext(b"a.example")));
    let n = msg.len();
    msg[n - 1 - b"a.example".len() - 1] = 0xFF;
    assert!(matches!(
        parse(&records(&msg, 16384)),
        Err(Error::Malformed(_))
    ));
}

/// A hello cut into more than `MAX_RECORDS` records is refused, however small (a caller that
/// parses after every read would otherwise re-read thousands of 6-byte records thousands of
/// times); real clients use one or two.
#[test]
fn more_than_max_records_is_refused() {
    let msg = hello_message(Some(sni_ext(b"a.example")));
    // Exactly `n` records: `n - 1` of one byte, then the rest.
    let in_records = |n: usize| {
        let mut out = records(&msg[..n - 1], 1);
        out.extend(records(&msg[n - 1..], 16384));
        out
    };
    let named = |r: Result<Parsed, Error>| match r {
        Ok(Parsed::Complete(h)) => h.server_name,
        other => panic!("{other:?}"),
    };
    assert_eq!(named(parse(&in_records(2))), Some("a.example".into()));
    assert_eq!(
        named(parse(&in_records(MAX_RECORDS))),
        Some("a.example".into())
    );
    let over = in_records(MAX_RECORDS + 1);
    assert_eq!(parse(&over), Err(Error::TooManyRecords));
    // Refused as soon as the 33rd record begins, without waiting for the rest.
    assert_eq!(
        parse(&over[..6 * MAX_RECORDS + 1]),
        Err(Error::TooManyRecords)
    );
    // The attack: a hello in 1-byte records.
    assert_eq!(parse(&records(&msg, 1)), Err(Error::TooManyRecords));
}

proptest! {
    #[test]
    fn any_record_split_gives_the_same_answer(
        name in "[a-z0-9]{1,20}(\\.[a-z0-9]{1,20}){0,3}",
        record_max in 1usize..300,
    ) {
        let mut exts = sni_ext(name.as_bytes());
        exts.extend(alpn_ext(&[b"h2"]));
        let msg = hello_message(Some(exts));
        // Any split into at most MAX_RECORDS records (more is refused: see above).
        let buf = records(&msg, record_max.max(msg.len().div_ceil(MAX_RECORDS)));
        let got = parse(&buf).unwrap();
        prop_assert_eq!(got, Parsed::Complete(ClientHello { server_name: Some(name), alpn: vec![b"h2".to_vec()] }));
    }

    #[test]
    fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse(&buf);
        let mut tls = vec![22, 3, 1];
        tls.extend_from_slice(&buf);
        let _ = parse(&tls);
    }
}
