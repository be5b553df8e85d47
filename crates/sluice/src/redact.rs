//! Masking secrets before they reach a log line or a printed config (a leaf: every module may use it).

/// Replaces the password of `scheme://user:pass@host` with stars; anything else comes back as
/// it was given (no normalisation: what is printed is what the operator wrote).
pub fn mask_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..end].rfind('@') else {
        return url.to_string();
    };
    match rest[..at].split_once(':') {
        Some((user, password)) if !password.is_empty() => {
            format!("{scheme}://{user}:****{}", &rest[at..])
        }
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
            ("http://proxy/a?u=x:y@z", "http://proxy/a?u=x:y@z"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(super::mask_userinfo(given), want, "{given}");
        }
    }
}
