//! fMP4 writer tests: the DRM fixtures (decrypted) remuxed to TS, written back as fMP4 and
//! remuxed again, compared sample by sample; segment boundaries that cut audio frames; hostile
//! input.

use super::*;
use crate::cenc::{decrypt_segment, rewrite_init};
use crate::keys::KeyRing;
use crate::mp4::{boxes, find, Tfdt, Trun};
use crate::mpegts::{parse_header, PACKET_LEN};
use crate::remux::{Codec, RemuxState, Remuxer, TIMESTAMP_OFFSET};

const DRM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/drm");

/// One fixture track (`video` or `audio`) as the two TS segments the remuxer makes of it.
fn ts_of(track: &str) -> (Remuxer, Vec<Vec<u8>>) {
    let keys = KeyRing::parse(
        Some("6d76f25cb17f5e16b8eaef6bbf582d8e,1fba7ed02bb85aa8b8c0dbf0d1ac2e7a"),
        "ce1b07f0b4c5f1b8c2a9f6ba2a8c7e41,4c2d8a6e3e5b9a7c1d0f2e4b6a8c9d1e",
    )
    .unwrap();
    let dir = format!("{DRM}/cenc/{track}");
    let init = std::fs::read(format!("{dir}/init.mp4")).unwrap();
    let (clear_init, info) = rewrite_init(&init).unwrap();
    let remuxer = Remuxer::new(&clear_init).unwrap();
    let mut state = RemuxState::default();
    let segments = (1..=2)
        .map(|n| {
            let seg = std::fs::read(format!("{dir}/{n}.m4s")).unwrap();
            let clear = decrypt_segment(&seg, &info, &keys).unwrap();
            remuxer.segment(&clear, &mut state).unwrap()
        })
        .collect();
    (remuxer, segments)
}

/// `(pts, dts, es)` of every PES of `pid`.
fn pes_of(ts: &[u8], pid: u16) -> Vec<(u64, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut cur: Vec<u8> = Vec::new();
    let flush = |cur: &mut Vec<u8>, out: &mut Vec<(u64, u64, Vec<u8>)>| {
        if let Some(p) = demux_parse(cur) {
            out.push((p.pts.unwrap(), p.dts.unwrap(), p.es));
        }
        cur.clear();
    };
    for pkt in ts.chunks_exact(PACKET_LEN) {
        let h = parse_header(pkt).unwrap();
        if h.pid != pid {
            continue;
        }
        if h.payload_unit_start {
            flush(&mut cur, &mut out);
        }
        cur.extend_from_slice(crate::segmenter::payload(pkt, &h).unwrap_or_default());
    }
    flush(&mut cur, &mut out);
    out
}

/// A PES as the remuxer writes it: PTS always, DTS when it differs.
fn demux_parse(pes: &[u8]) -> Option<demux::Pes> {
    if pes.len() < 9 {
        return None;
    }
    let hl = usize::from(pes[8]);
    let flags = pes[7] >> 6;
    let ts = |b: &[u8]| {
        (u64::from(b[0] >> 1 & 7) << 30)
            | (u64::from(u16::from_be_bytes([b[1], b[2]]) >> 1) << 15)
            | u64::from(u16::from_be_bytes([b[3], b[4]]) >> 1)
    };
    let pts = ts(&pes[9..14]);
    let dts = if flags == 3 { ts(&pes[14..19]) } else { pts };
    Some(demux::Pes {
        pts: Some(pts),
        dts: Some(dts),
        es: pes[9 + hl..].to_vec(),
    })
}

/// NAL units of an Annex B stream other than delimiters and parameter sets.
fn slices(es: &[u8]) -> Vec<Vec<u8>> {
    h264::nal_units(es)
        .filter(|n| !matches!(n[0] & 0x1f, 7..=9))
        .map(<[u8]>::to_vec)
        .collect()
}

/// The first decoding time of a TS segment's `pid`.
fn first_dts(ts: &[u8], pid: u16) -> u64 {
    pes_of(ts, pid)[0].1
}

#[test]
fn video_round_trips_through_the_remuxer() {
    let (source, ts) = ts_of("video");
    let pid = Remuxer::pid(0);
    let mut w = Writer::new();
    let one = w.segment(&ts[0], 1, Some(first_dts(&ts[1], pid))).unwrap();
    let two = w.segment(&ts[1], 2, None).unwrap();
    assert_eq!(one.init_id, 1);
    assert_eq!(
        (two.init_id, &two.init),
        (1, &one.init),
        "same SPS, same init"
    );

    // The init is one the remuxer reads: an H.264 track at 90 kHz with the source's SPS and PPS.
    let back = Remuxer::new(&one.init).unwrap();
    assert_eq!(back.tracks().len(), 1);
    assert_eq!(back.tracks()[0].timescale, 90_000);
    let (
        Codec::H264 { parameter_sets, .. },
        Codec::H264 {
            parameter_sets: want,
            ..
        },
    ) = (&back.tracks()[0].codec, &source.tracks()[0].codec)
    else {
        panic!("H.264 expected");
    };
    assert_eq!(parameter_sets, want);

    // Every picture comes back with the same slices and the same timestamps.
    let mut state = RemuxState::default();
    for (frag, src) in [(&one, &ts[0]), (&two, &ts[1])] {
        let again = back.segment(&frag.media, &mut state).unwrap();
        let (want, got) = (pes_of(src, pid), pes_of(&again, pid));
        assert_eq!(want.len(), got.len());
        for (w, g) in want.iter().zip(&got) {
            assert_eq!(g.0, w.0 + TIMESTAMP_OFFSET, "pts");
            assert_eq!(g.1, w.1 + TIMESTAMP_OFFSET, "dts");
            assert_eq!(slices(&g.2), slices(&w.2));
        }
    }

    // One moof, its track's tfdt the first TS decoding time, then the mdat.
    let tops: Vec<_> = boxes(&one.media).map(|b| b.unwrap().kind).collect();
    assert_eq!(tops, [*b"moof", *b"mdat"]);
    let moof = find(boxes(&one.media), b"moof").unwrap().unwrap();
    let traf = moof.child(b"traf").unwrap().unwrap();
    let tfdt = Tfdt::parse(&traf.child(b"tfdt").unwrap().unwrap()).unwrap();
    assert_eq!(tfdt.base_media_decode_time, first_dts(&ts[0], pid));
    let trun = Trun::parse(&traf.child(b"trun").unwrap().unwrap()).unwrap();
    assert_eq!(trun.sample_count as usize, pes_of(&ts[0], pid).len());
}

#[test]
fn audio_frames_cut_by_a_segment_boundary_land_in_one_fragment() {
    let (_, ts) = ts_of("audio");
    let pid = Remuxer::pid(0);
    let whole: Vec<u8> = ts.concat();
    // ADTS frames of the source, headers off.
    let mut want = Vec::new();
    for (_, _, es) in pes_of(&whole, pid) {
        let mut at = 0;
        while at + 7 <= es.len() {
            let len = (usize::from(es[at + 3] & 3) << 11)
                | (usize::from(es[at + 4]) << 3)
                | usize::from(es[at + 5] >> 5);
            want.push(es[at + 7..at + len].to_vec());
            at += len;
        }
    }
    // Cut the stream after every possible packet, inside PES packets included: the frames
    // of both fragments, in order, are the source's frames, each once.
    let packets = whole.len() / PACKET_LEN;
    let tables = 2 * PACKET_LEN;
    for cut in (3..packets).step_by(7) {
        let (a, b) = whole.split_at(cut * PACKET_LEN);
        let mut second = whole[..tables].to_vec();
        second.extend_from_slice(b);
        let mut w = Writer::new();
        let mut got = Vec::new();
        for (n, seg) in [a, &second[..]].into_iter().enumerate() {
            let Ok(frag) = w.segment(seg, n as u32 + 1, None) else {
                continue;
            };
            let moof = find(boxes(&frag.media), b"moof").unwrap().unwrap();
            let mdat = find(boxes(&frag.media), b"mdat").unwrap().unwrap();
            let traf = moof.child(b"traf").unwrap().unwrap();
            let trun = Trun::parse(&traf.child(b"trun").unwrap().unwrap()).unwrap();
            let mut at = trun.data_offset.unwrap() as usize;
            for s in trun.samples() {
                let size = s.size.unwrap() as usize;
                assert_eq!(s.duration, Some(1024));
                got.push(frag.media[at..at + size].to_vec());
                at += size;
            }
            assert_eq!(at, mdat.end());
        }
        assert_eq!(got.len(), want.len(), "cut after packet {cut}");
        assert!(got == want, "cut after packet {cut}");
    }
}

#[test]
fn aac_init_carries_the_adts_configuration() {
    let (source, ts) = ts_of("audio");
    let frag = Writer::new().segment(&ts[0], 1, None).unwrap();
    let back = Remuxer::new(&frag.init).unwrap();
    assert_eq!(back.tracks()[0].codec, source.tracks()[0].codec);
    assert_eq!(back.tracks()[0].timescale, 48_000);
}

#[test]
fn sps_gives_the_picture_size() {
    let (source, _) = ts_of("video");
    let Codec::H264 { parameter_sets, .. } = &source.tracks()[0].codec else {
        panic!()
    };
    // What the fixture's own sample entry declares.
    let f = h264::parse_sps(&parameter_sets[0]).unwrap();
    assert_eq!((f.width, f.height), (160, 90));
}

#[test]
fn the_clock_wrap_counts_on() {
    let mut w = Writer::new();
    w.last = Some(WRAP - 3000);
    assert_eq!(w.unwrap(600), WRAP + 600);
    w.last = Some(WRAP + 600);
    assert_eq!(
        w.unwrap(WRAP - 3000),
        WRAP - 3000,
        "a stamp just before the wrap"
    );
    assert_eq!(w.unwrap(1200), WRAP + 1200);
}

#[test]
fn segments_without_a_program_or_tracks_are_refused() {
    let mut w = Writer::new();
    assert_eq!(w.segment(&[], 1, None).unwrap_err(), Fmp4Error::NoProgram);
    assert_eq!(
        w.segment(&[0x47; 188 * 3], 1, None).unwrap_err(),
        Fmp4Error::NoProgram
    );
}

mod hostile {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn any_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let mut w = Writer::new();
            let _ = w.segment(&data, 1, None);
            let _ = w.segment(&data, 2, Some(0));
        }

        #[test]
        fn mutated_segments_never_panic(
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..64),
            track in 0..2usize,
        ) {
            let (_, ts) = ts_of(["video", "audio"][track]);
            let mut seg = ts[0].clone();
            for (at, v) in flips {
                let i = at % seg.len();
                seg[i] = v;
            }
            let mut w = Writer::new();
            if let Ok(frag) = w.segment(&seg, 1, None) {
                // Whatever is written is boxes the reader walks.
                prop_assert!(boxes(&frag.media).all(|b| b.is_ok()));
                prop_assert!(boxes(&frag.init).all(|b| b.is_ok()));
            }
        }
    }
}

#[test]
fn a_short_sps_is_not_a_configuration() {
    // An SPS of two bytes has no profile and level for the avcC to copy.
    let pes = demux::Pes {
        pts: Some(9000),
        dts: Some(9000),
        es: vec![
            0, 0, 1, 0x67, 0x42, 0, 0, 1, 0x68, 0xce, 0, 0, 1, 0x65, 0x88,
        ],
    };
    let (data, pictures, config) = h264::samples(&[pes]);
    assert!(config.is_none());
    assert_eq!(pictures.len(), 1);
    assert!(pictures[0].sync);
    // Every NAL unit, delimiters aside, with a 4-byte length.
    assert_eq!(
        data,
        [0, 0, 0, 2, 0x67, 0x42, 0, 0, 0, 2, 0x68, 0xce, 0, 0, 0, 2, 0x65, 0x88]
    );
}
