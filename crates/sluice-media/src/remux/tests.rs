//! Remux tests over the Shaka-packaged fixtures (decrypted first) and small hand-made inputs.

use super::es::adts_header;
use super::ts::crc32_mpeg2;
use super::*;
use crate::cenc::{decrypt_segment, rewrite_init};
use crate::keys::KeyRing;
use crate::mpegts::{parse_header, Continuity, PACKET_LEN, SYNC_BYTE};

const DRM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/drm");

fn keys() -> KeyRing {
    KeyRing::parse(
        Some("6d76f25cb17f5e16b8eaef6bbf582d8e,1fba7ed02bb85aa8b8c0dbf0d1ac2e7a"),
        "ce1b07f0b4c5f1b8c2a9f6ba2a8c7e41,4c2d8a6e3e5b9a7c1d0f2e4b6a8c9d1e",
    )
    .unwrap()
}

/// The clear init and clear segments 1 and 2 of one fixture track.
fn clear(scheme: &str, track: &str) -> (Vec<u8>, Vec<Vec<u8>>) {
    let dir = format!("{DRM}/{scheme}/{track}");
    let init = std::fs::read(format!("{dir}/init.mp4")).unwrap();
    let (clear_init, info) = rewrite_init(&init).unwrap();
    let segments = (1..=2)
        .map(|n| {
            let seg = std::fs::read(format!("{dir}/{n}.m4s")).unwrap();
            decrypt_segment(&seg, &info, &keys()).unwrap()
        })
        .collect();
    (clear_init, segments)
}

/// (pid, payload_unit_start, payload) of every packet.
fn packets(ts: &[u8]) -> Vec<(u16, bool, &[u8])> {
    assert_eq!(ts.len() % PACKET_LEN, 0, "whole packets only");
    ts.chunks_exact(PACKET_LEN)
        .map(|p| {
            let h = parse_header(p).expect("a TS packet");
            let afc = (p[3] >> 4) & 3;
            let start = if afc & 2 != 0 {
                5 + usize::from(p[4])
            } else {
                4
            };
            (h.pid, h.payload_unit_start, &p[start..])
        })
        .collect()
}

/// PES payloads (reassembled) of `pid`, each with its PTS and DTS.
fn pes_of(ts: &[u8], pid: u16) -> Vec<(u64, u64, Vec<u8>)> {
    let mut out: Vec<(u64, u64, Vec<u8>)> = Vec::new();
    let mut cur: Vec<u8> = Vec::new();
    let flush = |cur: &mut Vec<u8>, out: &mut Vec<(u64, u64, Vec<u8>)>| {
        if cur.is_empty() {
            return;
        }
        assert_eq!(&cur[..3], &[0, 0, 1]);
        let flags = cur[7];
        let hl = usize::from(cur[8]);
        let pts = read_ts(&cur[9..14]);
        let dts = if flags & 0x40 != 0 {
            read_ts(&cur[14..19])
        } else {
            pts
        };
        let len = u16::from_be_bytes([cur[4], cur[5]]) as usize;
        if len != 0 {
            assert_eq!(len, cur.len() - 6, "PES length matches its payload");
        }
        out.push((pts, dts, cur[9 + hl..].to_vec()));
        cur.clear();
    };
    for (p, start, payload) in packets(ts) {
        if p != pid {
            continue;
        }
        if start {
            flush(&mut cur, &mut out);
        }
        cur.extend_from_slice(payload);
    }
    flush(&mut cur, &mut out);
    out
}

fn read_ts(b: &[u8]) -> u64 {
    (u64::from(b[0] >> 1 & 7) << 30)
        | (u64::from(u16::from_be_bytes([b[1], b[2]]) >> 1) << 15)
        | u64::from(u16::from_be_bytes([b[3], b[4]]) >> 1)
}

#[test]
fn crc_matches_the_mpeg2_check_value() {
    assert_eq!(crc32_mpeg2(b"123456789"), 0x0376_e6e7);
}

#[test]
fn adts_header_fields() {
    // AAC-LC, 48 kHz (index 3), mono, a 200-byte frame with its header.
    let h = adts_header(1, 3, 1, 207);
    assert_eq!(h[0], 0xff);
    assert_eq!(h[1], 0xf1);
    assert_eq!(h[2] >> 6, 1);
    assert_eq!((h[2] >> 2) & 0x0f, 3);
    let channels = ((h[2] & 1) << 2) | (h[3] >> 6);
    assert_eq!(channels, 1);
    let len = (u32::from(h[3] & 3) << 11) | (u32::from(h[4]) << 3) | u32::from(h[5] >> 5);
    assert_eq!(len, 207);
}

#[test]
fn reads_fixture_tracks() {
    let (init, _) = clear("cenc", "video");
    let r = Remuxer::new(&init).unwrap();
    assert_eq!(r.tracks().len(), 1);
    let t = &r.tracks()[0];
    assert_eq!(t.timescale, 12800);
    let Codec::H264 {
        nal_length_size,
        parameter_sets,
    } = &t.codec
    else {
        panic!("H.264 expected, got {:?}", t.codec);
    };
    assert_eq!(*nal_length_size, 4);
    assert_eq!(parameter_sets.len(), 2);
    assert_eq!(parameter_sets[0][0] & 0x1f, 7);
    assert_eq!(parameter_sets[1][0] & 0x1f, 8);

    let (init, _) = clear("cenc", "audio");
    let r = Remuxer::new(&init).unwrap();
    assert_eq!(
        r.tracks()[0].codec,
        Codec::Aac {
            profile: 1,
            frequency_index: 3,
            channel_config: 1
        }
    );
    assert_eq!(r.tracks()[0].timescale, 48000);
}

#[test]
fn encrypted_init_is_refused() {
    let init = std::fs::read(format!("{DRM}/cenc/video/init.mp4")).unwrap();
    assert!(matches!(
        Remuxer::new(&init),
        Err(RemuxError::Encrypted { .. })
    ));
}

#[test]
fn video_segments_become_continuous_ts() {
    for scheme in ["cenc", "cbcs"] {
        let (init, segments) = clear(scheme, "video");
        let r = Remuxer::new(&init).unwrap();
        let mut state = RemuxState::default();
        let mut cc = Continuity::default();
        let mut last_dts = None;
        for seg in &segments {
            let ts = r.segment(seg, &mut state).unwrap();
            assert_eq!(cc.check(&ts), 0, "{scheme}: continuity");
            let pk = packets(&ts);
            assert_eq!(pk[0].0, 0, "PAT first");
            assert_eq!(pk[1].0, PMT_PID, "PMT second");
            check_section(pk[0].2);
            check_section(pk[1].2);
            let pes = pes_of(&ts, FIRST_ES_PID);
            // 25 fps, 1 s segments.
            assert_eq!(pes.len(), 25, "{scheme}: one PES per sample");
            for (i, (pts, dts, es)) in pes.iter().enumerate() {
                assert!(pts >= dts);
                assert_eq!(&es[..6], &[0, 0, 0, 1, 0x09, 0xf0], "AUD first");
                if i == 0 {
                    // Keyframe: SPS, PPS, then the IDR slice.
                    assert_eq!(es[10] & 0x1f, 7, "SPS after the AUD");
                }
                if let Some(prev) = last_dts {
                    assert_eq!(dts - prev, 3600, "{scheme}: 25 fps at 90 kHz, continuous");
                }
                last_dts = Some(*dts);
            }
            // The first packet of every PES carries the PCR, behind the DTS.
            let first = &ts[2 * PACKET_LEN..3 * PACKET_LEN];
            assert_eq!(first[3] & 0x20, 0x20);
            assert_eq!(first[5] & 0x50, 0x50, "PCR and random access");
        }
        assert_eq!(state.counter(0), 2, "PAT counter carried over");
    }
}

#[test]
fn first_video_timestamp_comes_from_tfdt() {
    let (init, segments) = clear("cenc", "video");
    let r = Remuxer::new(&init).unwrap();
    let ts = r.segment(&segments[1], &mut RemuxState::default()).unwrap();
    let pes = pes_of(&ts, FIRST_ES_PID);
    // Segment 2 starts at tfdt 12800 of 12800 Hz: 1 s, plus the fixed offset.
    let min_dts = pes.iter().map(|p| p.1).min().unwrap();
    assert_eq!(min_dts, TS_CLOCK + TIMESTAMP_OFFSET);
}

#[test]
fn audio_becomes_adts() {
    let (init, segments) = clear("cbcs", "audio");
    let r = Remuxer::new(&init).unwrap();
    let mut state = RemuxState::default();
    let mut cc = Continuity::default();
    for seg in &segments {
        let ts = r.segment(seg, &mut state).unwrap();
        assert_eq!(cc.check(&ts), 0);
        let pes = pes_of(&ts, FIRST_ES_PID);
        assert!(pes.len() > 40);
        for (_, _, es) in &pes {
            assert_eq!(es[0], 0xff);
            assert_eq!(es[1] & 0xf6, 0xf0);
            let len = (usize::from(es[3] & 3) << 11)
                | (usize::from(es[4]) << 3)
                | usize::from(es[5] >> 5);
            assert_eq!(len, es.len(), "ADTS length is the frame");
        }
    }
}

/// A PSI section at `payload` (after the pointer field) has a valid CRC.
fn check_section(payload: &[u8]) {
    assert_eq!(payload[0], 0, "pointer field");
    let s = &payload[1..];
    let len = usize::from(u16::from_be_bytes([s[1], s[2]]) & 0x0fff);
    assert_eq!(
        crc32_mpeg2(&s[..3 + len]),
        0,
        "CRC over the section with its CRC is 0"
    );
}

#[test]
fn an_error_leaves_state_and_output_alone() {
    let (init, segments) = clear("cenc", "video");
    let r = Remuxer::new(&init).unwrap();
    let mut state = RemuxState::default();
    r.segment(&segments[0], &mut state).unwrap();
    let before = state.clone();
    let mut cut = segments[1].clone();
    cut.truncate(cut.len() - 100);
    let mut out = b"kept".to_vec();
    assert!(r.segment_into(&cut, &mut state, &mut out).is_err());
    assert_eq!(state, before);
    assert_eq!(out, b"kept");
}

#[test]
fn pes_packets_are_exact() {
    // One 183-byte payload: the header (14 bytes, PTS only) and payload need 197 bytes, so two
    // packets; sizes around the packet boundary exercise every stuffing branch.
    for len in [
        0usize, 1, 150, 165, 166, 167, 168, 169, 170, 183, 184, 400, 1000,
    ] {
        let payload = vec![0xab; len];
        let mut state = RemuxState::default();
        let mut out = Vec::new();
        let pes = ts::Pes {
            pid: 0x100,
            stream_id: 0xc0,
            pts: 123_456,
            dts: 123_456,
            pcr: len % 2 == 0,
            random_access: false,
            bounded: true,
        };
        ts::write_pes(&pes, &payload, &mut state, &mut out);
        assert_eq!(out.len() % PACKET_LEN, 0);
        assert!(out.chunks(PACKET_LEN).all(|p| p[0] == SYNC_BYTE));
        let got = pes_of(&out, 0x100);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, 123_456);
        assert_eq!(got[0].2, payload, "len {len}");
    }
}

#[test]
fn hostile_segments_never_panic() {
    let (init, segments) = clear("cenc", "video");
    let r = Remuxer::new(&init).unwrap();
    let seg = &segments[0];
    for cut in (0..seg.len()).step_by(97) {
        let _ = r.segment(&seg[..cut], &mut RemuxState::default());
        let mut flipped = seg.clone();
        flipped[cut] ^= 0xff;
        let _ = r.segment(&flipped, &mut RemuxState::default());
    }
    for cut in 0..init.len() {
        let _ = Remuxer::new(&init[..cut]);
    }
}

const CLEAR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/remux/hevc-ac3");

/// The init and media segments of representation `rep` of the clear H.265/AC-3 package.
fn clear_package(rep: u32) -> (Vec<u8>, Vec<Vec<u8>>) {
    let init = std::fs::read(format!("{CLEAR}/init-{rep}.mp4")).unwrap();
    let segments = (1..)
        .map_while(|n| std::fs::read(format!("{CLEAR}/seg-{rep}-{n}.m4s")).ok())
        .collect();
    (init, segments)
}

/// The PMT's (stream_type, PID) entries.
fn pmt_streams(ts: &[u8]) -> Vec<(u8, u16)> {
    let pmt = packets(ts)[1].2;
    let s = &pmt[1..];
    let len = usize::from(u16::from_be_bytes([s[1], s[2]]) & 0x0fff);
    let info_len = usize::from(u16::from_be_bytes([s[10], s[11]]) & 0x0fff);
    let mut at = 12 + info_len;
    let mut out = Vec::new();
    while at < 3 + len - 4 {
        let pid = u16::from_be_bytes([s[at + 1], s[at + 2]]) & 0x1fff;
        out.push((s[at], pid));
        at += 5 + usize::from(u16::from_be_bytes([s[at + 3], s[at + 4]]) & 0x0fff);
    }
    out
}

#[test]
fn hevc_gets_parameter_sets_before_keyframes_and_ordered_timestamps() {
    let (init, segments) = clear_package(0);
    let r = Remuxer::new(&init).unwrap();
    let Codec::H265 { parameter_sets, .. } = &r.tracks()[0].codec else {
        panic!("H.265 expected, got {:?}", r.tracks()[0].codec);
    };
    let types: Vec<u8> = parameter_sets.iter().map(|n| (n[0] >> 1) & 0x3f).collect();
    // VPS, SPS, PPS, then whatever else the encoder stored (x265 adds an SEI).
    assert_eq!(&types[..3], [32, 33, 34]);
    let mut state = RemuxState::default();
    let mut cc = Continuity::default();
    let mut frames = 0;
    for seg in &segments {
        let ts = r.segment(seg, &mut state).unwrap();
        assert_eq!(cc.check(&ts), 0);
        assert_eq!(pmt_streams(&ts), [(0x24, FIRST_ES_PID)]);
        let pes = pes_of(&ts, FIRST_ES_PID);
        frames += pes.len();
        for (i, (pts, dts, es)) in pes.iter().enumerate() {
            assert!(pts >= dts, "presentation never before decode");
            assert_eq!(&es[..7], &[0, 0, 0, 1, 0x46, 0x01, 0x50], "HEVC AUD first");
            if i == 0 {
                // Segments start on a keyframe: VPS follows the delimiter.
                assert_eq!((es[11] >> 1) & 0x3f, 32);
            }
        }
        // B-frames: presentation order differs from decode order somewhere.
        assert!(pes.windows(2).any(|w| w[1].0 < w[0].0));
    }
    assert_eq!(frames, 50);
}

#[test]
fn ac3_and_eac3_pass_through_byte_for_byte() {
    for (rep, codec, stream_type) in [(1, Codec::Ac3, 0x81), (2, Codec::Eac3, 0x87)] {
        let (init, segments) = clear_package(rep);
        let r = Remuxer::new(&init).unwrap();
        assert_eq!(r.tracks()[0].codec, codec);
        let mut state = RemuxState::default();
        for seg in &segments {
            let ts = r.segment(seg, &mut state).unwrap();
            assert_eq!(pmt_streams(&ts), [(stream_type, FIRST_ES_PID)]);
            let got: Vec<u8> = pes_of(&ts, FIRST_ES_PID)
                .into_iter()
                .flat_map(|(_, _, es)| es)
                .collect();
            // The mdat payload is the frames back to back; the remux must carry exactly them.
            let samples = samples::read(seg, r.tracks()).unwrap();
            let want: Vec<u8> = samples
                .iter()
                .flat_map(|s| seg[s.offset..s.offset + s.size].iter().copied())
                .collect();
            assert_eq!(got, want);
            assert_eq!(&got[..2], &[0x0b, 0x77], "AC-3 sync word");
        }
    }
}

#[test]
fn spans_chain_segments() {
    let (init, segments) = clear("cenc", "video");
    let r = Remuxer::new(&init).unwrap();
    let a = r.span(&segments[0]).unwrap().unwrap();
    let b = r.span(&segments[1]).unwrap().unwrap();
    assert_eq!(
        a,
        Span {
            start: 0,
            end: 12800
        }
    );
    assert_eq!(b.start, a.end);
    assert_eq!(r.span(b"").unwrap(), None);
}

// === hostile segments: bounded work and output ===

/// (CRC-32/MPEG-2, length) of the TS made from every segment of each fixture stream, chained.
fn fixture_outputs() -> Vec<(u32, usize)> {
    let mut streams: Vec<(Vec<u8>, Vec<Vec<u8>>)> = Vec::new();
    for scheme in ["cenc", "cbcs"] {
        for track in ["video", "audio"] {
            streams.push(clear(scheme, track));
        }
    }
    streams.extend((0..3).map(clear_package));
    streams
        .iter()
        .map(|(init, segments)| {
            let r = Remuxer::new(init).unwrap();
            let mut state = RemuxState::default();
            let mut all = Vec::new();
            for seg in segments {
                r.segment_into(seg, &mut state, &mut all).unwrap();
            }
            (crc32_mpeg2(&all), all.len())
        })
        .collect()
}

#[test]
fn bounds_leave_real_output_unchanged() {
    // Recorded before the sample, output and parameter-set bounds were added.
    let want = [
        (0x849d_a06d, 0xa190),
        (0x518e_dde6, 0x4ae8),
        (0x849d_a06d, 0xa190),
        (0x518e_dde6, 0x4ae8),
        (0x854d_5ba8, 0x8ff0),
        (0xf60b_2929, 0x8f34),
        (0xd45e_319d, 0x8f34),
    ];
    assert_eq!(fixture_outputs(), want);
}

fn bx(kind: &[u8; 4], parts: &[&[u8]]) -> Vec<u8> {
    let len = 8 + parts.iter().map(|p| p.len()).sum::<usize>();
    [&(len as u32).to_be_bytes()[..], kind, &parts.concat()].concat()
}

fn full(kind: &[u8; 4], flags: u32, parts: &[&[u8]]) -> Vec<u8> {
    bx(kind, &[&flags.to_be_bytes(), &parts.concat()])
}

/// One `moof` of `runs` data-offset-only `trun`s of `count` samples (sized by the `tfhd` default
/// `size`), every run starting at the first byte of the following `mdat` of `payload` bytes.
fn same_bytes_runs(track_id: u32, size: u32, count: u32, runs: usize, payload: usize) -> Vec<u8> {
    let tfhd = full(
        b"tfhd",
        0x02_0000 | 0x10,
        &[&track_id.to_be_bytes(), &size.to_be_bytes()],
    );
    let moof_len = 16 + tfhd.len() + runs * 20;
    let offset = (moof_len as u32 + 8).to_be_bytes();
    let trun = full(b"trun", 0x001, &[&count.to_be_bytes(), &offset]);
    let mut traf = vec![tfhd.as_slice()];
    traf.extend(std::iter::repeat_n(trun.as_slice(), runs));
    let moof = bx(b"moof", &[&bx(b"traf", &traf)]);
    assert_eq!(moof.len(), moof_len);
    [moof, bx(b"mdat", &[&vec![0x0b; payload]])].concat()
}

#[test]
fn runs_over_the_same_bytes_are_refused() {
    let (init, _) = clear_package(1);
    let r = Remuxer::new(&init).unwrap();
    let id = r.tracks()[0].track_id;
    // One run of 64 one-byte samples is fine.
    assert_eq!(
        samples::read(&same_bytes_runs(id, 1, 64, 1, 64), r.tracks())
            .unwrap()
            .len(),
        64
    );
    // 50 runs of four 16-byte samples over the same 64 bytes: few samples, many bytes. The
    // first sample past the segment's length is refused, wherever it falls in its run.
    let seg = same_bytes_runs(id, 16, 4, 50, 64);
    let payload_at = seg.len() - 64;
    let fit = seg.len() / 16;
    let want = RemuxError::SamplesPastSegment {
        track_id: id,
        offset: (payload_at + fit % 4 * 16) as u64,
        segment: seg.len() as u64,
    };
    let count = |seg: &[u8]| samples::read(seg, r.tracks()).map(|s| s.len());
    assert_eq!(count(&seg), Err(want.clone()));
    assert_eq!(r.segment(&seg, &mut RemuxState::default()), Err(want));
    // 50 runs of 64 one-byte samples over the same bytes (3,200 without the bound).
    let seg = same_bytes_runs(id, 1, 64, 50, 64);
    assert!(matches!(
        samples::read(&seg, r.tracks()),
        Err(RemuxError::TooManySamples { .. })
    ));
    // Empty samples take no bytes but each is still walked: their count is bounded across runs
    // (each run alone stays under the segment's length).
    let seg = same_bytes_runs(id, 0, 1000, 50, 64);
    assert!(1000 < seg.len());
    assert_eq!(
        samples::read(&seg, r.tracks()),
        Err(RemuxError::TooManySamples {
            track_id: id,
            count: (seg.len() as u64 / 1000 + 1) * 1000,
        })
    );
}

#[test]
fn tiny_samples_cannot_amplify_the_output() {
    let (init, _) = clear_package(1);
    let r = Remuxer::new(&init).unwrap();
    let id = r.tracks()[0].track_id;
    // 8,000 one-byte AC-3 samples, one after the other: each is a PES of one 188-byte packet,
    // 1.5 MB from 8 KB. Refused, and nothing is left in the output.
    let seg = same_bytes_runs(id, 1, 8000, 1, 8000);
    let limit = seg.len() * OUTPUT_PER_INPUT + OUTPUT_ALLOWANCE;
    assert!((8000 + 2) * PACKET_LEN > limit);
    let mut out = b"kept".to_vec();
    let mut state = RemuxState::default();
    assert_eq!(
        r.segment_into(&seg, &mut state, &mut out),
        Err(RemuxError::OutputTooLarge {
            input: seg.len(),
            limit
        })
    );
    assert_eq!(out, b"kept");
    assert_eq!(state, RemuxState::default());
    // Under the allowance the same samples go through, one packet each.
    let seg = same_bytes_runs(id, 1, 4000, 1, 4000);
    let ts = r.segment(&seg, &mut RemuxState::default()).unwrap();
    assert_eq!(ts.len(), (4000 + 2) * PACKET_LEN);
}

#[test]
fn tiny_samples_are_refused_before_they_are_listed() {
    let (init, _) = clear_package(1);
    let r = Remuxer::new(&init).unwrap();
    let id = r.tracks()[0].track_id;
    // Two million one-byte samples in a 2 MB segment: listed, they took 128 MB (64 bytes each)
    // before the output's limit was ever checked. Each costs at least a 188-byte packet, so past
    // limit / 188 of them the segment is refused as the list grows, with the error the write
    // would have given.
    let n = 2_000_000;
    let seg = same_bytes_runs(id, 1, n, 1, n as usize);
    let refused = RemuxError::OutputTooLarge {
        input: seg.len(),
        limit: output_limit(seg.len()),
    };
    let listed = |seg: &[u8]| samples::read(seg, r.tracks()).map(|s| s.len());
    assert_eq!(listed(&seg), Err(refused.clone()));
    assert_eq!(r.span(&seg), Err(refused.clone()));
    assert_eq!(r.segment(&seg, &mut RemuxState::default()), Err(refused));
    // The bound is exact: the most samples whose packets fit the limit are still listed.
    let seg_of = |k: u32| same_bytes_runs(id, 1, k, 1, k as usize);
    let fits = |k: u32| k as usize * PACKET_LEN <= output_limit(seg_of(k).len());
    let most = (1..n).find(|&k| !fits(k + 1)).unwrap();
    assert_eq!(listed(&seg_of(most)), Ok(most as usize));
    assert!(matches!(
        listed(&seg_of(most + 1)),
        Err(RemuxError::OutputTooLarge { .. })
    ));
}

/// `init` with its one `avcC` replaced by `avcc`, every box around it resized.
fn with_avcc(init: &[u8], avcc: &[u8]) -> Vec<u8> {
    let at = init.windows(4).position(|w| w == b"avcC").unwrap() - 4;
    let old = u32::from_be_bytes(init[at..at + 4].try_into().unwrap()) as usize;
    let new = bx(b"avcC", &[avcc]);
    let grow = new.len() - old;
    let mut out = [&init[..at], &new, &init[at + old..]].concat();
    for kind in [
        b"moov", b"trak", b"mdia", b"minf", b"stbl", b"stsd", b"avc1",
    ] {
        // The last header of that type before `avcC` is the box holding it (`avc1` is also a
        // brand in `ftyp`).
        let start = out[..at].windows(4).rposition(|w| w == kind).unwrap() - 4;
        let len = u32::from_be_bytes(out[start..start + 4].try_into().unwrap()) as usize;
        out[start..start + 4].copy_from_slice(&((len + grow) as u32).to_be_bytes());
    }
    out
}

#[test]
fn parameter_sets_repeated_before_keyframes_are_bounded() {
    let (init, _) = clear("cenc", "video");
    let r = Remuxer::new(&init).unwrap();
    let id = r.tracks()[0].track_id;
    // Two SPS of `len` bytes and one PPS, each written after a 4-byte start code.
    let avcc = |len: usize| {
        let sps = [&[0x67u8][..], &vec![0x42; len - 1]].concat();
        let set = [&(len as u16).to_be_bytes()[..], &sps].concat();
        [
            &[1, 0x64, 0, 0x1f, 0xff, 0xe2][..],
            &set,
            &set,
            &[1, 0, 2, 0x68, 0xce],
        ]
        .concat()
    };
    // 2 x (4 + 32,761) + (4 + 2) is exactly 64 KiB.
    let fits = Remuxer::new(&with_avcc(&init, &avcc(32_761))).unwrap();
    let Codec::H264 { parameter_sets, .. } = &fits.tracks()[0].codec else {
        panic!("H.264 expected");
    };
    assert_eq!(parameter_sets.len(), 3);
    assert_eq!(
        Remuxer::new(&with_avcc(&init, &avcc(32_762))).unwrap_err(),
        RemuxError::BadConfig {
            track_id: id,
            why: "parameter sets over 64 KiB"
        }
    );
}

/// The AC-3 init with its one track repeated `n` times (track IDs 1 to `n`).
fn ac3_tracks(n: u32) -> Vec<u8> {
    let (init, _) = clear_package(1);
    let moov = crate::mp4::find(crate::mp4::boxes(&init), b"moov")
        .unwrap()
        .unwrap();
    let mut children = Vec::new();
    let mut trak = Vec::new();
    for b in moov.children() {
        let b = b.unwrap();
        match &b.kind {
            b"trak" => trak = b.bytes().to_vec(),
            b"mvex" => {}
            _ => children.push(b.bytes().to_vec()),
        }
    }
    let tkhd = trak.windows(4).position(|w| w == b"tkhd").unwrap() - 4;
    let id_at = tkhd + if trak[tkhd + 8] == 1 { 28 } else { 20 };
    for id in 1..=n {
        trak[id_at..id_at + 4].copy_from_slice(&id.to_be_bytes());
        children.push(trak.clone());
    }
    let refs: Vec<&[u8]> = children.iter().map(Vec::as_slice).collect();
    bx(b"moov", &refs)
}

#[test]
fn a_pmt_longer_than_its_packet_is_refused() {
    // 15 AC-3 tracks: 16 + 15 x 11 = 181 bytes of section, the PMT fits with its CRC.
    let r = Remuxer::new(&ac3_tracks(15)).unwrap();
    assert_eq!(r.tracks().len(), 15);
    let ts = r.segment(b"", &mut RemuxState::default()).unwrap();
    assert_eq!(ts.len(), 2 * PACKET_LEN);
    check_section(packets(&ts)[1].2);
    assert_eq!(pmt_streams(&ts).len(), 15);
    // 16 (MAX_TRACKS) would need 192 bytes: its CRC was cut off.
    assert_eq!(
        Remuxer::new(&ac3_tracks(16)).unwrap_err(),
        RemuxError::TooManyTracks
    );
}
