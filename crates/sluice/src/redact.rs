//! Masking secrets before they reach a log line or a printed config (a leaf: every module may use it).

/// Replaces the password of `scheme://user:pass@host` with stars; anything else comes back as
/// it was given (no normalisation: what is printed is what the operator wrote).
///
/// A mistyped URL must not print its password either: one without a scheme
/// (`user:pass@host:port`), or with an unencoded `/`, `?` or `#` in the password, has no
/// user info a parser would find, so when the strict reading finds none but an `@` follows a
/// `:`, everything before the last `@` is starred. That may hide a harmless `@` in a query,
/// never a secret.
pub fn mask_userinfo(url: &str) -> String {
    let (prefix, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (&url[..scheme.len() + 3], rest),
        None => ("", url),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    if let Some(at) = rest[..end].rfind('@') {
        return match rest[..at].split_once(':') {
            Some((user, password)) if !password.is_empty() => {
                format!("{prefix}{user}:****{}", &rest[at..])
            }
            _ => url.to_string(),
        };
    }
    match rest.rfind('@') {
        Some(at) if rest[..at].contains(':') => format!("{prefix}****{}", &rest[at..]),
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn masks_only_the_password() {
        for (given, want) in [
            (
                "http://user:secret@proxy:3128",
                "http://user:****@proxy:3128",
            ),
            (
                "socks5h://me:p%40ss:w@[::1]:1080/x?y=@z",
                "socks5h://me:****@[::1]:1080/x?y=@z",
            ),
            ("socks5://proxy:1080", "socks5://proxy:1080"),
            ("socks5://user@proxy:1080", "socks5://user@proxy:1080"),
            // Mistyped: no scheme, or `/`, `?`, `#` unencoded in the password.
            ("user:secret@10.0.0.1:3128", "user:****@10.0.0.1:3128"),
            ("http://user:pa/ss@proxy:3128", "http://****@proxy:3128"),
            ("http://u:p?ss@h:1", "http://****@h:1"),
            ("http://u:p#ss@h:1", "http://****@h:1"),
            // An `@` after a `:` in a query is starred too: safe, if over-cautious.
            ("http://proxy/a?u=x:y@z", "http://****@z"),
            ("http://proxy/a?u=x@z", "http://proxy/a?u=x@z"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(super::mask_userinfo(given), want, "{given}");
        }
    }
}
