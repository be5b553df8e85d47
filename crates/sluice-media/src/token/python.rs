//! Python's text forms of JSON values (`json.dumps`, `str()`, `quote`), so tokens and URLs match MediaFlow byte for byte.
//!
//! MediaFlow serialises token payloads with `json.dumps(dict)` and query strings with
//! `urlencode(dict)`. Both spellings are observable (a token is only byte-identical if the JSON is),
//! so they are reproduced here rather than approximated with `serde_json`'s compact output.

use serde_json::{Number, Value};

/// `json.dumps(obj)` with Python's defaults: `", "` and `": "` separators, ASCII-only output,
/// keys in the given order.
pub(crate) fn dumps_object(entries: &[(String, Value)]) -> String {
    let mut out = String::with_capacity(64 * entries.len().max(1));
    out.push('{');
    for (i, (key, value)) in entries.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        dumps_str(key, &mut out);
        out.push_str(": ");
        dumps(value, &mut out);
    }
    out.push('}');
    out
}

fn dumps(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => push_number(n, out),
        Value::String(s) => dumps_str(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                dumps(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let entries: Vec<(String, Value)> =
                map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            out.push_str(&dumps_object(&entries));
        }
    }
}

/// Python escapes everything outside printable ASCII, as `\uXXXX` with lowercase hex and
/// surrogate pairs above the BMP (`ensure_ascii=True`).
fn dumps_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}

fn push_number(n: &Number, out: &mut String) {
    if n.is_f64() {
        out.push_str(&float_repr(n.as_f64().unwrap_or(0.0)));
    } else {
        out.push_str(&n.to_string());
    }
}

/// Python's `repr(float)`: shortest round-trip digits, positional notation for decimal exponents
/// in `-4..16`, scientific (`1e+16`, `1.5e-05`) outside, and a trailing `.0` on integral values.
pub(crate) fn float_repr(x: f64) -> String {
    if !x.is_finite() {
        // JSON cannot carry these; Python would write `Infinity`/`NaN`.
        let word = if x.is_nan() {
            "NaN"
        } else if x > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        };
        return word.to_owned();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits as Python's repr.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if !(-4..16).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{exp_sign}{:02}", exp.abs());
    }
    let point = exp + 1; // digits before the decimal point
    let body = if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
    } else {
        let (int, frac) = digits.split_at(point as usize);
        format!("{int}.{frac}")
    };
    format!("{sign}{body}")
}

/// Python's `str(value)`, which `urlencode` applies to every non-string value and MediaFlow's
/// token middleware applies when it merges token claims into the query string.
pub(crate) fn to_str(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => {
            let mut out = String::new();
            repr(other, &mut out);
            out
        }
    }
}

/// Python's `repr()` of the value Python's `json.loads` would build. Strings inside containers
/// follow the common cases of Python's quoting rule (non-ASCII printable text is kept as is).
fn repr(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => push_number(n, out),
        Value::String(s) => repr_str(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr_str(k, out);
                out.push_str(": ");
                repr(v, out);
            }
            out.push('}');
        }
    }
}

fn repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..=0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `quote(s, safe)`: UTF-8, uppercase hex, letters, digits and `_.-~` never escaped.
pub(crate) fn quote(s: &str, safe: &[u8]) -> String {
    escape(s, safe, false)
}

/// Python's `quote_plus(s)`: like `quote` with nothing extra safe, and spaces as `+`.
pub(crate) fn quote_plus(s: &str) -> String {
    escape(s, b"", true)
}

fn escape(s: &str, safe: &[u8], space_as_plus: bool) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || b"_.-~".contains(&b) || safe.contains(&b) {
            out.push(b as char);
        } else if b == b' ' && space_as_plus {
            out.push('+');
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xf)] as char);
        }
    }
    out
}

/// Python's `urlencode(dict)` (no `doseq`): `quote_plus` on keys and on `str()` of values.
pub(crate) fn urlencode(entries: &[(String, Value)]) -> String {
    let pairs: Vec<String> = entries
        .iter()
        .map(|(k, v)| format!("{}={}", quote_plus(k), quote_plus(&to_str(v))))
        .collect();
    pairs.join("&")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dumps_matches_python_spelling() {
        let entries = vec![
            ("a".to_string(), json!("é\u{7f}\n😀")),
            ("b".to_string(), json!(1e16)),
            ("c".to_string(), json!(1e-5)),
            ("d".to_string(), json!(true)),
            ("e".to_string(), Value::Null),
            ("f".to_string(), json!(0.1)),
        ];
        assert_eq!(
            dumps_object(&entries),
            r#"{"a": "\u00e9\u007f\n\ud83d\ude00", "b": 1e+16, "c": 1e-05, "d": true, "e": null, "f": 0.1}"#
        );
    }

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.5, "1.5"),
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (0.0001, "0.0001"),
            (1.5e-5, "1.5e-05"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (1e300, "1e+300"),
            (-2.5, "-2.5"),
        ];
        for (x, want) in cases {
            assert_eq!(float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn urlencode_matches_python() {
        let entries = vec![
            ("a".to_string(), json!(true)),
            ("b".to_string(), json!([1, "x"])),
            ("c".to_string(), json!({"k": "v"})),
            ("d".to_string(), Value::Null),
            ("e".to_string(), json!(1.5)),
            ("f g".to_string(), json!("https://x/y?z=1&w=é ~")),
        ];
        assert_eq!(
            urlencode(&entries),
            "a=True&b=%5B1%2C+%27x%27%5D&c=%7B%27k%27%3A+%27v%27%7D&d=None&e=1.5\
             &f+g=https%3A%2F%2Fx%2Fy%3Fz%3D1%26w%3D%C3%A9+~"
        );
    }

    #[test]
    fn quote_keeps_slash_when_safe() {
        assert_eq!(quote("a b/ç.mkv", b"/"), "a%20b/%C3%A7.mkv");
    }
}
