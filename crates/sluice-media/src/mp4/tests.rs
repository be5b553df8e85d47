//! Unit tests for the box walker, the rebuild helper and the fragment parsers.

use super::*;

/// A box of `kind` around `payload` (the other modules' tests build theirs with it too).
pub(crate) fn bx(kind: &[u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut out = ((payload.len() + 8) as u32).to_be_bytes().to_vec();
    out.extend_from_slice(kind);
    out.extend_from_slice(payload);
    out
}

fn full(kind: &[u8; 4], version: u8, flags: u32, payload: &[u8]) -> Vec<u8> {
    let mut body = ((u32::from(version) << 24) | flags).to_be_bytes().to_vec();
    body.extend_from_slice(payload);
    bx(kind, &body)
}

fn kinds(data: &[u8]) -> Vec<FourCC> {
    boxes(data).map(|b| b.unwrap().kind).collect()
}

#[test]
fn walks_32_bit_64_bit_and_to_end_sizes() {
    let mut data = bx(b"ftyp", b"isom");
    data.extend_from_slice(&1u32.to_be_bytes());
    data.extend_from_slice(b"free");
    data.extend_from_slice(&20u64.to_be_bytes());
    data.extend_from_slice(&[0xaa; 4]);
    data.extend_from_slice(&0u32.to_be_bytes());
    data.extend_from_slice(b"mdat");
    data.extend_from_slice(&[1, 2, 3]);
    let all: Vec<Mp4Box<'_>> = boxes(&data).map(Result::unwrap).collect();
    assert_eq!(kinds(&data), [*b"ftyp", *b"free", *b"mdat"]);
    assert_eq!((all[1].header_len, all[1].payload()), (16, &[0xaa; 4][..]));
    assert_eq!((all[2].offset, all[2].payload()), (32, &[1, 2, 3][..]));
}

#[test]
fn uuid_boxes_carry_their_user_type() {
    let mut payload = [7u8; 16].to_vec();
    payload.extend_from_slice(b"body");
    let data = bx(b"uuid", &payload);
    let b = boxes(&data).next().unwrap().unwrap();
    assert_eq!(b.user_type(), Some(&[7u8; 16][..]));
    assert_eq!(b.payload(), b"body");
}

#[test]
fn hostile_sizes_are_typed_errors() {
    let too_small = [0, 0, 0, 4, b'm', b'o', b'o', b'f'];
    assert!(matches!(
        boxes(&too_small).next(),
        Some(Err(Mp4Error::SizeTooSmall { size: 4, .. }))
    ));
    let past_end = [0, 0, 0, 99, b'm', b'o', b'o', b'f', 0];
    assert!(matches!(
        boxes(&past_end).next(),
        Some(Err(Mp4Error::SizePastEnd {
            size: 99,
            left: 9,
            ..
        }))
    ));
    let huge = [
        0, 0, 0, 1, b'm', b'd', b'a', b't', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    ];
    assert!(matches!(
        boxes(&huge).next(),
        Some(Err(Mp4Error::SizePastEnd { .. }))
    ));
    let short = [0, 0, 0];
    assert!(matches!(
        boxes(&short).next(),
        Some(Err(Mp4Error::Truncated { .. }))
    ));
    // The walker stops after an error instead of looping.
    assert_eq!(boxes(&past_end).count(), 1);
}

#[test]
fn every_prefix_of_a_tree_is_handled() {
    let tree = bx(
        b"moov",
        &[
            bx(b"trak", &full(b"tkhd", 0, 0, &[0; 20])),
            bx(b"mvex", &[]),
        ]
        .concat(),
    );
    for len in 0..tree.len() {
        for b in boxes(&tree[..len]).flatten() {
            b.children().for_each(drop);
        }
    }
}

#[test]
fn rebuild_drops_renames_and_fixes_sizes() {
    let entry = bx(
        b"encv",
        &[vec![0u8; 78], bx(b"avcC", b"cfg"), bx(b"sinf", b"x")].concat(),
    );
    let tree = bx(
        b"moov",
        &[
            bx(b"pssh", b"p"),
            bx(b"stsd", &[&[0u8; 8][..], &entry].concat()),
        ]
        .concat(),
    );
    let mut out = Vec::new();
    rebuild(
        boxes(&tree),
        &mut out,
        &mut |path: &[FourCC], b: &Mp4Box<'_>| {
            Ok::<_, Mp4Error>(match (&b.kind, path.last()) {
                (b"moov", None) => Edit::Descend {
                    prefix: 0,
                    rename: None,
                },
                (b"stsd", _) => Edit::Descend {
                    prefix: 8,
                    rename: None,
                },
                (b"encv", _) => Edit::Descend {
                    prefix: 78,
                    rename: Some(*b"avc1"),
                },
                (b"pssh", _) | (b"sinf", _) => Edit::Drop,
                _ => Edit::Keep,
            })
        },
    )
    .unwrap();
    let want_entry = bx(b"avc1", &[vec![0u8; 78], bx(b"avcC", b"cfg")].concat());
    let want = bx(
        b"moov",
        &bx(b"stsd", &[&[0u8; 8][..], &want_entry].concat()),
    );
    assert_eq!(out, want);
}

#[test]
fn trun_reads_every_flag_combination() {
    for flags in 0..16u32 {
        let trun_flags = 0x001 | 0x004 | (flags << 8);
        let fields = flags.count_ones() as usize;
        let mut payload = 2u32.to_be_bytes().to_vec();
        payload.extend_from_slice(&(-8i32).to_be_bytes());
        payload.extend_from_slice(&0x0200_0000u32.to_be_bytes());
        for sample in 0..2u32 {
            for field in 0..fields as u32 {
                payload.extend_from_slice(&(100 * sample + field).to_be_bytes());
            }
        }
        let data = full(b"trun", 1, trun_flags, &payload);
        let b = boxes(&data).next().unwrap().unwrap();
        let trun = Trun::parse(&b).unwrap();
        assert_eq!(trun.data_offset, Some(-8));
        let samples: Vec<TrunSample> = trun.samples().collect();
        assert_eq!(samples.len(), 2);
        assert_eq!(
            samples[0].flags,
            Some(0x0200_0000),
            "first_sample_flags wins"
        );
        assert_eq!(samples[1].size.is_some(), flags & 2 != 0);
        if flags == 0b1111 {
            assert_eq!(samples[1].duration, Some(100));
            assert_eq!(samples[1].size, Some(101));
            assert_eq!(samples[1].flags, Some(102));
            assert_eq!(samples[1].composition_offset, Some(103));
        }
    }
}

#[test]
fn trun_with_an_overflowing_count_is_an_error() {
    let data = full(b"trun", 0, 0x300, &u32::MAX.to_be_bytes());
    let b = boxes(&data).next().unwrap().unwrap();
    assert!(matches!(
        Trun::parse(&b),
        Err(Mp4Error::CountOverflow { .. })
    ));
}

#[test]
fn senc_with_and_without_subsamples() {
    for iv_size in [0u8, 8, 16] {
        let mut payload = 2u32.to_be_bytes().to_vec();
        for i in 0..2u8 {
            payload.extend(std::iter::repeat_n(i, iv_size as usize));
            payload.extend_from_slice(&1u16.to_be_bytes());
            payload.extend_from_slice(&[0, 5, 0, 0, 0, 11]);
        }
        let data = full(b"senc", 0, 2, &payload);
        let b = boxes(&data).next().unwrap().unwrap();
        let entries: Vec<SencEntry<'_>> = Senc::parse(&b)
            .unwrap()
            .entries(iv_size)
            .map(Result::unwrap)
            .collect();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1].iv, vec![1u8; iv_size as usize].as_slice());
        let subs: Vec<Subsample> = entries[1].subsamples().collect();
        assert_eq!(
            subs,
            [Subsample {
                clear: 5,
                protected: 11
            }]
        );
    }
    let data = full(b"senc", 0, 0, &[&1u32.to_be_bytes()[..], &[9; 8]].concat());
    let b = boxes(&data).next().unwrap().unwrap();
    let entry = Senc::parse(&b).unwrap().entries(8).next().unwrap().unwrap();
    assert!(!entry.has_subsamples());
    // One entry short: an error, not a panic.
    let mut short = Senc::parse(&b).unwrap();
    short.sample_count = 2;
    assert!(short.entries(8).nth(1).unwrap().is_err());
}

#[test]
fn tfhd_sidx_saiz_saio_tenc_parse() {
    let mut tfhd = 5u32.to_be_bytes().to_vec();
    tfhd.extend_from_slice(&1000u64.to_be_bytes());
    tfhd.extend_from_slice(&512u32.to_be_bytes());
    let data = full(b"tfhd", 0, 0x01 | 0x10, &tfhd);
    let t = Tfhd::parse(&boxes(&data).next().unwrap().unwrap()).unwrap();
    assert_eq!(
        (t.track_id, t.base_data_offset, t.default_sample_size),
        (5, Some(1000), Some(512))
    );

    let mut sidx = [1u32, 90000, 0, 0].map(u32::to_be_bytes).concat();
    sidx.extend_from_slice(&[0, 0, 0, 1]);
    sidx.extend_from_slice(&[0x80, 0, 0, 10, 0, 0, 0, 1, 0, 0, 0, 0]);
    let data = full(b"sidx", 0, 0, &sidx);
    let s = Sidx::parse(&boxes(&data).next().unwrap().unwrap()).unwrap();
    let r: Vec<SidxReference> = s.references().collect();
    assert!(r[0].is_index && r[0].referenced_size == 10);

    let data = full(
        b"saiz",
        0,
        0,
        &[&[0u8][..], &3u32.to_be_bytes(), &[16, 16, 22]].concat(),
    );
    let z = Saiz::parse(&boxes(&data).next().unwrap().unwrap()).unwrap();
    assert_eq!(z.sizes, [16, 16, 22]);
    let data = full(
        b"saio",
        1,
        0,
        &[&1u32.to_be_bytes()[..], &77u64.to_be_bytes()].concat(),
    );
    let o = Saio::parse(&boxes(&data).next().unwrap().unwrap()).unwrap();
    assert_eq!(o.offsets().collect::<Vec<_>>(), [77]);

    let mut tenc = vec![0, 0x19, 1, 0];
    tenc.extend_from_slice(&[3; 16]);
    tenc.push(16);
    tenc.extend_from_slice(&[4; 16]);
    let data = full(b"tenc", 1, 0, &tenc);
    let t = Tenc::parse(&boxes(&data).next().unwrap().unwrap()).unwrap();
    assert_eq!((t.crypt_byte_block, t.skip_byte_block), (1, 9));
    assert_eq!((t.constant_iv_size, t.constant_iv), (16, [4; 16]));
}
