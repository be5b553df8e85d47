use super::*;

thread_local! {
    /// Bytes `find_head_end` searched on this thread.
    pub(super) static SCANNED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn parse(buf: &[u8]) -> Result<Option<(Item, usize)>, RtspError> {
    next_item(buf, Limits::default()).map(Next::into_item)
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

/// Attack: a hostile server sends a large head and then its body a byte at a time. Once the
/// head is in, the parser names the message's whole length, so a caller that waits for it
/// parses twice (head complete, body complete) instead of once per byte.
#[test]
fn a_complete_head_names_the_whole_length() {
    let mut raw = b"RTSP/1.0 200 OK\r\nCSeq: 3\r\n".to_vec();
    for i in 0..1000 {
        raw.extend_from_slice(format!("a{i}: x\r\n").as_bytes());
    }
    raw.extend_from_slice(b"Content-Length: 4000\r\n\r\n");
    let head = raw.len();
    raw.resize(head + 4000, b'b');
    let limits = Limits::default();
    // Within the head nothing says how long the message is: one byte more.
    for cut in [0, 1, 20, head - 1] {
        assert_eq!(next_item(&raw[..cut], limits), Ok(Next::NeedMore(cut + 1)));
    }
    // The head is in: the whole length, wherever the body stands.
    for cut in [head, head + 1, head + 3999] {
        assert_eq!(
            next_item(&raw[..cut], limits),
            Ok(Next::NeedMore(raw.len()))
        );
    }
    // A caller that parses only once the buffer holds what the last parse asked for.
    let (mut parses, mut need, mut got) = (0, 0, None);
    for cut in head..=raw.len() {
        if cut < need {
            continue;
        }
        parses += 1;
        match next_item(&raw[..cut], limits).unwrap() {
            Next::NeedMore(n) => need = n,
            Next::Item(item, used) => {
                got = Some((item, used));
                break;
            }
        }
    }
    assert_eq!(parses, 2);
    let (Item::Message(m), used) = got.unwrap() else {
        panic!("not a message")
    };
    assert_eq!((used, m.body.len(), m.cseq()), (raw.len(), 4000, Some(3)));
}

/// Attack: a hostile server sends a 16 KiB head a byte per TCP segment. A caller that keeps
/// `scanned` has the head searched once over, not again from its start on every byte (which
/// was ~134 M bytes searched for one head), and gets the same message as from one read; the
/// item after it starts afresh.
#[test]
fn a_trickled_head_is_searched_once() {
    let mut raw = b"RTSP/1.0 200 OK\r\nCSeq: 4\r\n".to_vec();
    while raw.len() < 16 * 1024 - 32 {
        raw.extend_from_slice(b"a:b\r\n");
    }
    raw.extend_from_slice(b"Content-Length: 2\r\n\r\nok");
    let whole = next_item(&raw, Limits::default()).unwrap();
    // Then a message with bare newlines, its blank line also cut between reads.
    let mut second = b"RTSP/1.0 200 OK\nCSeq: 5\n".to_vec();
    for _ in 0..100 {
        second.extend_from_slice(b"a:b\n");
    }
    second.extend_from_slice(b"\n");
    let stream = [raw.as_slice(), &second].concat();
    let (mut got, mut scanned, mut at) = (Vec::new(), 0, 0);
    SCANNED.with(|s| s.set(0));
    for end in 1..=stream.len() {
        let buf = &stream[at..end];
        if let Next::Item(item, used) =
            next_item_resumed(buf, Limits::default(), &mut scanned).unwrap()
        {
            assert_eq!(scanned, 0, "reset for the next item");
            got.push((item, used));
            at += used;
        }
    }
    let searched = SCANNED.with(|s| s.get());
    assert_eq!(got.len(), 2);
    assert_eq!(Next::Item(got[0].0.clone(), got[0].1), whole);
    let Item::Message(m) = &got[1].0 else {
        panic!("not a message")
    };
    assert_eq!(
        (m.cseq(), got[1].1, at),
        (Some(5), second.len(), stream.len())
    );
    // Each byte is looked at a few times (the overlap), not once per later byte.
    assert!(searched <= 4 * stream.len(), "{searched} bytes searched");
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
    // The frame's length is known from its header on.
    let limits = Limits::default();
    assert_eq!(next_item(&raw[..2], limits), Ok(Next::NeedMore(4)));
    assert_eq!(next_item(&raw[..4], limits), Ok(Next::NeedMore(7)));
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
