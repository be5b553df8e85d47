use super::*;

fn parse(buf: &[u8]) -> Result<Option<(Item, usize)>, RtspError> {
    next_item(buf, Limits::default())
}

#[test]
fn response_with_body() {
    let raw = b"RTSP/1.0 200 OK\r\nCSeq: 2\r\nContent-Type: application/sdp\r\nContent-Length: 5\r\n\r\nv=0\r\n$";
    let (item, used) = parse(raw).unwrap().unwrap();
    assert_eq!(used, raw.len() - 1);
    let Item::Message(m) = item else { panic!() };
    assert_eq!(m.status, 200);
    assert_eq!(m.text, "OK");
    assert_eq!(m.cseq(), Some(2));
    assert_eq!(m.header("content-type"), Some("application/sdp"));
    assert_eq!(m.body, b"v=0\r\n");
}

#[test]
fn every_prefix_of_a_message_waits() {
    let raw = b"RTSP/1.0 401 Unauthorized\r\nCSeq: 1\r\nWWW-Authenticate: Basic realm=\"x\"\r\nContent-Length: 2\r\n\r\nab";
    for cut in 0..raw.len() {
        assert_eq!(parse(&raw[..cut]).unwrap(), None, "cut at {cut}");
    }
    assert!(parse(raw).unwrap().is_some());
}

#[test]
fn interleaved_frame() {
    let raw = [b'$', 1, 0, 3, 9, 8, 7, b'R'];
    let (item, used) = parse(&raw).unwrap().unwrap();
    assert_eq!(used, 7);
    assert_eq!(
        item,
        Item::Frame {
            channel: 1,
            payload: 4..7
        }
    );
    assert_eq!(parse(&raw[..6]).unwrap(), None);
}

#[test]
fn server_request_and_folded_header() {
    let raw = b"GET_PARAMETER rtsp://h/x RTSP/1.0\nCSeq: 7\nX-Long: a\n  b\n\n";
    let (item, used) = parse(raw).unwrap().unwrap();
    assert_eq!(used, raw.len());
    let Item::Message(m) = item else { panic!() };
    assert!(m.is_request());
    assert_eq!(m.text, "GET_PARAMETER");
    assert_eq!(m.header("x-long"), Some("a b"));
}

#[test]
fn bounds_and_garbage() {
    let big = vec![b'A'; 20_000];
    assert_eq!(parse(&big), Err(RtspError::HeadTooLarge(16 * 1024)));
    let raw = b"RTSP/1.0 200 OK\r\nContent-Length: 999999\r\n\r\n";
    assert_eq!(parse(raw), Err(RtspError::BodyTooLarge(999_999, 64 * 1024)));
    assert_eq!(parse(&[0x80, 1, 2]), Err(RtspError::Garbage(0x80)));
    assert!(matches!(
        parse(b"RTSP/1.0 2000 OK\r\n\r\n"),
        Err(RtspError::StartLine(_))
    ));
    assert!(matches!(
        parse(b"RTSP/1.0 200 OK\r\nno colon\r\n\r\n"),
        Err(RtspError::HeaderLine(_))
    ));
    assert!(matches!(
        parse(b"RTSP/1.0 200 OK\r\nContent-Length: -1\r\n\r\n"),
        Err(RtspError::ContentLength(_))
    ));
}

proptest::proptest! {
    #[test]
    fn never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
        if let Ok(Some((_, used))) = parse(&data) {
            proptest::prop_assert!(used <= data.len() && used > 0);
        }
    }
}
