//! ISO 8601 durations and xs:dateTime values as seconds, and PROGRAM-DATE-TIME formatting. No I/O.

use crate::civil::{civil_from_days, days_from_civil};

/// Parses an xs:duration (`PT1H2M3.5S`, `P1DT2H`, `P0Y0M1W`) into seconds.
///
/// Years count 365 days and months 30: MPD durations rarely use them and the standard leaves
/// their length to the calendar. Negative durations are rejected; nothing in an MPD needs one.
pub fn parse_duration(text: &str) -> Option<f64> {
    let rest = text.trim().strip_prefix('P')?;
    let (date, time) = match rest.split_once('T') {
        Some((d, t)) if !t.is_empty() => (d, Some(t)),
        Some(_) => return None,
        None => (rest, None),
    };
    if date.is_empty() && time.is_none() {
        return None;
    }
    const DAY: f64 = 86_400.0;
    let mut total = sum_components(
        date,
        &[
            ('Y', 365.0 * DAY),
            ('M', 30.0 * DAY),
            ('W', 7.0 * DAY),
            ('D', DAY),
        ],
    )?;
    if let Some(time) = time {
        total += sum_components(time, &[('H', 3600.0), ('M', 60.0), ('S', 1.0)])?;
    }
    total.is_finite().then_some(total)
}

/// Adds up `<number><designator>` pairs, designators in the given order, each at most once.
fn sum_components(mut text: &str, units: &[(char, f64)]) -> Option<f64> {
    let mut total = 0.0;
    let mut next_unit = 0;
    while !text.is_empty() {
        let end = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let designator = text[end..].chars().next()?;
        let value: f64 = parse_unsigned_decimal(&text[..end])?;
        let offset = units[next_unit..]
            .iter()
            .position(|(c, _)| *c == designator)?;
        total += value * units[next_unit + offset].1;
        next_unit += offset + 1;
        text = &text[end + designator.len_utf8()..];
    }
    Some(total)
}

fn parse_unsigned_decimal(text: &str) -> Option<f64> {
    if text.is_empty() || text.starts_with('.') || text.ends_with('.') {
        return None;
    }
    text.parse().ok()
}

/// Parses an xs:dateTime / RFC 3339 timestamp into unix seconds. A missing zone means UTC,
/// which is what packagers that omit it intend.
pub fn parse_datetime(text: &str) -> Option<f64> {
    let text = text.trim();
    let (date, time) = text.split_once(['T', 't', ' '])?;
    let mut date_parts = date.splitn(3, '-');
    let year: i64 = fixed_digits(date_parts.next()?, 4)?;
    let month: i64 = fixed_digits(date_parts.next()?, 2)?;
    let day: i64 = fixed_digits(date_parts.next()?, 2)?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let (clock, zone_offset) = split_zone(time)?;
    let mut clock_parts = clock.splitn(3, ':');
    let hour: i64 = fixed_digits(clock_parts.next()?, 2)?;
    let minute: i64 = fixed_digits(clock_parts.next()?, 2)?;
    let seconds: f64 = match clock_parts.next() {
        Some(s) => parse_unsigned_decimal(s).filter(|s| *s < 61.0)?,
        None => 0.0,
    };
    if hour > 24 || minute > 59 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let whole = days * 86_400 + hour * 3600 + minute * 60 - zone_offset;
    Some(whole as f64 + seconds)
}

/// Splits `HH:MM:SS(.f)` from its zone suffix, returning the zone offset in seconds east of UTC.
fn split_zone(time: &str) -> Option<(&str, i64)> {
    if let Some(clock) = time.strip_suffix(['Z', 'z']) {
        return Some((clock, 0));
    }
    match time.rfind(['+', '-']) {
        Some(at) => {
            let (clock, zone) = time.split_at(at);
            let sign = if zone.starts_with('-') { -1 } else { 1 };
            let (h, m) = zone[1..].split_once(':')?;
            let offset = fixed_digits(h, 2)? * 3600 + fixed_digits(m, 2)? * 60;
            Some((clock, sign * offset))
        }
        None => Some((time, 0)),
    }
}

fn fixed_digits(text: &str, len: usize) -> Option<i64> {
    (text.len() == len && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

/// Formats unix seconds as `YYYY-MM-DDTHH:MM:SS.mmmZ` for `#EXT-X-PROGRAM-DATE-TIME`.
pub fn format_datetime(unix: f64) -> String {
    let millis = (unix * 1000.0).round() as i64;
    let secs = millis.div_euclid(1000);
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let of_day = secs.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60,
        millis.rem_euclid(1000)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("PT1H2M3.5S"), Some(3723.5));
        assert_eq!(parse_duration("P1DT1S"), Some(86_401.0));
        assert_eq!(parse_duration("PT2M"), Some(120.0));
        assert_eq!(parse_duration("P0Y0M0DT0H0M10S"), Some(10.0));
        assert_eq!(parse_duration("P1W"), Some(604_800.0));
        assert_eq!(parse_duration("PT0S"), Some(0.0));
        for bad in [
            "", "P", "PT", "1S", "PT1", "PTS", "PT1S2M", "PT.5S", "-PT1S", "PT1H1H", "P1S",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        assert_eq!(parse_duration(&format!("PT{}S", "9".repeat(400))), None);
    }

    #[test]
    fn datetimes() {
        assert_eq!(parse_datetime("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(
            parse_datetime("2024-02-29T12:00:00.5Z"),
            Some(1_709_208_000.5)
        );
        assert_eq!(
            parse_datetime("2024-02-29T13:30:00+01:30"),
            Some(1_709_208_000.0)
        );
        assert_eq!(parse_datetime("2024-02-29T12:00:00"), Some(1_709_208_000.0));
        assert_eq!(parse_datetime("2024-13-01T00:00:00Z"), None);
        assert_eq!(parse_datetime("yesterday"), None);
        assert_eq!(format_datetime(1_709_208_000.5), "2024-02-29T12:00:00.500Z");
        assert_eq!(format_datetime(0.0), "1970-01-01T00:00:00.000Z");
    }
}
