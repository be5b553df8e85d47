//! Variant selection in master playlists (`max_res`, `resolution`) and resolution parsing.

use super::HlsError;

/// Heights above this are not video; refusing them keeps arithmetic and errors sane.
const MAX_HEIGHT: u32 = 100_000;

/// Parses a wanted resolution into a height: `"720p"`, `"720"`, `"1280x720"`, `"4k"`.
pub fn parse_resolution(input: &str) -> Result<u32, HlsError> {
    let s = input.trim();
    let height = if s.eq_ignore_ascii_case("4k") {
        Some(2160)
    } else if let Some(h) = parse_dimensions(s) {
        Some(h)
    } else {
        let digits = s
            .strip_suffix('p')
            .or_else(|| s.strip_suffix('P'))
            .unwrap_or(s);
        parse_height(digits)
    };
    height.ok_or_else(|| HlsError::InvalidResolution(super::snippet(input)))
}

/// `WIDTHxHEIGHT` as found in `RESOLUTION=` attributes; returns the height.
pub(crate) fn parse_dimensions(s: &str) -> Option<u32> {
    let (w, h) = s.split_once(['x', 'X'])?;
    parse_height(w)?;
    parse_height(h)
}

fn parse_height(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u32>()
        .ok()
        .filter(|&h| (1..=MAX_HEIGHT).contains(&h))
}

/// Picks the height whose variants survive, given every variant's height in playlist order
/// (`None` = no `RESOLUTION`). `None` means "keep every variant": nothing was asked, or no
/// variant declares a resolution so there is nothing to choose on.
///
/// `resolution` wins over `max_res` when both are set: it is the more specific request.
/// Rule for `resolution`: that height if present, else the closest lower, else the lowest.
pub(crate) fn choose(
    heights: &[Option<u32>],
    max_res: bool,
    resolution: Option<u32>,
) -> Option<u32> {
    let known = || heights.iter().flatten().copied();
    match resolution {
        Some(want) => {
            let lower = known().filter(|&h| h <= want).max();
            lower.or_else(|| known().min())
        }
        None if max_res => known().max(),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_spellings() {
        assert_eq!(parse_resolution("720p"), Ok(720));
        assert_eq!(parse_resolution(" 1080P "), Ok(1080));
        assert_eq!(parse_resolution("480"), Ok(480));
        assert_eq!(parse_resolution("1280x720"), Ok(720));
        assert_eq!(parse_resolution("4K"), Ok(2160));
    }

    #[test]
    fn rejects_nonsense() {
        for bad in [
            "",
            "p",
            "hd",
            "-720",
            "0p",
            "720px",
            "1280x",
            "99999999999p",
        ] {
            assert!(
                matches!(parse_resolution(bad), Err(HlsError::InvalidResolution(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn choice_rules() {
        let hs = [Some(360), Some(720), None, Some(1080)];
        assert_eq!(choose(&hs, false, None), None);
        assert_eq!(choose(&hs, true, None), Some(1080));
        assert_eq!(choose(&hs, false, Some(720)), Some(720));
        assert_eq!(choose(&hs, false, Some(900)), Some(720));
        assert_eq!(choose(&hs, false, Some(240)), Some(360));
        assert_eq!(choose(&hs, true, Some(480)), Some(360));
        assert_eq!(choose(&[None, None], true, None), None);
    }
}
