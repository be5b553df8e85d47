//! Init segment rewriting: `pssh` and `sinf` dropped, `encv`/`enca` renamed to the original format,
//! and each track's protection recorded. No I/O.

use super::{
    segment, CencError, EntryProtection, InitInfo, Pattern, Protection, Scheme, TrackInfo,
    MAX_TRACKS,
};
use crate::mp4::{
    boxes, find, rebuild, Boxes, Edit, FourCC, Frma, Hdlr, Mp4Box, SampleEntry, Schm, Stsd, Tenc,
    Tkhd, Trex,
};

/// Rewrites a protected init segment into a clear one and reports each track's protection.
/// Boxes outside `moov` (`ftyp`, `free`, ...) are kept; an unprotected init passes unchanged.
pub fn rewrite_init(init: &[u8]) -> Result<(Vec<u8>, InitInfo), CencError> {
    let moov = find(boxes(init), b"moov")?.ok_or(CencError::NoMoov)?;
    let info = read_info(&moov)?;
    let mut out = Vec::with_capacity(init.len());
    rewrite_boxes(boxes(init), &mut out)?;
    Ok((out, info))
}

/// Reads every track of `moov`. More than [`MAX_TRACKS`] `trak` or `trex` boxes is refused as
/// soon as the walk meets one too many, before any of the per-track lookups add up.
pub(crate) fn read_info(moov: &Mp4Box<'_>) -> Result<InitInfo, CencError> {
    let mut trexes = Vec::new();
    if let Some(mvex) = moov.child(b"mvex")? {
        for b in mvex.children() {
            let b = b?;
            if b.kind == *b"trex" {
                check_count(trexes.len(), "trex")?;
                trexes.push(Trex::parse(&b)?);
            }
        }
    }
    let mut tracks = Vec::new();
    for trak in moov.children() {
        let trak = trak?;
        if trak.kind != *b"trak" {
            continue;
        }
        check_count(tracks.len(), "trak")?;
        let mut track = read_track(&trak)?;
        track.trex = trexes
            .iter()
            .find(|t| t.track_id == track.track_id)
            .copied();
        tracks.push(track);
    }
    Ok(InitInfo { tracks })
}

/// Refuses one more box of `kind` when `seen` of them already make [`MAX_TRACKS`].
pub(crate) fn check_count(seen: usize, kind: &'static str) -> Result<(), CencError> {
    if seen >= MAX_TRACKS {
        return Err(CencError::TooManyTracks(kind));
    }
    Ok(())
}

fn read_track(trak: &Mp4Box<'_>) -> Result<TrackInfo, CencError> {
    let tkhd = trak.child(b"tkhd")?.ok_or(CencError::MissingBox("tkhd"))?;
    let track_id = Tkhd::parse(&tkhd)?.track_id;
    let handler = trak_handler(trak)?;
    let mut protection = None;
    // Every entry, clear ones included: Shaka Packager's clear lead adds a clear entry after the
    // protected one and points its clear fragments at it.
    let mut entries = Vec::new();
    let mut seig_default_differs = false;
    if let Some(stbl) = descend(trak, &[b"mdia", b"minf", b"stbl"])? {
        if let Some(stsd) = stbl.child(b"stsd")? {
            for entry in Stsd::parse(&stsd)?.entries {
                check_count(entries.len(), "stsd entry")?;
                let entry = SampleEntry::parse(&entry?, handler)?;
                let entry_protection = match find(entry.children(), b"sinf")? {
                    None => EntryProtection::Clear,
                    // The first protected entry decrypts the track: it must be readable.
                    Some(sinf) if protection.is_none() => {
                        let p = read_sinf(track_id, &entry, &sinf)?;
                        protection = Some(p);
                        EntryProtection::Protected(p)
                    }
                    // A later one matters only to the fragments naming it, refused then.
                    Some(sinf) => match read_sinf(track_id, &entry, &sinf) {
                        Ok(p) => EntryProtection::Protected(p),
                        Err(e) => EntryProtection::Unreadable(e),
                    },
                };
                entries.push(entry_protection);
            }
        }
        if protection.is_some() {
            seig_default_differs = init_seig_default_differs(&stbl, protection.as_ref())?;
        }
    }
    Ok(TrackInfo {
        track_id,
        handler,
        protection,
        entries,
        seig_default_differs,
        trex: None,
    })
}

/// Whether a `seig` sample group description of the init's `stbl` names (version 2) a default
/// entry for the track's samples that differs from the `tenc`: clear (a clear lead signalled by
/// groups), another KID, IV or pattern. Samples of fragments that no `sbgp` maps elsewhere would
/// take it, and decrypting them with the `tenc` would pass garbage on. A `seig` description
/// that does not parse counts as differing, rather than failing the whole init.
fn init_seig_default_differs(
    stbl: &Mp4Box<'_>,
    protection: Option<&Protection>,
) -> Result<bool, CencError> {
    for b in stbl.children() {
        let b = b?;
        if b.kind != *b"sgpd" || !segment::is_seig(&b) {
            continue;
        }
        // A description that does not parse says nothing trustworthy about the default: the
        // protected fragments are refused, the clear lead and the init still pass.
        let Ok((entries, default_index)) = segment::seig_entries(&b, protection) else {
            return Ok(true);
        };
        // The init's descriptions are numbered from 1, unlike a fragment's (from 0x10001).
        let repeats_tenc = default_index
            .checked_sub(1)
            .and_then(|i| entries.get(i as usize))
            .copied()
            .unwrap_or(false);
        if default_index != 0 && !repeats_tenc {
            return Ok(true);
        }
    }
    Ok(false)
}

fn read_sinf(
    track_id: u32,
    entry: &SampleEntry<'_>,
    sinf: &Mp4Box<'_>,
) -> Result<Protection, CencError> {
    let frma = sinf.child(b"frma")?.ok_or(CencError::MissingBox("frma"))?;
    let schm = sinf.child(b"schm")?.ok_or(CencError::MissingBox("schm"))?;
    let tenc = descend(sinf, &[b"schi", b"tenc"])?.ok_or(CencError::MissingBox("tenc"))?;
    let schm = Schm::parse(&schm)?;
    let tenc = Tenc::parse(&tenc)?;
    let scheme = Scheme::from_fourcc(schm.scheme_type)
        .ok_or_else(|| CencError::unsupported(track_id, schm.scheme_type))?;
    let constant_iv =
        (tenc.per_sample_iv_size == 0 && tenc.constant_iv_size > 0).then_some(tenc.constant_iv);
    Ok(Protection {
        scheme,
        original_format: Frma::parse(&frma)?.data_format,
        is_protected: tenc.is_protected,
        per_sample_iv_size: tenc.per_sample_iv_size,
        constant_iv,
        pattern: pattern_for(scheme, &tenc, entry.kind),
        default_kid: tenc.default_kid,
    })
}

/// The pattern in force: `tenc` v1 carries it; `cbcs` without one falls back to the usual
/// 1:9 for video and whole-sample CBC for everything else.
fn pattern_for(scheme: Scheme, tenc: &Tenc, entry_kind: FourCC) -> Pattern {
    let stated = Pattern {
        crypt: tenc.crypt_byte_block,
        skip: tenc.skip_byte_block,
    };
    match scheme {
        Scheme::Cenc | Scheme::Cbc1 => Pattern::NONE,
        Scheme::Cens => stated,
        Scheme::Cbcs if tenc.version >= 1 => stated,
        Scheme::Cbcs if entry_kind == *b"encv" => Pattern { crypt: 1, skip: 9 },
        Scheme::Cbcs => Pattern::NONE,
    }
}

fn trak_handler(trak: &Mp4Box<'_>) -> Result<FourCC, CencError> {
    Ok(match descend(trak, &[b"mdia", b"hdlr"])? {
        Some(hdlr) => Hdlr::parse(&hdlr)?.handler_type,
        None => *b"\0\0\0\0",
    })
}

/// Follows a chain of first-children of the given types.
fn descend<'a>(from: &Mp4Box<'a>, path: &[&FourCC]) -> Result<Option<Mp4Box<'a>>, CencError> {
    let mut current = *from;
    for kind in path {
        match current.child(kind)? {
            Some(next) => current = next,
            None => return Ok(None),
        }
    }
    Ok(Some(current))
}

/// Copies `iter` into `out` with protection removed from every `moov` met.
pub(crate) fn rewrite_boxes(iter: Boxes<'_>, out: &mut Vec<u8>) -> Result<(), CencError> {
    let mut handler: FourCC = [0; 4];
    rebuild(iter, out, &mut |path: &[FourCC], b: &Mp4Box<'_>| {
        let parent = path.last().copied().unwrap_or_default();
        let grandparent = path.len().checked_sub(2).map(|i| path[i]);
        Ok::<_, CencError>(match (&b.kind, &parent) {
            (b"pssh", _) => Edit::Drop,
            (b"moov", [0, 0, 0, 0]) if path.is_empty() => descend_edit(),
            (b"trak", b"moov") => {
                handler = trak_handler(b)?;
                descend_edit()
            }
            (b"mdia", b"trak") | (b"minf", b"mdia") | (b"stbl", b"minf") => descend_edit(),
            (b"stsd", b"stbl") => Edit::Descend {
                prefix: Stsd::PREFIX,
                rename: None,
            },
            (_, b"stsd") => sample_entry_edit(b, handler)?,
            (b"sinf", _) if grandparent == Some(*b"stsd") => Edit::Drop,
            _ => Edit::Keep,
        })
    })
}

fn descend_edit() -> Edit {
    Edit::Descend {
        prefix: 0,
        rename: None,
    }
}

/// Protected entries are descended into (to drop `sinf`) and renamed to their `frma` format.
fn sample_entry_edit(b: &Mp4Box<'_>, handler: FourCC) -> Result<Edit, CencError> {
    let entry = SampleEntry::parse(b, handler)?;
    let Some(sinf) = find(entry.children(), b"sinf")? else {
        return Ok(Edit::Keep);
    };
    let rename = match sinf.child(b"frma")? {
        Some(frma) => Some(Frma::parse(&frma)?.data_format),
        None => None,
    };
    Ok(Edit::Descend {
        prefix: entry.prefix,
        rename,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mp4::tests::bx;

    /// The smallest track `read_info` accepts: a 32-byte `trak` holding only a `tkhd`.
    fn trak(track_id: u32) -> Vec<u8> {
        let mut tkhd = vec![0u8; 12];
        tkhd.extend_from_slice(&track_id.to_be_bytes());
        bx(b"trak", &bx(b"tkhd", &tkhd))
    }

    fn trex(track_id: u32) -> Vec<u8> {
        let mut payload = vec![0u8; 4];
        payload.extend_from_slice(&track_id.to_be_bytes());
        payload.extend_from_slice(&[0u8; 16]);
        bx(b"trex", &payload)
    }

    /// `traks` tracks numbered from 1 and `trexes` fragment defaults numbered from `trex_from`.
    fn init(traks: u32, trexes: u32, trex_from: u32) -> Vec<u8> {
        let mut moov = Vec::new();
        if trexes > 0 {
            let mvex: Vec<u8> = (0..trexes).flat_map(|i| trex(trex_from + i)).collect();
            moov.extend(bx(b"mvex", &mvex));
        }
        for id in 1..=traks {
            moov.extend(trak(id));
        }
        bx(b"moov", &moov)
    }

    #[test]
    fn thousands_of_tiny_tracks_are_refused_while_walking() {
        // ~640 KiB of boxes that would cost 10^8 id comparisons, refused at the 65th box.
        let n = 10_000;
        assert_eq!(
            rewrite_init(&init(n, n, 1_000_000)).unwrap_err(),
            CencError::TooManyTracks("trex")
        );
        assert_eq!(
            rewrite_init(&init(n, 0, 0)).unwrap_err(),
            CencError::TooManyTracks("trak")
        );
        assert_eq!(
            rewrite_init(&init(MAX_TRACKS as u32 + 1, 1, 1)).unwrap_err(),
            CencError::TooManyTracks("trak")
        );
    }

    #[test]
    fn as_many_tracks_as_the_cap_still_read() {
        let max = MAX_TRACKS as u32;
        let (clear, info) = rewrite_init(&init(max, max, 1)).unwrap();
        assert_eq!(clear, init(max, max, 1));
        assert_eq!(info.tracks.len(), MAX_TRACKS);
        assert!(info
            .tracks
            .iter()
            .all(|t| t.trex.map(|x| x.track_id) == Some(t.track_id)));
    }
}
