//! The HLS media playlist of a window of segments (RFC 8216): live, a timeshift window with
//! wall-clock times, or a catch-up range (EVENT or VOD, starting at an offset); low-latency
//! HLS adds partial segments and a preload hint to a live one. No I/O.

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
    /// Wall-clock start (Unix milliseconds), written as `#EXT-X-PROGRAM-DATE-TIME`.
    pub wall_ms: Option<i64>,
}

/// `#EXT-X-PLAYLIST-TYPE`, when there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A sliding window (no type).
    Live,
    /// Segments are only ever added.
    Event,
    /// Complete.
    Vod,
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
    pub kind: Kind,
    /// Where playback should start, in milliseconds from the first segment's start
    /// (`#EXT-X-START:TIME-OFFSET=…,PRECISE=YES`).
    pub start_ms: Option<u64>,
    /// Low-latency HLS: the partial segments to list.
    pub low_latency: Option<LowLatency<'a>>,
}

/// One partial segment as the playlist lists it: `<sequence>.<index>.ts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartEntry {
    /// Media sequence number of the segment it belongs to.
    pub sequence: u64,
    pub index: u32,
    /// In 90 kHz ticks.
    pub duration: u64,
    pub independent: bool,
}

/// What a low-latency playlist adds (RFC 8216bis §4.4.4.9, §4.4.5.2, §4.4.5.3).
#[derive(Debug, Clone, Copy)]
pub struct LowLatency<'a> {
    /// Part target duration in 90 kHz ticks; no part is longer.
    pub part_target: u64,
    /// Parts of the last few segments and of the one being built (the sequence after the
    /// last entry), oldest first; each is listed before its segment.
    pub parts: &'a [PartEntry],
}

/// Writes the playlist; segment URIs are `<sequence>.ts` relative to the playlist.
pub fn media(window: Window<'_>, entries: &[Entry]) -> String {
    write(window, entries, None)
}

/// Writes the playlist of fMP4 segments: URIs `<sequence>.m4s`, and `#EXT-X-MAP` naming
/// `init-<id>.mp4` before the first entry and wherever the init changes; `inits` has the init
/// number of each entry. Parts are not listed (they are TS only).
pub fn media_fmp4(window: Window<'_>, entries: &[Entry], inits: &[u64]) -> String {
    let window = Window {
        low_latency: None,
        ..window
    };
    write(window, entries, Some(inits))
}

fn write(window: Window<'_>, entries: &[Entry], inits: Option<&[u64]>) -> String {
    let mut out = String::with_capacity(128 + entries.len() * 48);
    let first = entries.first().map_or(0, |e| e.sequence);
    // Longer entries cannot happen (the segmenter cuts before), but a playlist must never
    // claim less than its longest segment.
    let longest = entries
        .iter()
        .map(|e| (e.duration + CLOCK / 2) / CLOCK)
        .max()
        .unwrap_or(0);
    // EXT-X-MAP needs version 6; fMP4 segments are written as ffmpeg and Apple's tools do (7).
    let version = match (inits.is_some(), window.low_latency.is_some()) {
        (true, _) => 7,
        (false, true) => 6,
        (false, false) => 3,
    };
    let extension = if inits.is_some() { "m4s" } else { "ts" };
    let _ = write!(
        out,
        "#EXTM3U\n#EXT-X-VERSION:{version}\n#EXT-X-TARGETDURATION:{}\n",
        window.target.max(longest)
    );
    if let Some(ll) = &window.low_latency {
        // Players stay three parts behind the live edge and may hold their reloads.
        let _ = write!(
            out,
            "#EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,PART-HOLD-BACK={}\n\
             #EXT-X-PART-INF:PART-TARGET={}\n",
            seconds(3 * ll.part_target),
            seconds(ll.part_target)
        );
    }
    let _ = writeln!(out, "#EXT-X-MEDIA-SEQUENCE:{first}");
    match window.kind {
        Kind::Live => {}
        Kind::Event => out.push_str("#EXT-X-PLAYLIST-TYPE:EVENT\n"),
        Kind::Vod => out.push_str("#EXT-X-PLAYLIST-TYPE:VOD\n"),
    }
    if let Some(ms) = window.start_ms {
        let _ = writeln!(
            out,
            "#EXT-X-START:TIME-OFFSET={}.{:03},PRECISE=YES",
            ms / 1000,
            ms % 1000
        );
    }
    if window.discontinuity_sequence > 0 {
        let _ = writeln!(
            out,
            "#EXT-X-DISCONTINUITY-SEQUENCE:{}",
            window.discontinuity_sequence
        );
    }
    let parts = window.low_latency.map_or(&[][..], |ll| ll.parts);
    for (i, e) in entries.iter().enumerate() {
        write_parts(&mut out, parts, e.sequence, window.query);
        if e.discontinuity {
            out.push_str("#EXT-X-DISCONTINUITY\n");
        }
        if let Some(inits) = inits {
            let id = inits.get(i).copied().unwrap_or(0);
            if i == 0 || inits.get(i - 1) != Some(&id) {
                let _ = writeln!(
                    out,
                    "#EXT-X-MAP:URI=\"init-{id}.mp4{}\"",
                    query_suffix(window.query)
                );
            }
        }
        if let Some(ms) = e.wall_ms {
            let _ = writeln!(out, "#EXT-X-PROGRAM-DATE-TIME:{}", iso8601(ms));
        }
        let ms = e.duration * 1000 / CLOCK;
        let _ = write!(
            out,
            "#EXTINF:{}.{:03},\n{}.{extension}",
            ms / 1000,
            ms % 1000,
            e.sequence
        );
        if !window.query.is_empty() {
            let _ = write!(out, "?{}", window.query);
        }
        out.push('\n');
    }
    if window.low_latency.is_some() && !window.ended {
        // The segment being built: its parts so far, then the next one's address, which a
        // player may ask for at once (the request waits until the part is complete).
        let next = entries.last().map_or(0, |e| e.sequence + 1);
        write_parts(&mut out, parts, next, window.query);
        let index = parts
            .iter()
            .filter(|p| p.sequence == next)
            .map(|p| p.index + 1)
            .max()
            .unwrap_or(0);
        let _ = writeln!(
            out,
            "#EXT-X-PRELOAD-HINT:TYPE=PART,URI=\"{next}.{index}.ts{}\"",
            query_suffix(window.query)
        );
    }
    if window.ended {
        out.push_str("#EXT-X-ENDLIST\n");
    }
    out
}

/// `#EXT-X-PART` lines of segment `sequence`.
fn write_parts(out: &mut String, parts: &[PartEntry], sequence: u64, query: &str) {
    for p in parts.iter().filter(|p| p.sequence == sequence) {
        let _ = writeln!(
            out,
            "#EXT-X-PART:DURATION={},URI=\"{}.{}.ts{}\"{}",
            seconds(p.duration),
            p.sequence,
            p.index,
            query_suffix(query),
            if p.independent {
                ",INDEPENDENT=YES"
            } else {
                ""
            }
        );
    }
}

fn query_suffix(query: &str) -> String {
    if query.is_empty() {
        String::new()
    } else {
        format!("?{query}")
    }
}

/// 90 kHz ticks as seconds with three decimals (`0.480`).
fn seconds(ticks: u64) -> String {
    let ms = ticks * 1000 / CLOCK;
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// `2024-01-01T12:00:00.000Z`.
pub fn iso8601(unix_ms: i64) -> String {
    let secs = unix_ms.div_euclid(1000);
    let (y, mo, d) = crate::civil::civil_from_days(secs.div_euclid(86_400));
    let t = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        t / 3600,
        t / 60 % 60,
        t % 60,
        unix_ms.rem_euclid(1000)
    )
}
