//! Request framing checks against smuggling (RFC 9112 §6): a request whose body length two parsers
//! could disagree on is refused before anything is forwarded. No I/O.

use http::header::{self, HeaderMap};

/// How the body of an accepted request is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    None,
    /// `Content-Length: n`.
    Length(u64),
    /// `Transfer-Encoding: chunked` (HTTP/1.1 only).
    Chunked,
}

/// Why a request's framing is ambiguous or invalid (each a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("both Content-Length and Transfer-Encoding")]
    LengthAndChunked,
    #[error("Content-Length values disagree")]
    ConflictingLength,
    #[error("Content-Length is not a decimal number")]
    BadLength,
    #[error("Transfer-Encoding must end with `chunked`, once, with no other coding")]
    BadTransferEncoding,
    #[error("Transfer-Encoding in an HTTP/1.0 or HTTP/2 request")]
    TransferEncodingNotAllowed,
}

/// Checks the framing headers; `http11` is false for HTTP/1.0 and HTTP/2+ requests.
pub fn check_request(headers: &HeaderMap, http11: bool) -> Result<Framing, FramingError> {
    let te: Vec<&[u8]> = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    let cl: Vec<&[u8]> = headers
        .get_all(header::CONTENT_LENGTH)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    check_fields(&te, &cl, http11)
}

/// [`check_request`] on raw field values: every `Transfer-Encoding` value and every
/// `Content-Length` value, in the order received (the connection screen reads them straight from
/// the bytes of a request head).
pub fn check_fields(te: &[&[u8]], cl: &[&[u8]], http11: bool) -> Result<Framing, FramingError> {
    if !te.is_empty() {
        if !cl.is_empty() {
            return Err(FramingError::LengthAndChunked);
        }
        if !http11 {
            return Err(FramingError::TransferEncodingNotAllowed);
        }
        let codings: Vec<String> = te
            .iter()
            .flat_map(|v| v.split(|&b| b == b','))
            .map(|c| String::from_utf8_lossy(c).trim().to_ascii_lowercase())
            .collect();
        // A proxy that forwards other codings invites disagreement on where the body ends; sluice
        // accepts exactly `chunked`.
        return if codings.len() == 1 && codings[0] == "chunked" {
            Ok(Framing::Chunked)
        } else {
            Err(FramingError::BadTransferEncoding)
        };
    }
    Ok(match declared_length(cl.iter().copied())? {
        Some(0) | None => Framing::None,
        Some(n) => Framing::Length(n),
    })
}

/// Whether a field value starts or ends with a space or tab, which HTTP/2 and HTTP/3 requests may
/// not carry (RFC 9113 §8.2.1, RFC 9114 §10.3: a field value is `field-content`); HTTP/1.1's
/// parser strips such whitespace instead.
pub fn padded(value: &[u8]) -> bool {
    matches!(value.first(), Some(b' ' | b'\t')) || matches!(value.last(), Some(b' ' | b'\t'))
}

/// Whether `value` is a length written the one plain way: decimal digits without a leading zero
/// (or `0`), at most 19 of them.
pub fn is_plain_length(value: &[u8]) -> bool {
    value == b"0"
        || (!value.is_empty()
            && value.len() <= 19
            && value[0] != b'0'
            && value.iter().all(u8::is_ascii_digit))
}

/// Leaves `headers` with the one plain `Content-Length` its values declare, when they were several
/// fields of the same number or another spelling of it (RFC 9110 §8.6: a recipient that accepts
/// such a list replaces it with the one value, so the next hop cannot read it otherwise). Values
/// [`declared_length`] refuses are left as they are (the caller refused them first); no
/// `Content-Length` stays none.
pub fn settle_length(headers: &mut HeaderMap) {
    let mut values = headers.get_all(header::CONTENT_LENGTH).iter();
    match (values.next(), values.next()) {
        (None, _) => return,
        (Some(v), None) if is_plain_length(v.as_bytes()) => return,
        _ => {}
    }
    let values = headers.get_all(header::CONTENT_LENGTH).iter();
    if let Ok(Some(n)) = declared_length(values.map(|v| v.as_bytes())) {
        headers.insert(header::CONTENT_LENGTH, n.into());
    }
}

/// The length a request's `Content-Length` values declare: each value one decimal number
/// (whitespace around it allowed, as HTTP/1.1's parser strips it), every value the same; `None`
/// for no value. The same number in several fields is that one length (RFC 9110 §8.6), and what
/// goes on is the one number ([`settle_length`]). A comma-separated list inside one value is
/// refused, as hyper's HTTP/1.1 parser (which reads every HTTP/1.1 request sluice takes), Go's and
/// nginx's refuse it, so the protocols sluice serves agree on which requests have a length.
pub fn declared_length<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<u64>, FramingError> {
    let mut length: Option<u64> = None;
    for value in values {
        let part = trim(value);
        if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
            return Err(FramingError::BadLength);
        }
        let n = crate::response_head::decimal(part).ok_or(FramingError::BadLength)?;
        match length {
            Some(prev) if prev != n => return Err(FramingError::ConflictingLength),
            _ => length = Some(n),
        }
    }
    Ok(length)
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    #[test]
    fn accepted_shapes() {
        assert_eq!(check_request(&h(&[]), true), Ok(Framing::None));
        assert_eq!(
            check_request(&h(&[("content-length", "0")]), true),
            Ok(Framing::None)
        );
        assert_eq!(
            check_request(&h(&[("content-length", "12")]), true),
            Ok(Framing::Length(12))
        );
        assert_eq!(
            check_request(
                &h(&[("content-length", "5"), ("content-length", "5")]),
                true
            ),
            Ok(Framing::Length(5))
        );
        // One number per field: a list inside one is refused (as hyper's parser refuses it).
        assert_eq!(
            check_request(&h(&[("content-length", "5, 5")]), true),
            Err(FramingError::BadLength)
        );
        assert_eq!(
            check_request(&h(&[("content-length", " 05 ")]), true),
            Ok(Framing::Length(5))
        );
        assert_eq!(
            check_request(&h(&[("transfer-encoding", "Chunked")]), true),
            Ok(Framing::Chunked)
        );
    }

    #[test]
    fn smuggling_shapes_are_refused() {
        use FramingError::*;
        type Case<'a> = (&'a [(&'a str, &'a str)], bool, FramingError);
        let cases: &[Case] = &[
            (
                &[("content-length", "5"), ("transfer-encoding", "chunked")],
                true,
                LengthAndChunked,
            ),
            (
                &[("content-length", "5"), ("content-length", "6")],
                true,
                ConflictingLength,
            ),
            (&[("content-length", "5, 6")], true, BadLength),
            (&[("content-length", "5, 5")], true, BadLength),
            (&[("content-length", "+5")], true, BadLength),
            (&[("content-length", "0x5")], true, BadLength),
            (&[("content-length", "")], true, BadLength),
            (
                &[("content-length", "99999999999999999999")],
                true,
                BadLength,
            ),
            (
                &[("transfer-encoding", "gzip, chunked")],
                true,
                BadTransferEncoding,
            ),
            (
                &[("transfer-encoding", "chunked, chunked")],
                true,
                BadTransferEncoding,
            ),
            (
                &[
                    ("transfer-encoding", "chunked"),
                    ("transfer-encoding", "identity"),
                ],
                true,
                BadTransferEncoding,
            ),
            (
                &[("transfer-encoding", "xchunked")],
                true,
                BadTransferEncoding,
            ),
            (
                &[("transfer-encoding", "chunked")],
                false,
                TransferEncodingNotAllowed,
            ),
        ];
        for (headers, http11, want) in cases {
            assert_eq!(
                check_request(&h(headers), *http11),
                Err(want.clone()),
                "{headers:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn arbitrary_values_never_panic(cl in "[ -~]{0,25}", te in "[ -~]{0,25}", both in any::<bool>()) {
            let mut m = HeaderMap::new();
            if let Ok(v) = HeaderValue::from_str(&cl) { m.insert(header::CONTENT_LENGTH, v); }
            if both { if let Ok(v) = HeaderValue::from_str(&te) { m.insert(header::TRANSFER_ENCODING, v); } }
            let _ = check_request(&m, true);
        }
    }
}
