//! CENC decryption micro-benchmarks. Each answers one question:
//! - `aes128_ctr`: how close does whole-sample `cenc` decryption get to `openssl speed -evp
//!   aes-128-ctr` (bytes of sample per second, 1 MiB samples)?
//! - `cbcs_pattern`: what does `cbcs` 1:9 pattern decryption cost per byte of sample, and whole
//!   sample CBC (0:0, as audio uses) for comparison?
//! - `segment_4mb`: how long does a whole 4 MiB `cenc` video segment take, box parsing, copy,
//!   subsample walk and `senc`/`trun`/`sidx` fix-ups included (target: under 1 ms)?

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};

use aes::Aes128;
use cipher::KeyInit;
use sluice_media::cenc::{decrypt_sample, decrypt_segment_into, rewrite_init, Pattern, Scheme};
use sluice_media::keys::KeyRing;

const KEY: [u8; 16] = [0x42; 16];

fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9u32;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn aes128_ctr(c: &mut Criterion) {
    let aes = Aes128::new(&KEY.into());
    let mut buf = noise(1 << 20);
    let mut group = c.benchmark_group("aes128_ctr");
    group.throughput(Throughput::Bytes(buf.len() as u64));
    group.bench_function("cenc_whole_sample_1MiB", |b| {
        b.iter(|| {
            decrypt_sample(&aes, Scheme::Cenc, Pattern::NONE, &[7; 16], &[], &mut buf).unwrap();
            black_box(&buf);
        })
    });
    group.finish();
}

fn cbcs_pattern(c: &mut Criterion) {
    let aes = Aes128::new(&KEY.into());
    let mut buf = noise(1 << 20);
    let mut group = c.benchmark_group("cbcs_pattern");
    group.throughput(Throughput::Bytes(buf.len() as u64));
    for (name, pattern) in [
        ("1_9_1MiB", Pattern { crypt: 1, skip: 9 }),
        ("0_0_1MiB", Pattern::NONE),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                decrypt_sample(&aes, Scheme::Cbcs, pattern, &[7; 16], &[], &mut buf).unwrap();
                black_box(&buf);
            })
        });
    }
    group.finish();
}

// === a 4 MiB segment for the fixture's protected video track ===

fn bx(kind: &[u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut out = ((payload.len() + 8) as u32).to_be_bytes().to_vec();
    out.extend_from_slice(kind);
    out.extend_from_slice(payload);
    out
}

fn full(kind: &[u8; 4], flags: u32, payload: &[u8]) -> Vec<u8> {
    bx(kind, &[&flags.to_be_bytes()[..], payload].concat())
}

/// `styp`, `sidx`, then one `moof`/`mdat` with `samples` samples of `size` bytes, each with a
/// 16-byte IV and two subsamples (a clear NAL header, then protected data).
fn segment(track_id: u32, iv_size: usize, samples: u32, size: u32) -> Vec<u8> {
    let mut senc = samples.to_be_bytes().to_vec();
    let mut trun_entries = Vec::new();
    for i in 0..samples {
        senc.extend_from_slice(&[i as u8; 16][..iv_size]);
        senc.extend_from_slice(&2u16.to_be_bytes());
        senc.extend_from_slice(&[0, 64, 0, 0, 0, 64]);
        senc.extend_from_slice(&96u16.to_be_bytes());
        senc.extend_from_slice(&(size - 224).to_be_bytes());
        trun_entries.extend_from_slice(&size.to_be_bytes());
    }
    let moof = |data_offset: u32| {
        let trun = full(
            b"trun",
            0x201,
            &[
                &samples.to_be_bytes()[..],
                &data_offset.to_be_bytes(),
                &trun_entries,
            ]
            .concat(),
        );
        let traf = [
            full(b"tfhd", 0x02_0000, &track_id.to_be_bytes()),
            full(b"tfdt", 0, &0u32.to_be_bytes()),
            trun,
            full(b"saiz", 0, &[&[0u8][..], &0u32.to_be_bytes()].concat()),
            full(b"saio", 0, &[0, 0, 0, 1, 0, 0, 0, 0]),
            full(b"senc", 2, &senc),
        ]
        .concat();
        bx(
            b"moof",
            &[full(b"mfhd", 0, &1u32.to_be_bytes()), bx(b"traf", &traf)].concat(),
        )
    };
    let moof_len = moof(0).len() as u32;
    let fragment = [
        moof(moof_len + 8),
        bx(b"mdat", &noise((samples * size) as usize)),
    ]
    .concat();
    let sidx = full(
        b"sidx",
        0,
        &[
            &[
                0, 0, 0, 1, 0, 0, 0x03, 0xe8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
            ][..],
            &(fragment.len() as u32).to_be_bytes(),
            &[0, 0, 0x03, 0xe8, 0x90, 0, 0, 0],
        ]
        .concat(),
    );
    [bx(b"styp", b"msdh\0\0\0\0msdh"), sidx, fragment].concat()
}

fn segment_4mb(c: &mut Criterion) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/drm/cenc/video");
    let init = std::fs::read(format!("{dir}/init.mp4")).expect("fixture init");
    let (_, info) = rewrite_init(&init).unwrap();
    let track = &info.tracks[0];
    let mut keys = KeyRing::new();
    keys.insert(track.protection.unwrap().default_kid, KEY);
    // 100 samples of 40 KiB: a 4 MiB segment shaped like 4 s of 8 Mb/s video.
    let iv_size = track.protection.unwrap().per_sample_iv_size as usize;
    let seg = segment(track.track_id, iv_size, 100, 40 * 1024 + 960);
    let mut out = Vec::with_capacity(seg.len());
    decrypt_segment_into(&seg, &info, &keys, &mut out).unwrap();
    let mut group = c.benchmark_group("segment_4mb");
    group.throughput(Throughput::Bytes(seg.len() as u64));
    group.bench_function("cenc_subsamples_reused_buffer", |b| {
        b.iter(|| decrypt_segment_into(black_box(&seg), &info, &keys, &mut out).unwrap())
    });
    group.finish();
}

criterion_group!(benches, aes128_ctr, cbcs_pattern, segment_4mb);
criterion_main!(benches);
