//! Unit and property tests for TS alignment and continuity.

use super::*;
use proptest::prelude::*;

fn packet(pid: u16, cc: u8) -> [u8; PACKET_LEN] {
    let mut p = [0xffu8; PACKET_LEN];
    p[0] = SYNC_BYTE;
    p[1] = (pid >> 8) as u8 & 0x1f;
    p[2] = pid as u8;
    p[3] = 0x10 | (cc & 0x0f);
    p
}

fn keyframe(pid: u16, cc: u8) -> [u8; PACKET_LEN] {
    let mut p = packet(pid, cc);
    p[1] |= 0x40;
    p[3] = 0x30 | (cc & 0x0f);
    p[4] = 7;
    p[5] = 0x40;
    p
}

fn stream(pkts: &[[u8; PACKET_LEN]]) -> Vec<u8> {
    pkts.iter().flatten().copied().collect()
}

#[test]
fn finds_sync_after_garbage() {
    let mut buf = vec![0x47, 1, 2, 3, 0x47];
    let junk = buf.len();
    buf.extend(stream(&[packet(1, 0), packet(1, 1), packet(1, 2)]));
    assert_eq!(find_sync(&buf), Some(junk));
    assert_eq!(find_sync(&buf[..100]), None);
    assert!(is_aligned(&buf[junk..]));
    assert!(!is_aligned(&buf));
}

#[test]
fn finds_random_access_point() {
    let buf = stream(&[packet(256, 0), packet(256, 1), keyframe(256, 2)]);
    assert_eq!(find_random_access(&buf), Some(2 * PACKET_LEN));
    let h = parse_header(&buf[2 * PACKET_LEN..]).unwrap();
    assert!(h.random_access && h.payload_unit_start && h.has_payload);
    assert_eq!(find_random_access(&buf[..PACKET_LEN]), None);
}

#[test]
fn counts_continuity_errors_per_pid() {
    let mut c = Continuity::default();
    let ok = stream(&[
        packet(1, 14),
        packet(2, 3),
        packet(1, 15),
        packet(1, 0),
        packet(2, 4),
    ]);
    assert_eq!(c.check(&ok), 0);
    // Legal duplicate, then a gap on PID 1; PID 2 unaffected.
    let bad = stream(&[packet(1, 0), packet(1, 2), packet(2, 5)]);
    assert_eq!(c.check(&bad), 1);
    // Null packets and flagged discontinuities are not errors.
    let mut disc = keyframe(1, 9);
    disc[5] |= 0x80;
    assert_eq!(
        c.check(&stream(&[packet(NULL_PID, 3), disc, packet(1, 10)])),
        0
    );
    assert_eq!(c.errors(), 1);
    assert_eq!(c.packets(), 11);
}

proptest! {
    #[test]
    fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..1000)) {
        let mut c = Continuity::default();
        c.check(&bytes);
        if let Some(at) = find_sync(&bytes) {
            prop_assert_eq!(bytes[at], SYNC_BYTE);
        }
        let _ = find_random_access(&bytes);
    }
}
