//! Fuzzes the IPTV parsers with hostile datagrams: RTP parsing and reordering, TS sync search,
//! continuity checking and random-access search must never panic, and every payload range
//! returned must lie inside the datagram.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_media::{mpegts, rtp};

fuzz_target!(|data: &[u8]| {
    let mut reorder = rtp::Reorder::new(16);
    let mut out = Vec::new();
    let mut continuity = mpegts::Continuity::default();
    // Treat the input as a run of datagrams, each prefixed by a one-byte length.
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        let (datagram, next) = tail.split_at(usize::from(len).min(tail.len()));
        rest = next;
        let _ = rtp::classify(datagram);
        if let Ok(p) = rtp::parse_rtp(datagram) {
            assert!(p.payload.start <= p.payload.end && p.payload.end <= datagram.len());
            reorder.push(p.header.sequence, p.payload.len(), &mut out);
        }
        continuity.check(datagram);
        if let Some(at) = mpegts::find_sync(datagram) {
            assert_eq!(datagram[at], mpegts::SYNC_BYTE);
            let _ = mpegts::find_random_access(&datagram[at..]);
        }
    }
    reorder.flush(&mut out);
    assert_eq!(reorder.held(), 0);
});
