//! Masking secrets before they reach a log line or a printed config (a leaf: every module may use it).

/// Replaces the password of `scheme://user:pass@host` with stars.
pub fn mask_userinfo(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("****"));
            parsed.to_string()
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn masks_only_the_password() {
        assert_eq!(
            super::mask_userinfo("http://user:secret@proxy:3128"),
            "http://user:****@proxy:3128/"
        );
        assert_eq!(
            super::mask_userinfo("socks5://proxy:1080"),
            "socks5://proxy:1080"
        );
    }
}
