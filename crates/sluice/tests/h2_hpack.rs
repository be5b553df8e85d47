//! The patched h2's response encoder (`vendor/h2`, static table and literals only, no dynamic
//! table): random header maps sent by an h2 server come out of h2's own client decoder equal,
//! and the bytes of a header block are the representations RFC 7541 names for them.

use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An h2 server on `io` that answers the first request with `status` and `fields` (no body), then
/// drives the connection until the client is done with it.
fn answer_once(
    io: tokio::io::DuplexStream,
    status: StatusCode,
    fields: HeaderMap,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut conn = h2::server::handshake(io).await.unwrap();
        let (_req, mut respond) = conn.accept().await.unwrap().unwrap();
        let mut resp = Response::new(());
        *resp.status_mut() = status;
        *resp.headers_mut() = fields;
        respond.send_response(resp, true).unwrap();
        while let Some(r) = conn.accept().await {
            if r.is_err() {
                break;
            }
        }
    })
}

/// Serves one response with `status` and `fields` from an h2 server and returns what an h2
/// client decoded, both ends in this process over an in-memory pipe.
async fn round_trip(status: StatusCode, fields: HeaderMap) -> (StatusCode, HeaderMap) {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let server = answer_once(server_io, status, fields);
    let (send, conn) = h2::client::handshake(client_io).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut send = send.ready().await.unwrap();
    let (resp, _) = send
        .send_request(Request::get("http://a/").body(()).unwrap(), true)
        .unwrap();
    let resp = resp.await.unwrap();
    drop(send);
    let (parts, _) = resp.into_parts();
    conn.abort();
    server.abort();
    (parts.status, parts.headers)
}

fn field_name() -> impl Strategy<Value = HeaderName> {
    prop_oneof![
        // Names in the static table (and two that are not), as responses carry them.
        proptest::sample::select(vec![
            "content-type",
            "date",
            "etag",
            "server",
            "set-cookie",
            "cache-control",
            "last-modified",
            "vary",
            "link",
            "location",
            "www-authenticate",
            "accept-ranges",
            "x-request-id",
            "strict-transport-security",
        ])
        .prop_map(HeaderName::from_static),
        // Any other lower-case token.
        "[a-z0-9!#$%&'*+.^_`|~-]{1,40}".prop_map(|s| HeaderName::from_bytes(s.as_bytes()).unwrap()),
    ]
    // (`content-length` is left to the byte test: h2's client holds it to the body.)
    .prop_filter("connection-specific fields are refused in HTTP/2", |n| {
        !matches!(
            n.as_str(),
            "connection"
                | "keep-alive"
                | "proxy-connection"
                | "transfer-encoding"
                | "upgrade"
                | "te"
                | "content-length"
        )
    })
}

fn field_value() -> impl Strategy<Value = HeaderValue> {
    // Visible ASCII, space, tab and obs-text (0x80-0xFF); lengths across the one- and
    // multi-byte string length prefixes; sometimes marked sensitive.
    let byte = prop_oneof![0x20u8..0x7f, Just(b'\t'), 0x80u8..=0xff];
    (
        prop_oneof![
            proptest::collection::vec(byte.clone(), 0..40),
            proptest::collection::vec(byte, 120..400),
        ],
        any::<bool>(),
    )
        .prop_map(|(bytes, sensitive)| {
            let mut v = HeaderValue::from_bytes(&bytes).unwrap();
            v.set_sensitive(sensitive);
            v
        })
}

fn header_map() -> impl Strategy<Value = HeaderMap> {
    proptest::collection::vec((field_name(), field_value()), 0..40).prop_map(|fields| {
        let mut map = HeaderMap::new();
        for (name, value) in fields {
            map.append(name, value);
        }
        map
    })
}

fn status() -> impl Strategy<Value = StatusCode> {
    prop_oneof![
        // The static table's seven, then any other.
        proptest::sample::select(vec![200u16, 204, 206, 304, 400, 404, 500]),
        200u16..600,
    ]
    .prop_map(|s| StatusCode::from_u16(s).unwrap())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_responses_decode_to_what_was_sent(status in status(), fields in header_map()) {
        let (got_status, got) = runtime().block_on(async {
            tokio::time::timeout(Duration::from_secs(10), round_trip(status, fields.clone()))
                .await
                .expect("round trip timed out")
        });
        prop_assert_eq!(got_status, status);
        prop_assert_eq!(got, fields);
    }
}

#[test]
fn a_header_block_over_one_frame_goes_out_in_continuation_frames() {
    let mut fields = HeaderMap::new();
    for i in 0..6 {
        let value = HeaderValue::from_bytes(&vec![b'a' + i as u8; 5000]).unwrap();
        fields.append(HeaderName::from_static("x-long"), value);
    }
    fields.insert("etag", HeaderValue::from_static("\"e\""));
    let (status, got) = runtime().block_on(round_trip(StatusCode::OK, fields.clone()));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got, fields);
}

// === The bytes on the wire ===

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(9 + payload.len());
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Sends a GET on stream 1 from a hand-written client (`settings` in its SETTINGS frame), has
/// the h2 server answer with `status` and `fields`, and returns the response's header block as
/// the bytes of its HEADERS frame.
async fn response_block(settings: &[u8], status: StatusCode, fields: HeaderMap) -> Vec<u8> {
    let (mut client, server_io) = tokio::io::duplex(1 << 16);
    let server = answer_once(server_io, status, fields);
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, settings));
    // :method GET, :scheme http, :path /, :authority "a" (a literal with the static name).
    let request = [0x82, 0x86, 0x84, 0x01, 0x01, b'a'];
    out.extend(frame(0x1, 0x5, 1, &request));
    client.write_all(&out).await.unwrap();

    let mut buf = BytesMut::new();
    loop {
        while buf.len() >= 9 {
            let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
            if buf.len() < 9 + len {
                break;
            }
            let (kind, stream) = (buf[3], u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]));
            buf.advance(9);
            let payload = buf.split_to(len);
            if kind == 0x1 && stream == 1 {
                server.abort();
                return payload.to_vec();
            }
        }
        let mut chunk = [0u8; 4096];
        let n = client.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the server closed before its HEADERS frame");
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn wire(settings: &[u8], status: StatusCode, fields: HeaderMap) -> Vec<u8> {
    runtime().block_on(async {
        tokio::time::timeout(
            Duration::from_secs(10),
            response_block(settings, status, fields),
        )
        .await
        .expect("no HEADERS frame")
    })
}

#[test]
fn fields_are_static_indexes_and_raw_literals_without_indexing() {
    let mut fields = HeaderMap::new();
    fields.insert("content-length", HeaderValue::from_static("5"));
    let mut cookie = HeaderValue::from_static("id=1");
    cookie.set_sensitive(true);
    fields.insert("set-cookie", cookie);
    fields.insert("x-a", HeaderValue::from_bytes(b"\xe9t\xe9").unwrap());
    let long = "v".repeat(200);
    fields.insert("server", HeaderValue::from_str(&long).unwrap());
    let mut want = vec![
        0x88, // :status 200, the static entry 8
        0x0f, 0x0d, 0x01, b'5', // content-length (28): without indexing, raw "5"
        0x1f, 0x28, 0x04, b'i', b'd', b'=', b'1', // set-cookie (55): never indexed
        0x00, 0x03, b'x', b'-', b'a', 0x03, 0xe9, b't', 0xe9, // literal name, obs-text
        0x0f, 0x27, 0x7f, 0x49, // server (54), a 200-byte value: 127 + 73
    ];
    want.extend_from_slice(long.as_bytes());
    assert_eq!(wire(&[], StatusCode::OK, fields.clone()), want);

    // The same response again on a fresh connection is the same bytes: nothing was indexed.
    assert_eq!(wire(&[], StatusCode::OK, fields), want);
}

#[test]
fn a_status_outside_the_static_table_is_a_literal_with_its_name_index() {
    let block = wire(&[], StatusCode::from_u16(302).unwrap(), HeaderMap::new());
    assert_eq!(block, [0x08, 0x03, b'3', b'0', b'2']);
    let block = wire(&[], StatusCode::NOT_FOUND, HeaderMap::new());
    assert_eq!(block, [0x8d]);
}

#[test]
fn a_peer_that_shrinks_the_table_still_gets_its_size_update() {
    // SETTINGS_HEADER_TABLE_SIZE = 0: the block opens with a dynamic table size update to 0,
    // which a decoder may require, and refers to no dynamic entry after it.
    let settings = [0x00, 0x01, 0, 0, 0, 0];
    let block = wire(&settings, StatusCode::NO_CONTENT, HeaderMap::new());
    assert_eq!(block, [0x20, 0x89]);
}

#[test]
fn many_responses_on_one_connection_each_decode_whole() {
    // Many streams on one connection, the same fields each time (which the dynamic table
    // used to turn into references to earlier entries): every one decoded equal.
    runtime().block_on(async {
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let fields = {
            let mut m = HeaderMap::new();
            m.insert(
                "date",
                HeaderValue::from_static("Wed, 02 Dec 2026 10:41:38 GMT"),
            );
            m.insert("etag", HeaderValue::from_static("\"6b0ff0fc-400\""));
            m.insert("x-served-by", HeaderValue::from_static("sluice"));
            m
        };
        let sent = fields.clone();
        let server = tokio::spawn(async move {
            let mut conn = h2::server::handshake(server_io).await.unwrap();
            while let Some(r) = conn.accept().await {
                let Ok((_req, mut respond)) = r else { break };
                let mut resp = Response::new(());
                *resp.headers_mut() = sent.clone();
                let mut body = respond.send_response(resp, false).unwrap();
                body.send_data(Bytes::from_static(b"ok"), true).unwrap();
            }
        });
        let (send, conn) = h2::client::handshake(client_io).await.unwrap();
        let conn = tokio::spawn(conn);
        for _ in 0..50 {
            let mut send = send.clone().ready().await.unwrap();
            let (resp, _) = send
                .send_request(Request::get("http://a/").body(()).unwrap(), true)
                .unwrap();
            let resp = tokio::time::timeout(Duration::from_secs(10), resp)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(resp.headers(), &fields);
        }
        conn.abort();
        server.abort();
    });
}
