//! ClearKey Common Encryption (ISO/IEC 23001-7) removal: init segments lose their protection boxes,
//! media segments are decrypted (`cenc`, `cens`, `cbc1`, `cbcs`) and their boxes fixed up. No I/O.
//!
//! [`rewrite_init`] turns a protected init segment into a clear one and records what each track
//! needs ([`InitInfo`]); [`decrypt_segment`] then decrypts every `moof`/`mdat` pair of a media
//! segment with keys from a [`KeyRing`].

mod crypto;
mod fixup;
mod init;
mod segment;

pub use crypto::{decrypt_sample, Pattern, SubsampleOverrun};
pub use init::rewrite_init;
pub use segment::{decrypt_segment, decrypt_segment_into};

use crate::keys::{to_hex, Kid};
use crate::mp4::{fourcc_str, FourCC, Mp4Error, Trex};

/// Most `trak` (and `trex`) boxes an init segment may hold, most sample entries in one `stsd`,
/// and most `traf` boxes in one `moof`. Real inits carry a handful of tracks; the cap keeps the
/// per-track lookups (a `trex` per `trak`, a track per `traf`, distinct KIDs) from growing with
/// the square of a hostile init of thousands of tiny boxes, which is rewritten on the runtime on
/// every request.
pub const MAX_TRACKS: usize = 64;

/// Protection scheme from `schm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// AES-128-CTR, full sample or subsamples.
    Cenc,
    /// AES-128-CTR with a crypt:skip pattern.
    Cens,
    /// AES-128-CBC on whole blocks.
    Cbc1,
    /// AES-128-CBC with a pattern, IV restarting at each subsample.
    Cbcs,
}

impl Scheme {
    /// `piff` is Smooth Streaming's CTR scheme, identical to `cenc` for decryption.
    pub fn from_fourcc(kind: FourCC) -> Option<Self> {
        match &kind {
            b"cenc" | b"piff" => Some(Scheme::Cenc),
            b"cens" => Some(Scheme::Cens),
            b"cbc1" => Some(Scheme::Cbc1),
            b"cbcs" => Some(Scheme::Cbcs),
            _ => None,
        }
    }
}

/// How one track is protected, from its sample entry's `sinf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protection {
    pub scheme: Scheme,
    /// The clear sample entry type from `frma` (`avc1`, `mp4a`, ...).
    pub original_format: FourCC,
    /// `tenc` default: samples are encrypted unless a sample group says otherwise.
    pub is_protected: bool,
    /// 0, 8 or 16; 0 means the constant IV applies.
    pub per_sample_iv_size: u8,
    pub constant_iv: Option<[u8; 16]>,
    pub pattern: Pattern,
    pub default_kid: Kid,
}

/// How one sample entry of a track's `stsd` is protected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryProtection {
    /// No `sinf`: the fragments naming it are clear.
    Clear,
    Protected(Protection),
    /// A protected entry after the track's first whose `sinf` could not be read (a scheme not
    /// supported, `frma`, `schm` or `tenc` missing): the error, given only when a fragment
    /// names the entry. The first protected entry is read strictly, as it decrypts the track.
    Unreadable(CencError),
}

/// What decryption needs to know about one track of the init segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackInfo {
    pub track_id: u32,
    /// `hdlr` type: `vide`, `soun`, ...
    pub handler: FourCC,
    /// The first protected sample entry's: the protection every fragment is decrypted with.
    pub protection: Option<Protection>,
    /// Each `stsd` entry in order (`tfhd.sample_description_index` 1 is the first): clear
    /// (Shaka Packager's clear lead points at one), protected, or unreadable.
    pub entries: Vec<EntryProtection>,
    /// The init's own `seig` sample group description (version 2) names a default entry that
    /// differs from the `tenc`: samples no fragment maps elsewhere are clear or under another
    /// key, so they cannot be decrypted with the track's defaults.
    pub seig_default_differs: bool,
    /// Fragment defaults from `mvex/trex`, used where `tfhd` and `trun` are silent.
    pub trex: Option<Trex>,
}

/// Per-track facts recorded by [`rewrite_init`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InitInfo {
    pub tracks: Vec<TrackInfo>,
}

impl InitInfo {
    pub fn track(&self, track_id: u32) -> Option<&TrackInfo> {
        self.tracks.iter().find(|t| t.track_id == track_id)
    }

    /// True when any track carries protection.
    pub fn is_protected(&self) -> bool {
        self.tracks.iter().any(|t| t.protection.is_some())
    }

    /// Default KIDs of the protected tracks, without repeats.
    pub fn kids(&self) -> Vec<Kid> {
        let mut kids: Vec<Kid> = Vec::new();
        for p in self.tracks.iter().filter_map(|t| t.protection.as_ref()) {
            if !kids.contains(&p.default_kid) {
                kids.push(p.default_kid);
            }
        }
        kids
    }
}

/// Why a segment could not be rewritten or decrypted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CencError {
    #[error(transparent)]
    Mp4(#[from] Mp4Error),
    /// The caller gave no key for this KID (lowercase hex).
    #[error("no key for KID {kid}")]
    MissingKey { kid: String },
    #[error("no 'moov' box in the init segment")]
    NoMoov,
    #[error("'{0}' box missing")]
    MissingBox(&'static str),
    /// More `trak`, `trex` or (in one `moof`) `traf` boxes than [`MAX_TRACKS`].
    #[error("more than {MAX_TRACKS} '{0}' boxes")]
    TooManyTracks(&'static str),
    #[error("track {track_id}: unsupported protection scheme '{scheme}'")]
    UnsupportedScheme { track_id: u32, scheme: String },
    #[error("track {track_id}: {samples} samples but encryption info for {entries}")]
    MissingSampleInfo {
        track_id: u32,
        samples: u64,
        entries: u64,
    },
    #[error("track {track_id}: a {len}-byte IV")]
    BadIv { track_id: u32, len: usize },
    #[error("track {track_id}: sample at byte {offset} ({size} bytes) is not inside an 'mdat'")]
    SampleOutsideMdat {
        track_id: u32,
        offset: u64,
        size: u64,
    },
    #[error("track {track_id}: samples overlap at byte {offset}")]
    OverlappingSamples { track_id: u32, offset: u64 },
    /// The protected samples listed so far add up to more bytes than the segment holds, so some
    /// are listed twice (a data offset pointing back at bytes already used).
    #[error("track {track_id}: the sample at byte {offset} takes the protected samples past the segment's {segment} bytes")]
    SamplesPastSegment {
        track_id: u32,
        offset: u64,
        segment: u64,
    },
    #[error("track {track_id}: subsamples cover {covered} bytes of a {size}-byte sample")]
    SubsampleOverrun {
        track_id: u32,
        covered: u64,
        size: u64,
    },
    #[error("track {track_id}: data offset does not fit after removing {removed} bytes")]
    DataOffset { track_id: u32, removed: u64 },
    /// Sample groups of type `seig` (clear lead, key rotation), whose samples the track's
    /// default key and IV would not decrypt.
    #[error(
        "track {track_id}: 'seig' sample groups (clear lead or key rotation) are not supported"
    )]
    KeyGroups { track_id: u32 },
    /// `tfhd.sample_description_index` (or the `trex` default) names no entry of the `stsd`.
    #[error("track {track_id}: sample description {index} is not one of the init's {entries}")]
    NoSampleDescription {
        track_id: u32,
        index: u32,
        entries: u32,
    },
    /// A fragment uses a protected sample entry other than the track's first protected one, with
    /// another scheme, key or IV.
    #[error("track {track_id}: sample description {index} is protected unlike the track's first")]
    OtherProtection { track_id: u32, index: u32 },
    /// A box that decryption removes or shrinks (`pssh`, `moov`, another `moof`) between a
    /// `moof` and its `mdat`: the samples would move by bytes their offsets do not count.
    #[error("a '{kind}' box between a 'moof' and its 'mdat' would move the samples")]
    RemovedBeforeMdat { kind: String },
    #[error("a {len}-byte segment is over 4 GiB")]
    SegmentTooLarge { len: u64 },
}

impl CencError {
    pub(crate) fn missing_key(kid: &Kid) -> Self {
        CencError::MissingKey { kid: to_hex(kid) }
    }

    pub(crate) fn unsupported(track_id: u32, scheme: FourCC) -> Self {
        CencError::UnsupportedScheme {
            track_id,
            scheme: fourcc_str(scheme),
        }
    }
}

#[cfg(test)]
mod tests;
