//! Synthetic round trips: encrypt known samples with a naive reference cipher, box them, decrypt,
//! and compare byte for byte with the same segment built in the clear.

use aes::Aes128;
use cipher::{BlockEncrypt, KeyInit};

use super::*;
use crate::keys::KeyRing;

// === reference encryption, block by block, independent of the decryptor ===

fn aes(key: &[u8; 16]) -> Aes128 {
    Aes128::new(key.into())
}

/// Protected byte ranges of a sample, in order.
fn runs(len: usize, subsamples: &[(u16, u32)]) -> Vec<(usize, usize)> {
    if subsamples.is_empty() {
        return vec![(0, len)];
    }
    let mut pos = 0;
    subsamples
        .iter()
        .map(|&(clear, protected)| {
            let start = pos + clear as usize;
            pos = start + protected as usize;
            (start, pos)
        })
        .collect()
}

/// Block indexes (within a run of `len` bytes) that the pattern encrypts.
fn crypt_blocks(len: usize, pattern: Pattern) -> Vec<usize> {
    let blocks = len / 16;
    if pattern.crypt == 0 || pattern.skip == 0 {
        return (0..blocks).collect();
    }
    let period = (pattern.crypt + pattern.skip) as usize;
    (0..blocks)
        .filter(|b| b % period < pattern.crypt as usize)
        .collect()
}

fn next_counter(counter: &mut [u8; 16]) {
    let low = u64::from_be_bytes(counter[8..].try_into().unwrap()).wrapping_add(1);
    counter[8..].copy_from_slice(&low.to_be_bytes());
}

fn encrypt_sample(
    key: &[u8; 16],
    scheme: Scheme,
    pattern: Pattern,
    iv: &[u8; 16],
    subsamples: &[(u16, u32)],
    data: &mut [u8],
) {
    let cipher = aes(key);
    let block = |b: [u8; 16]| {
        let mut g = b.into();
        cipher.encrypt_block(&mut g);
        <[u8; 16]>::from(g)
    };
    match scheme {
        Scheme::Cenc => {
            // One keystream over the concatenated protected bytes.
            let mut counter = *iv;
            let mut stream = Vec::new();
            let total: usize = runs(data.len(), subsamples)
                .iter()
                .map(|(s, e)| e - s)
                .sum();
            while stream.len() < total {
                stream.extend_from_slice(&block(counter));
                next_counter(&mut counter);
            }
            let mut k = 0;
            for (s, e) in runs(data.len(), subsamples) {
                for byte in &mut data[s..e] {
                    *byte ^= stream[k];
                    k += 1;
                }
            }
        }
        Scheme::Cens => {
            let mut counter = *iv;
            for (s, e) in runs(data.len(), subsamples) {
                for b in crypt_blocks(e - s, pattern) {
                    let ks = block(counter);
                    next_counter(&mut counter);
                    let at = s + b * 16;
                    data[at..at + 16]
                        .iter_mut()
                        .zip(ks)
                        .for_each(|(d, k)| *d ^= k);
                }
            }
        }
        Scheme::Cbc1 | Scheme::Cbcs => {
            let mut chain = *iv;
            for (s, e) in runs(data.len(), subsamples) {
                if scheme == Scheme::Cbcs {
                    chain = *iv;
                }
                for b in crypt_blocks(e - s, pattern) {
                    let at = s + b * 16;
                    let mut plain = [0u8; 16];
                    plain.copy_from_slice(&data[at..at + 16]);
                    plain.iter_mut().zip(chain).for_each(|(p, c)| *p ^= c);
                    chain = block(plain);
                    data[at..at + 16].copy_from_slice(&chain);
                }
            }
        }
    }
}

// === box building ===

fn bx(kind: &[u8; 4], parts: &[&[u8]]) -> Vec<u8> {
    let len: usize = 8 + parts.iter().map(|p| p.len()).sum::<usize>();
    let mut out = (len as u32).to_be_bytes().to_vec();
    out.extend_from_slice(kind);
    parts.iter().for_each(|p| out.extend_from_slice(p));
    out
}

fn full(kind: &[u8; 4], version: u8, flags: u32, parts: &[&[u8]]) -> Vec<u8> {
    let vf = ((u32::from(version) << 24) | flags).to_be_bytes();
    let mut all: Vec<&[u8]> = vec![&vf];
    all.extend_from_slice(parts);
    bx(kind, &all)
}

fn be32(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

#[derive(Clone, Debug)]
struct Track {
    id: u32,
    video: bool,
    scheme: Option<Scheme>,
    pattern: Pattern,
    iv_size: u8,
    constant_iv: Option<[u8; 16]>,
    kid: [u8; 16],
    key: [u8; 16],
    /// Written in `trex` and left out of `trun` when set.
    default_size: Option<u32>,
    /// When set, `tfhd` carries an absolute `base_data_offset`, the fragment being placed this
    /// many bytes into the segment.
    absolute_at: Option<usize>,
    /// Sample entries written after the track's own in `stsd`, as they are in both builds.
    more_entries: Vec<Vec<u8>>,
    /// Boxes written after `stsd` in `stbl`, in both builds.
    stbl_extra: Vec<u8>,
    /// `trex.default_sample_description_index` (1 when unset).
    trex_index: Option<u32>,
    /// Written as `tfhd.sample_description_index` when set.
    description_index: Option<u32>,
}

fn track(id: u32, video: bool, scheme: Option<Scheme>, iv_size: u8) -> Track {
    Track {
        id,
        video,
        scheme,
        pattern: Pattern::NONE,
        iv_size,
        constant_iv: None,
        kid: [id as u8; 16],
        key: [0x40 + id as u8; 16],
        default_size: None,
        absolute_at: None,
        more_entries: Vec::new(),
        stbl_extra: Vec::new(),
        trex_index: None,
        description_index: None,
    }
}

fn scheme_fourcc(s: Scheme) -> &'static [u8; 4] {
    match s {
        Scheme::Cenc => b"cenc",
        Scheme::Cens => b"cens",
        Scheme::Cbc1 => b"cbc1",
        Scheme::Cbcs => b"cbcs",
    }
}

fn sample_entry(t: &Track, encrypted: bool) -> Vec<u8> {
    let mut prefix = vec![0u8; if t.video { 78 } else { 28 }];
    prefix[7] = 1; // data_reference_index
    let config = if t.video {
        bx(b"avcC", &[&[1, 0x64, 0, 0x1f]])
    } else {
        full(b"esds", 0, 0, &[&[3, 0, 0, 0]])
    };
    let format: &[u8; 4] = if t.video { b"avc1" } else { b"mp4a" };
    match (t.scheme, encrypted) {
        (Some(scheme), true) => {
            let sinf = sinf(t, Some(format), Some(scheme_fourcc(scheme)), true);
            let kind = if t.video { b"encv" } else { b"enca" };
            bx(kind, &[&prefix, &config, &sinf])
        }
        _ => bx(format, &[&prefix, &config]),
    }
}

/// `t`'s `sinf`, with `frma` naming `format` and `schm` naming `scheme` when given, and `t`'s
/// `tenc` when `with_tenc`.
fn sinf(t: &Track, format: Option<&[u8; 4]>, scheme: Option<&[u8; 4]>, with_tenc: bool) -> Vec<u8> {
    let version = u8::from(t.pattern != Pattern::NONE);
    let pattern = (t.pattern.crypt << 4) | t.pattern.skip;
    let mut tenc = vec![0, pattern, 1, t.iv_size];
    tenc.extend_from_slice(&t.kid);
    if let Some(iv) = t.constant_iv {
        tenc.push(16);
        tenc.extend_from_slice(&iv);
    }
    let mut children = Vec::new();
    if let Some(format) = format {
        children.extend(bx(b"frma", &[format]));
    }
    if let Some(scheme) = scheme {
        children.extend(full(b"schm", 0, 0, &[scheme, &be32(0x10000)]));
    }
    if with_tenc {
        children.extend(bx(b"schi", &[&full(b"tenc", version, 0, &[&tenc])]));
    }
    bx(b"sinf", &[&children])
}

/// A protected video entry of `t` (an `encv`) with [`sinf`]'s choices.
fn protected_entry(
    t: &Track,
    format: Option<&[u8; 4]>,
    scheme: Option<&[u8; 4]>,
    with_tenc: bool,
) -> Vec<u8> {
    let mut prefix = vec![0u8; 78];
    prefix[7] = 1;
    let config = bx(b"avcC", &[&[1, 0x64, 0, 0x1f]]);
    bx(
        b"encv",
        &[&prefix, &config, &sinf(t, format, scheme, with_tenc)],
    )
}

fn init(tracks: &[Track], encrypted: bool) -> Vec<u8> {
    let mut moov: Vec<Vec<u8>> = vec![full(b"mvhd", 0, 0, &[&[0; 96]])];
    for t in tracks {
        let tkhd = full(b"tkhd", 0, 7, &[&be32(0), &be32(0), &be32(t.id), &[0; 68]]);
        let handler = if t.video { b"vide" } else { b"soun" };
        let hdlr = full(b"hdlr", 0, 0, &[&be32(0), handler, &[0; 13]]);
        let mut entries = sample_entry(t, encrypted);
        t.more_entries
            .iter()
            .for_each(|e| entries.extend_from_slice(e));
        let count = be32(1 + t.more_entries.len() as u32);
        let stsd = full(b"stsd", 0, 0, &[&count, &entries]);
        let stbl = bx(b"stbl", &[&stsd, &t.stbl_extra]);
        let minf = bx(b"minf", &[&bx(b"vmhd", &[]), &stbl]);
        let mdia = bx(b"mdia", &[&hdlr, &minf]);
        moov.push(bx(b"trak", &[&tkhd, &mdia]));
    }
    let trexes: Vec<Vec<u8>> = tracks
        .iter()
        .map(|t| {
            let size = t.default_size.unwrap_or(0);
            full(
                b"trex",
                0,
                0,
                &[
                    &be32(t.id),
                    &be32(t.trex_index.unwrap_or(1)),
                    &be32(1000),
                    &be32(size),
                    &be32(0),
                ],
            )
        })
        .collect();
    let trex_refs: Vec<&[u8]> = trexes.iter().map(Vec::as_slice).collect();
    moov.push(bx(b"mvex", &trex_refs));
    if encrypted {
        moov.push(full(b"pssh", 0, 0, &[&[0x10; 16], &be32(2), &[1, 2]]));
    }
    let moov_refs: Vec<&[u8]> = moov.iter().map(Vec::as_slice).collect();
    let mut out = bx(b"ftyp", &[b"iso6", &be32(0), b"iso6dash"]);
    out.extend_from_slice(&bx(b"moov", &moov_refs));
    out
}

struct Sample {
    data: Vec<u8>,
    subsamples: Vec<(u16, u32)>,
    iv: Vec<u8>,
}

/// Deterministic pseudo-random bytes.
fn noise(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn sample(len: usize, seed: u32, t: &Track, subsamples: &[(u16, u32)]) -> Sample {
    let iv = if t.constant_iv.is_some() {
        Vec::new()
    } else {
        noise(t.iv_size as usize, seed + 1000)
    };
    Sample {
        data: noise(len, seed),
        subsamples: subsamples.to_vec(),
        iv,
    }
}

fn full_iv(t: &Track, s: &Sample) -> [u8; 16] {
    let mut iv = t.constant_iv.unwrap_or_default();
    if !s.iv.is_empty() {
        iv = [0; 16];
        iv[..s.iv.len()].copy_from_slice(&s.iv);
    }
    iv
}

fn traf(
    t: &Track,
    samples: &[Sample],
    data_offset: u32,
    base: Option<u64>,
    encrypted: bool,
    extra: &[u8],
) -> Vec<u8> {
    let index = t.description_index.map(be32);
    let index_flag = if index.is_some() { 0x02 } else { 0 };
    let index: &[u8] = index.as_ref().map_or(&[], |i| &i[..]);
    let tfhd = match base {
        Some(base) => full(
            b"tfhd",
            0,
            0x01 | index_flag,
            &[&be32(t.id), &base.to_be_bytes(), index],
        ),
        None => full(b"tfhd", 0, 0x02_0000 | index_flag, &[&be32(t.id), index]),
    };
    let tfdt = full(b"tfdt", 1, 0, &[&0u64.to_be_bytes()]);
    let with_sizes = t.default_size.is_none();
    let mut entries = Vec::new();
    for s in samples {
        if with_sizes {
            entries.extend_from_slice(&be32(s.data.len() as u32));
        }
    }
    let flags = 0x001 | if with_sizes { 0x200 } else { 0 };
    let trun = full(
        b"trun",
        0,
        flags,
        &[&be32(samples.len() as u32), &be32(data_offset), &entries],
    );
    let mut parts = vec![tfhd, tfdt, extra.to_vec(), trun];
    if encrypted && t.scheme.is_some() {
        let with_subsamples = samples.iter().any(|s| !s.subsamples.is_empty());
        let mut senc = be32(samples.len() as u32).to_vec();
        for s in samples {
            senc.extend_from_slice(&s.iv);
            if with_subsamples {
                senc.extend_from_slice(&(s.subsamples.len() as u16).to_be_bytes());
                for &(c, p) in &s.subsamples {
                    senc.extend_from_slice(&c.to_be_bytes());
                    senc.extend_from_slice(&be32(p));
                }
            }
        }
        let senc_flags = if with_subsamples { 2 } else { 0 };
        parts.push(full(
            b"saiz",
            0,
            0,
            &[&[t.iv_size], &be32(samples.len() as u32)],
        ));
        parts.push(full(b"saio", 0, 0, &[&be32(1), &be32(0)]));
        parts.push(full(b"senc", 0, senc_flags, &[&senc]));
    }
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    bx(b"traf", &refs)
}

/// One `moof` + `mdat`; samples of all tracks are laid out one track after the other.
fn fragment(trafs: &[(&Track, Vec<Sample>)], seq: u32, encrypted: bool) -> Vec<u8> {
    fragment_with(trafs, seq, encrypted, &[])
}

/// [`fragment`] with `extra` (boxes) in every `traf`, after its `tfdt`.
fn fragment_with(
    trafs: &[(&Track, Vec<Sample>)],
    seq: u32,
    encrypted: bool,
    extra: &[u8],
) -> Vec<u8> {
    let mut payload = Vec::new();
    let mut starts = Vec::new();
    for (t, samples) in trafs {
        starts.push(payload.len() as u32);
        for s in samples {
            let mut data = s.data.clone();
            if let (true, Some(scheme)) = (encrypted, t.scheme) {
                let iv = full_iv(t, s);
                encrypt_sample(&t.key, scheme, t.pattern, &iv, &s.subsamples, &mut data);
            }
            payload.extend_from_slice(&data);
        }
    }
    let build = |moof_len: u32| {
        let mut parts = vec![full(b"mfhd", 0, 0, &[&be32(seq)])];
        for ((t, samples), start) in trafs.iter().zip(&starts) {
            let part = match t.absolute_at {
                Some(at) => {
                    let base = (at + moof_len as usize + 8) as u64;
                    traf(t, samples, *start, Some(base), encrypted, extra)
                }
                None => traf(t, samples, moof_len + 8 + start, None, encrypted, extra),
            };
            parts.push(part);
        }
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        bx(b"moof", &refs)
    };
    let moof_len = build(0).len() as u32;
    let mut out = build(moof_len);
    out.extend_from_slice(&bx(b"mdat", &[&payload]));
    out
}

/// `styp`, `emsg`, `sidx` (one reference per fragment), the fragments, a trailing `prft`.
fn segment(frags: &[Vec<u8>]) -> Vec<u8> {
    let mut refs = Vec::new();
    for f in frags {
        refs.extend_from_slice(&be32(f.len() as u32));
        refs.extend_from_slice(&be32(1000));
        refs.extend_from_slice(&be32(0x9000_0000));
    }
    let sidx_body = [
        &be32(1)[..],
        &be32(1000),
        &be32(0),
        &be32(0),
        &[0, 0],
        &(frags.len() as u16).to_be_bytes(),
        &refs,
    ];
    let mut out = bx(b"styp", &[b"msdh", &be32(0), b"msdhmsix"]);
    out.extend_from_slice(&full(b"emsg", 0, 0, &[b"urn:x\0\0", &[0; 16]]));
    out.extend_from_slice(&full(b"sidx", 0, 0, &sidx_body));
    frags.iter().for_each(|f| out.extend_from_slice(f));
    out.extend_from_slice(&full(b"prft", 0, 0, &[&be32(1), &[0; 12]]));
    out
}

fn keys_for(tracks: &[&Track]) -> KeyRing {
    let mut ring = KeyRing::new();
    tracks.iter().for_each(|t| ring.insert(t.kid, t.key));
    ring
}

/// One fragment: per track index, the samples as (length, subsamples).
type Frag = Vec<(usize, Vec<(usize, Vec<(u16, u32)>)>)>;

/// Builds the same segment encrypted and clear, decrypts the first, compares with the second.
fn round_trip(tracks: &[Track], frags: &[Frag]) {
    let build = |encrypted: bool| {
        let mut seed = 0;
        let built: Vec<Vec<u8>> = frags
            .iter()
            .enumerate()
            .map(|(i, trafs)| {
                let trafs: Vec<(&Track, Vec<Sample>)> = trafs
                    .iter()
                    .map(|(ti, samples)| {
                        let t = &tracks[*ti];
                        let samples = samples
                            .iter()
                            .map(|(len, subs)| {
                                seed += 1;
                                sample(*len, seed, t, subs)
                            })
                            .collect();
                        (t, samples)
                    })
                    .collect();
                fragment(&trafs, i as u32 + 1, encrypted)
            })
            .collect();
        segment(&built)
    };
    let (clear_init, info) = rewrite_init(&init(tracks, true)).unwrap();
    assert_eq!(clear_init, init(tracks, false), "init rewrite");
    let keys = keys_for(&tracks.iter().collect::<Vec<_>>());
    let encrypted = build(true);
    let clear = build(false);
    assert_ne!(encrypted, clear);
    let got = decrypt_segment(&encrypted, &info, &keys).unwrap();
    assert!(
        got == clear,
        "decrypted segment differs from the clear build"
    );
}

/// Two fragments of one track, mixing whole-sample, subsample and odd sizes.
fn two_fragments(subsamples: bool) -> Vec<Frag> {
    let subs = |v: Vec<(u16, u32)>| if subsamples { v } else { Vec::new() };
    vec![
        vec![(
            0,
            vec![
                (1000, subs(vec![(5, 995)])),
                (333, subs(vec![(17, 160), (100, 56)])),
            ],
        )],
        vec![(
            0,
            vec![(64, subs(vec![(64, 0)])), (4099, subs(vec![(300, 3799)]))],
        )],
    ]
}

#[test]
fn cenc_8_byte_iv_subsamples_two_fragments() {
    round_trip(
        &[track(1, true, Some(Scheme::Cenc), 8)],
        &two_fragments(true),
    );
}

#[test]
fn cenc_16_byte_iv_whole_samples() {
    round_trip(
        &[track(1, false, Some(Scheme::Cenc), 16)],
        &two_fragments(false),
    );
}

#[test]
fn cens_pattern_with_subsamples() {
    let mut t = track(1, true, Some(Scheme::Cens), 16);
    t.pattern = Pattern { crypt: 1, skip: 9 };
    round_trip(&[t], &two_fragments(true));
}

#[test]
fn cbc1_subsamples_and_partial_blocks() {
    round_trip(
        &[track(1, true, Some(Scheme::Cbc1), 16)],
        &two_fragments(true),
    );
    round_trip(
        &[track(2, false, Some(Scheme::Cbc1), 16)],
        &two_fragments(false),
    );
}

#[test]
fn cbcs_constant_iv_pattern() {
    let mut t = track(1, true, Some(Scheme::Cbcs), 0);
    t.pattern = Pattern { crypt: 1, skip: 9 };
    t.constant_iv = Some(*b"constant-iv-0123");
    round_trip(&[t], &two_fragments(true));
}

#[test]
fn cbcs_per_sample_iv_and_two_block_pattern() {
    let mut t = track(1, true, Some(Scheme::Cbcs), 16);
    t.pattern = Pattern { crypt: 2, skip: 3 };
    round_trip(&[t], &two_fragments(true));
}

#[test]
fn cbcs_audio_whole_sample_cbc() {
    let mut t = track(2, false, Some(Scheme::Cbcs), 0);
    t.constant_iv = Some([7; 16]);
    round_trip(&[t], &two_fragments(false));
}

#[test]
fn two_tracks_in_one_moof_one_clear() {
    let video = track(1, true, Some(Scheme::Cenc), 8);
    let audio = track(2, false, None, 0);
    let frags: Vec<Frag> = vec![
        vec![
            (0, vec![(500, vec![(10, 490)])]),
            (1, vec![(200, vec![]), (201, vec![])]),
        ],
        vec![(1, vec![(99, vec![])]), (0, vec![(77, vec![(77, 0)])])],
    ];
    round_trip(&[video, audio], &frags);
}

#[test]
fn sample_sizes_from_trex_defaults() {
    let mut t = track(1, false, Some(Scheme::Cenc), 8);
    t.default_size = Some(256);
    let frags: Vec<Frag> = vec![vec![(0, vec![(256, vec![]), (256, vec![]), (256, vec![])])]];
    round_trip(&[t], &frags);
}

#[test]
fn many_fragments_like_chunked_cmaf() {
    let t = track(1, true, Some(Scheme::Cenc), 16);
    let frags: Vec<Frag> = (0..12)
        .map(|i| vec![(0, vec![(100 + i * 37, vec![(3, 97 + i as u32 * 37)])])])
        .collect();
    round_trip(&[t], &frags);
}

#[test]
fn clear_init_and_segment_pass_through() {
    let t = track(1, true, None, 0);
    let clear_init = init(std::slice::from_ref(&t), false);
    let (out, info) = rewrite_init(&clear_init).unwrap();
    assert_eq!(out, clear_init);
    assert!(!info.is_protected());
    let seg = segment(&[fragment(&[(&t, vec![sample(321, 1, &t, &[])])], 1, false)]);
    assert_eq!(decrypt_segment(&seg, &info, &KeyRing::new()).unwrap(), seg);
}

#[test]
fn init_info_records_protection() {
    let mut t = track(3, true, Some(Scheme::Cbcs), 0);
    t.pattern = Pattern { crypt: 1, skip: 9 };
    t.constant_iv = Some([9; 16]);
    let (_, info) = rewrite_init(&init(&[t], true)).unwrap();
    let p = info.track(3).unwrap().protection.unwrap();
    assert_eq!(p.scheme, Scheme::Cbcs);
    assert_eq!(p.original_format, *b"avc1");
    assert_eq!(p.per_sample_iv_size, 0);
    assert_eq!(p.constant_iv, Some([9; 16]));
    assert_eq!(p.pattern, Pattern { crypt: 1, skip: 9 });
    assert_eq!(p.default_kid, [3; 16]);
    assert_eq!(info.track(3).unwrap().handler, *b"vide");
}

#[test]
fn missing_key_names_the_kid() {
    let a = track(1, true, Some(Scheme::Cenc), 8);
    let b = track(2, false, Some(Scheme::Cenc), 8);
    let (_, info) = rewrite_init(&init(&[a.clone(), b.clone()], true)).unwrap();
    let seg = segment(&[fragment(&[(&b, vec![sample(50, 1, &b, &[])])], 1, true)]);
    let err = decrypt_segment(&seg, &info, &keys_for(&[&a])).unwrap_err();
    assert_eq!(
        err,
        CencError::MissingKey {
            kid: "02020202020202020202020202020202".into()
        }
    );
}

#[test]
fn lone_key_serves_a_single_kid_init() {
    let t = track(1, true, Some(Scheme::Cenc), 8);
    let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
    let seg = segment(&[fragment(&[(&t, vec![sample(80, 1, &t, &[])])], 1, true)]);
    let clear = segment(&[fragment(&[(&t, vec![sample(80, 1, &t, &[])])], 1, false)]);
    let mut keys = KeyRing::new();
    keys.insert([0xee; 16], t.key);
    assert_eq!(decrypt_segment(&seg, &info, &keys).unwrap(), clear);
}

#[test]
fn truncated_segments_never_panic() {
    let t = track(1, true, Some(Scheme::Cenc), 8);
    let init_bytes = init(std::slice::from_ref(&t), true);
    let (_, info) = rewrite_init(&init_bytes).unwrap();
    let seg = segment(&[fragment(
        &[(&t, vec![sample(300, 1, &t, &[(10, 290)])])],
        1,
        true,
    )]);
    let keys = keys_for(&[&t]);
    for len in 0..seg.len() {
        let _ = decrypt_segment(&seg[..len], &info, &keys);
    }
    for len in 0..init_bytes.len() {
        let _ = rewrite_init(&init_bytes[..len]);
    }
}

#[test]
fn corrupt_bytes_never_panic() {
    let t = track(1, true, Some(Scheme::Cenc), 8);
    let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
    let seg = segment(&[fragment(
        &[(&t, vec![sample(300, 1, &t, &[(10, 290)])])],
        1,
        true,
    )]);
    let keys = keys_for(&[&t]);
    for at in 0..seg.len() {
        for value in [0x00, 0x01, 0x7f, 0xff] {
            let mut bad = seg.clone();
            bad[at] = value;
            let _ = decrypt_segment(&bad, &info, &keys);
        }
    }
}

#[test]
fn absolute_base_data_offset_moves_with_the_removed_bytes() {
    let mut t = track(1, true, Some(Scheme::Cenc), 8);
    // Where the single fragment starts: after `styp`, `emsg` and a one-reference `sidx`.
    let prefix = segment(&[Vec::new()]).len() - full(b"prft", 0, 0, &[&be32(1), &[0; 12]]).len();
    t.absolute_at = Some(prefix);
    round_trip(
        &[t],
        &[vec![(0, vec![(700, vec![(20, 680)]), (90, vec![])])]],
    );
}

#[test]
fn init_and_segment_in_one_buffer() {
    let t = track(1, true, Some(Scheme::Cbc1), 16);
    let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
    let frag = |encrypted| {
        fragment(
            &[(&t, vec![sample(512, 3, &t, &[(16, 496)])])],
            1,
            encrypted,
        )
    };
    let joined = [init(std::slice::from_ref(&t), true), segment(&[frag(true)])].concat();
    let want = [
        init(std::slice::from_ref(&t), false),
        segment(&[frag(false)]),
    ]
    .concat();
    assert!(decrypt_segment(&joined, &info, &keys_for(&[&t])).unwrap() == want);
}

#[test]
fn largesize_moof_header_shrinks_to_32_bits() {
    let t = track(1, false, Some(Scheme::Cenc), 16);
    let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
    let samples = || vec![sample(200, 9, &t, &[])];
    let encrypted = fragment(&[(&t, samples())], 1, true);
    // Re-encode the moof header as a 64-bit largesize; trun offsets grow by the 8 extra bytes.
    let moof_len = u32::from_be_bytes(encrypted[..4].try_into().unwrap()) as usize;
    let mut moof = [
        &1u32.to_be_bytes()[..],
        b"moof",
        &((moof_len + 8) as u64).to_be_bytes(),
    ]
    .concat();
    moof.extend_from_slice(&encrypted[8..moof_len]);
    let trun_at = moof.windows(4).position(|w| w == b"trun").unwrap() + 12;
    let offset = u32::from_be_bytes(moof[trun_at..trun_at + 4].try_into().unwrap()) + 8;
    moof[trun_at..trun_at + 4].copy_from_slice(&offset.to_be_bytes());
    moof.extend_from_slice(&encrypted[moof_len..]);
    let clear = fragment(&[(&t, samples())], 1, false);
    assert_eq!(
        decrypt_segment(&moof, &info, &keys_for(&[&t])).unwrap(),
        clear
    );
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    const SCHEMES: [Scheme; 4] = [Scheme::Cenc, Scheme::Cens, Scheme::Cbc1, Scheme::Cbcs];

    /// One sample: either a plain length, or subsample pairs whose sum is the length.
    fn sample_shape(with_subsamples: bool) -> BoxedStrategy<(usize, Vec<(u16, u32)>)> {
        if with_subsamples {
            prop::collection::vec((0u16..200, 0u32..1500), 1..4)
                .prop_map(|subs| {
                    let len = subs.iter().map(|&(c, p)| c as usize + p as usize).sum();
                    (len, subs)
                })
                .boxed()
        } else {
            (0usize..3000).prop_map(|len| (len, Vec::new())).boxed()
        }
    }

    fn case() -> impl Strategy<Value = (Track, Vec<Frag>)> {
        (
            0usize..4,
            any::<bool>(),
            any::<bool>(),
            1u8..4,
            0u8..10,
            any::<bool>(),
        )
            .prop_flat_map(
                |(scheme, wide_iv, constant, crypt, skip, with_subsamples)| {
                    let scheme = SCHEMES[scheme];
                    let mut t = track(1, true, Some(scheme), if wide_iv { 16 } else { 8 });
                    if matches!(scheme, Scheme::Cbc1 | Scheme::Cbcs) {
                        t.iv_size = 16;
                    }
                    if scheme == Scheme::Cbcs && constant {
                        t.iv_size = 0;
                        t.constant_iv = Some([0x5a; 16]);
                    }
                    if matches!(scheme, Scheme::Cens | Scheme::Cbcs) {
                        t.pattern = Pattern { crypt, skip };
                    }
                    let fragment = prop::collection::vec(sample_shape(with_subsamples), 1..6)
                        .prop_map(|samples| vec![(0usize, samples)]);
                    (Just(t), prop::collection::vec(fragment, 1..4))
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn any_scheme_round_trips((t, frags) in case()) {
            round_trip(&[t], &frags);
        }
    }
}

#[test]
fn huge_sample_counts_cost_nothing() {
    let mut t = track(1, true, Some(Scheme::Cbcs), 0);
    t.constant_iv = Some([1; 16]);
    let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
    let keys = keys_for(&[&t]);
    for default_size in [0u32, 1] {
        // tfhd with a default sample size, trun with four billion samples and no sizes.
        let tfhd = full(
            b"tfhd",
            0,
            0x02_0000 | 0x10,
            &[&be32(1), &be32(default_size)],
        );
        let trun = full(b"trun", 0, 0x001, &[&be32(u32::MAX), &be32(0)]);
        let moof = bx(b"moof", &[&bx(b"traf", &[&tfhd, &trun])]);
        let seg = [moof, bx(b"mdat", &[&[0; 64]])].concat();
        let started = std::time::Instant::now();
        let result = decrypt_segment(&seg, &info, &keys);
        assert!(
            started.elapsed().as_secs() < 2,
            "size {default_size}: {result:?}"
        );
        if default_size == 1 {
            assert!(matches!(result, Err(CencError::SampleOutsideMdat { .. })));
        }
    }
}

#[test]
fn truns_pointing_back_at_the_same_bytes_are_refused_while_planning() {
    let mut t = track(1, true, Some(Scheme::Cbcs), 0);
    t.constant_iv = Some([1; 16]);
    let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
    let keys = keys_for(&[&t]);
    // `runs` data-offset-only `trun`s of 16-byte samples (`tfhd` default), no `senc`, each
    // pointing at the start of the same 256-byte `mdat` payload.
    let payload = 256u32;
    let seg = |runs: usize| {
        let tfhd = full(b"tfhd", 0, 0x02_0000 | 0x10, &[&be32(1), &be32(16)]);
        let trun_len = 20;
        let moof_len = 8 + 8 + tfhd.len() + runs * trun_len;
        let trun = full(
            b"trun",
            0,
            0x001,
            &[&be32(payload / 16), &be32(moof_len as u32 + 8)],
        );
        let mut traf = vec![tfhd.as_slice()];
        traf.extend(std::iter::repeat_n(trun.as_slice(), runs));
        let moof = bx(b"moof", &[&bx(b"traf", &traf)]);
        assert_eq!(moof.len(), moof_len);
        [moof, bx(b"mdat", &[&vec![0; payload as usize]])].concat()
    };
    // One run: one job per sample.
    assert_eq!(segment::planned_jobs(&seg(1), &info, &keys), Ok(16));
    // Eight runs over the same bytes: refused before any job past the segment's size is listed
    // (unbounded, this listed 8 x 16 jobs; a 1 MiB segment of such runs lists billions).
    let hostile = seg(8);
    // The first run uses 256 of the segment's bytes; the second runs out part way, at the
    // first sample that does not fit what is left.
    let start = hostile.len() - payload as usize;
    let left = hostile.len() - payload as usize;
    let want = CencError::SamplesPastSegment {
        track_id: 1,
        offset: (start + left / 16 * 16) as u64,
        segment: hostile.len() as u64,
    };
    assert_eq!(
        segment::planned_jobs(&hostile, &info, &keys),
        Err(want.clone())
    );
    assert_eq!(decrypt_segment(&hostile, &info, &keys), Err(want));
}

#[test]
fn jobs_take_less_memory_than_twice_the_segment() {
    // One-byte CTR samples, each with an 8-byte IV in `senc`: a job per 9 bytes, the most a
    // segment can list. At 56 bytes a job (the IV and subsample slice copied in), the list
    // took six times the segment: ~470 MB for a 64 MiB one.
    let mut t = track(1, false, Some(Scheme::Cenc), 8);
    t.default_size = Some(1);
    let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
    let keys = keys_for(&[&t]);
    let n = 20_000u32;
    let frag = |encrypted| {
        let samples = (0..n).map(|i| sample(1, i, &t, &[])).collect();
        fragment(&[(&t, samples)], 1, encrypted)
    };
    let seg = frag(true);
    assert_eq!(segment::planned_jobs(&seg, &info, &keys), Ok(n as usize));
    let job_bytes = n as usize * segment::JOB_SIZE;
    assert!(
        job_bytes < 2 * seg.len(),
        "{job_bytes} bytes of jobs for a {}-byte segment",
        seg.len()
    );
    assert_eq!(segment::JOB_SIZE, 16);
    // Read back from `senc` when decrypting, the IVs still make the clear samples.
    assert!(decrypt_segment(&seg, &info, &keys).unwrap() == frag(false));
}

/// A `seig` group description entry: pattern, isProtected, per-sample IV size, KID and, when
/// protected with no per-sample IV, the constant IV.
fn seig_entry(pattern: Pattern, protected: bool, iv_size: u8, kid: [u8; 16], iv: &[u8]) -> Vec<u8> {
    let mut e = vec![
        0,
        (pattern.crypt << 4) | pattern.skip,
        u8::from(protected),
        iv_size,
    ];
    e.extend_from_slice(&kid);
    if protected && iv_size == 0 {
        e.push(iv.len() as u8);
        e.extend_from_slice(iv);
    }
    e
}

/// A `seig` `sgpd` (version 1, each entry with its length) and an `sbgp` of (samples, index) runs.
fn seig_groups(entries: &[Vec<u8>], runs: &[(u32, u32)]) -> Vec<u8> {
    let mut body = be32(entries.len() as u32).to_vec();
    for e in entries {
        body.extend_from_slice(&be32(e.len() as u32));
        body.extend_from_slice(e);
    }
    let mut out = full(b"sgpd", 1, 0, &[b"seig", &be32(0), &body]);
    let mut map = be32(runs.len() as u32).to_vec();
    for &(count, index) in runs {
        map.extend_from_slice(&be32(count));
        map.extend_from_slice(&be32(index));
    }
    if !runs.is_empty() {
        out.extend_from_slice(&full(b"sbgp", 0, 0, &[b"seig", &map]));
    }
    out
}

/// The tracks the `seig` tests use: `cbcs` with a constant IV, and `cenc` with 8-byte IVs.
fn seig_tracks() -> [Track; 2] {
    let mut cbcs = track(1, true, Some(Scheme::Cbcs), 0);
    cbcs.constant_iv = Some([7; 16]);
    cbcs.pattern = Pattern { crypt: 1, skip: 9 };
    [cbcs, track(1, true, Some(Scheme::Cenc), 8)]
}

/// The track's `tenc`, as a `seig` entry.
fn tenc_entry(t: &Track) -> Vec<u8> {
    seig_entry(
        t.pattern,
        true,
        t.iv_size,
        t.kid,
        &t.constant_iv.unwrap_or_default()[..16],
    )
}

#[test]
fn seig_groups_repeating_the_tenc_decrypt() {
    // GPAC writes `seig` groups in every fragment after a clear lead, its samples mapped to
    // index 0 (no group: the `tenc`) or to an entry repeating the `tenc`. They were refused.
    for t in seig_tracks() {
        let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
        let keys = keys_for(&[&t]);
        let frag = |encrypted, extra: &[u8]| {
            let samples = (0..3).map(|i| sample(400, i, &t, &[])).collect();
            fragment_with(&[(&t, samples)], 1, encrypted, extra)
        };
        let tenc = tenc_entry(&t);
        let clear_lead = seig_entry(Pattern::NONE, false, 0, [0; 16], &[]);
        for groups in [
            seig_groups(std::slice::from_ref(&tenc), &[(3, 0)]),
            seig_groups(std::slice::from_ref(&clear_lead), &[(3, 0)]),
            seig_groups(std::slice::from_ref(&tenc), &[(3, 0x1_0001)]),
            seig_groups(&[clear_lead, tenc.clone()], &[(1, 0), (2, 0x1_0002)]),
            // A description no sample maps to.
            seig_groups(std::slice::from_ref(&tenc), &[]),
        ] {
            let out = decrypt_segment(&frag(true, &groups), &info, &keys);
            assert!(out.unwrap() == frag(false, &groups), "{}", t.iv_size);
        }
        // Other groups (`roll` for AAC) say nothing about encryption.
        let roll = full(b"sbgp", 0, 0, &[b"roll", &be32(1), &be32(3), &be32(1)]);
        let out = decrypt_segment(&frag(true, &roll), &info, &keys);
        assert!(out.unwrap() == frag(false, &roll));
    }
}

#[test]
fn seig_sample_groups_are_refused() {
    for t in seig_tracks() {
        let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
        let keys = keys_for(&[&t]);
        let frag = |encrypted, extra: &[u8]| {
            let samples = (0..3).map(|i| sample(400, i, &t, &[])).collect();
            fragment_with(&[(&t, samples)], 1, encrypted, extra)
        };
        let refused = Err(CencError::KeyGroups { track_id: 1 });
        let tenc = tenc_entry(&t);
        // A clear lead: its samples are clear and, under `cbcs` with a constant IV, nothing
        // else told them apart; they were "decrypted" into garbage.
        let clear = seig_entry(Pattern::NONE, false, 0, [0; 16], &[]);
        let lead = seig_groups(&[tenc.clone(), clear], &[(1, 0x1_0002), (2, 0)]);
        assert_eq!(decrypt_segment(&frag(false, &lead), &info, &keys), refused);
        // Key rotation: encrypted, but under another key than the track's.
        let rotated = seig_entry(t.pattern, true, t.iv_size, [0x99; 16], &[7; 16]);
        let rotated = seig_groups(&[rotated], &[(3, 0x1_0001)]);
        assert_eq!(
            decrypt_segment(&frag(true, &rotated), &info, &keys),
            refused
        );
        // Another constant IV, or another IV size.
        let other_iv = match t.iv_size {
            0 => seig_entry(t.pattern, true, 0, t.kid, &[8; 16]),
            _ => seig_entry(t.pattern, true, 16, t.kid, &[]),
        };
        let other_iv = seig_groups(&[other_iv], &[(3, 0x1_0001)]);
        assert_eq!(
            decrypt_segment(&frag(true, &other_iv), &info, &keys),
            refused
        );
        // An index into the init's descriptions, which are not kept, or past the `traf`'s.
        for index in [1, 0x1_0002] {
            let groups = seig_groups(std::slice::from_ref(&tenc), &[(3, index)]);
            assert_eq!(decrypt_segment(&frag(true, &groups), &info, &keys), refused);
        }
        // A version 2 description naming a default for the samples no `sbgp` maps.
        let clear = seig_entry(Pattern::NONE, false, 0, [0; 16], &[]);
        let mut body = be32(1).to_vec();
        body.extend_from_slice(&clear);
        let v2 = full(b"sgpd", 2, 0, &[b"seig", &be32(20), &be32(1), &body]);
        assert_eq!(decrypt_segment(&frag(false, &v2), &info, &keys), refused);
        // Counts the boxes cannot hold are errors, not allocations.
        let huge = full(b"sbgp", 0, 0, &[b"seig", &be32(u32::MAX)]);
        assert!(matches!(
            decrypt_segment(&frag(true, &huge), &info, &keys),
            Err(CencError::Mp4(Mp4Error::CountOverflow { .. }))
        ));
        let huge = full(b"sgpd", 1, 0, &[b"seig", &be32(20), &be32(u32::MAX)]);
        assert!(matches!(
            decrypt_segment(&frag(true, &huge), &info, &keys),
            Err(CencError::Mp4(Mp4Error::CountOverflow { .. }))
        ));
    }
}

/// A Shaka Packager track with its default clear lead: the protected entry, then a clear one
/// (index 2) that the clear fragments name.
fn shaka_clear_lead(mut t: Track) -> Track {
    let clear = sample_entry(&t, false);
    t.more_entries = vec![clear];
    t
}

/// Three samples of `t` in one fragment, encrypted when `encrypted`, naming sample entry `index`
/// in `tfhd` (none when `None`: the `trex` default applies).
fn indexed_fragment(t: &Track, index: Option<u32>, seq: u32, encrypted: bool) -> Vec<u8> {
    let mut t = t.clone();
    t.description_index = index;
    let samples = (0..3).map(|i| sample(400, seq * 10 + i, &t, &[])).collect();
    fragment(&[(&t, samples)], seq, encrypted)
}

#[test]
fn shaka_clear_lead_passes_through_and_the_rest_decrypts() {
    // The clear lead's fragments name the clear entry through `tfhd` (Shaka) or the `trex`
    // default, and carry no `senc`. The track's `tenc` was applied to them: `cbcs` with a
    // constant IV "decrypted" them into garbage, `cenc` refused them for want of IVs.
    for base in seig_tracks() {
        for via_trex in [false, true] {
            let mut t = shaka_clear_lead(base.clone());
            // Through `trex`, the encrypted fragments name their entry in `tfhd`.
            let (lead_index, protected_index) = match via_trex {
                false => (Some(2), None),
                true => {
                    t.trex_index = Some(2);
                    (None, Some(1))
                }
            };
            let (clear_init, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
            // The rewritten init keeps both entries, both clear now: index 2 still names one.
            assert_eq!(clear_init, init(std::slice::from_ref(&t), false));
            let track = info.track(1).unwrap();
            let first = EntryProtection::Protected(track.protection.unwrap());
            assert_eq!(track.entries, vec![first, EntryProtection::Clear]);
            let keys = keys_for(&[&t]);
            let lead = indexed_fragment(&t, lead_index, 1, false);
            let seg = |encrypted| {
                segment(&[
                    lead.clone(),
                    indexed_fragment(&t, protected_index, 2, encrypted),
                ])
            };
            let out = decrypt_segment(&seg(true), &info, &keys).unwrap();
            assert!(out == seg(false), "{} via trex {via_trex}", t.iv_size);
            // The lead is where it was, byte for byte (only the `sidx` before it shrank).
            let at = seg(true).windows(lead.len()).position(|w| w == lead);
            assert_eq!(at, seg(false).windows(lead.len()).position(|w| w == lead));
            let at = at.unwrap();
            assert!(out[at..at + lead.len()] == lead[..]);
            // A clear lead alone needs no key at all.
            let alone = segment(std::slice::from_ref(&lead));
            assert!(decrypt_segment(&alone, &info, &KeyRing::new()).unwrap() == alone);
        }
    }
}

#[test]
fn a_fragment_naming_no_sample_entry_is_refused() {
    for base in seig_tracks() {
        for (t, entries) in [(base.clone(), 1), (shaka_clear_lead(base), 2)] {
            let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
            let keys = keys_for(&[&t]);
            // Index 0 takes the `trex` default (a_description_index_of_0_takes_the_trex_default).
            for index in [entries + 1, u32::MAX] {
                let seg = segment(&[indexed_fragment(&t, Some(index), 1, true)]);
                assert_eq!(
                    decrypt_segment(&seg, &info, &keys),
                    Err(CencError::NoSampleDescription {
                        track_id: 1,
                        index,
                        entries,
                    })
                );
            }
            // The same through a `trex` default naming no entry, whatever `tfhd` says with 0.
            let mut t = t.clone();
            t.trex_index = Some(entries + 1);
            let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
            for index in [None, Some(0)] {
                let seg = segment(&[indexed_fragment(&t, index, 1, true)]);
                assert_eq!(
                    decrypt_segment(&seg, &info, &keys),
                    Err(CencError::NoSampleDescription {
                        track_id: 1,
                        index: entries + 1,
                        entries,
                    })
                );
            }
        }
    }
}

#[test]
fn a_fragment_naming_another_protected_entry_is_refused() {
    // Two protected entries, the second under another KID: its key was never looked up.
    for mut t in seig_tracks() {
        let mut other = t.clone();
        other.kid = [0x77; 16];
        t.more_entries = vec![sample_entry(&other, true)];
        let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
        let keys = keys_for(&[&t, &other]);
        let seg = segment(&[indexed_fragment(&t, Some(2), 1, true)]);
        assert_eq!(
            decrypt_segment(&seg, &info, &keys),
            Err(CencError::OtherProtection {
                track_id: 1,
                index: 2
            })
        );
        // Its first entry still decrypts.
        let seg = |encrypted| segment(&[indexed_fragment(&t, Some(1), 1, encrypted)]);
        assert!(decrypt_segment(&seg(true), &info, &keys).unwrap() == seg(false));
    }
}

/// A version 2 `seig` `sgpd` for the init's `stbl`, its entries numbered from 1, naming
/// `default_index` for the samples no `sbgp` maps.
fn init_seig_default(entries: &[Vec<u8>], default_index: u32) -> Vec<u8> {
    let mut body = be32(entries.len() as u32).to_vec();
    for e in entries {
        body.extend_from_slice(&be32(e.len() as u32));
        body.extend_from_slice(e);
    }
    full(
        b"sgpd",
        2,
        0,
        &[b"seig", &be32(0), &be32(default_index), &body],
    )
}

#[test]
fn an_init_seig_default_unlike_the_tenc_is_refused() {
    // An init whose `seig` description makes a clear (or other-key) entry the default for every
    // sample: the track's `tenc` was applied anyway, `cbcs` clear samples turned into garbage.
    for base in seig_tracks() {
        let clear = seig_entry(Pattern::NONE, false, 0, [0; 16], &[]);
        let rotated = seig_entry(base.pattern, true, base.iv_size, [0x99; 16], &[7; 16]);
        let tenc = tenc_entry(&base);
        let with = |stbl_extra: Vec<u8>| {
            let mut t = base.clone();
            t.stbl_extra = stbl_extra;
            let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
            (t, info)
        };
        for (groups, encrypted) in [
            (init_seig_default(std::slice::from_ref(&clear), 1), false),
            (init_seig_default(&[tenc.clone(), clear.clone()], 2), false),
            (init_seig_default(std::slice::from_ref(&rotated), 1), true),
            // A default past the entries.
            (init_seig_default(std::slice::from_ref(&tenc), 2), true),
        ] {
            let (t, info) = with(groups);
            assert!(info.track(1).unwrap().seig_default_differs);
            let seg = segment(&[indexed_fragment(&t, None, 1, encrypted)]);
            assert_eq!(
                decrypt_segment(&seg, &info, &keys_for(&[&t])),
                Err(CencError::KeyGroups { track_id: 1 }),
                "{} encrypted {encrypted}",
                t.iv_size
            );
        }
        // A default repeating the `tenc`, or none, decrypts as before.
        for groups in [
            init_seig_default(&[clear.clone(), tenc.clone()], 2),
            init_seig_default(&[clear.clone(), tenc.clone()], 0),
        ] {
            let (t, info) = with(groups);
            assert!(!info.track(1).unwrap().seig_default_differs);
            let seg = |encrypted| segment(&[indexed_fragment(&t, None, 1, encrypted)]);
            let out = decrypt_segment(&seg(true), &info, &keys_for(&[&t]));
            assert!(out.unwrap() == seg(false));
        }
        // A clear lead's fragments stay untouched whatever the default: nothing is decrypted.
        let t = shaka_clear_lead(with(init_seig_default(std::slice::from_ref(&clear), 1)).0);
        let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
        assert!(info.track(1).unwrap().seig_default_differs);
        let lead = segment(&[indexed_fragment(&t, Some(2), 1, false)]);
        assert!(decrypt_segment(&lead, &info, &keys_for(&[&t])).unwrap() == lead);
    }
}

#[test]
fn a_description_index_of_0_takes_the_trex_default() {
    // `tfhd` may carry index 0, which names no entry: Chrome takes the `trex` default for it,
    // and ffmpeg and GStreamer a `trex` default of 0 as the first entry. Both were refused.
    for base in seig_tracks() {
        let t = shaka_clear_lead(base);
        let keys = keys_for(&[&t]);
        for (trex_index, tfhd_index) in [(1, Some(0)), (0, Some(0)), (0, None)] {
            let mut t = t.clone();
            t.trex_index = Some(trex_index);
            let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
            let seg = |encrypted| segment(&[indexed_fragment(&t, tfhd_index, 1, encrypted)]);
            let out = decrypt_segment(&seg(true), &info, &keys);
            assert!(
                out.as_ref().ok() == Some(&seg(false)),
                "trex {trex_index} tfhd {tfhd_index:?}: {:?}",
                out.err()
            );
        }
        // `trex` naming the clear entry makes a 0 in `tfhd` the clear lead.
        let mut t = t.clone();
        t.trex_index = Some(2);
        let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
        let lead = segment(&[indexed_fragment(&t, Some(0), 1, false)]);
        assert!(decrypt_segment(&lead, &info, &keys).unwrap() == lead);
    }
}

#[test]
fn a_later_unreadable_protected_entry_is_refused_only_when_named() {
    // Protected entries after the first that do not read (another scheme, `frma`, `schm` or
    // `tenc` missing) failed the whole init, so the first entry and the clear lead with it.
    for mut t in seig_tracks() {
        let scheme = scheme_fourcc(t.scheme.unwrap());
        let unreadable = [
            (
                protected_entry(&t, Some(b"avc1"), Some(b"abcd"), true),
                CencError::UnsupportedScheme {
                    track_id: 1,
                    scheme: "abcd".into(),
                },
            ),
            (
                protected_entry(&t, None, Some(scheme), true),
                CencError::MissingBox("frma"),
            ),
            (
                protected_entry(&t, Some(b"avc1"), None, true),
                CencError::MissingBox("schm"),
            ),
            (
                protected_entry(&t, Some(b"avc1"), Some(scheme), false),
                CencError::MissingBox("tenc"),
            ),
        ];
        t.more_entries = unreadable.iter().map(|(e, _)| e.clone()).collect();
        t.more_entries.push(sample_entry(&t, false));
        let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
        let keys = keys_for(&[&t]);
        for (i, (_, refused)) in unreadable.iter().enumerate() {
            let index = i as u32 + 2;
            let seg = segment(&[indexed_fragment(&t, Some(index), 1, true)]);
            assert_eq!(decrypt_segment(&seg, &info, &keys), Err(refused.clone()));
        }
        // The first entry decrypts and the clear lead (the last entry) passes.
        let seg = |encrypted| segment(&[indexed_fragment(&t, Some(1), 1, encrypted)]);
        assert!(decrypt_segment(&seg(true), &info, &keys).unwrap() == seg(false));
        let lead = segment(&[indexed_fragment(&t, Some(6), 1, false)]);
        assert!(decrypt_segment(&lead, &info, &keys).unwrap() == lead);
    }
    // The first protected entry, which decrypts the track, is still read strictly.
    let mut t = track(1, true, None, 8);
    t.more_entries = vec![protected_entry(&t, Some(b"avc1"), Some(b"abcd"), true)];
    assert_eq!(
        rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap_err(),
        CencError::UnsupportedScheme {
            track_id: 1,
            scheme: "abcd".into()
        }
    );
}

#[test]
fn entries_differing_only_in_their_clear_format_decrypt_alike() {
    // `avc1` then `avc3` under one `tenc` (or `hvc1` and `hev1`): the clear format is not used
    // by decryption, but the comparison with the first entry counted it (OtherProtection).
    for mut t in seig_tracks() {
        let scheme = scheme_fourcc(t.scheme.unwrap());
        t.more_entries = vec![protected_entry(&t, Some(b"avc3"), Some(scheme), true)];
        let (clear_init, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
        assert!(clear_init.windows(4).any(|w| w == b"avc3"));
        assert!(!clear_init.windows(4).any(|w| w == b"encv"));
        let keys = keys_for(&[&t]);
        let seg = |encrypted| segment(&[indexed_fragment(&t, Some(2), 1, encrypted)]);
        let out = decrypt_segment(&seg(true), &info, &keys);
        assert!(out.as_ref().ok() == Some(&seg(false)), "{:?}", out.err());
    }
}

#[test]
fn an_unreadable_init_seig_description_refuses_only_protected_fragments() {
    // The init's `seig` description was not read before clear leads were; one that does not
    // parse failed the whole init rewrite, the clear lead with it.
    for base in seig_tracks() {
        let mut t = shaka_clear_lead(base);
        let cut_short = tenc_entry(&t)[..10].to_vec();
        for broken in [
            full(
                b"sgpd",
                2,
                0,
                &[b"seig", &be32(0), &be32(1), &be32(u32::MAX)],
            ),
            init_seig_default(&[cut_short], 1),
        ] {
            t.stbl_extra = broken;
            let (clear_init, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
            assert_eq!(clear_init, init(std::slice::from_ref(&t), false));
            assert!(info.track(1).unwrap().seig_default_differs);
            let keys = keys_for(&[&t]);
            let seg = segment(&[indexed_fragment(&t, Some(1), 1, true)]);
            assert_eq!(
                decrypt_segment(&seg, &info, &keys),
                Err(CencError::KeyGroups { track_id: 1 })
            );
            let lead = segment(&[indexed_fragment(&t, Some(2), 1, false)]);
            assert!(decrypt_segment(&lead, &info, &keys).unwrap() == lead);
        }
    }
}

#[test]
fn a_clear_lead_carrying_empty_encryption_boxes_loses_them() {
    // A clear lead fragment may carry empty `saiz`, `saio` and `senc`: they are dropped from
    // every `traf`, so its `trun` offsets (or absolute base) and the `sidx` move with them.
    for base in seig_tracks() {
        let t = shaka_clear_lead(base);
        let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
        let keys = keys_for(&[&t]);
        let empty = [
            full(b"saiz", 0, 0, &[&[t.iv_size], &be32(0)]),
            full(b"saio", 0, 0, &[&be32(0)]),
            full(b"senc", 0, 0, &[&be32(0)]),
        ]
        .concat();
        // Where the lead starts: after `styp`, `emsg` and a two-reference `sidx`.
        let prft = full(b"prft", 0, 0, &[&be32(1), &[0; 12]]).len();
        let prefix = segment(&[Vec::new(), Vec::new()]).len() - prft;
        for absolute_at in [None, Some(prefix)] {
            let mut lead_track = t.clone();
            lead_track.description_index = Some(2);
            lead_track.absolute_at = absolute_at;
            let lead = |extra: &[u8]| {
                let samples = (0..3)
                    .map(|i| sample(400, 10 + i, &lead_track, &[]))
                    .collect();
                fragment_with(&[(&lead_track, samples)], 1, false, extra)
            };
            let seg = |encrypted, extra: &[u8]| {
                let rest = indexed_fragment(&t, Some(1), 2, encrypted);
                segment(&[lead(extra), rest])
            };
            let out = decrypt_segment(&seg(true, &empty), &info, &keys);
            assert!(
                out.as_ref().ok() == Some(&seg(false, &[])),
                "{} at {absolute_at:?}: {:?}",
                t.iv_size,
                out.err()
            );
        }
    }
}

#[test]
fn a_box_removed_between_a_moof_and_its_mdat_is_refused() {
    let t = track(1, true, Some(Scheme::Cenc), 8);
    let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
    let keys = keys_for(&[&t]);
    let samples = || vec![sample(300, 4, &t, &[(10, 290)])];
    let encrypted = fragment(&[(&t, samples())], 1, true);
    let clear = fragment(&[(&t, samples())], 1, false);
    let pssh = full(b"pssh", 0, 0, &[&[0x10; 16], &be32(0)]);
    // Before the `moof`, a dropped `pssh` moves the `moof` and its data alike.
    let before = [pssh.clone(), encrypted.clone()].concat();
    assert_eq!(decrypt_segment(&before, &info, &keys).unwrap(), clear);
    // Between them, the `trun` offset counts the `pssh` (moved here to still find the `mdat`),
    // whose removal it was not moved for: the output pointed 32 bytes past the samples.
    let moof_len = u32::from_be_bytes(encrypted[..4].try_into().unwrap()) as usize;
    let mut moof = encrypted[..moof_len].to_vec();
    let trun_at = moof.windows(4).position(|w| w == b"trun").unwrap() + 12;
    let offset = u32::from_be_bytes(moof[trun_at..trun_at + 4].try_into().unwrap());
    moof[trun_at..trun_at + 4].copy_from_slice(&(offset + pssh.len() as u32).to_be_bytes());
    let between = [moof, pssh, encrypted[moof_len..].to_vec()].concat();
    assert_eq!(
        decrypt_segment(&between, &info, &keys),
        Err(CencError::RemovedBeforeMdat {
            kind: "pssh".into()
        })
    );
}

#[test]
fn a_box_removed_after_an_empty_mdat_is_refused() {
    let t = track(1, true, Some(Scheme::Cenc), 8);
    let (_, info) = rewrite_init(&init(std::slice::from_ref(&t), true)).unwrap();
    let keys = keys_for(&[&t]);
    let samples = || vec![sample(300, 4, &t, &[(10, 290)])];
    let encrypted = fragment(&[(&t, samples())], 1, true);
    let clear = fragment(&[(&t, samples())], 1, false);
    let pssh = full(b"pssh", 0, 0, &[&[0x10; 16], &be32(0)]);
    let empty = bx(b"mdat", &[]);
    // After the samples' `mdat`, a dropped `pssh` moves nothing the `moof` points at.
    let after = [encrypted.clone(), empty.clone(), pssh.clone()].concat();
    let want = [clear, empty.clone()].concat();
    assert_eq!(decrypt_segment(&after, &info, &keys).unwrap(), want);
    // An empty `mdat` first, then the `pssh`, then the samples: the `trun` offset counts the
    // `pssh`, and the output pointed 32 bytes past the samples.
    let moof_len = u32::from_be_bytes(encrypted[..4].try_into().unwrap()) as usize;
    let mut moof = encrypted[..moof_len].to_vec();
    let trun_at = moof.windows(4).position(|w| w == b"trun").unwrap() + 12;
    let offset = u32::from_be_bytes(moof[trun_at..trun_at + 4].try_into().unwrap());
    let moved = offset + (empty.len() + pssh.len()) as u32;
    moof[trun_at..trun_at + 4].copy_from_slice(&moved.to_be_bytes());
    let between = [moof, empty, pssh, encrypted[moof_len..].to_vec()].concat();
    assert_eq!(
        decrypt_segment(&between, &info, &keys),
        Err(CencError::RemovedBeforeMdat {
            kind: "pssh".into()
        })
    );
}
