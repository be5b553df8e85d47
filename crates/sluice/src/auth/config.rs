//! `[auth]`: who may use the proxy (the password, trusted proxies, tokens), with its defaults.

use serde::Serialize;

use crate::section::config_section;

/// Who may use the proxy.
#[derive(Debug, Clone, Serialize)]
pub struct AuthConfig {
    /// Shared secret (`api_password` query parameter or header). Empty: no auth, loopback listeners only.
    pub api_password: String,
    /// Peers (IPs or CIDRs) whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Accept MediaFlow-format tokens (from `/generate_url` or MediaFlow's own generators) when their
    /// claims carry the password.
    pub accept_mediaflow_tokens: bool,
    /// Seconds a minted child token (a rewritten manifest's child URL) stays valid, unless the parent
    /// token expires sooner.
    pub child_token_ttl_secs: u64,
    /// Seal new tokens under the legacy key (HKDF of the bare password) instead of the Argon2id
    /// one, so that nodes of a version before Argon2id that share the password open them. Both
    /// keys open tokens either way. On only while such nodes run (a rolling upgrade, a
    /// rollback): a token sealed so is a fast offline test of password guesses
    /// (docs/decisions/sealed-token-kdf.md).
    pub seal_with_legacy_key: bool,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            api_password: String::new(),
            trusted_proxies: Vec::new(),
            accept_mediaflow_tokens: true,
            // Long enough for a feature film paused for lunch: VOD players fetch the media
            // playlist once and then only its children.
            child_token_ttl_secs: 12 * 3600,
            // New installs seal with the strong key only.
            seal_with_legacy_key: false,
        }
    }
}

config_section!(AuthConfig {
    api_password,
    trusted_proxies,
    accept_mediaflow_tokens,
    child_token_ttl_secs,
    seal_with_legacy_key,
});
