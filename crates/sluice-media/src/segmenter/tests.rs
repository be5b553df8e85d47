use super::playlist::{self, Entry, Kind, LowLatency, PartEntry, Window};
use super::*;

const VIDEO: u16 = 0x100;
const AUDIO: u16 = 0x101;
const FRAME: u64 = 3600; // 25 pictures a second

/// A TS generator: PAT, PMT, then pictures and audio frames, counters running.
struct Gen {
    cc: std::collections::HashMap<u16, u8>,
    pmt_pid: u16,
    video: (u16, u8),
}

impl Gen {
    fn new() -> Gen {
        Gen {
            cc: Default::default(),
            pmt_pid: 0x1000,
            video: (VIDEO, 0x1b),
        }
    }

    fn packet(&mut self, pid: u16, start: bool, random_access: bool, payload: &[u8]) -> Vec<u8> {
        let cc = self.cc.entry(pid).or_insert(0);
        let mut p = vec![
            0x47,
            (pid >> 8) as u8 | if start { 0x40 } else { 0 },
            pid as u8,
        ];
        let room = 184 - if random_access { 2 } else { 0 };
        let take = payload.len().min(room);
        let stuffing = room - take;
        if random_access || stuffing > 0 {
            let af_len = if random_access { 1 } else { 0 } + stuffing;
            let af_len = if random_access { af_len } else { stuffing - 1 };
            p.push(0x30 | *cc);
            p.push(af_len as u8);
            if af_len > 0 {
                p.push(if random_access { 0x40 } else { 0x00 });
                p.resize(p.len() + af_len - 1, 0xff);
            }
        } else {
            p.push(0x10 | *cc);
        }
        *cc = (*cc + 1) & 0x0f;
        p.extend_from_slice(&payload[..take]);
        assert_eq!(p.len(), 188, "packet built to size");
        p
    }

    fn section(&mut self, pid: u16, section: &[u8]) -> Vec<u8> {
        let mut payload = vec![0];
        payload.extend_from_slice(section);
        payload.resize(184, 0xff);
        self.packet(pid, true, false, &payload)
    }

    fn tables(&mut self) -> Vec<u8> {
        let pmt_pid = self.pmt_pid;
        let pat = [
            0x00,
            0xb0,
            13,
            0,
            1,
            0xc1,
            0,
            0,
            0,
            1,
            0xe0 | (pmt_pid >> 8) as u8,
            pmt_pid as u8,
            0,
            0,
            0,
            0,
        ];
        let (vpid, vtype) = self.video;
        let pmt = [
            0x02,
            0xb0,
            23,
            0,
            1,
            0xc1,
            0,
            0,
            0xe0 | (vpid >> 8) as u8,
            vpid as u8,
            0xf0,
            0,
            vtype,
            0xe0 | (vpid >> 8) as u8,
            vpid as u8,
            0xf0,
            0,
            0x0f,
            0xe0 | (AUDIO >> 8) as u8,
            AUDIO as u8,
            0xf0,
            0,
            0,
            0,
            0,
            0,
        ];
        let mut out = self.section(0, &pat);
        out.extend(self.section(pmt_pid, &pmt));
        out
    }

    /// One picture (a PES over several packets) at `dts`, then one audio frame.
    fn picture(&mut self, dts: u64, keyframe: bool, flag: bool) -> Vec<u8> {
        let mut pes = vec![0, 0, 1, 0xe0, 0, 0, 0x80, 0x80, 5];
        pes.extend_from_slice(&stamp(0x21, dts));
        pes.extend_from_slice(&[0, 0, 0, 1, 0x09, 0xf0]); // access unit delimiter
        if keyframe {
            pes.extend_from_slice(&[0, 0, 0, 1, 0x67, 1, 2, 3, 0, 0, 0, 1, 0x68, 4]);
            pes.extend_from_slice(&[0, 0, 0, 1, 0x06]); // SEI, long
            pes.resize(pes.len() + 300, 0x55);
            pes.extend_from_slice(&[0, 0, 1, 0x65]);
        } else {
            pes.extend_from_slice(&[0, 0, 1, 0x41]);
        }
        pes.resize(pes.len() + 500, (dts / FRAME) as u8 | 0x80);
        let mut out = Vec::new();
        for (i, part) in pes.chunks(184).enumerate() {
            let first = i == 0;
            let room = if first && flag { 182 } else { 184 };
            let _ = room;
            out.extend(self.packet(self.video.0, first, first && flag && keyframe, part));
        }
        let mut audio = vec![0, 0, 1, 0xc0, 0, 0, 0x80, 0x80, 5];
        audio.extend_from_slice(&stamp(0x21, dts));
        audio.resize(150, 0x33);
        out.extend(self.packet(AUDIO, true, false, &audio));
        out
    }
}

fn stamp(prefix: u8, ts: u64) -> [u8; 5] {
    [
        prefix | ((ts >> 29) & 0x0e) as u8,
        (ts >> 22) as u8,
        ((ts >> 14) & 0xfe) as u8 | 1,
        (ts >> 7) as u8,
        ((ts << 1) & 0xfe) as u8 | 1,
    ]
}

fn settings(target_secs: u64) -> Settings {
    Settings {
        target: target_secs * CLOCK,
        max_bytes: 16 << 20,
        part: 0,
    }
}

/// `secs` of stream from `dts0`: tables every 10 pictures, a keyframe every `gop` pictures
/// (none when 0).
fn stream(g: &mut Gen, dts0: u64, pictures: u64, gop: u64, flag: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..pictures {
        if i % 10 == 0 {
            out.extend(g.tables());
        }
        let key = gop > 0 && i % gop == 0;
        out.extend(g.picture(dts0 + i * FRAME, key, flag));
    }
    out
}

fn starts_clean(seg: &Segment, g_tables: usize) {
    let d = &seg.data;
    assert_eq!(mpegts::parse_header(&d[..188]).unwrap().pid, 0, "PAT first");
    assert_eq!(
        mpegts::parse_header(&d[188..376]).unwrap().pid,
        0x1000,
        "PMT second"
    );
    let third = mpegts::parse_header(&d[376..564]).unwrap();
    assert_eq!(third.pid, VIDEO);
    assert!(third.payload_unit_start);
    let _ = g_tables;
}

fn run(input: &[u8], target: u64, chunk: usize) -> Vec<Segment> {
    let mut s = Segmenter::new(settings(target));
    for c in input.chunks(chunk) {
        s.push(c);
    }
    s.finish();
    s.take()
}

#[test]
fn segments_start_with_tables_and_a_keyframe_and_keep_every_byte() {
    let mut g = Gen::new();
    // A picture before the first keyframe is dropped; keyframes every 25 pictures (1 s).
    let mut input = g.tables();
    input.extend(g.picture(0, false, false));
    let from = input.len();
    input.extend(stream(&mut g, FRAME, 250, 25, false));
    let segs = run(&input, 2, 1316);
    assert_eq!(segs.len(), 5, "10 s in 2 s segments");
    let mut joined = Vec::new();
    for (i, seg) in segs.iter().enumerate() {
        starts_clean(seg, 2);
        assert!(seg.keyframe && !seg.discontinuity, "segment {i}");
        assert_eq!(seg.duration, 2 * CLOCK, "segment {i}");
        joined.extend_from_slice(&seg.data[376..]);
    }
    // The stream from the first keyframe on (after its tables), byte for byte.
    assert!(
        joined == input[from + 376..],
        "{} vs {} bytes",
        joined.len(),
        input.len() - from - 376
    );
}

/// A segment holds no more memory than its bytes: the buffer it was built in grew by doubling,
/// and its spare capacity (up to as much again, uncounted) is not kept with it.
#[test]
fn a_segment_holds_no_spare_capacity() {
    let mut g = Gen::new();
    let input = stream(&mut g, 0, 250, 25, false);
    let segs = run(&input, 2, 1316);
    assert_eq!(segs.len(), 5);
    for (i, seg) in segs.into_iter().enumerate() {
        let len = seg.data.len();
        let held = seg.data.try_into_mut().expect("the only handle").capacity();
        assert_eq!(held, len, "segment {i}: {held} bytes held for {len}");
    }
}

#[test]
fn chunking_does_not_change_the_segments() {
    let mut g = Gen::new();
    let input = stream(&mut g, 0, 120, 12, false);
    let whole = run(&input, 2, input.len());
    for chunk in [1, 187, 188, 189, 1316, 7000] {
        let parts = run(&input, 2, chunk);
        assert_eq!(parts.len(), whole.len(), "chunk {chunk}");
        for (a, b) in parts.iter().zip(&whole) {
            assert_eq!(a.data, b.data, "chunk {chunk}");
            assert_eq!(a.duration, b.duration);
        }
    }
}

#[test]
fn the_random_access_flag_alone_marks_a_keyframe() {
    let mut g = Gen::new();
    g.video = (VIDEO, 0xea); // a codec whose pictures are not scanned
    let input = stream(&mut g, 0, 100, 25, true);
    let segs = run(&input, 2, 1316);
    assert_eq!(segs.len(), 2);
    assert!(segs.iter().all(|s| s.keyframe));
}

#[test]
fn a_gop_longer_than_the_target_never_makes_a_longer_segment() {
    for (gop, target) in [(75u64, 2u64), (250, 4), (0, 2), (48, 4), (36, 4)] {
        let mut g = Gen::new();
        let mut input = stream(&mut g, 0, 1, 1, false);
        input.extend(stream(&mut g, FRAME, 400, gop, false));
        let segs = run(&input, target, 1316);
        assert!(segs.len() > 2, "gop {gop}");
        for seg in &segs {
            assert!(
                (seg.duration + CLOCK / 2) / CLOCK <= target,
                "gop {gop}: {} ticks",
                seg.duration
            );
            assert!(!seg.discontinuity);
            starts_clean(seg, 2);
        }
        if gop == 48 {
            // 1.92 s GOPs in 4 s: two GOPs a segment (a third would overshoot).
            assert!(segs[1..segs.len() - 1]
                .iter()
                .all(|s| s.keyframe && s.duration == 96 * FRAME));
        }
    }
}

#[test]
fn a_restarted_sender_and_new_pids_are_discontinuities() {
    let mut g = Gen::new();
    let mut input = stream(&mut g, 500_000, 100, 25, false);
    // Restart: timestamps from near zero again.
    input.extend(stream(&mut g, 0, 100, 25, false));
    // New PIDs (same timeline going on).
    g.pmt_pid = 0x1100;
    g.video = (0x200, 0x1b);
    input.extend(stream(&mut g, 100 * FRAME, 100, 25, false));
    let segs = run(&input, 2, 1316);
    let flags: Vec<bool> = segs.iter().map(|s| s.discontinuity).collect();
    assert_eq!(
        flags,
        [false, false, true, false, true, false],
        "{:?}",
        segs.iter().map(|s| s.duration).collect::<Vec<_>>()
    );
    let after = &segs[4].data;
    assert_eq!(mpegts::parse_header(&after[188..]).unwrap().pid, 0x1100);
    assert_eq!(mpegts::parse_header(&after[376..]).unwrap().pid, 0x200);
    assert!(segs.iter().all(|s| s.keyframe));
}

/// A forward step shorter than a restart (under 10 s) that would carry the segment past the
/// target is a break: the segment ends one picture after its last, and the next is a
/// discontinuity, so no segment is longer than the target (RFC 8216 6.2.1: the target
/// duration of a playlist never changes).
#[test]
fn a_step_past_the_target_is_a_break_not_a_long_segment() {
    let mut g = Gen::new();
    // 2 s, then 2 s more 9 s later, then 2 s more 9 s later again (keyframes every 1.6 s).
    let mut input = stream(&mut g, 0, 50, 25, false);
    input.extend(stream(&mut g, 50 * FRAME + 9 * CLOCK, 50, 25, false));
    input.extend(stream(&mut g, 100 * FRAME + 18 * CLOCK, 50, 40, false));
    let segs = run(&input, 4, 1316);
    let limit = 4 * CLOCK + CLOCK / 2 - 1;
    let lengths: Vec<u64> = segs.iter().map(|s| s.duration).collect();
    assert!(lengths.iter().all(|d| *d <= limit), "{lengths:?}");
    let flags: Vec<bool> = segs.iter().map(|s| s.discontinuity).collect();
    assert_eq!(flags, [false, true, true], "{lengths:?}");
    assert_eq!(
        segs[0].duration,
        50 * FRAME,
        "ends one picture after its last"
    );
    assert_eq!(segs[1].start, 50 * FRAME + 9 * CLOCK);
}

/// A long GOP (10 s at target 4) with two pictures dropped just before the limit: the step
/// (0.12 s) carries the segment over the limit, and the segment is cut there as any picture
/// past it is, with no discontinuity and no picture lost (a break there reset the player's
/// decoder and dropped everything to the next keyframe).
#[test]
fn a_dropped_frame_past_the_limit_is_no_discontinuity() {
    let mut g = Gen::new();
    let mut input = stream(&mut g, 0, 111, 250, false);
    input.extend(stream(&mut g, 113 * FRAME, 100, 0, false));
    let segs = run(&input, 4, 1316);
    let flags: Vec<bool> = segs.iter().map(|s| s.discontinuity).collect();
    assert!(flags.iter().all(|d| !d), "{flags:?}");
    let limit = 4 * CLOCK + CLOCK / 2 - 1;
    let lengths: Vec<u64> = segs.iter().map(|s| s.duration).collect();
    assert!(lengths.iter().all(|d| *d <= limit), "{lengths:?}");
    // Every picture is in a segment: 211 pictures, the two dropped ones a gap between two.
    let total: u64 = segs.iter().map(|s| s.duration).sum();
    assert!(total >= 211 * FRAME, "{total}: pictures lost");
}

/// A stream of one picture a second (a slide show, a radio channel's still picture), keyframes
/// every 10: each crossing of the limit is its ordinary step, not a hole: no discontinuity,
/// nothing dropped.
#[test]
fn one_picture_a_second_is_no_hole() {
    let one_a_second: Vec<u8> = {
        // One call per picture: the generator spaces a call's pictures FRAME apart.
        let mut g = Gen::new();
        let mut out = Vec::new();
        for i in 0..30u64 {
            out.extend(stream(
                &mut g,
                i * CLOCK,
                1,
                if i % 10 == 0 { 1 } else { 0 },
                false,
            ));
        }
        out
    };
    let segs = run(&one_a_second, 4, 1316);
    let flags: Vec<bool> = segs.iter().map(|s| s.discontinuity).collect();
    assert!(flags.iter().all(|d| !d), "{flags:?}");
    let total: u64 = segs.iter().map(|s| s.duration).sum();
    assert!(total >= 29 * CLOCK, "{total}: pictures lost");
}

#[test]
fn a_gap_ends_the_segment_and_the_next_waits_for_a_keyframe() {
    let mut g = Gen::new();
    let input = stream(&mut g, 0, 60, 25, false);
    let mut s = Segmenter::new(settings(2));
    s.push(&input[..input.len() / 2]);
    s.gap();
    s.push(&input[input.len() / 2..]);
    s.finish();
    let segs = s.take();
    assert_eq!(segs.len(), 2);
    assert!(!segs[0].discontinuity && segs[1].discontinuity);
    assert_eq!(segs[1].start, 50 * FRAME, "restarted on the next keyframe");
}

#[test]
fn garbage_is_skipped_without_panicking() {
    let mut s = Segmenter::new(settings(2));
    let mut noise = vec![0x47u8; 5000];
    for (i, b) in noise.iter_mut().enumerate() {
        *b = (i * 7919 % 251) as u8;
    }
    s.push(&noise);
    let mut g = Gen::new();
    s.push(&stream(&mut g, 0, 60, 25, false));
    s.finish();
    assert_eq!(s.take().len(), 2);
}

#[test]
fn noise_without_packet_boundaries_is_skipped_in_one_pass() {
    // Runs of 0x47 that never line up 188 bytes apart: no offset starts a packet. Each 0x47
    // used to start another search over the rest of the chunk (256 KiB: 33 million offsets
    // tried, seconds of CPU per chunk a source sends).
    let mut noise = Vec::new();
    while noise.len() < 256 * 1024 {
        noise.extend_from_slice(&[SYNC_BYTE; PACKET_LEN]);
        noise.extend_from_slice(&[0; PACKET_LEN]);
    }
    noise.extend_from_slice(&[0; 2 * PACKET_LEN]);
    let mut g = Gen::new();
    let input = stream(&mut g, 0, 60, 25, false);
    let started = std::time::Instant::now();
    let mut s = Segmenter::new(settings(2));
    s.push(&noise);
    s.push(&input);
    s.finish();
    assert!(
        started.elapsed().as_secs() < 2,
        "256 KiB of noise took {:?}",
        started.elapsed()
    );
    // Nothing of the noise is kept: the stream after it is cut as it is on its own.
    let after: Vec<_> = s.take().into_iter().map(|seg| seg.data).collect();
    let alone: Vec<_> = run(&input, 2, input.len())
        .into_iter()
        .map(|seg| seg.data)
        .collect();
    assert_eq!(after.len(), 2);
    assert!(after == alone);
}

#[test]
fn playlist_lists_the_window() {
    let entries = [
        Entry {
            sequence: 7,
            duration: 2 * CLOCK,
            discontinuity: false,
            wall_ms: None,
        },
        Entry {
            sequence: 8,
            duration: 180_450,
            discontinuity: true,
            wall_ms: None,
        },
    ];
    let window = Window {
        target: 2,
        discontinuity_sequence: 3,
        ended: true,
        query: "iface=lo",
        kind: Kind::Live,
        start_ms: None,
        low_latency: None,
    };
    assert_eq!(
        playlist::media(window, &entries),
        "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n#EXT-X-MEDIA-SEQUENCE:7\n\
         #EXT-X-DISCONTINUITY-SEQUENCE:3\n#EXTINF:2.000,\n7.ts?iface=lo\n\
         #EXT-X-DISCONTINUITY\n#EXTINF:2.005,\n8.ts?iface=lo\n#EXT-X-ENDLIST\n"
    );
}

#[test]
fn an_fmp4_playlist_maps_its_inits() {
    let entry = |sequence, discontinuity| Entry {
        sequence,
        duration: 2 * CLOCK,
        discontinuity,
        wall_ms: None,
    };
    let entries = [entry(7, false), entry(8, false), entry(9, true)];
    let window = Window {
        target: 2,
        discontinuity_sequence: 0,
        ended: false,
        query: "iface=lo",
        kind: Kind::Live,
        start_ms: None,
        low_latency: None,
    };
    assert_eq!(
        playlist::media_fmp4(window, &entries, &[1, 1, 2]),
        "#EXTM3U\n#EXT-X-VERSION:7\n#EXT-X-TARGETDURATION:2\n#EXT-X-MEDIA-SEQUENCE:7\n\
         #EXT-X-MAP:URI=\"init-1.mp4?iface=lo\"\n#EXTINF:2.000,\n7.m4s?iface=lo\n\
         #EXTINF:2.000,\n8.m4s?iface=lo\n\
         #EXT-X-DISCONTINUITY\n#EXT-X-MAP:URI=\"init-2.mp4?iface=lo\"\n#EXTINF:2.000,\n9.m4s?iface=lo\n"
    );
}

#[test]
fn a_catch_up_playlist_has_its_type_start_and_wall_clock() {
    let entries = [Entry {
        sequence: 40,
        duration: CLOCK,
        discontinuity: false,
        wall_ms: Some(1_704_110_407_250),
    }];
    let window = Window {
        target: 1,
        discontinuity_sequence: 0,
        ended: true,
        query: "",
        kind: Kind::Vod,
        start_ms: Some(750),
        low_latency: None,
    };
    assert_eq!(
        playlist::media(window, &entries),
        "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:1\n#EXT-X-MEDIA-SEQUENCE:40\n\
         #EXT-X-PLAYLIST-TYPE:VOD\n#EXT-X-START:TIME-OFFSET=0.750,PRECISE=YES\n\
         #EXT-X-PROGRAM-DATE-TIME:2024-01-01T12:00:07.250Z\n#EXTINF:1.000,\n40.ts\n#EXT-X-ENDLIST\n"
    );
}

/// Segments and parts of `input` pushed in `chunk`-byte pieces, parts taken before segments
/// after each push, as the gateway does.
fn run_parts(input: &[u8], settings: Settings, chunk: usize) -> (Vec<Segment>, Vec<Part>) {
    let mut s = Segmenter::new(settings);
    let (mut segs, mut parts) = (Vec::new(), Vec::new());
    for c in input.chunks(chunk) {
        s.push(c);
        parts.extend(s.take_parts());
        segs.extend(s.take());
    }
    s.finish();
    parts.extend(s.take_parts());
    segs.extend(s.take());
    (segs, parts)
}

#[test]
fn parts_make_up_their_segment_and_start_independent_at_keyframes() {
    let mut g = Gen::new();
    let input = stream(&mut g, 0, 250, 25, false);
    let low = Settings {
        part: CLOCK / 2,
        ..settings(2)
    };
    let (segs, parts) = run_parts(&input, low, 1316);
    assert_eq!(segs.len(), 5);
    for seg in &segs {
        let mine: Vec<&Part> = parts.iter().filter(|p| p.number == seg.number).collect();
        let joined: Vec<u8> = mine.iter().flat_map(|p| p.data.iter().copied()).collect();
        assert!(
            joined == seg.data[..],
            "segment {}: parts join to it",
            seg.number
        );
        assert_eq!(mine.iter().map(|p| p.duration).sum::<u64>(), seg.duration);
        for (i, p) in mine.iter().enumerate() {
            assert_eq!(p.index as usize, i, "indexes count from 0");
            assert!(p.duration <= CLOCK / 2, "part {i}: {} ticks", p.duration);
        }
        assert!(mine[0].independent, "a segment starts on a keyframe part");
        // Once the GOP is known (after the first), each 25-picture GOP is 9 + 9 + 7 pictures,
        // the keyframe part independent, the others not.
        if seg.number > 0 {
            let frames: Vec<u64> = mine.iter().map(|p| p.duration / FRAME).collect();
            assert_eq!(frames, [9, 9, 7, 9, 9, 7], "segment {}", seg.number);
            let independent: Vec<bool> = mine.iter().map(|p| p.independent).collect();
            assert_eq!(independent, [true, false, false, true, false, false]);
        }
    }
    // Same parts whatever the chunking.
    let (_, other) = run_parts(&input, low, 187);
    assert_eq!(other.len(), parts.len());
    assert!(other.iter().zip(&parts).all(|(a, b)| a.data == b.data));
    // Without a part target there are none.
    assert!(run_parts(&input, settings(2), 1316).1.is_empty());
}

#[test]
fn a_low_latency_playlist_lists_parts_and_a_preload_hint() {
    let entries = [Entry {
        sequence: 7,
        duration: 2 * CLOCK,
        discontinuity: false,
        wall_ms: Some(1_704_110_407_250),
    }];
    let part = |sequence, index, duration, independent| PartEntry {
        sequence,
        index,
        duration,
        independent,
    };
    let parts = [
        part(7, 0, 45_000, true),
        part(7, 1, 45_000, false),
        part(7, 2, 40_000, false),
        part(8, 0, 32_400, true),
    ];
    let window = Window {
        target: 2,
        discontinuity_sequence: 0,
        ended: false,
        query: "iface=lo",
        kind: Kind::Live,
        start_ms: None,
        low_latency: Some(LowLatency {
            part_target: CLOCK / 2,
            parts: &parts,
        }),
    };
    assert_eq!(
        playlist::media(window, &entries),
        "#EXTM3U\n#EXT-X-VERSION:6\n#EXT-X-TARGETDURATION:2\n\
         #EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,PART-HOLD-BACK=1.500\n\
         #EXT-X-PART-INF:PART-TARGET=0.500\n#EXT-X-MEDIA-SEQUENCE:7\n\
         #EXT-X-PART:DURATION=0.500,URI=\"7.0.ts?iface=lo\",INDEPENDENT=YES\n\
         #EXT-X-PART:DURATION=0.500,URI=\"7.1.ts?iface=lo\"\n\
         #EXT-X-PART:DURATION=0.444,URI=\"7.2.ts?iface=lo\"\n\
         #EXT-X-PROGRAM-DATE-TIME:2024-01-01T12:00:07.250Z\n#EXTINF:2.000,\n7.ts?iface=lo\n\
         #EXT-X-PART:DURATION=0.360,URI=\"8.0.ts?iface=lo\",INDEPENDENT=YES\n\
         #EXT-X-PRELOAD-HINT:TYPE=PART,URI=\"8.1.ts?iface=lo\"\n"
    );
}

#[test]
fn a_segment_whose_parts_were_handed_out_is_kept_when_a_longer_pat_arrives() {
    // A one-packet PAT and PMT, then a PAT section spread over 16 packets (the most the
    // collector keeps), of which 15 arrive before the first keyframe.
    let mut g = Gen::new();
    let mut pat = vec![0x00, 0xb0, 0, 0, 1, 0xc1, 0, 0, 0, 1, 0xf0, 0x00];
    for _ in 0..41 {
        pat.extend_from_slice(&[0, 0, 0xe0, 0x10]); // network PID entries, skipped
    }
    pat.extend_from_slice(&[0; 4]); // CRC, not checked
    pat[2] = (pat.len() - 3) as u8;
    let long_pat: Vec<Vec<u8>> = [&[0][..], &pat]
        .concat()
        .chunks(12)
        .enumerate()
        .map(|(i, c)| g.packet(0, i == 0, false, c))
        .collect();
    assert_eq!(long_pat.len(), 16);
    let mut input = g.tables();
    input.extend(long_pat[..15].concat());
    // Segment 0 starts here, with 376 bytes of tables; the next picture hands out its part 0.
    input.extend(g.picture(0, true, false));
    input.extend(g.picture(FRAME, false, false));
    // The PAT completes: the latest tables are now 17 packets, longer than segment 0 so far.
    input.extend(&long_pat[15]);
    // A sender restart ends segment 0 there.
    input.extend(g.picture(FRAME + 20 * CLOCK, true, false));
    let low = Settings {
        part: FRAME,
        ..settings(2)
    };
    let (segs, parts) = run_parts(&input, low, 188);
    assert!(parts.iter().any(|p| p.number == 0 && p.index == 0));
    for p in &parts {
        assert!(
            segs.iter().any(|s| s.number == p.number),
            "part {}.{} handed out for a segment never finished",
            p.number,
            p.index
        );
    }
    let first = segs.iter().find(|s| s.number == 0).unwrap();
    let joined: Vec<u8> = parts
        .iter()
        .filter(|p| p.number == 0)
        .flat_map(|p| p.data.iter().copied())
        .collect();
    assert_eq!(joined, first.data[..]);
    // The 376 bytes of tables it started with, two pictures with their audio, the PAT's end.
    assert_eq!(first.data.len(), 376 + 6 * 188 + 4 * 188 + 188);
    assert_eq!(first.duration, 2 * FRAME);
    // The segment after the restart starts with the whole of the new PAT.
    assert_eq!(segs[1].data[..16 * 188], long_pat.concat()[..]);
}

/// One packet per picture, each flagged random access, one tick after the last: every picture
/// a keyframe, the GOP one tick long.
fn keyframe_per_packet(g: &mut Gen, pictures: u64) -> Vec<u8> {
    let mut out = g.tables();
    for dts in 0..pictures {
        let mut pes = vec![0, 0, 1, 0xe0, 0, 0, 0x80, 0x80, 5];
        pes.extend_from_slice(&stamp(0x21, dts));
        out.extend(g.packet(VIDEO, true, true, &pes));
    }
    out
}

/// Segments and parts of `input`: parts per segment, and checks that they join to it.
fn parts_per_segment(input: &[u8], settings: Settings) -> (Vec<Segment>, Vec<usize>) {
    let (segs, parts) = run_parts(input, settings, 1316);
    let counts = segs
        .iter()
        .map(|seg| {
            let mine: Vec<&Part> = parts.iter().filter(|p| p.number == seg.number).collect();
            let joined: Vec<u8> = mine.iter().flat_map(|p| p.data.iter().copied()).collect();
            assert!(
                joined == seg.data[..],
                "segment {}: parts join to it",
                seg.number
            );
            assert!(mine.iter().enumerate().all(|(i, p)| p.index as usize == i));
            mine.len()
        })
        .collect();
    (segs, counts)
}

#[test]
fn a_keyframe_in_every_packet_does_not_make_a_part_of_each() {
    let mut g = Gen::new();
    let pictures = 20_000;
    let input = keyframe_per_packet(&mut g, pictures);
    // 4 s segments of 1 s parts: 12 parts before a segment is crowded, and 20,000 ticks are
    // far less than a part target, so none is cut after.
    let low = Settings {
        target: 4 * CLOCK,
        max_bytes: 1 << 20,
        part: CLOCK,
    };
    let (segs, counts) = parts_per_segment(&input, low);
    assert_eq!(segs.len(), 4, "1 MiB each, cut as gaps");
    assert!(
        counts.iter().all(|&n| n == 12),
        "parts per segment: {counts:?}"
    );
    // Every picture is in a segment, each behind its 376 bytes of tables.
    let kept: usize = segs.iter().map(|s| s.data.len() - 376).sum();
    assert_eq!(kept as u64, pictures * 188);
    // A part target of one tick: no more than MAX_PARTS, however many are due.
    let tick = Settings { part: 1, ..low };
    let (segs, counts) = parts_per_segment(&input, tick);
    assert_eq!(counts, vec![MAX_PARTS as usize; segs.len()]);
}

#[test]
fn a_crowded_segment_is_cut_on_the_part_target() {
    // Only keyframes, 25 a second, 4 s segments of 1 s parts: 11 parts of one picture, then
    // the rest in parts of a second (25 pictures), none longer than the part target.
    let mut g = Gen::new();
    let input = stream(&mut g, 0, 400, 1, false);
    let low = Settings {
        part: CLOCK,
        ..settings(4)
    };
    let (segs, parts) = run_parts(&input, low, 1316);
    assert_eq!(segs.len(), 4);
    for seg in &segs[..3] {
        let frames: Vec<u64> = parts
            .iter()
            .filter(|p| p.number == seg.number)
            .map(|p| p.duration / FRAME)
            .collect();
        assert_eq!(
            frames,
            [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 25, 25, 25, 14],
            "segment {}",
            seg.number
        );
    }
    assert!(parts.iter().all(|p| p.duration <= CLOCK && p.independent));
}
