//! Catch-up (time-shift) values as IPTV players send them (`playseek=`, `tvdr=`), read the way
//! rtp2httpd reads them, and turned into what an RTSP server takes: a `Range: clock=` value in
//! UTC, or the same value in its own format with the zone applied and the offset added.
//!
//! Accepted instants: Unix seconds (up to 10 digits), `yyyyMMddHHmmss` (the client's zone),
//! `yyyyMMddHHmmssGMT`, compact ISO 8601 `yyyyMMddTHHmmss[Z|±HH:MM]` and full ISO 8601
//! `yyyy-MM-ddTHH:mm:ss[.sss][Z|±HH:MM]` (no suffix: the client's zone). A value is
//! `begin`, `begin-` or `begin-end`.

use crate::civil::{civil_from_days, days_from_civil};

/// How an instant was written, so it can be written back the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Unix,
    /// `yyyyMMddHHmmss`, in the client's zone.
    Digits,
    /// `yyyyMMddHHmmssGMT`.
    DigitsGmt,
    /// `yyyyMMddTHHmmss` with an optional zone.
    CompactIso(Zone),
    /// `yyyy-MM-ddTHH:mm:ss[.sss]` with an optional zone.
    Iso(Zone, Option<u16>),
}

/// An ISO 8601 zone suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zone {
    /// None written: the client's zone applies.
    Local,
    Utc,
    /// `±HH:MM`, in seconds east of UTC.
    Offset(i64),
}

/// One instant: seconds since the Unix epoch (UTC) and how it was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub unix: i64,
    pub format: Format,
}

/// A parsed seek value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seek {
    pub begin: Stamp,
    pub end: Option<Stamp>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatchupError {
    #[error("{0:?} is not a time range (begin[-end]) in a known format")]
    Format(String),
    #[error("the range ends before it begins")]
    Backwards,
}

/// The longest `playseek` value taken (the longest well-formed one has 59 characters).
const MAX_SEEK_LEN: usize = 96;

/// Parses `begin[-end]`; `client_zone` (seconds east of UTC) applies to instants written
/// without a zone.
pub fn parse_seek(value: &str, client_zone: i64) -> Result<Seek, CatchupError> {
    let value = value.trim();
    let bad = || CatchupError::Format(value.chars().take(64).collect());
    // The longest value written in any form (two ISO instants with milliseconds and zones) has
    // 59 characters: a longer one is refused before every dash is tried as the separator (each
    // try scans what is before it: 64 KiB of dashes was billions of steps).
    if value.len() > MAX_SEEK_LEN {
        return Err(bad());
    }
    let seek = if let Some(begin) = stamp(value, client_zone) {
        Seek { begin, end: None }
    } else {
        // ISO values contain dashes themselves: try every dash as the separator.
        value
            .match_indices('-')
            .find_map(|(at, _)| {
                let begin = stamp(&value[..at], client_zone)?;
                let rest = &value[at + 1..];
                if rest.is_empty() {
                    return Some(Seek { begin, end: None });
                }
                Some(Seek {
                    begin,
                    end: Some(stamp(rest, client_zone)?),
                })
            })
            .ok_or_else(bad)?
    };
    if seek.end.is_some_and(|e| e.unix < seek.begin.unix) {
        return Err(CatchupError::Backwards);
    }
    Ok(seek)
}

/// `Range: clock=` value (RFC 2326 §3.7) for the seek, shifted by `offset` seconds.
pub fn clock_range(seek: &Seek, offset: i64) -> String {
    let b = utc_compact(seek.begin.unix + offset);
    match seek.end {
        Some(e) => format!("clock={b}-{}", utc_compact(e.unix + offset)),
        None => format!("clock={b}-"),
    }
}

/// The seek written back in its own format(s), zone applied and shifted by `offset` seconds,
/// for servers that take the time range in the URL.
pub fn rewrite(seek: &Seek, offset: i64) -> String {
    let b = write(seek.begin, offset);
    match seek.end {
        Some(e) => format!("{b}-{}", write(e, offset)),
        None => b,
    }
}

/// Seconds east of UTC from rtp2httpd's User-Agent marker: `TZ/UTC+8`, `TZ/UTC-5`,
/// `TZ/UTC+5:30`, `TZ/UTC`. `None` when absent or malformed.
pub fn user_agent_zone(user_agent: &str) -> Option<i64> {
    let at = user_agent.find("TZ/UTC")?;
    let rest = &user_agent[at + 6..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '+' | '-' | ':')))
        .unwrap_or(rest.len());
    let spec = &rest[..end];
    if spec.is_empty() {
        return Some(0);
    }
    zone_offset(spec, true)
}

/// `+8`, `-05`, `+05:30`, `+0530` (hours alone only when `bare_hours`).
fn zone_offset(s: &str, bare_hours: bool) -> Option<i64> {
    let sign = match s.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let body = &s[1..];
    // Digits and a colon only, checked first: the split below counts bytes.
    if !body.bytes().all(|b| b.is_ascii_digit() || b == b':') {
        return None;
    }
    let (h, m) = match body.split_once(':') {
        Some((h, m)) => (h, m),
        None if body.len() == 4 => body.split_at(2),
        None if bare_hours || body.len() == 2 => (body, "0"),
        None => return None,
    };
    if h.is_empty() || h.len() > 2 || m.is_empty() || m.len() > 2 {
        return None;
    }
    let (h, m): (i64, i64) = (h.parse().ok()?, m.parse().ok()?);
    if h > 14 || m > 59 {
        return None;
    }
    Some(sign * (h * 3600 + m * 60))
}

fn stamp(s: &str, client_zone: i64) -> Option<Stamp> {
    if s.is_empty() {
        return None;
    }
    if s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Stamp {
            unix: s.parse().ok()?,
            format: Format::Unix,
        });
    }
    if s.len() == 14 && s.bytes().all(|b| b.is_ascii_digit()) {
        let local = digits_time(s)?;
        return Some(Stamp {
            unix: local - client_zone,
            format: Format::Digits,
        });
    }
    if let Some(d) = s.strip_suffix("GMT") {
        if d.len() == 14 && d.bytes().all(|b| b.is_ascii_digit()) {
            return Some(Stamp {
                unix: digits_time(d)?,
                format: Format::DigitsGmt,
            });
        }
        return None;
    }
    let (body, zone) = split_zone(s)?;
    let zone_secs = match zone {
        Zone::Local => client_zone,
        Zone::Utc => 0,
        Zone::Offset(o) => o,
    };
    if body.len() == 15 && body.as_bytes()[8] == b'T' {
        let digits = format!("{}{}", &body[..8], &body[9..]);
        if !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        return Some(Stamp {
            unix: digits_time(&digits)? - zone_secs,
            format: Format::CompactIso(zone),
        });
    }
    // yyyy-MM-ddTHH:mm:ss[.sss]
    let (main, millis) = match body.split_once('.') {
        Some((m, f)) if (1..=3).contains(&f.len()) && f.bytes().all(|b| b.is_ascii_digit()) => {
            let ms: u16 = format!("{f:0<3}").parse().ok()?;
            (m, Some(ms))
        }
        Some(_) => return None,
        None => (body, None),
    };
    let b = main.as_bytes();
    if b.len() != 19
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let digits: String = main.chars().filter(char::is_ascii_digit).collect();
    if digits.len() != 14 {
        return None;
    }
    Some(Stamp {
        unix: digits_time(&digits)? - zone_secs,
        format: Format::Iso(zone, millis),
    })
}

/// Splits an ISO value into its body and zone suffix.
fn split_zone(s: &str) -> Option<(&str, Zone)> {
    if let Some(body) = s.strip_suffix('Z') {
        return Some((body, Zone::Utc));
    }
    // A zone offset starts at a sign after the time (position 15 compact, 19+ full).
    if let Some(at) = s.rfind(['+', '-']) {
        if at >= 15 && s[..at].contains('T') {
            return Some((&s[..at], Zone::Offset(zone_offset(&s[at..], false)?)));
        }
    }
    Some((s, Zone::Local))
}

/// `yyyyMMddHHmmss` (already all digits) as seconds since the epoch, read as UTC.
fn digits_time(d: &str) -> Option<i64> {
    let n = |r: std::ops::Range<usize>| d[r].parse::<i64>().ok();
    let (y, mo, day) = (n(0..4)?, n(4..6)?, n(6..8)?);
    let (h, mi, s) = (n(8..10)?, n(10..12)?, n(12..14)?);
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&mo) || h > 23 || mi > 59 || s > 59 {
        return None;
    }
    if day < 1 || day > days_in_month(y, mo) {
        return None;
    }
    Some(days_from_civil(y, mo, day) * 86_400 + h * 3600 + mi * 60 + s)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// (y, M, d, H, m, s) of a Unix time.
fn fields(unix: i64) -> (i64, i64, i64, i64, i64, i64) {
    let (days, secs) = (unix.div_euclid(86_400), unix.rem_euclid(86_400));
    let (y, mo, d) = civil_from_days(days);
    (y, mo, d, secs / 3600, secs % 3600 / 60, secs % 60)
}

fn utc_compact(unix: i64) -> String {
    let (y, mo, d, h, mi, s) = fields(unix);
    format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}Z")
}

fn write(st: Stamp, offset: i64) -> String {
    let t = st.unix + offset;
    let digits = |t: i64| {
        let (y, mo, d, h, mi, s) = fields(t);
        format!("{y:04}{mo:02}{d:02}{h:02}{mi:02}{s:02}")
    };
    match st.format {
        Format::Unix => t.to_string(),
        Format::Digits => digits(t),
        Format::DigitsGmt => format!("{}GMT", digits(t)),
        Format::CompactIso(zone) => {
            let (local, suffix) = zoned(t, zone);
            let d = digits(local);
            format!("{}T{}{suffix}", &d[..8], &d[8..])
        }
        Format::Iso(zone, millis) => {
            let (local, suffix) = zoned(t, zone);
            let (y, mo, d, h, mi, s) = fields(local);
            let ms = millis.map(|m| format!(".{m:03}")).unwrap_or_default();
            format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{ms}{suffix}")
        }
    }
}

/// The wall-clock time to print for a zone, and its suffix. A value written without a zone
/// is printed in UTC (the client's zone has been applied), still without a suffix.
fn zoned(t: i64, zone: Zone) -> (i64, String) {
    match zone {
        Zone::Local => (t, String::new()),
        Zone::Utc => (t, "Z".into()),
        Zone::Offset(o) => {
            let sign = if o < 0 { '-' } else { '+' };
            let a = o.abs();
            (t + o, format!("{sign}{:02}:{:02}", a / 3600, a % 3600 / 60))
        }
    }
}

#[cfg(test)]
#[path = "catchup/tests.rs"]
mod tests;
