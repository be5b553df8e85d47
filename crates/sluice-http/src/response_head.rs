//! HTTP/1.x response heads read off a raw upstream socket: status, fields, head length, and how
//! the body is delimited (RFC 9112 §6.3). No I/O.

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::StatusCode;

/// Most fields a response head may carry.
pub const MAX_FIELDS: usize = 100;

/// A parsed response head.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// `HTTP/1.0` (minor version 0) or `HTTP/1.1`.
    pub minor_version: u8,
    /// Bytes the head took, blank line included; what follows is body.
    pub len: usize,
    /// A `Connection` field names `close`: the server closes the connection after this response.
    pub close: bool,
}

/// How the body after a response head ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// No body whatever the fields say (1xx, 204, 304, or the answer to HEAD).
    Empty,
    /// Exactly this many bytes (`Content-Length`).
    Exact(u64),
    /// `Transfer-Encoding`: chunked (or another coding); ends where the coding says.
    Coded,
    /// Neither field: the body runs until the server closes the connection.
    UntilClose,
}

/// Why a response head is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("malformed response head: {0}")]
    Malformed(String),
    #[error("response head has more than {MAX_FIELDS} fields")]
    TooManyFields,
    #[error("response head field is not valid: {0}")]
    BadField(String),
    #[error("Content-Length values disagree or are not decimal")]
    BadLength,
}

pub use crate::wire::shared_value;

/// Parses the response head at the start of `buf`: `Ok(None)` while it is incomplete.
pub fn parse(buf: &[u8]) -> Result<Option<ResponseHead>, HeadError> {
    parse_with(buf, HeaderMap::with_capacity)
}

/// [`parse`], with the fields put in the empty map that `map` gives for room for a number of
/// fields (a map from a stock of emptied ones, say); asked for only once the head is complete.
pub fn parse_with(
    buf: &[u8],
    map: impl FnOnce(usize) -> HeaderMap,
) -> Result<Option<ResponseHead>, HeadError> {
    // Left uninitialised: the parser writes only the fields it finds (writing 100 empty ones
    // first was a sixth of this function's cost for an 8-field head).
    let mut fields =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
    let mut resp = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut resp,
        buf,
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyFields),
        Err(e) => return Err(HeadError::Malformed(e.to_string())),
    };
    let code = resp
        .code
        .ok_or_else(|| HeadError::Malformed("no status".into()))?;
    let status =
        StatusCode::from_u16(code).map_err(|_| HeadError::Malformed(format!("status {code}")))?;
    // Room for the fields a proxy adds on the way back (`Via`, `Alt-Svc`), without a rehash.
    let mut headers = map(resp.headers.len() + 2);
    let raw = Bytes::copy_from_slice(&buf[..len]);
    let mut close = false;
    for f in resp.headers.iter() {
        let name = crate::wire::field_name(f.name.as_bytes())
            .map_err(|_| HeadError::BadField(f.name.to_string()))?;
        // SAFETY: `raw` copies the head's bytes from `buf`, and `f.value` is httparse's output
        // for `buf`.
        let value = unsafe { shared_value(&raw, buf, f.value) }
            .map_err(|_| HeadError::BadField(f.name.to_string()))?;
        if name == header::CONNECTION {
            close |= names_close(f.value);
        }
        headers.append(name, value);
    }
    Ok(Some(ResponseHead {
        status,
        headers,
        minor_version: resp.version.unwrap_or(1),
        len,
        close,
    }))
}

/// Whether a `Connection` value lists `close` (a value with obs-text lists nothing).
fn names_close(value: &[u8]) -> bool {
    value.is_ascii()
        && value
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
}

impl ResponseHead {
    /// How the body ends (RFC 9112 §6.3), for a request of method HEAD when `head` is set.
    /// `Transfer-Encoding` wins over `Content-Length`; several lengths must agree.
    pub fn body_length(&self, head: bool) -> Result<BodyLength, HeadError> {
        let code = self.status.as_u16();
        if head || self.status.is_informational() || code == 204 || code == 304 {
            return Ok(BodyLength::Empty);
        }
        if self.headers.contains_key(header::TRANSFER_ENCODING) {
            return Ok(BodyLength::Coded);
        }
        let mut length = None;
        for value in self.headers.get_all(header::CONTENT_LENGTH) {
            // A field may itself be a list (`5, 5`), which RFC 9110 §8.6 allows when all agree.
            for part in value.as_bytes().split(|&b| b == b',') {
                let n = decimal(part.trim_ascii()).ok_or(HeadError::BadLength)?;
                if length.is_some_and(|l| l != n) {
                    return Err(HeadError::BadLength);
                }
                length = Some(n);
            }
        }
        Ok(match length {
            Some(n) => BodyLength::Exact(n),
            None => BodyLength::UntilClose,
        })
    }
}

/// A non-empty run of ASCII digits that fits a `u64` (leading zeros allowed), or `None`.
pub fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> ResponseHead {
        parse(text.as_bytes()).unwrap().unwrap()
    }

    #[test]
    fn complete_head_with_body_after_it() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello";
        let h = parse(raw).unwrap().unwrap();
        assert_eq!(h.status, StatusCode::OK);
        assert_eq!(h.len, raw.len() - 5);
        assert_eq!(h.headers["x-a"], "b");
        assert_eq!(h.minor_version, 1);
        assert_eq!(h.body_length(false), Ok(BodyLength::Exact(5)));
        assert_eq!(h.body_length(true), Ok(BodyLength::Empty));
    }

    #[test]
    fn partial_head_asks_for_more() {
        for cut in 0..30 {
            let raw = &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"[..cut];
            assert!(parse(raw).unwrap().is_none(), "cut at {cut}");
        }
    }

    #[test]
    fn framing_rules() {
        let te = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n");
        assert_eq!(te.body_length(false), Ok(BodyLength::Coded));
        let close = head("HTTP/1.0 200 OK\r\n\r\n");
        assert_eq!(close.minor_version, 0);
        assert_eq!(close.body_length(false), Ok(BodyLength::UntilClose));
        let same = head("HTTP/1.1 200 OK\r\nContent-Length: 7, 7\r\nContent-Length: 7\r\n\r\n");
        assert_eq!(same.body_length(false), Ok(BodyLength::Exact(7)));
        let differ = head("HTTP/1.1 200 OK\r\nContent-Length: 7\r\nContent-Length: 8\r\n\r\n");
        assert_eq!(differ.body_length(false), Err(HeadError::BadLength));
        for bad in ["+7", "-1", "0x10", "", "99999999999999999999999"] {
            let h = head(&format!("HTTP/1.1 200 OK\r\nContent-Length: {bad}\r\n\r\n"));
            assert_eq!(h.body_length(false), Err(HeadError::BadLength), "{bad:?}");
        }
        let no_content = head("HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n");
        assert_eq!(no_content.body_length(false), Ok(BodyLength::Empty));
        let not_modified = head("HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n");
        assert_eq!(not_modified.body_length(false), Ok(BodyLength::Empty));
    }

    #[test]
    fn garbage_and_too_many_fields_are_errors() {
        assert!(matches!(
            parse(b"SSH-2.0-OpenSSH\r\n\r\n"),
            Err(HeadError::Malformed(_))
        ));
        let mut many = String::from("HTTP/1.1 200 OK\r\n");
        for i in 0..=MAX_FIELDS {
            many.push_str(&format!("x-{i}: v\r\n"));
        }
        many.push_str("\r\n");
        assert_eq!(
            parse(many.as_bytes()).unwrap_err(),
            HeadError::TooManyFields
        );
    }

    #[test]
    fn connection_close_is_noticed() {
        assert!(!head("HTTP/1.1 200 OK\r\nConnection: keep-alive\r\n\r\n").close);
        assert!(head("HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\n\r\n").close);
        assert!(head("HTTP/1.1 200 OK\r\nX: y\r\nconnection:  close \r\n\r\n").close);
        assert!(!head("HTTP/1.1 200 OK\r\nX-Connection: close\r\n\r\n").close);
        assert!(!head("HTTP/1.1 200 OK\r\nConnection: closed\r\n\r\n").close);
    }

    /// The length rules as first written (text, `split`, `trim`, `str::parse`), which the byte
    /// version must agree with.
    fn reference_length(h: &ResponseHead) -> Result<Option<u64>, HeadError> {
        let mut length = None;
        for value in h.headers.get_all(header::CONTENT_LENGTH) {
            for part in value.to_str().map_err(|_| HeadError::BadLength)?.split(',') {
                let part = part.trim();
                if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(HeadError::BadLength);
                }
                let n: u64 = part.parse().map_err(|_| HeadError::BadLength)?;
                if length.is_some_and(|l| l != n) {
                    return Err(HeadError::BadLength);
                }
                length = Some(n);
            }
        }
        Ok(length)
    }

    /// The `close` rule as first written (`to_str`, `split`, `trim`) on the parsed map.
    fn reference_close(h: &ResponseHead) -> bool {
        h.headers.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
        })
    }

    proptest::proptest! {
        /// Lengths and `Connection` values of every shape read as the text-based rules read them.
        #[test]
        fn lengths_and_close_agree_with_the_text_rules(
            lengths in proptest::collection::vec("[0-9 ,+\t-]{0,24}|9{19,21}|[0-9]{1,3}\u{e9}", 0..3),
            connections in proptest::collection::vec("[a-zA-Z ,\t-]{0,16}|close\u{e9}", 0..3),
        ) {
            let mut text = String::from("HTTP/1.1 200 OK\r\n");
            for l in &lengths {
                text.push_str(&format!("Content-Length: {l}\r\n"));
            }
            for c in &connections {
                text.push_str(&format!("Connection: {c}\r\n"));
            }
            text.push_str("\r\n");
            if let Ok(Some(h)) = parse(text.as_bytes()) {
                let want = match reference_length(&h) {
                    Ok(Some(n)) => Ok(BodyLength::Exact(n)),
                    Ok(None) => Ok(BodyLength::UntilClose),
                    Err(e) => Err(e),
                };
                proptest::prop_assert_eq!(h.body_length(false), want);
                proptest::prop_assert_eq!(h.close, reference_close(&h));
            }
        }

        #[test]
        fn never_panics_and_len_is_in_bounds(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            if let Ok(Some(h)) = parse(&data) {
                proptest::prop_assert!(h.len <= data.len());
                let _ = h.body_length(false);
            }
        }
    }
}
