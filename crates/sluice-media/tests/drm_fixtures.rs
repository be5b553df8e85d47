//! Real DRM fixtures (made by `scripts/make-drm-fixtures.sh` with ffmpeg and Shaka Packager):
//! decrypt init + segments for every scheme and check that ffmpeg decodes the result to exactly
//! the frames of the clear source.

use std::path::{Path, PathBuf};
use std::process::Command;

use sluice_media::cenc::{decrypt_segment, rewrite_init, InitInfo, Scheme};
use sluice_media::keys::KeyRing;
use sluice_media::mp4::{boxes, Mp4Box, Sidx};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/drm")
}

fn key_ring() -> KeyRing {
    let text = std::fs::read_to_string(fixtures().join("keys.txt")).unwrap();
    let (mut kids, mut keys) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        kids.push(fields[1]);
        keys.push(fields[2]);
    }
    KeyRing::parse(Some(&kids.join(",")), &keys.join(",")).unwrap()
}

fn require_ffmpeg() {
    let found = Command::new("ffmpeg").arg("-version").output().is_ok();
    assert!(
        found,
        "ffmpeg is required for the DRM fixture tests: apt-get update && apt-get install -y ffmpeg"
    );
}

/// Decrypts one track of a variant; returns the clear init + segments and the init info.
fn decrypt_track(variant: &str, track: &str) -> (Vec<u8>, InitInfo, usize) {
    let dir = fixtures().join(variant).join(track);
    let init = std::fs::read(dir.join("init.mp4")).unwrap();
    let (mut clear, info) = rewrite_init(&init).unwrap();
    let keys = key_ring();
    let mut moofs = 0;
    for n in 1.. {
        let Ok(segment) = std::fs::read(dir.join(format!("{n}.m4s"))) else {
            break;
        };
        moofs = moofs.max(top_level(&segment, b"moof"));
        let plain = decrypt_segment(&segment, &info, &keys)
            .unwrap_or_else(|e| panic!("{variant}/{track}/{n}.m4s: {e}"));
        assert_clear(&plain);
        assert_sidx_matches(&plain);
        clear.extend_from_slice(&plain);
    }
    assert_clear(&clear);
    (clear, info, moofs)
}

fn top_level(data: &[u8], kind: &[u8; 4]) -> usize {
    boxes(data)
        .filter(|b| &b.as_ref().unwrap().kind == kind)
        .count()
}

/// Each `sidx` reference must cover exactly one decrypted `moof` + `mdat` pair.
fn assert_sidx_matches(data: &[u8]) {
    let all: Vec<Mp4Box<'_>> = boxes(data).map(Result::unwrap).collect();
    let Some(at) = all.iter().position(|b| &b.kind == b"sidx") else {
        return;
    };
    let sidx = Sidx::parse(&all[at]).unwrap();
    assert_eq!(sidx.first_offset, 0);
    let fragments: Vec<usize> = all[at + 1..]
        .chunks(2)
        .map(|pair| pair.iter().map(Mp4Box::len).sum())
        .collect();
    let sizes: Vec<usize> = sidx
        .references()
        .map(|r| r.referenced_size as usize)
        .collect();
    assert_eq!(sizes, fragments, "sidx sizes after decryption");
}

/// No protection box may survive anywhere in the tree.
fn assert_clear(data: &[u8]) {
    fn walk(b: Mp4Box<'_>, depth: usize) {
        for kind in [
            b"senc", b"saiz", b"saio", b"pssh", b"sinf", b"encv", b"enca",
        ] {
            assert_ne!(&b.kind, kind, "protection box left in output");
        }
        let container = matches!(
            &b.kind,
            b"moov" | b"trak" | b"mdia" | b"minf" | b"stbl" | b"moof" | b"traf" | b"mvex"
        );
        if container && depth < 10 {
            b.children().for_each(|c| walk(c.unwrap(), depth + 1));
        }
        if &b.kind == b"stsd" {
            b.children_after(8)
                .for_each(|c| walk(c.unwrap(), depth + 1));
        }
    }
    boxes(data).for_each(|b| walk(b.unwrap(), 0));
}

/// One md5 per decoded frame of the first stream of `kind` (`v` or `a`).
fn frame_hashes(file: &Path, kind: &str) -> Vec<String> {
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-f", "mp4", "-i"])
        .arg(file)
        .args(["-map", &format!("0:{kind}"), "-f", "framemd5", "-"])
        .output()
        .expect("ffmpeg runs");
    assert!(
        out.status.success(),
        "ffmpeg failed on {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "ffmpeg complained about {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.rsplit(',').next().unwrap().trim().to_string())
        .collect()
}

fn expected(name: &str) -> Vec<String> {
    std::fs::read_to_string(fixtures().join(name))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn check_variant(variant: &str, scheme: Scheme, min_moofs: usize) {
    require_ffmpeg();
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    for (track, stream, md5s) in [
        ("video", "v", "source-video.md5"),
        ("audio", "a", "source-audio.md5"),
    ] {
        let (clear, info, moofs) = decrypt_track(variant, track);
        let protection = info.tracks[0]
            .protection
            .expect("fixture track is protected");
        assert_eq!(protection.scheme, scheme, "{variant}/{track}");
        assert!(
            moofs >= min_moofs,
            "{variant}/{track}: {moofs} moof per segment"
        );
        let file = tmp.join(format!("drm-{variant}-{track}.mp4"));
        std::fs::write(&file, &clear).unwrap();
        let got = frame_hashes(&file, stream);
        let want = expected(md5s);
        // The DASH init has no edit list, so ffmpeg may also decode the AAC encoder's priming
        // frame that the source's edit list hides; every other frame must match exactly.
        let extra = got.len().saturating_sub(want.len());
        let allowed = if track == "audio" { 1 } else { 0 };
        assert!(
            got.len() >= want.len() && extra <= allowed,
            "{variant}/{track}: {} frames decoded, {} expected",
            got.len(),
            want.len()
        );
        assert!(
            got[extra..] == want[..],
            "{variant}/{track}: decoded frames differ from the clear source"
        );
    }
}

#[test]
fn cenc_decodes_to_the_clear_source() {
    check_variant("cenc", Scheme::Cenc, 1);
}

#[test]
fn cens_decodes_to_the_clear_source() {
    check_variant("cens", Scheme::Cens, 1);
}

#[test]
fn cbc1_decodes_to_the_clear_source() {
    check_variant("cbc1", Scheme::Cbc1, 1);
}

#[test]
fn cbcs_decodes_to_the_clear_source() {
    check_variant("cbcs", Scheme::Cbcs, 1);
}

#[test]
fn chunked_cenc_decrypts_every_fragment() {
    check_variant("cenc-chunked", Scheme::Cenc, 5);
}

#[test]
fn chunked_cbcs_decrypts_every_fragment() {
    check_variant("cbcs-chunked", Scheme::Cbcs, 5);
}

#[test]
fn missing_audio_key_names_the_kid() {
    let dir = fixtures().join("cenc/audio");
    let (_, info) = rewrite_init(&std::fs::read(dir.join("init.mp4")).unwrap()).unwrap();
    let segment = std::fs::read(dir.join("1.m4s")).unwrap();
    // Two keys, neither for audio: no single-key fallback, so the KID is reported.
    let keys = KeyRing::parse(
        Some("6d76f25cb17f5e16b8eaef6bbf582d8e,00000000000000000000000000000001"),
        "ce1b07f0b4c5f1b8c2a9f6ba2a8c7e41,00000000000000000000000000000001",
    )
    .unwrap();
    let err = decrypt_segment(&segment, &info, &keys).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no key for KID 1fba7ed02bb85aa8b8c0dbf0d1ac2e7a"
    );
}
