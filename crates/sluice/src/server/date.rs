//! Today's `Date` field value (RFC 9110 section 6.6.1), formatted once a second per thread: as text
//! for the heads the fast paths write, and as a field value for the HTTP/2 responses sluice dates
//! itself (hyper's own dating is off there; see `docs/decisions/tls-cost.md`).

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

use http::HeaderValue;

/// The second it was formatted for, its text and that text as a field value.
struct Today {
    secs: u64,
    text: String,
    value: HeaderValue,
}

thread_local! {
    static TODAY: RefCell<Option<Today>> = const { RefCell::new(None) };
}

/// Calls `f` with today's `Date` value as text.
pub fn with_text<R>(f: impl FnOnce(&str) -> R) -> R {
    with_today(|t| f(&t.text))
}

/// Today's `Date` value as a field value (a reference-counted copy of this second's).
pub fn value() -> HeaderValue {
    with_today(|t| t.value.clone())
}

fn with_today<R>(f: impl FnOnce(&Today) -> R) -> R {
    let now = SystemTime::now();
    let secs = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    TODAY.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.as_ref().is_none_or(|t| t.secs != secs) {
            let text = httpdate::fmt_http_date(now);
            let value = HeaderValue::from_str(&text).expect("an HTTP date is a field value");
            *cell = Some(Today { secs, text, value });
        }
        f(cell.as_ref().expect("set above"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_value_agree_and_parse_as_now() {
        // Read within one second (a tick between the two reads is retried once).
        let (text, value) = (0..2)
            .map(|_| (with_text(str::to_string), value()))
            .find(|(t, v)| t.as_bytes() == v.as_bytes())
            .expect("the text and the value agree within a second");
        let parsed = httpdate::parse_http_date(value.to_str().unwrap()).unwrap();
        let age = SystemTime::now().duration_since(parsed).unwrap_or_default();
        assert!(age.as_secs() <= 1, "{text}");
        assert!(text.ends_with(" GMT") && text.len() == 29, "{text}");
    }
}
