//! `Content-Length` values (lines of the input) through `framing::declared_length` and
//! `settle_length`. A length is accepted only when every value is one decimal number and all
//! are the same number (checked against a plain reference); two different lengths are never
//! accepted. Settling leaves exactly one plain `Content-Length` of that number, touches nothing
//! else, changes no framing decision and is idempotent; refused or absent values stay as they
//! came.
#![no_main]

use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH};
use libfuzzer_sys::fuzz_target;
use sluice_http::framing::{
    check_request, declared_length, is_plain_length, settle_length, FramingError,
};

/// The rule written plainly: each value, trimmed of whitespace, 1 to 19 decimal digits; all the
/// same number.
fn reference(values: &[&[u8]]) -> Result<Option<u64>, FramingError> {
    let mut numbers = Vec::new();
    for v in values {
        let text = std::str::from_utf8(v).map_err(|_| FramingError::BadLength)?;
        let t = text.trim_matches(|c: char| c.is_ascii_whitespace());
        if t.is_empty() || t.len() > 19 || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(FramingError::BadLength);
        }
        numbers.push(t.parse::<u64>().map_err(|_| FramingError::BadLength)?);
    }
    match numbers.first() {
        None => Ok(None),
        Some(&n) if numbers.iter().all(|&m| m == n) => Ok(Some(n)),
        Some(_) => Err(FramingError::ConflictingLength),
    }
}

fn fields(h: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    h.iter()
        .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
        .collect()
}

fuzz_target!(|data: &[u8]| {
    // Each line is a `Content-Length` value; a line starting with `#` is another field.
    let mut headers = HeaderMap::new();
    let other = HeaderName::from_static("x-other");
    for line in data.split(|&b| b == b'\n') {
        let (name, value) = match line.strip_prefix(b"#") {
            Some(v) => (other.clone(), v),
            None => (CONTENT_LENGTH, line),
        };
        if let Ok(v) = HeaderValue::from_bytes(value) {
            headers.append(name, v);
        }
    }
    let values: Vec<&[u8]> = headers
        .get_all(CONTENT_LENGTH)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    let declared = declared_length(values.iter().copied());
    let want = reference(&values);
    // The same verdict as the plain rule: the kind of refusal may differ only when a value is
    // malformed anyway (the first bad value decides).
    match (&declared, &want) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(_), Err(_)) => {}
        _ => panic!("{declared:?} but the rule says {want:?} for {values:?}"),
    }
    // Two different numbers among the values are never one length.
    let numbers: Vec<u64> = values
        .iter()
        .filter_map(|v| std::str::from_utf8(v).ok()?.trim().parse().ok())
        .collect();
    if numbers.windows(2).any(|w| w[0] != w[1]) {
        assert!(declared.is_err(), "{values:?} accepted as {declared:?}");
    }
    let framing = check_request(&headers, true);
    let before = fields(&headers);
    let mut settled = headers.clone();
    settle_length(&mut settled);
    let after = fields(&settled);
    // Every other field as it was, in its order.
    let others = |f: &[(String, Vec<u8>)]| {
        f.iter()
            .filter(|(k, _)| k != "content-length")
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(others(&before), others(&after));
    match declared {
        Ok(Some(n)) => {
            let left: Vec<&HeaderValue> = settled.get_all(CONTENT_LENGTH).iter().collect();
            assert_eq!(left.len(), 1, "{values:?}");
            assert!(is_plain_length(left[0].as_bytes()));
            assert_eq!(left[0].as_bytes(), n.to_string().as_bytes());
            assert_eq!(
                declared_length(settled.get_all(CONTENT_LENGTH).iter().map(|v| v.as_bytes())),
                Ok(Some(n))
            );
        }
        // Nothing to settle, or refused (the caller refused it first): as it came.
        _ => assert_eq!(before, after),
    }
    assert_eq!(check_request(&settled, true), framing);
    let mut twice = settled.clone();
    settle_length(&mut twice);
    assert_eq!(fields(&twice), after);
});
