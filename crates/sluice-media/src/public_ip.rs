//! Answers of "what is my IP" echo services (ipify, ipinfo, httpbin and the like) parsed into an
//! address. No I/O.
//!
//! Two shapes exist: the address as plain text (`203.0.113.7\n`), and a JSON object with the
//! address in a named top-level field (`{"ip": "..."}`, httpbin's `{"origin": "a, b"}` where a
//! proxy chain lists several and the first is the caller).

use std::net::IpAddr;

/// Largest answer looked at; an echo answer is a few hundred bytes.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Why an echo answer gave no address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EchoError {
    #[error("answer is larger than {MAX_ANSWER_BYTES} bytes")]
    TooLarge,
    #[error("answer is not UTF-8 text")]
    NotText,
    #[error("answer is not a JSON object")]
    NotJson,
    #[error("JSON answer has no string field `{0}`")]
    NoField(String),
    #[error("`{0}` is not an IP address")]
    NotAnAddress(String),
}

/// Parses an echo answer. `field` names the JSON field holding the address; `None` (or empty)
/// means the body is the address as text.
pub fn parse_answer(body: &[u8], field: Option<&str>) -> Result<IpAddr, EchoError> {
    if body.len() > MAX_ANSWER_BYTES {
        return Err(EchoError::TooLarge);
    }
    let text = std::str::from_utf8(body).map_err(|_| EchoError::NotText)?;
    let raw = match field.filter(|f| !f.is_empty()) {
        None => text.to_string(),
        Some(field) => {
            let value: serde_json::Value =
                serde_json::from_str(text).map_err(|_| EchoError::NotJson)?;
            let object = value.as_object().ok_or(EchoError::NotJson)?;
            object
                .get(field)
                .and_then(|v| v.as_str())
                .ok_or_else(|| EchoError::NoField(field.to_string()))?
                .to_string()
        }
    };
    let first = raw.split(',').next().unwrap_or("").trim();
    first
        .parse::<IpAddr>()
        .map_err(|_| EchoError::NotAnAddress(first.chars().take(64).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_services_use() {
        let v4: IpAddr = "203.0.113.7".parse().unwrap();
        assert_eq!(parse_answer(b"203.0.113.7\n", None), Ok(v4));
        assert_eq!(parse_answer(b"  203.0.113.7 ", Some("")), Ok(v4));
        assert_eq!(
            parse_answer(br#"{"ip":"203.0.113.7","city":"x"}"#, Some("ip")),
            Ok(v4)
        );
        assert_eq!(
            parse_answer(
                br#"{"origin": "203.0.113.7, 198.51.100.1"}"#,
                Some("origin")
            ),
            Ok(v4)
        );
        assert_eq!(
            parse_answer(b"2001:db8::1", None),
            Ok("2001:db8::1".parse().unwrap())
        );
    }

    #[test]
    fn refusals_say_why() {
        assert_eq!(
            parse_answer(b"<html>blocked</html>", None),
            Err(EchoError::NotAnAddress("<html>blocked</html>".into()))
        );
        assert_eq!(
            parse_answer(b"1.2.3.4", Some("ip")),
            Err(EchoError::NotJson)
        );
        assert_eq!(parse_answer(b"[1]", Some("ip")), Err(EchoError::NotJson));
        assert_eq!(
            parse_answer(br#"{"ip": 5}"#, Some("ip")),
            Err(EchoError::NoField("ip".into()))
        );
        assert_eq!(parse_answer(&[0xff, 0xfe], None), Err(EchoError::NotText));
        assert_eq!(
            parse_answer(&vec![b' '; MAX_ANSWER_BYTES + 1], None),
            Err(EchoError::TooLarge)
        );
        assert!(parse_answer(b"", None).is_err());
    }
}
