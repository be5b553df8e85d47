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

/// `url` with its user info's password and every query value starred: a provider's playlist or
/// EPG address commonly carries `username=…&password=…` in its query, and an `ask` URL a key.
/// Names are kept, so the printed config still says what the URL asks for.
pub fn mask_url(url: &str) -> String {
    let url = mask_userinfo(url);
    let Some((base, rest)) = url.split_once('?') else {
        return url;
    };
    let (query, fragment) = match rest.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (rest, None),
    };
    let starred: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) if !value.is_empty() => format!("{name}=****"),
            _ => pair.to_string(),
        })
        .collect();
    let mut out = format!("{base}?{}", starred.join("&"));
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

/// Whether a header named `name` carries a credential by its name (`Authorization`, a cookie,
/// an API key or token), so a printed config stars its value.
pub fn is_secret_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    matches!(
        name.as_str(),
        "authorization" | "proxy-authorization" | "cookie" | "set-cookie"
    ) || ["auth", "token", "key", "secret", "password", "session"]
        .iter()
        .any(|w| name.contains(w))
}

#[cfg(test)]
mod tests {
    #[test]
    fn masks_query_values_and_secret_headers() {
        for (given, want) in [
            (
                "http://u:p@iptv.example/get.php?username=me&password=pw&type=m3u_plus",
                "http://u:****@iptv.example/get.php?username=****&password=****&type=****",
            ),
            (
                "https://ask.example/check?domain=",
                "https://ask.example/check?domain=",
            ),
            ("https://ask.example/check#x", "https://ask.example/check#x"),
            ("http://h/x?k=v#frag", "http://h/x?k=****#frag"),
            ("http://h/x?flag&k=v", "http://h/x?flag&k=****"),
        ] {
            assert_eq!(super::mask_url(given), want, "{given}");
        }
        for name in ["Authorization", "X-Api-Key", "x-auth-token", "Cookie"] {
            assert!(super::is_secret_header(name), "{name}");
        }
        for name in ["X-Forwarded-Proto", "Cache-Control", "X-Served-By"] {
            assert!(!super::is_secret_header(name), "{name}");
        }
    }

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
