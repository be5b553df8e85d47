//! How fast does `hls::rewrite_playlist` turn a large (5000-segment) media playlist into proxy
//! URLs, i.e. can manifest rewriting ever be the bottleneck of a live reload, next to fetching?

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use sluice_media::hls::{rewrite_playlist, RewriteOptions, Target};
use url::Url;

/// A live-looking media playlist: a key, a map, and `n` relative segment URIs with dates.
fn media_playlist(n: usize) -> String {
    let mut text = String::from(
        "#EXTM3U\n#EXT-X-VERSION:7\n#EXT-X-TARGETDURATION:6\n#EXT-X-MEDIA-SEQUENCE:100000\n\
#EXT-X-KEY:METHOD=AES-128,URI=\"../keys/k1.bin\",IV=0x00000000000000000000000000000001\n\
#EXT-X-MAP:URI=\"init.mp4\"\n",
    );
    for i in 0..n {
        text.push_str(&format!(
            "#EXT-X-PROGRAM-DATE-TIME:2026-11-21T10:{:02}:{:02}.000Z\n#EXTINF:6.006,\nsegment_{}.m4s?token=abcdef0123456789\n",
            (i / 10) % 60,
            (i * 6) % 60,
            100_000 + i
        ));
    }
    text
}

/// What the front end does per URI: percent-encode the upstream URL into a query parameter.
fn proxy_url(target: Target, url: &Url) -> String {
    let path = match target {
        Target::Playlist => "manifest.m3u8",
        Target::Key => "segment.ts",
        Target::Segment { ext } | Target::Map { ext } => ext.as_str(),
    };
    format!(
        "/proxy/hls/{path}?d={}&api_password=secret",
        utf8_percent_encode(url.as_str(), NON_ALPHANUMERIC)
    )
}

fn bench(c: &mut Criterion) {
    let text = media_playlist(5000);
    let base = Url::parse("https://cdn.example.com/live/channel/1080p/index.m3u8?st=1").unwrap();
    let opts = RewriteOptions {
        default_live_start_offset: Some(-18.0),
        ..Default::default()
    };
    let mut group = c.benchmark_group("hls_rewrite");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("media_5000_segments", |b| {
        b.iter(|| rewrite_playlist(black_box(&text), &base, &opts, &mut proxy_url).unwrap())
    });
    // The rewriter alone, without the front end's percent-encoding: where the time goes.
    group.bench_function("media_5000_segments_plain_urls", |b| {
        b.iter(|| {
            rewrite_playlist(black_box(&text), &base, &opts, &mut |_, url: &Url| {
                url.as_str().to_owned()
            })
            .unwrap()
        })
    });
    let skip = RewriteOptions {
        skip: vec![(600.0, 1200.0), (20_000.0, 20_100.0)],
        ..opts.clone()
    };
    group.bench_function("media_5000_segments_skip", |b| {
        b.iter(|| rewrite_playlist(black_box(&text), &base, &skip, &mut proxy_url).unwrap())
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
