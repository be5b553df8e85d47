//! Field names and values taken from an HTTP/1 head that `httparse` has already parsed, without
//! checking every byte a second time: the common names by their spelling, values as views of one
//! copy of the head. No I/O.

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue, InvalidHeaderName, InvalidHeaderValue};

/// `Keep-Alive`, which `http` has no constant for.
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// A field value as text: the ASCII check first (a short value's is a few instructions, where
/// `from_utf8`'s set-up costs a hundred or more), UTF-8's only for a value with other bytes.
pub fn text(value: &[u8]) -> Option<&str> {
    if value.is_ascii() {
        // SAFETY: ASCII is UTF-8.
        Some(unsafe { std::str::from_utf8_unchecked(value) })
    } else {
        std::str::from_utf8(value).ok()
    }
}

/// The field name `name` (as a parser found it: a token, any case). The names most heads carry
/// are known constants, matched without regard to case (which is all `HeaderName::from_bytes`
/// would do to them: lower-case a token); any other goes through `from_bytes`, which checks it.
pub fn field_name(name: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
    // The first listed spelling `name` matches, or `None`.
    macro_rules! known {
        ($($lower:literal => $value:expr),+ $(,)?) => {
            $( if same_name(name, $lower) { Some($value) } else )+ { None }
        };
    }
    // By length first: a name of no listed length costs one branch.
    let found = match name.len() {
        3 => known!(b"age" => header::AGE, b"via" => header::VIA),
        4 => known!(
            b"host" => header::HOST,
            b"date" => header::DATE,
            b"etag" => header::ETAG,
            b"vary" => header::VARY,
        ),
        6 => known!(
            b"accept" => header::ACCEPT,
            b"server" => header::SERVER,
            b"cookie" => header::COOKIE,
            b"origin" => header::ORIGIN,
            b"pragma" => header::PRAGMA,
        ),
        7 => known!(b"referer" => header::REFERER, b"expires" => header::EXPIRES),
        8 => known!(b"location" => header::LOCATION),
        10 => known!(
            b"connection" => header::CONNECTION,
            b"user-agent" => header::USER_AGENT,
            b"keep-alive" => KEEP_ALIVE,
            b"set-cookie" => header::SET_COOKIE,
        ),
        12 => known!(b"content-type" => header::CONTENT_TYPE),
        13 => known!(
            b"last-modified" => header::LAST_MODIFIED,
            b"accept-ranges" => header::ACCEPT_RANGES,
            b"cache-control" => header::CACHE_CONTROL,
            b"authorization" => header::AUTHORIZATION,
            b"if-none-match" => header::IF_NONE_MATCH,
            b"content-range" => header::CONTENT_RANGE,
        ),
        14 => known!(b"content-length" => header::CONTENT_LENGTH),
        15 => known!(
            b"accept-encoding" => header::ACCEPT_ENCODING,
            b"accept-language" => header::ACCEPT_LANGUAGE,
        ),
        16 => known!(b"content-encoding" => header::CONTENT_ENCODING),
        17 => known!(
            b"transfer-encoding" => header::TRANSFER_ENCODING,
            b"if-modified-since" => header::IF_MODIFIED_SINCE,
        ),
        _ => None,
    };
    match found {
        Some(n) => Ok(n),
        None => HeaderName::from_bytes(name),
    }
}

/// Whether `name` spells `lower` (lower-case letters, digits and `-`) in any case. Eight bytes
/// at a time: where `lower` has a letter (bit 0x40 set) the case bit 0x20 is ignored, every other
/// byte must be the same.
#[inline]
fn same_name(name: &[u8], lower: &[u8]) -> bool {
    let n = lower.len();
    if name.len() != n {
        return false;
    }
    if n < 8 {
        return name
            .iter()
            .zip(lower)
            .all(|(&x, &y)| x | ((y & 0x40) >> 1) == y);
    }
    let mut at = 0;
    while at + 8 < n {
        if !same_word(&name[at..at + 8], &lower[at..at + 8]) {
            return false;
        }
        at += 8;
    }
    // The last eight bytes (overlapping the word before when `n` is not a multiple of eight).
    same_word(&name[n - 8..], &lower[n - 8..])
}

/// [`same_name`] for eight bytes.
#[inline]
fn same_word(name: &[u8], lower: &[u8]) -> bool {
    let (Ok(x), Ok(y)) = (<[u8; 8]>::try_from(name), <[u8; 8]>::try_from(lower)) else {
        return false;
    };
    let (x, y) = (u64::from_le_bytes(x), u64::from_le_bytes(y));
    x | ((y & 0x4040_4040_4040_4040) >> 1) == y
}

/// A field's value as a view of `raw`, the head's bytes copied once: one allocation per head
/// instead of one per field. A value that is not ASCII is checked as any other; one that is not
/// inside `raw` is copied and checked.
///
/// # Safety
/// `raw` must hold a copy of the start of `buf`, and `value`, where it lies inside that start, must
/// be a field value `httparse` (default configuration) accepted while parsing `buf`. Such a value
/// holds only HTAB, visible ASCII, space and obs-text, all of which a `HeaderValue` allows, so an
/// ASCII one is taken without checking its bytes again.
pub unsafe fn shared_value(
    raw: &Bytes,
    buf: &[u8],
    value: &[u8],
) -> Result<HeaderValue, InvalidHeaderValue> {
    let at = (value.as_ptr() as usize).wrapping_sub(buf.as_ptr() as usize);
    match at.checked_add(value.len()) {
        Some(end) if end <= raw.len() && value.is_ascii() => {
            let view = raw.slice(at..end);
            debug_assert_eq!(&view[..], value);
            // SAFETY: `from_maybe_shared_unchecked` asks for bytes a `HeaderValue` allows
            // (HTAB, 0x20-0x7E, 0x80-0xFF) and states its contract as UTF-8; `view` is ASCII
            // (checked just above), so it is UTF-8, and (the caller's promise) the same bytes as
            // a field value `httparse` accepted,
            // whose value grammar (HTAB, SP, VCHAR, obs-text; CR, LF, DEL and other controls
            // refused, in its scalar and SIMD scanners alike) leaves no byte a `HeaderValue`
            // refuses. Debug builds check it again inside the call.
            Ok(unsafe { HeaderValue::from_maybe_shared_unchecked(view) })
        }
        Some(end) if end <= raw.len() => HeaderValue::from_maybe_shared(raw.slice(at..end)),
        // Not inside the head (never, from the parsers here): copied.
        _ => HeaderValue::from_bytes(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name the table knows.
    const NAMES: &[&str] = &[
        "age",
        "via",
        "host",
        "date",
        "etag",
        "vary",
        "accept",
        "server",
        "cookie",
        "origin",
        "pragma",
        "referer",
        "expires",
        "location",
        "connection",
        "user-agent",
        "keep-alive",
        "set-cookie",
        "content-type",
        "last-modified",
        "accept-ranges",
        "cache-control",
        "authorization",
        "if-none-match",
        "content-range",
        "content-length",
        "accept-encoding",
        "accept-language",
        "content-encoding",
        "transfer-encoding",
        "if-modified-since",
    ];

    fn title(name: &str) -> String {
        name.split('-')
            .map(|w| {
                let mut c = w.chars();
                c.next()
                    .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("-")
    }

    #[test]
    fn names_are_what_http_makes_of_them() {
        for name in NAMES {
            for spelling in [
                name.to_string(),
                title(name),
                name.to_ascii_uppercase(),
                name.replacen('e', "E", 1),
            ] {
                assert_eq!(
                    field_name(spelling.as_bytes()).unwrap(),
                    HeaderName::from_bytes(spelling.as_bytes()).unwrap(),
                    "{spelling}"
                );
            }
        }
        assert_eq!(field_name(b"ETag").unwrap(), header::ETAG);
        // A byte one case bit away from a letter or a hyphen is not that letter or hyphen.
        for name in NAMES {
            for at in 0..name.len() {
                for flip in [0x20u8, 0x40, 0x60, 0x01] {
                    let mut odd = name.as_bytes().to_vec();
                    odd[at] ^= flip;
                    assert_eq!(
                        field_name(&odd).ok(),
                        HeaderName::from_bytes(&odd).ok(),
                        "{odd:?}"
                    );
                }
            }
        }
        assert_eq!(field_name(b"X-Custom").unwrap().as_str(), "x-custom");
        for bad in [&b""[..], b"a b", b"host:", b"\xff"] {
            assert!(field_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn values_are_views_and_odd_ones_are_checked() {
        let buf = b"X-A: b c\r\nX-B: caf\xc3\xa9\r\n";
        let raw = Bytes::copy_from_slice(buf);
        // SAFETY: `raw` copies `buf`; the two values inside it are the ones httparse would return
        // for this head, and the other two lie outside it.
        let (v1, v2, outside, elsewhere) = unsafe {
            (
                shared_value(&raw, buf, &buf[5..8]),
                shared_value(&raw, buf, &buf[15..20]),
                shared_value(&raw, buf, b"x\x7fy"),
                shared_value(&raw, buf, b"elsewhere"),
            )
        };
        assert_eq!(v1.unwrap(), "b c");
        assert_eq!(v2.unwrap().as_bytes(), "caf\u{e9}".as_bytes());
        // Not inside `buf`: copied, and checked.
        assert!(outside.is_err());
        assert_eq!(elsewhere.unwrap(), "elsewhere");
    }

    /// Field names: mostly tokens, some known names in any case, some other bytes.
    fn name_bytes() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        prop_oneof![
            "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,14}".prop_map(String::into_bytes),
            (proptest::sample::select(NAMES), any::<u64>()).prop_map(|(n, bits)| n
                .bytes()
                .enumerate()
                .map(|(i, b)| if bits >> (i % 64) & 1 == 1 {
                    b.to_ascii_uppercase()
                } else {
                    b
                })
                .collect()),
            proptest::collection::vec(any::<u8>(), 1..12),
        ]
    }

    /// Field values: HTAB, every ASCII byte, obs-text.
    fn value_bytes() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        proptest::collection::vec(
            prop_oneof![Just(b'\t'), 0x20u8..=0x7f, 0x80u8..=0xff, 0u8..0x20],
            0..40,
        )
    }

    proptest::proptest! {
        /// Whatever a head holds, the values taken from httparse's fields are the ones the
        /// checked constructor makes, and the names are `http`'s.
        #[test]
        fn parsed_fields_match_the_checked_path(
            fields in proptest::collection::vec((name_bytes(), value_bytes()), 0..6)
        ) {
            let mut buf = b"HTTP/1.1 200 OK\r\n".to_vec();
            for (k, v) in &fields {
                buf.extend_from_slice(k);
                buf.extend_from_slice(b": ");
                buf.extend_from_slice(v);
                buf.extend_from_slice(b"\r\n");
            }
            buf.extend_from_slice(b"\r\n");
            let mut slots = [httparse::EMPTY_HEADER; 8];
            let mut resp = httparse::Response::new(&mut slots);
            if let Ok(httparse::Status::Complete(len)) = resp.parse(&buf) {
                let raw = Bytes::copy_from_slice(&buf[..len]);
                for f in resp.headers.iter() {
                    let checked = HeaderValue::from_bytes(f.value);
                    // SAFETY: `raw` copies the start of `buf`, which httparse just parsed.
                    let fast = unsafe { shared_value(&raw, &buf, f.value) };
                    proptest::prop_assert_eq!(checked.ok(), fast.ok());
                    let name = field_name(f.name.as_bytes()).ok();
                    proptest::prop_assert_eq!(name, HeaderName::from_bytes(f.name.as_bytes()).ok());
                }
            }
        }
    }
}
