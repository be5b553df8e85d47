//! Track attributes that need decoding: content kind, audio channel count, frame rate. No I/O.

use super::mpd::{invalid, parse_number, ContentKind};
use super::xml::Element;
use super::DashError;

/// `contentType` first, then `mimeType`; a generic `application/mp4` says nothing, so the codec
/// decides, and dimensions as a last resort (MediaFlow mislabels such tracks as audio).
pub(crate) fn content_kind(
    content_type: Option<&str>,
    mime: Option<&str>,
    codecs: Option<&str>,
    height: Option<u32>,
) -> ContentKind {
    let by_prefix = |text: &str| match text.split('/').next().unwrap_or("") {
        "video" => Some(ContentKind::Video),
        "audio" => Some(ContentKind::Audio),
        "text" => Some(ContentKind::Text),
        _ => None,
    };
    if let Some(kind) = content_type
        .and_then(by_prefix)
        .or_else(|| mime.and_then(by_prefix))
    {
        return kind;
    }
    let codec = codecs
        .unwrap_or("")
        .split(['.', ','])
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    match codec.as_str() {
        "avc1" | "avc3" | "hev1" | "hvc1" | "dvh1" | "dvhe" | "vp09" | "vp8" | "vp9" | "av01" => {
            ContentKind::Video
        }
        "mp4a" | "ac-3" | "ec-3" | "ac-4" | "opus" | "flac" | "dtsc" | "dtse" | "dtsx" => {
            ContentKind::Audio
        }
        "stpp" | "wvtt" => ContentKind::Text,
        _ if height.is_some() => ContentKind::Video,
        _ => ContentKind::Other,
    }
}

/// Channel count from the common AudioChannelConfiguration schemes.
pub(crate) fn channel_count(el: &Element) -> Option<u32> {
    let scheme = el.attr("schemeIdUri").unwrap_or("");
    let value = el.attr("value")?.trim();
    if scheme.contains("dolby") {
        return dolby_channel_count(value);
    }
    if scheme.contains("cicp") {
        // ISO/IEC 23091-3 ChannelConfiguration indices that players meet in practice.
        let count = match value.parse::<u32>().ok()? {
            n @ 1..=6 => n,
            7 | 12 | 14 => 8,
            11 => 7,
            13 => 24,
            _ => return None,
        };
        return Some(count);
    }
    value.parse().ok().filter(|n| (1..=64).contains(n))
}

/// Dolby's 16-bit speaker mask: some bits stand for a pair of speakers.
fn dolby_channel_count(value: &str) -> Option<u32> {
    let mask = u16::from_str_radix(value, 16).ok()?;
    const PAIR_BITS: [u32; 6] = [5, 6, 9, 10, 11, 13]; // counted from the most significant bit
    let count = (0..16u32)
        .filter(|bit| mask & (0x8000 >> bit) != 0)
        .map(|bit| if PAIR_BITS.contains(&bit) { 2 } else { 1 })
        .sum();
    (count > 0).then_some(count)
}

pub(crate) fn parse_frame_rate(text: &str) -> Result<f64, DashError> {
    let rate = match text.split_once('/') {
        Some((num, den)) => {
            let num: f64 = parse_number("frameRate", num)?;
            let den: f64 = parse_number("frameRate", den)?;
            num / den
        }
        None => parse_number("frameRate", text)?,
    };
    if rate.is_finite() && rate > 0.0 {
        Ok(rate)
    } else {
        Err(invalid("frameRate", text))
    }
}
