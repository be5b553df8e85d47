//! The init segment (`ftyp`, `moov`) and one movie fragment (`moof`, `mdat`) of the fMP4
//! writer, written with the MP4 module's box writers. No I/O.

use super::{Config, Run};
use crate::mp4::{write_box_with as boxed, write_full_box_with as full};

/// `trun` flags: data offset, and per sample duration, size, flags, composition offset.
const DATA_OFFSET: u32 = 0x1;
const DURATION: u32 = 0x100;
const SIZE: u32 = 0x200;
const FLAGS: u32 = 0x400;
const COMPOSITION: u32 = 0x800;
/// `tfhd`: offsets count from the `moof`.
const BASE_IS_MOOF: u32 = 0x02_0000;
/// Sample flags: a sync sample depends on nothing; any other depends on others and is not sync.
const SYNC: u32 = 0x0200_0000;
const NOT_SYNC: u32 = 0x0101_0000;

const MATRIX: [u32; 9] = [0x0001_0000, 0, 0, 0, 0x0001_0000, 0, 0, 0, 0x4000_0000];

fn u16s(out: &mut Vec<u8>, v: &[u16]) {
    v.iter()
        .for_each(|x| out.extend_from_slice(&x.to_be_bytes()));
}

fn u32s(out: &mut Vec<u8>, v: &[u32]) {
    v.iter()
        .for_each(|x| out.extend_from_slice(&x.to_be_bytes()));
}

/// `ftyp` and `moov` for the tracks `(track_id, config)`.
pub(super) fn init(tracks: &[(u32, Config)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1024);
    boxed(&mut out, *b"ftyp", |o| {
        o.extend_from_slice(b"iso6");
        u32s(o, &[0]);
        o.extend_from_slice(b"iso6isommp41");
    });
    boxed(&mut out, *b"moov", |o| {
        full(o, *b"mvhd", 0, 0, |o| {
            // Times, timescale (ms), duration (fragments say), rate 1.0, volume 1.0.
            u32s(o, &[0, 0, 1000, 0, 0x0001_0000]);
            u16s(o, &[0x0100, 0]);
            u32s(o, &[0, 0]);
            u32s(o, &MATRIX);
            u32s(o, &[0; 6]);
            let next = tracks.iter().map(|t| t.0).max().unwrap_or(0) + 1;
            u32s(o, &[next]);
        });
        for (id, config) in tracks {
            trak(o, *id, config);
        }
        boxed(o, *b"mvex", |o| {
            for (id, _) in tracks {
                full(o, *b"trex", 0, 0, |o| u32s(o, &[*id, 1, 0, 0, 0]));
            }
        });
    });
    out
}

fn trak(out: &mut Vec<u8>, id: u32, config: &Config) {
    let (width, height, volume) = match config {
        Config::Avc(v) => (v.width, v.height, 0),
        Config::Aac(_) => (0, 0, 0x0100),
    };
    boxed(out, *b"trak", |o| {
        // Enabled, in the movie.
        full(o, *b"tkhd", 0, 3, |o| {
            u32s(o, &[0, 0, id, 0, 0, 0, 0]);
            u16s(o, &[0, 0, volume, 0]);
            u32s(o, &MATRIX);
            u32s(o, &[u32::from(width) << 16, u32::from(height) << 16]);
        });
        boxed(o, *b"mdia", |o| {
            full(o, *b"mdhd", 0, 0, |o| {
                u32s(o, &[0, 0, config.timescale(), 0]);
                // Language "und", packed.
                u16s(o, &[0x55c4, 0]);
            });
            let (handler, name): (&[u8; 4], &[u8]) = match config {
                Config::Avc(_) => (b"vide", b"sluice video\0"),
                Config::Aac(_) => (b"soun", b"sluice audio\0"),
            };
            full(o, *b"hdlr", 0, 0, |o| {
                u32s(o, &[0]);
                o.extend_from_slice(handler);
                u32s(o, &[0, 0, 0]);
                o.extend_from_slice(name);
            });
            boxed(o, *b"minf", |o| {
                match config {
                    Config::Avc(_) => full(o, *b"vmhd", 0, 1, |o| u16s(o, &[0; 4])),
                    Config::Aac(_) => full(o, *b"smhd", 0, 0, |o| u16s(o, &[0, 0])),
                }
                boxed(o, *b"dinf", |o| {
                    full(o, *b"dref", 0, 0, |o| {
                        u32s(o, &[1]);
                        // The media is in this file.
                        full(o, *b"url ", 0, 1, |_| {});
                    });
                });
                boxed(o, *b"stbl", |o| {
                    full(o, *b"stsd", 0, 0, |o| {
                        u32s(o, &[1]);
                        sample_entry(o, config);
                    });
                    // Empty tables: the samples are in the fragments.
                    full(o, *b"stts", 0, 0, |o| u32s(o, &[0]));
                    full(o, *b"stsc", 0, 0, |o| u32s(o, &[0]));
                    full(o, *b"stsz", 0, 0, |o| u32s(o, &[0, 0]));
                    full(o, *b"stco", 0, 0, |o| u32s(o, &[0]));
                });
            });
        });
    });
}

fn sample_entry(out: &mut Vec<u8>, config: &Config) {
    match config {
        Config::Avc(v) => boxed(out, *b"avc1", |o| {
            // Reserved, data reference 1, pre-defined and reserved.
            u16s(o, &[0, 0, 0, 1]);
            u32s(o, &[0; 4]);
            u16s(o, &[v.width, v.height]);
            // 72 dpi both ways, reserved, one frame per sample.
            u32s(o, &[0x0048_0000, 0x0048_0000, 0]);
            u16s(o, &[1]);
            o.extend_from_slice(&[0; 32]); // compressor name
            u16s(o, &[0x0018, 0xffff]); // depth, pre-defined -1
            boxed(o, *b"avcC", |o| avcc(o, v));
        }),
        Config::Aac(a) => boxed(out, *b"mp4a", |o| {
            u16s(o, &[0, 0, 0, 1]);
            u32s(o, &[0, 0]);
            u16s(o, &[a.channels(), 16, 0, 0]);
            // 16.16 rate; rates above 65535 Hz do not fit and are read from the config.
            let rate = if a.rate <= 0xffff { a.rate << 16 } else { 0 };
            u32s(o, &[rate]);
            // ES_ID 0, as ISO-BMFF asks (the track id names the stream).
            full(o, *b"esds", 0, 0, |o| {
                esds(o, 0, &a.audio_specific_config())
            });
        }),
    }
}

fn avcc(out: &mut Vec<u8>, v: &super::h264::AvcConfig) {
    let sps = &v.sps[0];
    // Version 1, profile, compatibility and level from the SPS, 4-byte lengths.
    out.extend_from_slice(&[1, sps[1], sps[2], sps[3], 0xff]);
    out.push(0xe0 | v.sps.len() as u8);
    for s in &v.sps {
        u16s(out, &[s.len() as u16]);
        out.extend_from_slice(s);
    }
    out.push(v.pps.len() as u8);
    for p in &v.pps {
        u16s(out, &[p.len() as u16]);
        out.extend_from_slice(p);
    }
    if let (Some((format, luma, chroma)), true) =
        (v.chroma, matches!(sps[1], 100 | 110 | 122 | 144))
    {
        out.extend_from_slice(&[0xfc | format, 0xf8 | luma, 0xf8 | chroma, 0]);
    }
}

/// An ES_Descriptor: AAC (object type 0x40), an audio stream, its AudioSpecificConfig.
fn esds(out: &mut Vec<u8>, es_id: u16, asc: &[u8; 2]) {
    let mut specific = vec![0x05, asc.len() as u8];
    specific.extend_from_slice(asc);
    let mut decoder = vec![0x04, (13 + specific.len()) as u8, 0x40, 0x15];
    decoder.extend_from_slice(&[0, 0, 0]); // buffer size
    decoder.extend_from_slice(&[0; 8]); // max and average bitrate
    decoder.extend_from_slice(&specific);
    let sl = [0x06, 1, 0x02];
    out.extend_from_slice(&[0x03, (3 + decoder.len() + sl.len()) as u8]);
    u16s(out, &[es_id]);
    out.push(0);
    out.extend_from_slice(&decoder);
    out.extend_from_slice(&sl);
}

/// `moof` (number `sequence`, one `traf` per run) and the `mdat` with every run's samples.
pub(super) fn fragment(sequence: u32, runs: &[Run]) -> Vec<u8> {
    let data: usize = runs.iter().map(|r| r.data.len()).sum();
    let mut out = Vec::with_capacity(data + 1024 + runs.len() * 16 * 64);
    // Where each run's data offset goes, patched once the moof's size is known.
    let mut offsets = Vec::with_capacity(runs.len());
    boxed(&mut out, *b"moof", |o| {
        full(o, *b"mfhd", 0, 0, |o| u32s(o, &[sequence]));
        for run in runs {
            boxed(o, *b"traf", |o| {
                full(o, *b"tfhd", 0, BASE_IS_MOOF, |o| u32s(o, &[run.track_id]));
                full(o, *b"tfdt", 1, 0, |o| {
                    o.extend_from_slice(&run.start.to_be_bytes())
                });
                let video = matches!(run.config, Config::Avc(_));
                let flags = if video {
                    DATA_OFFSET | DURATION | SIZE | FLAGS | COMPOSITION
                } else {
                    DATA_OFFSET | DURATION | SIZE
                };
                full(o, *b"trun", 1, flags, |o| {
                    u32s(o, &[run.samples.len() as u32]);
                    offsets.push(o.len());
                    u32s(o, &[0]);
                    for s in &run.samples {
                        u32s(o, &[s.duration, s.size]);
                        if video {
                            let f = if s.sync { SYNC } else { NOT_SYNC };
                            u32s(o, &[f, s.composition as u32]);
                        }
                    }
                });
            });
        }
    });
    let mut at = out.len() + 8;
    for (run, field) in runs.iter().zip(offsets) {
        let offset = u32::try_from(at).unwrap_or(u32::MAX);
        out[field..field + 4].copy_from_slice(&offset.to_be_bytes());
        at += run.data.len();
    }
    boxed(&mut out, *b"mdat", |o| {
        for run in runs {
            o.extend_from_slice(&run.data);
        }
    });
    out
}
