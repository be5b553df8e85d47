use super::*;

const H8: i64 = 8 * 3600;
/// 2024-01-01T12:00:00Z
const NOON: i64 = 1_704_110_400;

#[test]
fn digits_in_the_client_zone() {
    let s = parse_seek("20240101200000-20240101210000", H8).unwrap();
    assert_eq!(s.begin.unix, NOON);
    assert_eq!(s.end.unwrap().unix, NOON + 3600);
    assert_eq!(
        clock_range(&s, 0),
        "clock=20240101T120000Z-20240101T130000Z"
    );
    assert_eq!(rewrite(&s, 0), "20240101120000-20240101130000");
    assert_eq!(
        clock_range(&s, -30),
        "clock=20240101T115930Z-20240101T125930Z"
    );
}

#[test]
fn every_format() {
    let cases = [
        ("1704110400", NOON, "1704110400"),
        ("20240101120000GMT", NOON, "20240101120000GMT"),
        ("20240101T120000Z", NOON, "20240101T120000Z"),
        ("20240101T200000+08:00", NOON, "20240101T200000+08:00"),
        ("20240101T120000", NOON, "20240101T120000"),
        ("2024-01-01T12:00:00Z", NOON, "2024-01-01T12:00:00Z"),
        (
            "2024-01-01T07:00:00-05:00",
            NOON,
            "2024-01-01T07:00:00-05:00",
        ),
        ("2024-01-01T12:00:00.12", NOON, "2024-01-01T12:00:00.120"),
    ];
    for (input, unix, back) in cases {
        let s = parse_seek(input, 0).unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!(s.begin.unix, unix, "{input}");
        assert_eq!(s.end, None);
        assert_eq!(rewrite(&s, 0), back, "{input}");
    }
}

#[test]
fn iso_ranges_with_dashes_and_open_ends() {
    let s = parse_seek("2024-01-01T12:00:00Z-2024-01-01T13:00:00Z", 0).unwrap();
    assert_eq!(s.end.unwrap().unix, NOON + 3600);
    let s = parse_seek("2024-01-01T20:00:00+08:00-2024-01-01T21:00:00+08:00", 0).unwrap();
    assert_eq!((s.begin.unix, s.end.unwrap().unix), (NOON, NOON + 3600));
    let s = parse_seek("20240101120000-", 0).unwrap();
    assert_eq!(s.end, None);
    assert_eq!(clock_range(&s, 60), "clock=20240101T120100Z-");
}

#[test]
fn refuses_nonsense() {
    for bad in [
        "",
        "yesterday",
        "20241301120000",
        "20240230120000",
        "20240101246000",
        "12345678901",
        "2024-01-01 12:00:00",
        "20240101T120000+99:00",
    ] {
        assert!(parse_seek(bad, 0).is_err(), "{bad}");
    }
    assert_eq!(
        parse_seek("20240101130000-20240101120000", 0),
        Err(CatchupError::Backwards)
    );
}

#[test]
fn user_agent_zones() {
    assert_eq!(user_agent_zone("AptvPlayer/1.3 TZ/UTC+8"), Some(H8));
    assert_eq!(user_agent_zone("x TZ/UTC-5 y"), Some(-5 * 3600));
    assert_eq!(user_agent_zone("TZ/UTC+5:30"), Some(5 * 3600 + 1800));
    assert_eq!(user_agent_zone("TZ/UTC"), Some(0));
    assert_eq!(user_agent_zone("VLC/3.0"), None);
    assert_eq!(user_agent_zone("TZ/UTC+99"), None);
}

#[test]
fn calendar_round_trip() {
    for days in [-1, 0, 59, 60, 365, 10_956, 11_016, 19_723, 2_932_896] {
        let (y, m, d) = civil_from_days(days);
        assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
    }
    assert_eq!(civil_from_days(19_723), (2024, 1, 1));
    assert_eq!(civil_from_days(19_782), (2024, 2, 29));
}

/// Found by `never_panics`: a four-byte character where a four-digit zone offset goes used to be
/// split at byte 2, inside the character.
#[test]
fn a_multibyte_zone_offset_is_refused_not_split() {
    assert!(parse_seek("T🟰🟠A𐮩a-𐖻", 0).is_err());
    assert!(parse_seek("20240101T200000+𐖻", 0).is_err());
    assert_eq!(user_agent_zone("TZ/UTC+𐖻"), None);
}

/// A value longer than any well-formed one is refused before every dash is tried as the
/// separator (64 KiB of dashes was billions of steps); the longest well-formed one still parses.
#[test]
fn an_overlong_seek_is_refused_before_splitting() {
    assert!(parse_seek(&"-".repeat(64 * 1024), 0).is_err());
    let longest = "2024-01-01T20:00:00.000+08:00-2024-01-01T21:00:00.000+08:00";
    assert_eq!(longest.len(), 59);
    let seek = parse_seek(longest, 0).unwrap();
    assert!(seek.end.is_some());
}

proptest::proptest! {
    #[test]
    fn digits_round_trip(t in 0i64..253_402_300_799, zone in -14i64 * 3600..=14 * 3600) {
        let written = rewrite(&Seek { begin: Stamp { unix: t, format: Format::Digits }, end: None }, 0);
        let back = parse_seek(&written, 0).unwrap();
        proptest::prop_assert_eq!(back.begin.unix, t);
        let zoned = parse_seek(&written, zone).unwrap();
        proptest::prop_assert_eq!(zoned.begin.unix, t - zone);
    }

    #[test]
    fn never_panics(s in "\\PC{0,48}", zone in -50_000i64..50_000) {
        let _ = parse_seek(&s, zone);
        let _ = user_agent_zone(&s);
    }
}
