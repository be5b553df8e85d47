//! The live HLS media playlist of a window of segments (RFC 8216). No I/O.

use std::fmt::Write;

use super::CLOCK;

/// One segment as the playlist lists it.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Media sequence number.
    pub sequence: u64,
    /// In 90 kHz ticks.
    pub duration: u64,
    pub discontinuity: bool,
}

/// What the playlist says about the window as a whole.
#[derive(Debug, Clone, Copy)]
pub struct Window<'a> {
    /// Seconds; every entry rounds to at most this.
    pub target: u64,
    /// Discontinuities that have left the window (`EXT-X-DISCONTINUITY-SEQUENCE`).
    pub discontinuity_sequence: u64,
    /// The stream has ended: `EXT-X-ENDLIST`.
    pub ended: bool,
    /// Appended to every segment URI (`?iface=lo`, say), empty for none.
    pub query: &'a str,
}

/// Writes the playlist; segment URIs are `<sequence>.ts` relative to the playlist.
pub fn media(window: Window<'_>, entries: &[Entry]) -> String {
    let mut out = String::with_capacity(128 + entries.len() * 48);
    let first = entries.first().map_or(0, |e| e.sequence);
    // Longer entries cannot happen (the segmenter cuts before), but a playlist must never
    // claim less than its longest segment.
    let longest = entries
        .iter()
        .map(|e| (e.duration + CLOCK / 2) / CLOCK)
        .max()
        .unwrap_or(0);
    let _ = write!(
        out,
        "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:{}\n#EXT-X-MEDIA-SEQUENCE:{first}\n",
        window.target.max(longest)
    );
    if window.discontinuity_sequence > 0 {
        let _ = writeln!(
            out,
            "#EXT-X-DISCONTINUITY-SEQUENCE:{}",
            window.discontinuity_sequence
        );
    }
    for e in entries {
        if e.discontinuity {
            out.push_str("#EXT-X-DISCONTINUITY\n");
        }
        let ms = e.duration * 1000 / CLOCK;
        let _ = write!(
            out,
            "#EXTINF:{}.{:03},\n{}.ts",
            ms / 1000,
            ms % 1000,
            e.sequence
        );
        if !window.query.is_empty() {
            let _ = write!(out, "?{}", window.query);
        }
        out.push('\n');
    }
    if window.ended {
        out.push_str("#EXT-X-ENDLIST\n");
    }
    out
}
