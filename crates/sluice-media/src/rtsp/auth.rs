//! RTSP authentication: the `WWW-Authenticate` challenges of a 401 and the `Authorization`
//! value that answers them (Basic, and Digest with MD5 or MD5-sess, with or without
//! `qop=auth`, RFC 2617 as RTSP servers deploy it).

use base64::Engine;
use md5::{Digest, Md5};

/// A challenge the client can answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Digest(DigestChallenge),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestChallenge {
    pub realm: String,
    pub nonce: String,
    pub opaque: Option<String>,
    /// `MD5-sess` rather than `MD5`.
    pub session: bool,
    /// The server offered `qop=auth`.
    pub qop_auth: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no Basic or Digest (MD5) challenge in the 401 answer")]
    NoUsableChallenge,
}

/// Picks the strongest usable challenge among a 401's `WWW-Authenticate` values: Digest
/// before Basic, so a password is never sent in clear when the server can do better.
pub fn choose<'a>(values: impl IntoIterator<Item = &'a str>) -> Result<Challenge, AuthError> {
    let mut basic = false;
    for v in values {
        let v = v.trim();
        let (scheme, rest) = v.split_once(' ').unwrap_or((v, ""));
        if scheme.eq_ignore_ascii_case("Digest") {
            if let Some(d) = digest_challenge(rest) {
                return Ok(Challenge::Digest(d));
            }
        } else if scheme.eq_ignore_ascii_case("Basic") {
            basic = true;
        }
    }
    if basic {
        Ok(Challenge::Basic)
    } else {
        Err(AuthError::NoUsableChallenge)
    }
}

fn digest_challenge(params: &str) -> Option<DigestChallenge> {
    let mut d = DigestChallenge {
        realm: String::new(),
        nonce: String::new(),
        opaque: None,
        session: false,
        qop_auth: false,
    };
    let mut has_nonce = false;
    for (k, v) in auth_params(params) {
        match k.to_ascii_lowercase().as_str() {
            "realm" => d.realm = v,
            "nonce" => {
                d.nonce = v;
                has_nonce = true;
            }
            "opaque" => d.opaque = Some(v),
            "algorithm" => match v.to_ascii_uppercase().as_str() {
                "MD5" => {}
                "MD5-SESS" => d.session = true,
                _ => return None,
            },
            "qop" => d.qop_auth = v.split(',').any(|q| q.trim().eq_ignore_ascii_case("auth")),
            _ => {}
        }
    }
    has_nonce.then_some(d)
}

/// `k=v, k="quoted, with commas"` pairs; backslash escapes inside quotes.
fn auth_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c == ',' {
                break;
            }
            key.push(c);
            chars.next();
        }
        if key.is_empty() && chars.peek().is_none() {
            return out;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'=') {
            chars.next();
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
            if chars.peek() == Some(&'"') {
                chars.next();
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => value.extend(chars.next()),
                        c => value.push(c),
                    }
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == ',' {
                        break;
                    }
                    value.push(c);
                    chars.next();
                }
            }
        }
        let key = key.trim().to_string();
        if !key.is_empty() {
            out.push((key, value.trim().to_string()));
        }
        if chars.peek().is_none() {
            return out;
        }
    }
}

/// The request a Digest answer is computed for, and the client's per-answer values.
#[derive(Debug, Clone, Copy)]
pub struct DigestInput<'a> {
    pub method: &'a str,
    pub uri: &'a str,
    /// Request counter for this nonce (starts at 1).
    pub nc: u32,
    /// Client nonce: random, hex or base64 (any token without quotes).
    pub cnonce: &'a str,
}

/// The `Authorization` header value answering `challenge`.
pub fn authorization(
    challenge: &Challenge,
    user: &str,
    password: &str,
    input: DigestInput<'_>,
) -> String {
    match challenge {
        Challenge::Basic => {
            let raw = format!("{user}:{password}");
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(raw)
            )
        }
        Challenge::Digest(d) => digest_authorization(d, user, password, input),
    }
}

fn digest_authorization(
    d: &DigestChallenge,
    user: &str,
    password: &str,
    i: DigestInput<'_>,
) -> String {
    let mut ha1 = md5_hex(&format!("{user}:{}:{password}", d.realm));
    if d.session {
        ha1 = md5_hex(&format!("{ha1}:{}:{}", d.nonce, i.cnonce));
    }
    let ha2 = md5_hex(&format!("{}:{}", i.method, i.uri));
    let nc = format!("{:08x}", i.nc);
    let response = if d.qop_auth {
        md5_hex(&format!("{ha1}:{}:{nc}:{}:auth:{ha2}", d.nonce, i.cnonce))
    } else {
        md5_hex(&format!("{ha1}:{}:{ha2}", d.nonce))
    };
    let mut out = format!(
        "Digest username=\"{}\", realm=\"{}\", nonce=\"{}\", uri=\"{}\", response=\"{response}\"",
        quote(user),
        quote(&d.realm),
        quote(&d.nonce),
        quote(i.uri)
    );
    if d.session {
        out.push_str(", algorithm=MD5-sess");
    }
    if d.qop_auth {
        out.push_str(&format!(
            ", qop=auth, nc={nc}, cnonce=\"{}\"",
            quote(i.cnonce)
        ));
    }
    if let Some(o) = &d.opaque {
        out.push_str(&format!(", opaque=\"{}\"", quote(o)));
    }
    out
}

fn quote(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

fn md5_hex(s: &str) -> String {
    let digest = Md5::digest(s.as_bytes());
    let mut out = String::with_capacity(32);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefers_digest_and_parses_quotes() {
        let c = choose([
            "Basic realm=\"IPTV\"",
            "Digest realm=\"IP, TV\", nonce=\"abc\\\"d\", qop=\"auth,auth-int\", opaque=o1",
        ])
        .unwrap();
        let Challenge::Digest(d) = c else { panic!() };
        assert_eq!(d.realm, "IP, TV");
        assert_eq!(d.nonce, "abc\"d");
        assert!(d.qop_auth);
        assert_eq!(d.opaque.as_deref(), Some("o1"));
        assert_eq!(choose(["Basic realm=x"]).unwrap(), Challenge::Basic);
        assert_eq!(
            choose(["Digest realm=x, nonce=n, algorithm=SHA-256", "Bearer x"]),
            Err(AuthError::NoUsableChallenge)
        );
    }

    /// RFC 2617 §3.5's worked example (qop=auth), recomputed for method GET.
    #[test]
    fn rfc2617_example() {
        let c = choose(["Digest realm=\"testrealm@host.com\", qop=\"auth,auth-int\", nonce=\"dcd98b7102dd2f0e8b11d0f600bfb0c093\", opaque=\"5ccc069c403ebaf9f0171e9517f40e41\""]).unwrap();
        let input = DigestInput {
            method: "GET",
            uri: "/dir/index.html",
            nc: 1,
            cnonce: "0a4f113b",
        };
        let v = authorization(&c, "Mufasa", "Circle Of Life", input);
        assert!(
            v.contains("response=\"6629fae49393a05397450978507c4ef1\""),
            "{v}"
        );
        assert!(v.contains("nc=00000001, cnonce=\"0a4f113b\""), "{v}");
        assert!(
            v.ends_with("opaque=\"5ccc069c403ebaf9f0171e9517f40e41\""),
            "{v}"
        );
    }

    #[test]
    fn digest_without_qop_and_basic() {
        let c = choose(["Digest realm=\"r\", nonce=\"n\""]).unwrap();
        let input = DigestInput {
            method: "DESCRIBE",
            uri: "rtsp://h/x",
            nc: 1,
            cnonce: "c",
        };
        let v = authorization(&c, "u", "p", input);
        let ha1 = md5_hex("u:r:p");
        let ha2 = md5_hex("DESCRIBE:rtsp://h/x");
        assert!(v.contains(&format!(
            "response=\"{}\"",
            md5_hex(&format!("{ha1}:n:{ha2}"))
        )));
        assert!(!v.contains("qop"));
        assert_eq!(
            authorization(&Challenge::Basic, "Aladdin", "open sesame", input),
            "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
    }
}
