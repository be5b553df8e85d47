//! fMP4 → MPEG-TS remux throughput (bytes of clear fMP4 in per second), on the Shaka-packaged
//! fixtures decrypted once up front: `video_2s` is two H.264 segments, `audio_2s` two AAC ones.
//! S6 of the benchmark suite reports the medians.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};

use sluice_media::cenc::{decrypt_segment, rewrite_init};
use sluice_media::keys::KeyRing;
use sluice_media::remux::{RemuxState, Remuxer};

const DRM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/drm/cenc");

fn clear(track: &str) -> (Remuxer, Vec<Vec<u8>>) {
    let keys = KeyRing::parse(
        Some("6d76f25cb17f5e16b8eaef6bbf582d8e,1fba7ed02bb85aa8b8c0dbf0d1ac2e7a"),
        "ce1b07f0b4c5f1b8c2a9f6ba2a8c7e41,4c2d8a6e3e5b9a7c1d0f2e4b6a8c9d1e",
    )
    .expect("fixture keys");
    let init = std::fs::read(format!("{DRM}/{track}/init.mp4")).expect("fixture init");
    let (init, info) = rewrite_init(&init).expect("fixture init rewrites");
    let segments = (1..=2)
        .map(|n| {
            let seg = std::fs::read(format!("{DRM}/{track}/{n}.m4s")).expect("fixture segment");
            decrypt_segment(&seg, &info, &keys).expect("fixture decrypts")
        })
        .collect();
    (Remuxer::new(&init).expect("fixture remuxer"), segments)
}

fn remux(c: &mut Criterion) {
    let mut group = c.benchmark_group("remux_ts");
    for track in ["video", "audio"] {
        let (remuxer, segments) = clear(track);
        let bytes: usize = segments.iter().map(Vec::len).sum();
        group.throughput(Throughput::Bytes(bytes as u64));
        let mut out = Vec::with_capacity(bytes * 2);
        group.bench_function(format!("{track}_2s"), |b| {
            b.iter(|| {
                let mut state = RemuxState::default();
                for seg in &segments {
                    out.clear();
                    remuxer.segment_into(seg, &mut state, &mut out).unwrap();
                    black_box(&out);
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, remux);
criterion_main!(benches);
