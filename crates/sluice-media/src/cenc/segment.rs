//! Media segment decryption: every `moof`/`mdat` pair is decrypted, `senc`/`saiz`/`saio`/`pssh`
//! removed, `trun`/`tfhd` offsets, `moof` sizes and `sidx` sizes fixed. No I/O.
//!
//! Two passes: [`plan`] reads the small metadata boxes and lists every encrypted sample (a
//! [`Job`]); [`emit`] then copies the segment once, decrypting each sample in the output buffer
//! right after copying it, while it is still in cache. Samples are never allocated one by one.

use aes::Aes128;
use cipher::KeyInit;

use super::crypto::{decrypt_sample, Pattern};
use super::fixup::{is_dropped_in_moof, rebuild_moof, rewrite_sidx, Removals, TrafFix};
use super::{init, CencError, EntryProtection, InitInfo, Protection, Scheme, TrackInfo};
use crate::keys::{KeyRing, Kid};
use crate::mp4::{boxes, fourcc_str, Mp4Box, Mp4Error, Reader, Senc, SencEntries, Tfhd, Trun};

/// Decrypts a media segment with the tracks described by `info` and the keys in `keys`.
///
/// Every `moof`/`mdat` pair is handled (chunked CMAF has many). Boxes that carry no encryption
/// data (`styp`, `emsg`, `prft`, ...) are copied unchanged. Tracks without protection pass through.
pub fn decrypt_segment(
    segment: &[u8],
    info: &InitInfo,
    keys: &KeyRing,
) -> Result<Vec<u8>, CencError> {
    let mut out = Vec::new();
    decrypt_segment_into(segment, info, keys, &mut out)?;
    Ok(out)
}

/// Like [`decrypt_segment`], writing into `out` (cleared first) so a caller can reuse buffers.
pub fn decrypt_segment_into(
    segment: &[u8],
    info: &InitInfo,
    keys: &KeyRing,
    out: &mut Vec<u8>,
) -> Result<(), CencError> {
    let tracks = resolve_tracks(info, keys);
    let plan = plan(segment, &tracks)?;
    out.clear();
    out.reserve(segment.len());
    emit(segment, &plan, &tracks, out)
}

// === keys ===

/// A track and, when it is protected, its expanded AES key (or the KID nobody gave a key for).
struct TrackCrypto<'i> {
    info: &'i TrackInfo,
    cipher: Option<Result<(Aes128, Protection), Kid>>,
}

fn resolve_tracks<'i>(info: &'i InitInfo, keys: &KeyRing) -> Vec<TrackCrypto<'i>> {
    // One key given and one KID in the init: the caller's key_id may be mislabelled (a common
    // copy-paste slip MediaFlow tolerates), so the lone key serves. With several KIDs a wrong
    // guess would emit garbage, so an unmatched KID stays an error there.
    let only_key = (keys.len() == 1 && info.kids().len() == 1)
        .then(|| keys.iter().next().map(|(_, key)| *key))
        .flatten();
    info.tracks
        .iter()
        .map(|track| TrackCrypto {
            info: track,
            cipher: track.protection.filter(|p| p.is_protected).map(|p| {
                keys.get(&p.default_kid)
                    .copied()
                    .or(only_key)
                    .map(|key| (Aes128::new(&key.into()), p))
                    .ok_or(p.default_kid)
            }),
        })
        .collect()
}

// === plan ===

/// What happens to one top-level box.
enum TopOut {
    Copy,
    Drop,
    Bytes(Vec<u8>),
    Mdat,
}

struct Top<'a> {
    b: Mp4Box<'a>,
    out: TopOut,
}

/// One encrypted sample: where it and its `senc` entry sit in the input.
///
/// Kept to 16 bytes: a segment can list a job per 9 of its bytes (a one-byte CTR sample and its
/// 8-byte IV), so the list stays under twice the segment's size. With the IV and the subsample
/// slice copied in, a job took 56 bytes and the list six times the segment.
struct Job {
    offset: u32,
    size: u32,
    /// Where the sample's `senc` entry starts in the segment, when it has one.
    entry: u32,
    /// Index into the resolved tracks.
    track: u16,
    /// The entry's IV length, with [`SUBSAMPLE_RECORDS`] or [`NO_ENTRY`] set.
    layout: u8,
}

/// [`Job::layout`]: the entry has a subsample count and records after its IV.
const SUBSAMPLE_RECORDS: u8 = 0x40;
/// [`Job::layout`]: the track's constant IV applies, and the whole sample is protected.
const NO_ENTRY: u8 = 0x80;

impl Job {
    /// The sample's IV (empty for the constant IV) and raw subsample records, read again from
    /// its `senc` entry, which planning already read whole.
    fn entry<'a>(&self, segment: &'a [u8]) -> Result<(&'a [u8], &'a [u8]), CencError> {
        if self.layout & NO_ENTRY != 0 {
            return Ok((&[], &[]));
        }
        let at = self.entry as usize;
        let mut r = Reader::new(segment.get(at..).unwrap_or_default(), at);
        let iv = r.bytes(usize::from(self.layout & 0x1f))?;
        let subsamples = if self.layout & SUBSAMPLE_RECORDS != 0 {
            let count = r.u16()?;
            r.records("senc subsample", count.into(), 6)?
        } else {
            &[]
        };
        Ok((iv, subsamples))
    }
}

#[cfg(test)]
pub(super) const JOB_SIZE: usize = std::mem::size_of::<Job>();

struct Plan<'a> {
    tops: Vec<Top<'a>>,
    jobs: Vec<Job>,
}

fn plan<'a>(segment: &'a [u8], tracks: &[TrackCrypto<'_>]) -> Result<Plan<'a>, CencError> {
    // Jobs hold 32-bit offsets; segments are fetched whole, so far smaller in practice.
    if u32::try_from(segment.len()).is_err() {
        return Err(CencError::SegmentTooLarge {
            len: segment.len() as u64,
        });
    }
    let mut tops = Vec::new();
    let mut jobs = Vec::new();
    // The bytes each shrunk box loses, for `sidx`: summed once here, whatever the `sidx` count.
    let mut removals = Removals::new();
    let mut removed_total = 0usize;
    // Protected samples of one track never overlap, nor do two tracks' samples, and all lie in
    // the segment: their sizes add up to at most its length. Counted across every `trun`, `traf`
    // and `moof`, this bounds the jobs (and the walk) even when each `trun`'s data offset points
    // back at the same bytes, which would otherwise list the same samples again and again.
    let mut budget = segment.len();
    // Where the data of the `moof`s seen so far ends: their `trun` offsets count every byte
    // before it, so no box starting before it may be removed.
    let mut data_end = 0usize;
    for b in boxes(segment) {
        let b = b?;
        let mut moof_end = 0;
        let out = match &b.kind {
            b"moof" => {
                let within = Within {
                    limit: segment.len(),
                    budget: &mut budget,
                };
                let (bytes, end) = plan_moof(&b, removed_total, within, tracks, &mut jobs)?;
                moof_end = end;
                TopOut::Bytes(bytes)
            }
            b"moov" => {
                let mut bytes = Vec::with_capacity(b.len());
                init::rewrite_boxes(boxes(b.bytes()), &mut bytes)?;
                TopOut::Bytes(bytes)
            }
            b"pssh" => TopOut::Drop,
            b"mdat" => TopOut::Mdat,
            _ => TopOut::Copy,
        };
        let out_len = match &out {
            TopOut::Drop => 0,
            TopOut::Bytes(bytes) => bytes.len(),
            TopOut::Copy | TopOut::Mdat => b.len(),
        };
        if out_len < b.len() {
            // The `trun` offsets and the `tfhd` base are moved for what a `moof` loses and what
            // went before it, not for a box removed between it and its samples. Checked against
            // the samples' end, not the next `mdat`: an empty `mdat` may come first.
            if b.offset < data_end {
                return Err(CencError::RemovedBeforeMdat {
                    kind: fourcc_str(b.kind),
                });
            }
            removals.push(b.offset, b.len() - out_len);
            removed_total += b.len() - out_len;
        }
        data_end = data_end.max(moof_end);
        tops.push(Top { b, out });
    }
    if !removals.is_empty() {
        for top in tops.iter_mut().filter(|t| t.b.kind == *b"sidx") {
            top.out = TopOut::Bytes(rewrite_sidx(&top.b, &removals)?);
        }
    }
    jobs.sort_unstable_by_key(|j| j.offset);
    Ok(Plan { tops, jobs })
}

/// Where protected samples may lie: below `limit`, and `budget` bytes of them left in the segment.
struct Within<'b> {
    limit: usize,
    budget: &'b mut usize,
}

/// Plans one `moof`: lists its encrypted samples and returns its rebuilt bytes and where the
/// data its `trun`s point at ends (the furthest of its `traf`s).
fn plan_moof<'a>(
    moof: &Mp4Box<'a>,
    removed_before: usize,
    mut within: Within<'_>,
    tracks: &[TrackCrypto<'_>],
    jobs: &mut Vec<Job>,
) -> Result<(Vec<u8>, usize), CencError> {
    // Our rebuilt header is always 8 bytes; a 16-byte `largesize` header shrinks too.
    let mut removed = moof.header_len - 8;
    let mut fixes = Vec::new();
    let mut data_end = moof.offset;
    let mut furthest = moof.end();
    for child in moof.children() {
        let child = child?;
        if is_dropped_in_moof(&child) {
            removed += child.len();
        }
        if child.kind == *b"traf" {
            // A `moof` carries one `traf` per track; each one looks its track up in the init's.
            init::check_count(fixes.len(), "traf")?;
            for grandchild in child.children() {
                let grandchild = grandchild?;
                if is_dropped_in_moof(&grandchild) {
                    removed += grandchild.len();
                }
            }
            let (fix, end) = plan_traf(
                &child,
                moof.offset,
                fixes.is_empty(),
                data_end,
                &mut within,
                tracks,
                jobs,
            )?;
            fixes.push(fix);
            data_end = end;
            furthest = furthest.max(end);
        }
    }
    let bytes = rebuild_moof(moof, removed, removed_before + removed, &fixes)?;
    Ok((bytes, furthest))
}

/// Lists the encrypted samples of one `traf`; returns its offset fix and where its data ends.
fn plan_traf<'a>(
    traf: &Mp4Box<'a>,
    moof_start: usize,
    first_traf: bool,
    previous_end: usize,
    within: &mut Within<'_>,
    tracks: &[TrackCrypto<'_>],
    jobs: &mut Vec<Job>,
) -> Result<(TrafFix, usize), CencError> {
    let tfhd = traf.child(b"tfhd")?.ok_or(CencError::MissingBox("tfhd"))?;
    let tfhd = Tfhd::parse(&tfhd)?;
    let track = tracks.iter().position(|t| t.info.track_id == tfhd.track_id);
    // A fragment pointing at a clear sample entry (a clear lead) is left as it is: its samples
    // are clear whatever the track's `tenc` says.
    let mut crypto_track = track;
    if let Some(i) = track {
        if !uses_protected_entry(&tfhd, tracks[i].info)? {
            crypto_track = None;
        }
    }
    let protection = crypto_track.and_then(|i| tracks[i].info.protection.as_ref());
    refuse_key_groups(traf, protection, tfhd.track_id)?;
    let (base, fix) = match tfhd.base_data_offset {
        Some(base) => (to_usize(base, tfhd.track_id)?, TrafFix::Absolute),
        None if tfhd.default_base_is_moof() || first_traf => (moof_start, TrafFix::MoofRelative),
        None => (previous_end, TrafFix::Unchanged),
    };
    let trex = track.and_then(|i| tracks[i].info.trex);
    let default_size = tfhd
        .default_sample_size
        .or(trex.map(|t| t.default_sample_size))
        .unwrap_or(0) as usize;
    let mut samples = SampleSource::new(traf, crypto_track, tracks, tfhd.track_id)?;
    let mut cursor = base;
    for trun in traf.children() {
        let trun = trun?;
        if trun.kind != *b"trun" {
            continue;
        }
        let trun = Trun::parse(&trun)?;
        if let Some(offset) = trun.data_offset {
            cursor = offset_from(base, offset, tfhd.track_id)?;
        }
        let protected = samples.is_protected();
        if !trun.has_sizes() && (default_size == 0 || !protected) {
            // Equal sizes and nothing to decrypt: skip the walk, so a hostile count of four
            // billion empty samples costs nothing.
            let total = u64::from(trun.sample_count) * default_size as u64;
            cursor = cursor.saturating_add(usize::try_from(total).unwrap_or(usize::MAX));
            continue;
        }
        for sample in trun.samples() {
            let size = sample.size.unwrap_or(default_size as u32) as usize;
            let offset = cursor;
            if !protected {
                cursor = offset.saturating_add(size);
                continue;
            }
            // Every protected sample must lie in the segment, which also bounds the walk.
            cursor = offset
                .checked_add(size)
                .filter(|&end| end <= within.limit)
                .ok_or(CencError::SampleOutsideMdat {
                    track_id: tfhd.track_id,
                    offset: offset as u64,
                    size: size as u64,
                })?;
            *within.budget =
                within
                    .budget
                    .checked_sub(size)
                    .ok_or(CencError::SamplesPastSegment {
                        track_id: tfhd.track_id,
                        offset: offset as u64,
                        segment: within.limit as u64,
                    })?;
            samples.push(offset, size, jobs)?;
        }
    }
    Ok((fix, cursor))
}

/// Whether a `traf` of a protected track uses a protected sample entry, named by
/// `tfhd.sample_description_index`, else by the `trex` default. Shaka Packager's clear lead
/// points at a clear entry (its second): those samples pass through, and the rewritten init
/// keeps every entry, so the index stays valid. An index naming no entry, a protected entry
/// decrypted unlike the track's first (which [`resolve_tracks`] took the key for) or whose
/// `sinf` did not read, or an init whose `seig` default differs from the `tenc` is refused
/// rather than guessed at.
fn uses_protected_entry(tfhd: &Tfhd, track: &TrackInfo) -> Result<bool, CencError> {
    let Some(first) = &track.protection else {
        // A clear track: nothing is decrypted, whatever the index.
        return Ok(false);
    };
    // Index 0 names no entry: Chrome takes the `trex` default for it, and ffmpeg and GStreamer
    // take a `trex` default of 0 as the first entry.
    let index = tfhd
        .sample_description_index
        .filter(|&i| i != 0)
        .or(track
            .trex
            .map(|t| t.default_sample_description_index.max(1)))
        .unwrap_or(1);
    let entry = index
        .checked_sub(1)
        .and_then(|i| track.entries.get(i as usize))
        .ok_or(CencError::NoSampleDescription {
            track_id: track.track_id,
            index,
            entries: track.entries.len() as u32,
        })?;
    match entry {
        EntryProtection::Clear => Ok(false),
        EntryProtection::Unreadable(e) => Err(e.clone()),
        EntryProtection::Protected(p) if !decrypts_alike(p, first) => {
            Err(CencError::OtherProtection {
                track_id: track.track_id,
                index,
            })
        }
        EntryProtection::Protected(_) if track.seig_default_differs => Err(CencError::KeyGroups {
            track_id: track.track_id,
        }),
        EntryProtection::Protected(_) => Ok(true),
    }
}

/// Whether two protected entries decrypt alike: everything but the clear format (`avc1` and
/// `avc3`, `hvc1` and `hev1` entries under one `tenc`), which decryption never uses.
fn decrypts_alike(p: &Protection, first: &Protection) -> bool {
    Protection {
        original_format: first.original_format,
        ..*p
    } == *first
}

/// How many encrypted samples [`decrypt_segment`] would decrypt, or why it refuses the segment
/// before decrypting anything (the bound on planning, checked by the tests).
#[cfg(test)]
pub(super) fn planned_jobs(
    segment: &[u8],
    info: &InitInfo,
    keys: &KeyRing,
) -> Result<usize, CencError> {
    Ok(plan(segment, &resolve_tracks(info, keys))?.jobs.len())
}

/// `seig` sample groups (clear lead, key rotation) can give samples another key, IV or no
/// encryption at all; decrypted with the track's defaults those would be passed on as garbage,
/// so a segment mapping a sample to such an entry is refused. A sample mapped to index 0 (the
/// track's `tenc`) or to an entry repeating the `tenc` decrypts as before: GPAC writes both in
/// every fragment after a clear lead. Other groups (`roll`, ...) say nothing about encryption.
fn refuse_key_groups(
    traf: &Mp4Box<'_>,
    protection: Option<&Protection>,
    track_id: u32,
) -> Result<(), CencError> {
    let refused = CencError::KeyGroups { track_id };
    // Per entry of the `traf`'s own `seig` description: whether it repeats the `tenc`.
    let mut local: Option<Vec<bool>> = None;
    for b in traf.children() {
        let b = b?;
        if b.kind == *b"sgpd" && is_seig(&b) {
            if local.is_some() {
                // Two descriptions of one type: which one an index means is unclear.
                return Err(refused);
            }
            let (entries, default_index) = seig_entries(&b, protection)?;
            // Version 2 maps the samples no `sbgp` maps to this entry.
            if default_index != 0 && !maps_to_tenc(&entries, default_index) {
                return Err(refused);
            }
            local = Some(entries);
        }
    }
    let local = local.unwrap_or_default();
    for b in traf.children() {
        let b = b?;
        if b.kind != *b"sbgp" || !is_seig(&b) {
            continue;
        }
        let mut r = b.reader();
        let (version, _) = r.full_box()?;
        r.skip(4)?;
        if version == 1 {
            // grouping_type_parameter, unused by `seig`.
            r.skip(4)?;
        }
        let count = r.u32()?;
        let runs = r.records("sbgp entry", count.into(), 8)?;
        for run in runs.chunks_exact(8) {
            let samples = u32::from_be_bytes([run[0], run[1], run[2], run[3]]);
            let index = u32::from_be_bytes([run[4], run[5], run[6], run[7]]);
            // Index 0: no group, the track's defaults.
            if samples != 0 && index != 0 && !maps_to_tenc(&local, index) {
                return Err(refused);
            }
        }
    }
    Ok(())
}

/// Whether a `traf`'s group description index names an entry of its own `seig` description
/// that repeats the `tenc`. Indexes up to 0x10000 name the init's descriptions, which the
/// decryptor does not keep: those count as another key.
fn maps_to_tenc(local: &[bool], index: u32) -> bool {
    index
        .checked_sub(0x1_0001)
        .and_then(|i| local.get(i as usize))
        .copied()
        .unwrap_or(false)
}

/// Both `sgpd` and `sbgp` start with a version, flags and the grouping type.
pub(super) fn is_seig(b: &Mp4Box<'_>) -> bool {
    b.payload().get(4..8) == Some(&b"seig"[..])
}

/// Reads a `seig` `sgpd` (ISO/IEC 23001-7 `CencSampleEncryptionInformationGroupEntry`s): for
/// each entry, whether it repeats the track's `tenc`; and the version 2 default index.
pub(super) fn seig_entries(
    sgpd: &Mp4Box<'_>,
    protection: Option<&Protection>,
) -> Result<(Vec<bool>, u32), CencError> {
    let mut r = sgpd.reader();
    let payload_at = sgpd.offset + sgpd.header_len;
    let (version, _) = r.full_box()?;
    r.skip(4)?;
    let default_length = if version >= 1 { r.u32()? } else { 0 };
    let default_index = if version >= 2 { r.u32()? } else { 0 };
    let count = r.u32()?;
    // An entry takes at least 20 bytes: a count the box cannot hold is refused before the walk,
    // and the list grows with the entries read, never from the count.
    if u64::from(count) * SEIG_MIN > r.remaining() as u64 {
        return Err(Mp4Error::CountOverflow {
            what: "sgpd seig entry",
            count: count.into(),
        }
        .into());
    }
    let mut entries = Vec::new();
    for _ in 0..count {
        let same = if version >= 1 {
            let len = match default_length {
                0 => r.u32()?,
                len => len,
            };
            let at = payload_at + r.position();
            let mut entry = Reader::new(r.bytes(len as usize)?, at);
            seig_is_tenc(&mut entry, protection)?
        } else {
            seig_is_tenc(&mut r, protection)?
        };
        entries.push(same);
    }
    Ok((entries, default_index))
}

/// The fixed part of a `seig` entry: reserved, pattern, isProtected, IV size and KID.
const SEIG_MIN: u64 = 20;

/// Reads one `seig` entry; true when it says what the track's `tenc` does: protected, with the
/// same KID, per-sample IV size, pattern (for the pattern schemes) and constant IV.
fn seig_is_tenc(r: &mut Reader<'_>, p: Option<&Protection>) -> Result<bool, CencError> {
    r.skip(1)?;
    let pattern = r.u8()?;
    let is_protected = r.u8()?;
    let iv_size = r.u8()?;
    let kid: Kid = r.array()?;
    let mut constant_iv = None;
    if is_protected == 1 && iv_size == 0 {
        let len = r.u8()?;
        let iv = r.bytes(len.into())?;
        // 8-byte IVs are padded with zeros, as `expand_iv` and the `tenc` reader do.
        if matches!(len, 8 | 16) {
            let mut padded = [0u8; 16];
            padded[..iv.len()].copy_from_slice(iv);
            constant_iv = Some(padded);
        }
    }
    let Some(p) = p else {
        return Ok(false);
    };
    let same_pattern = match p.scheme {
        Scheme::Cens | Scheme::Cbcs => pattern == (p.pattern.crypt << 4) | p.pattern.skip,
        // Unused by the whole-sample schemes.
        Scheme::Cenc | Scheme::Cbc1 => true,
    };
    let same_iv = iv_size != 0 || (constant_iv.is_some() && constant_iv == p.constant_iv);
    Ok(is_protected == 1
        && p.is_protected
        && iv_size == p.per_sample_iv_size
        && kid == p.default_kid
        && same_pattern
        && same_iv)
}

fn to_usize(v: u64, track_id: u32) -> Result<usize, CencError> {
    usize::try_from(v).map_err(|_| CencError::DataOffset {
        track_id,
        removed: 0,
    })
}

/// `base` moved by a signed `trun` offset. A hostile `tfhd.base_data_offset` can sit anywhere
/// in 64 bits: one past `i64::MAX`, or a sum that overflows, is an error rather than a wrap.
fn offset_from(base: usize, offset: i32, track_id: u32) -> Result<usize, CencError> {
    i64::try_from(base)
        .ok()
        .and_then(|base| base.checked_add(i64::from(offset)))
        .and_then(|at| usize::try_from(at).ok())
        .ok_or(CencError::DataOffset {
            track_id,
            removed: 0,
        })
}

/// Pairs the samples of a protected `traf` with their `senc` entries (or the constant IV).
struct SampleSource<'a> {
    /// Index of the track in the resolved list and its protection; `None` for clear data.
    crypto: Option<(usize, Protection)>,
    entries: Option<SencEntries<'a>>,
    /// The `senc` box the entries come from, which locates each entry in the segment.
    senc: Option<Mp4Box<'a>>,
    /// Whether its entries carry subsample records.
    subsample_records: bool,
    track_id: u32,
    seen: u64,
}

impl<'a> SampleSource<'a> {
    fn new(
        traf: &Mp4Box<'a>,
        track: Option<usize>,
        tracks: &[TrackCrypto<'_>],
        track_id: u32,
    ) -> Result<Self, CencError> {
        let crypto = match track.map(|i| (i, &tracks[i].cipher)) {
            Some((i, Some(Ok((_, p))))) => Some((i, *p)),
            Some((_, Some(Err(kid)))) if has_samples(traf)? => {
                return Err(CencError::missing_key(kid))
            }
            _ => None,
        };
        let mut entries = None;
        let mut senc = None;
        let mut subsample_records = false;
        if let Some((_, p)) = &crypto {
            for b in traf.children() {
                let b = b?;
                if Senc::is_senc(&b) {
                    let parsed = Senc::parse(&b)?;
                    entries = Some(parsed.entries(p.per_sample_iv_size));
                    subsample_records = parsed.flags & Senc::SUBSAMPLES != 0;
                    senc = Some(b);
                    break;
                }
            }
        }
        Ok(SampleSource {
            crypto,
            entries,
            senc,
            subsample_records,
            track_id,
            seen: 0,
        })
    }

    fn is_protected(&self) -> bool {
        self.crypto.is_some()
    }

    fn push(&mut self, offset: usize, size: usize, jobs: &mut Vec<Job>) -> Result<(), CencError> {
        let Some((track, p)) = self.crypto else {
            return Ok(());
        };
        self.seen += 1;
        let (iv, entry, layout) = match (self.entries.as_mut().map(Iterator::next), &self.senc) {
            (Some(Some(entry)), Some(senc)) => {
                let iv = entry?.iv;
                // The IV is a slice of the `senc` box: where it starts is where the entry does.
                let at = senc.offset + (iv.as_ptr() as usize - senc.bytes().as_ptr() as usize);
                let records = if self.subsample_records {
                    SUBSAMPLE_RECORDS
                } else {
                    0
                };
                (iv, at, records)
            }
            (Some(None) | None, _) if p.per_sample_iv_size == 0 && p.constant_iv.is_some() => {
                (&[][..], 0, NO_ENTRY)
            }
            _ => return Err(self.short_of_entries()),
        };
        // Checked here, so a job's entry always makes an IV; its length is 0, 8 or 16.
        expand_iv(iv, &p, self.track_id)?;
        let track = u16::try_from(track).map_err(|_| CencError::TooManyTracks("trak"))?;
        // CBC leaves anything shorter than a block clear; skipping those also keeps a flood of
        // tiny constant-IV samples from growing the job list past one entry per 16 bytes.
        let min = match p.scheme {
            Scheme::Cbc1 | Scheme::Cbcs => 16,
            Scheme::Cenc | Scheme::Cens => 1,
        };
        if size >= min {
            // Offsets below the segment's length, which `plan` checked fits 32 bits.
            jobs.push(Job {
                offset: offset as u32,
                size: size as u32,
                entry: entry as u32,
                track,
                layout: layout | iv.len() as u8,
            });
        }
        Ok(())
    }

    fn short_of_entries(&self) -> CencError {
        CencError::MissingSampleInfo {
            track_id: self.track_id,
            samples: self.seen,
            entries: self.seen - 1,
        }
    }
}

fn has_samples(traf: &Mp4Box<'_>) -> Result<bool, CencError> {
    for b in traf.children() {
        let b = b?;
        if b.kind == *b"trun" && Trun::parse(&b)?.sample_count > 0 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A 16-byte counter or CBC IV: 8-byte IVs are zero-extended, an empty one takes the constant IV.
/// Constant IVs are a `cbcs` feature; a CTR counter reused across samples would be broken
/// encryption, so CTR schemes need a per-sample IV.
fn expand_iv(iv: &[u8], p: &Protection, track_id: u32) -> Result<[u8; 16], CencError> {
    let mut out = [0u8; 16];
    let cbc = matches!(p.scheme, Scheme::Cbc1 | Scheme::Cbcs);
    match iv.len() {
        0 if cbc => out = p.constant_iv.ok_or(CencError::BadIv { track_id, len: 0 })?,
        8 | 16 => out[..iv.len()].copy_from_slice(iv),
        len => return Err(CencError::BadIv { track_id, len }),
    }
    Ok(out)
}

// === emit ===

fn emit(
    segment: &[u8],
    plan: &Plan<'_>,
    tracks: &[TrackCrypto<'_>],
    out: &mut Vec<u8>,
) -> Result<(), CencError> {
    let mut next = 0usize;
    for top in &plan.tops {
        match &top.out {
            TopOut::Copy => out.extend_from_slice(top.b.bytes()),
            TopOut::Drop => {}
            TopOut::Bytes(bytes) => out.extend_from_slice(bytes),
            TopOut::Mdat => emit_mdat(segment, &top.b, &plan.jobs, &mut next, tracks, out)?,
        }
    }
    match plan.jobs.get(next) {
        Some(job) => Err(outside(job, tracks)),
        None => Ok(()),
    }
}

/// Copies one `mdat`, decrypting the samples that lie in it.
fn emit_mdat(
    segment: &[u8],
    mdat: &Mp4Box<'_>,
    jobs: &[Job],
    next: &mut usize,
    tracks: &[TrackCrypto<'_>],
    out: &mut Vec<u8>,
) -> Result<(), CencError> {
    let payload = mdat.offset + mdat.header_len;
    let end = mdat.end();
    out.extend_from_slice(&segment[mdat.offset..payload]);
    let mut pos = payload;
    while let Some(job) = jobs.get(*next).filter(|j| (j.offset as usize) < end) {
        let (start, stop) = (job.offset as usize, job.offset as usize + job.size as usize);
        if start < payload || stop > end {
            return Err(outside(job, tracks));
        }
        if start < pos {
            return Err(CencError::OverlappingSamples {
                track_id: tracks[usize::from(job.track)].info.track_id,
                offset: job.offset.into(),
            });
        }
        out.extend_from_slice(&segment[pos..start]);
        let at = out.len();
        out.extend_from_slice(&segment[start..stop]);
        decrypt_job(segment, job, tracks, &mut out[at..])?;
        pos = stop;
        *next += 1;
    }
    out.extend_from_slice(&segment[pos..end]);
    Ok(())
}

fn decrypt_job(
    segment: &[u8],
    job: &Job,
    tracks: &[TrackCrypto<'_>],
    sample: &mut [u8],
) -> Result<(), CencError> {
    let track = &tracks[usize::from(job.track)];
    let Some(Ok((aes, p))) = &track.cipher else {
        return Ok(());
    };
    let (iv, subsamples) = job.entry(segment)?;
    let iv = expand_iv(iv, p, track.info.track_id)?;
    let pattern: Pattern = p.pattern;
    let scheme: Scheme = p.scheme;
    decrypt_sample(aes, scheme, pattern, &iv, subsamples, sample).map_err(|e| {
        CencError::SubsampleOverrun {
            track_id: track.info.track_id,
            covered: e.covered,
            size: sample.len() as u64,
        }
    })
}

fn outside(job: &Job, tracks: &[TrackCrypto<'_>]) -> CencError {
    CencError::SampleOutsideMdat {
        track_id: tracks[usize::from(job.track)].info.track_id,
        offset: job.offset.into(),
        size: job.size.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixup;
    use super::*;
    use crate::mp4::tests::bx;

    /// A `traf` of track 1, with an absolute `base_data_offset` when given, and an empty `trun`
    /// whose data offset is `offset`.
    fn traf(base: Option<u64>, offset: i32) -> Vec<u8> {
        let mut tfhd = match base {
            Some(_) => Tfhd::BASE_DATA_OFFSET.to_be_bytes().to_vec(),
            None => vec![0; 4],
        };
        tfhd.extend_from_slice(&1u32.to_be_bytes());
        if let Some(base) = base {
            tfhd.extend_from_slice(&base.to_be_bytes());
        }
        let mut trun = Trun::DATA_OFFSET.to_be_bytes().to_vec();
        trun.extend_from_slice(&0u32.to_be_bytes());
        trun.extend_from_slice(&offset.to_be_bytes());
        [bx(b"tfhd", &tfhd), bx(b"trun", &trun)].concat()
    }

    fn segment(trafs: usize, base: Option<u64>, offset: i32) -> Vec<u8> {
        let moof: Vec<u8> = (0..trafs)
            .flat_map(|_| bx(b"traf", &traf(base, offset)))
            .collect();
        [bx(b"moof", &moof), bx(b"mdat", &[0; 16])].concat()
    }

    fn decrypt(segment: &[u8]) -> Result<Vec<u8>, CencError> {
        decrypt_segment(segment, &InitInfo::default(), &KeyRing::new())
    }

    #[test]
    fn thousands_of_trafs_in_one_moof_are_refused() {
        assert_eq!(
            decrypt(&segment(10_000, None, 0)).unwrap_err(),
            CencError::TooManyTracks("traf")
        );
        let max = segment(super::super::MAX_TRACKS, None, 0);
        assert_eq!(decrypt(&max).unwrap(), max);
    }

    /// A version 0 `sidx` with one reference of `size` bytes (none when `size` is `None`).
    fn sidx(size: Option<u32>) -> Vec<u8> {
        let mut payload = vec![0u8; 4 + 4 + 4 + 4 + 4 + 2];
        payload.extend_from_slice(&u16::from(size.is_some()).to_be_bytes());
        if let Some(size) = size {
            payload.extend_from_slice(&size.to_be_bytes());
            payload.extend_from_slice(&[0u8; 8]);
        }
        bx(b"sidx", &payload)
    }

    #[test]
    fn thousands_of_sidx_share_one_sum_of_removals() {
        // One indexing `sidx`, then 5,000 empty ones (32 bytes) each followed by a dropped
        // `pssh` (8 bytes): summing the removals again for each `sidx` took 25 million steps
        // here, and ~10^10 in a 4 MiB segment.
        let n = 5_000;
        let pair = [sidx(None), bx(b"pssh", &[])].concat();
        let input = [sidx(Some(40 * n)), pair.repeat(n as usize)].concat();
        fixup::SUMS_COMPUTED.with(|c| c.set(0));
        let out = decrypt(&input).unwrap();
        let sums = fixup::SUMS_COMPUTED.with(std::cell::Cell::get);
        assert_eq!(sums, n as usize, "{sums} running sums for {n} removals");
        // The indexing `sidx` lost every `pssh` from its reference; the rest are unchanged.
        let expected = [sidx(Some(32 * n)), sidx(None).repeat(n as usize)].concat();
        assert_eq!(out, expected);
    }

    #[test]
    fn base_data_offset_past_i64_is_an_error() {
        let refused = CencError::DataOffset {
            track_id: 1,
            removed: 0,
        };
        // Overflows i64 when the offset is added.
        let near_max = segment(1, Some(i64::MAX as u64 - 4), 8);
        assert_eq!(decrypt(&near_max).unwrap_err(), refused);
        // Wrapped to -1 by a cast, then back to byte 0 by the offset.
        let past_max = segment(1, Some(u64::MAX), 1);
        assert_eq!(decrypt(&past_max).unwrap_err(), refused);
        assert_eq!(offset_from(i64::MAX as usize, 1, 1), Err(refused.clone()));
        assert_eq!(offset_from(10, -11, 1), Err(refused));
        assert_eq!(offset_from(100, -40, 1), Ok(60));
    }
}
