//! The token gate: opens sealed and MediaFlow tokens into one scope, enforces where and how a token
//! may be used, mints sealed child tokens, and answers every refusal the same way.

use std::net::IpAddr;

use http::{header, HeaderValue, Response, StatusCode};
use sha2::{Digest, Sha256};
use sluice_media::query::Query;
use sluice_media::token::sealed::{self, Grant, SealedError, SealedKey};
use sluice_media::token::{TokenError, TokenKey};
use subtle::ConstantTimeEq;

use super::AuthConfig;
use crate::body::{self, Body};

/// Params a holder of a sealed token may add to the request; everything else the token fixes.
/// Only LL-HLS delivery directives, which players append to media playlist URLs by themselves and
/// which cannot change what is fetched from where.
pub const ADDABLE_PARAMS: [&str; 3] = ["_HLS_msn", "_HLS_part", "_HLS_skip"];

/// Params a sealed token's holder may add on `/rtsp/` paths: the catch-up range a player fills
/// into a playlist's `catchup-source` (the channel itself stays the token's path). The value of
/// `r2h-seek-name` may not name a param the token fixes, and a token that fixes the catch-up
/// itself (`playseek`, `tvdr`, `r2h-start` or `r2h-seek-name`: a programme, as `/generate_url`
/// can seal one) takes none of these, so `r2h-seek-offset` or `r2h-seek-mode` cannot shift the
/// fixed time or move it out of the URL (`scoped_query`).
pub const CATCHUP_PARAMS: [&str; 6] = [
    "playseek",
    "tvdr",
    "r2h-seek-name",
    "r2h-seek-offset",
    "r2h-seek-mode",
    "r2h-start",
];

/// Whether a sealed token's holder may add `name` on an `/rtsp/` path: one of
/// [`CATCHUP_PARAMS`] or a name the operator configured in `iptv.rtsp.seek_params`. The
/// playlist leaves these out of an entry's token for the same reason: a player fills them in.
pub fn is_catchup_param(name: &str, seek_params: &[String]) -> bool {
    CATCHUP_PARAMS.contains(&name) || seek_params.iter().any(|p| p == name)
}

/// Path prefixes an IPTV playlist entry token opens.
pub const CHANNEL_SCOPE: [&str; 3] = ["/rtp/", "/udp/", "/rtsp/"];

/// Starts a scope entry that opens its path alone (see [`exact_scope`]). No path starts with it,
/// so a node that predates it opens nothing with such an entry.
const EXACT: char = '=';

/// The scope entry that opens `path` and nothing else: not the paths below it (`/rtsp/h/live`
/// would open `/rtsp/h/live/other` as a plain entry), nor, for a path ending in `/`, the whole
/// family under it (`/rtsp/h/` or `/udp/`). A playlist entry is sealed to its own URL this way.
pub fn exact_scope(path: &str) -> String {
    format!("{EXACT}{path}")
}

pub use crate::request::TokenScope;

/// A token that opened: what it grants and the params the request is served with.
#[derive(Clone)]
pub struct Opened {
    pub scope: TokenScope,
    pub params: Vec<(String, String)>,
    /// A MediaFlow token's claims as it decrypted (password included), kept so nothing after
    /// the open decrypts it again (its in-flight share keys on them); `None` for a sealed token.
    pub claims: Option<sluice_media::token::TokenClaims>,
}

/// Without the claims, which hold the password.
impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("scope", &self.scope)
            .field("params", &self.params)
            .field("claims", &self.claims.as_ref().map(|_| "(hidden)"))
            .finish()
    }
}

/// Why a token was refused. Logged at debug level only; the client always gets [`refusal`].
#[derive(Debug, thiserror::Error)]
pub enum TokenRefusal {
    #[error("sealed token: {0}")]
    Sealed(SealedError),
    #[error("MediaFlow token: {0}")]
    MediaFlow(TokenError),
    #[error("MediaFlow tokens are turned off (auth.accept_mediaflow_tokens)")]
    MediaFlowOff,
    #[error("MediaFlow token does not carry the password")]
    NoPassword,
    #[error("no server password, so no token can be valid")]
    NoKey,
    #[error("token has expired")]
    Expired,
    #[error("token is bound to another client address")]
    WrongAddress,
    #[error("token does not open this path")]
    OutOfScope,
    #[error("token holder may not set `{0}`")]
    Override(String),
    #[error("path after the token is not normal (a dot or empty segment)")]
    UnnormalPath,
}

impl TokenRefusal {
    /// Whether the refusal says the token was made under another password: a sealed token whose
    /// tag does not verify (under the key or the legacy one, an HKDF of the bare password), or a
    /// MediaFlow token that does not decrypt to JSON claims carrying this server's password (its
    /// key is the password, padded, without a MAC). Each tested one guessed password, so it is
    /// charged to the client's network as a wrong password is (`auth::guesses`). Not so a token
    /// this server made or that proved the password (expired, bound to another address, used
    /// outside its scope or overridden), nor one that tested no password (not base64, too short
    /// or long, MediaFlow tokens off, no server password, a path that is not normal).
    pub fn is_guess(&self) -> bool {
        match self {
            TokenRefusal::Sealed(e) => *e == SealedError::Authentication,
            TokenRefusal::MediaFlow(e) => matches!(
                e,
                TokenError::Padding | TokenError::Json | TokenError::Claim(_)
            ),
            TokenRefusal::NoPassword => true,
            TokenRefusal::MediaFlowOff
            | TokenRefusal::NoKey
            | TokenRefusal::Expired
            | TokenRefusal::WrongAddress
            | TokenRefusal::OutOfScope
            | TokenRefusal::Override(_)
            | TokenRefusal::UnnormalPath => false,
        }
    }
}

/// Opens and mints tokens for one server password.
#[derive(Debug, Clone)]
pub struct TokenGate {
    sealed: SealedKey,
    /// `None` when MediaFlow tokens are turned off.
    mediaflow: Option<TokenKey>,
    digest: [u8; 32],
    child_ttl: u64,
    /// Child tokens reused across manifest reloads (`auth::reuse`); starts empty with each
    /// password, sealing key or child lifetime (`TokenGate::reloaded`).
    reuse: std::sync::Arc<super::reuse::Reuse>,
    /// Derives playlist entries' nonces ([`TokenGate::mint_entry`]); a new one with each
    /// password (`TokenGate::reloaded`).
    entry_nonces: EntryNonces,
}

/// The secret a playlist entry's nonce is derived under (HMAC-SHA256, [`EntryNonces::of`]):
/// random, drawn once per password and process, never written anywhere.
#[derive(Clone)]
struct EntryNonces([u8; 32]);

/// Without the secret.
impl std::fmt::Debug for EntryNonces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EntryNonces(..)")
    }
}

/// Domain tag in front of every entry nonce's input: nothing else hashed under the secret can
/// come out the same.
const ENTRY_NONCE_CONTEXT: &[u8] = b"sluice playlist entry nonce v1";

impl EntryNonces {
    fn random() -> Self {
        let mut secret = [0u8; 32];
        // The OS generator failing is not recoverable: a fixed secret would make every nonce
        // guessable (though never reused for two plaintexts).
        getrandom::getrandom(&mut secret).expect("operating system random generator");
        EntryNonces(secret)
    }

    /// The nonce `grant` is sealed under for client network `net` (an IPv4 address, an IPv6
    /// /64, never the unspecified address): HMAC-SHA256 under the secret of the domain tag, the
    /// grant's serialized form (the exact plaintext [`SealedKey::seal`] encrypts, its length in
    /// front) and the network (its family, then its octets), cut to [`sealed::NONCE_LEN`].
    ///
    /// Why a derived nonce is safe (the SIV construction, RFC 5297's argument): XChaCha20-Poly1305
    /// breaks only when one key seals two *different* plaintexts under one nonce (the keystream
    /// and the Poly1305 key repeat). Here the nonce is a pseudo-random function of the plaintext
    /// (and the network): two different plaintexts get the same nonce only by a collision of
    /// 192-bit PRF outputs, as unlikely as two random nonces colliding, which the random nonces
    /// of every other token already accept. The same plaintext under the same nonce is the same
    /// ciphertext, which tells an observer only that two tokens are one (their text is equal
    /// anyway). A nonce colliding with a random one (children, links) is the same 2^-192 chance.
    /// The secret is unknown outside the process, so a nonce tells nothing of the grant, and no
    /// one outside can predict another network's token.
    fn of(&self, grant: &Grant, net: IpAddr) -> [u8; sealed::NONCE_LEN] {
        // Serialising a struct of strings and integers cannot fail (as in `SealedKey::seal`).
        let plain = serde_json::to_vec(grant).unwrap_or_default();
        let (family, octets): (u8, Vec<u8>) = match net {
            IpAddr::V4(v4) => (4, v4.octets().to_vec()),
            IpAddr::V6(v6) => (6, v6.octets().to_vec()),
        };
        let mac = hmac_sha256(
            &self.0,
            &[
                ENTRY_NONCE_CONTEXT,
                &(plain.len() as u64).to_be_bytes(),
                &plain,
                &[family],
                &octets,
            ],
        );
        let mut nonce = [0u8; sealed::NONCE_LEN];
        nonce.copy_from_slice(&mac[..sealed::NONCE_LEN]);
        nonce
    }
}

/// HMAC-SHA256 (RFC 2104) of the concatenation of `parts` under `key`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    use hmac::{Hmac, Mac};
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes a key of any length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

impl TokenGate {
    /// `None` without a password: then no token can be minted or accepted.
    pub fn new(config: &AuthConfig) -> Option<Self> {
        let password = config.api_password.as_str();
        if password.is_empty() {
            return None;
        }
        let sealed = SealedKey::derive(password).sealing_with_legacy(config.seal_with_legacy_key);
        Some(Self::build(
            config,
            sealed,
            Default::default(),
            EntryNonces::random(),
        ))
    }

    /// The gate for a reloaded `[auth]`, given the running one. With the same password it keeps
    /// the key already derived instead of paying the Argon2id again (19 MiB and tens of
    /// milliseconds, more on a router); with the same sealing key and child lifetime too, it
    /// keeps the children minted so far, so a reload that did not touch them leaves every
    /// manifest's child URLs as they were. A change of either starts the children over: none
    /// sealed under the key just turned off, nor lasting longer than the new lifetime, is handed
    /// out again. Playlist entries' nonces keep their secret with the password (a reload that
    /// keeps it leaves entry URLs as they were) and draw a new one with a new password.
    pub fn reloaded(config: &AuthConfig, running: Option<&TokenGate>) -> Option<Self> {
        let password = config.api_password.as_str();
        let digest: [u8; 32] = Sha256::digest(password.as_bytes()).into();
        // The operator's own config against the running one: nothing secret to time.
        let Some(running) = running.filter(|r| !password.is_empty() && r.digest == digest) else {
            return Self::new(config);
        };
        let sealed = running
            .sealed
            .clone()
            .sealing_with_legacy(config.seal_with_legacy_key);
        let same_children = sealed.seals_with_legacy() == running.sealed.seals_with_legacy()
            && config.child_token_ttl_secs == running.child_ttl;
        let reuse = if same_children {
            running.reuse.clone()
        } else {
            Default::default()
        };
        Some(Self::build(
            config,
            sealed,
            reuse,
            running.entry_nonces.clone(),
        ))
    }

    /// A gate for `config`'s (non-empty) password over a key derived from it.
    fn build(
        config: &AuthConfig,
        sealed: SealedKey,
        reuse: std::sync::Arc<super::reuse::Reuse>,
        entry_nonces: EntryNonces,
    ) -> Self {
        let password = config.api_password.as_str();
        TokenGate {
            sealed,
            mediaflow: config
                .accept_mediaflow_tokens
                .then(|| TokenKey::new(password)),
            digest: Sha256::digest(password.as_bytes()).into(),
            child_ttl: config.child_token_ttl_secs,
            reuse,
            entry_nonces,
        }
    }

    /// Opens a token and checks expiry and address. Every failure is a [`TokenRefusal`].
    pub fn open(&self, token: &str, client_ip: IpAddr, now: u64) -> Result<Opened, TokenRefusal> {
        let opened = if sealed::is_sealed(token) {
            let Grant {
                params,
                scope,
                exp,
                ip,
            } = self.sealed.open(token).map_err(TokenRefusal::Sealed)?;
            Opened {
                scope: TokenScope {
                    exp,
                    ip,
                    paths: Some(scope),
                },
                params,
                claims: None,
            }
        } else {
            self.open_mediaflow(token)?
        };
        if opened.scope.exp.is_some_and(|exp| exp < now) {
            return Err(TokenRefusal::Expired);
        }
        let claims = sluice_media::token::TokenClaims {
            params: Vec::new(),
            exp: None,
            ip: opened.scope.ip.clone(),
        };
        // An unknown client (`auth::UNKNOWN_CLIENT`) matches no binding.
        let client = Some(client_ip).filter(|ip| !ip.is_unspecified());
        if claims.check(now, client).is_err() {
            return Err(TokenRefusal::WrongAddress);
        }
        Ok(opened)
    }

    /// A MediaFlow token proves nothing by decrypting (it has no MAC); only the password inside
    /// its claims makes it a credential, as in MediaFlow itself.
    fn open_mediaflow(&self, token: &str) -> Result<Opened, TokenRefusal> {
        let key = self.mediaflow.as_ref().ok_or(TokenRefusal::MediaFlowOff)?;
        let claims = key.decrypt(token).map_err(TokenRefusal::MediaFlow)?;
        let offered: [u8; 32] =
            Sha256::digest(claims.param("api_password").unwrap_or_default().as_bytes()).into();
        let has_password = claims.param("api_password").is_some();
        if !(bool::from(offered.ct_eq(&self.digest)) && has_password) {
            return Err(TokenRefusal::NoPassword);
        }
        let params = claims
            .params
            .iter()
            .filter(|(k, _)| k != "api_password")
            .cloned()
            .collect();
        Ok(Opened {
            scope: TokenScope {
                exp: claims.exp,
                ip: claims.ip.clone(),
                paths: None,
            },
            params,
            claims: Some(claims),
        })
    }

    /// Mints a sealed token for `paths`, inside the parent's limits. `expires` gives it the child
    /// TTL (or the parent's expiry if sooner); without it the token lasts as long as the parent.
    pub fn mint(
        &self,
        params: &[(String, String)],
        paths: &[&str],
        parent: Option<&TokenScope>,
        expires: bool,
        now: u64,
    ) -> String {
        let grant = self.grant(params, paths, parent, expires, now);
        self.sealed.seal(&grant, random_nonce())
    }

    /// What [`TokenGate::mint`] seals.
    fn grant(
        &self,
        params: &[(String, String)],
        paths: &[&str],
        parent: Option<&TokenScope>,
        expires: bool,
        now: u64,
    ) -> Grant {
        let parent_exp = parent.and_then(|p| p.exp);
        let own = expires.then(|| now.saturating_add(self.child_ttl));
        let exp = match (parent_exp, own) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Grant {
            params: params.to_vec(),
            scope: paths.iter().map(|p| p.to_string()).collect(),
            exp,
            ip: parent.and_then(|p| p.ip.clone()),
        }
    }

    /// [`TokenGate::mint`] of an expiring child, reusing the token this child of this parent
    /// was last given for `client`'s network while it has at least half the child lifetime left,
    /// so manifest reloads keep their URLs (`auth::reuse`).
    pub fn mint_child(
        &self,
        params: &[(String, String)],
        paths: &[&str],
        parent: Option<&TokenScope>,
        client: IpAddr,
        now: u64,
    ) -> String {
        self.reuse
            .get_or_mint(params, paths, parent, client, now, self.child_ttl, || {
                let parent_exp = parent.and_then(|p| p.exp);
                let own = now.saturating_add(self.child_ttl);
                let exp = Some(parent_exp.map_or(own, |p| p.min(own)));
                (self.mint(params, paths, parent, true, now), exp)
            })
    }

    /// [`TokenGate::mint`] of a playlist entry (`/playlist/playlist`, `/playlist.m3u`): no
    /// expiry of its own (the parent's expiry and address), sealed under a nonce derived from
    /// the grant and `client`'s network ([`EntryNonces::of`]) rather than a random one. The
    /// same grant for the same network is the same token text at every fetch, so the same
    /// in-flight share of `media.max_requests_per_token` (counted by a sealed token's text), not
    /// a new one per fetch; another network (an IPv4 address, an IPv6 /64) gets its own, so
    /// one viewer holding slow requests does not lock a channel for every viewer. Nothing is
    /// remembered, so a merge of any size costs no memory and pushes out nothing (a memory of
    /// entries evicted its own earliest and live viewers' children). A refreshed parent (a new
    /// expiry) is another grant, so new entries. The unknown clients (`auth::UNKNOWN_CLIENT`, the
    /// unspecified address) are one network, as for every per-client count: they share entries.
    pub fn mint_entry(
        &self,
        params: &[(String, String)],
        paths: &[&str],
        parent: Option<&TokenScope>,
        client: IpAddr,
    ) -> String {
        // An entry does not expire of its own: the time does not enter its grant.
        let grant = self.grant(params, paths, parent, false, 0);
        // Every client network's own, the unknown client's included: with a random nonce a
        // client that made itself unknown (two forwarding chains that disagree) got a new share
        // at every fetch; the unknown clients share their entries, as they share one network.
        let net = crate::net::per_ip::network_of(client);
        self.sealed.seal(&grant, self.entry_nonces.of(&grant, net))
    }
}

/// The query a token request is served with, or a refusal when the path is outside the token's
/// scope or the request tries to set what the token fixes.
///
/// A MediaFlow token (proof of the password) behaves as in MediaFlow: its params win and the
/// request may add others. A sealed token's params are the whole query, plus [`ADDABLE_PARAMS`]
/// (and on `/rtsp/` paths [`CATCHUP_PARAMS`] and the gateway's configured `seek_params`, which
/// count as catch-up times like `playseek` and `tvdr`).
pub fn scoped_query(
    opened: &Opened,
    path: &str,
    request: &Query,
    seek_params: &[String],
) -> Result<Query, TokenRefusal> {
    let mut query = Query::from_pairs(opened.params.clone());
    let extra = request
        .pairs()
        .iter()
        .filter(|(k, _)| k != "token" && k != "api_password");
    match &opened.scope.paths {
        None => {
            query.merge_missing(extra.cloned().collect());
        }
        Some(paths) => {
            if !paths.iter().any(|scope| opens(scope, path)) {
                return Err(TokenRefusal::OutOfScope);
            }
            // The catch-up times the gateway reads (`playseek`, `tvdr`: the default
            // `iptv.rtsp.seek_params`, and whatever names the operator configured there;
            // `r2h-start`) and its choice of seek param. A token fixing one is a programme, not
            // a channel: `r2h-seek-offset` would shift the fixed time, `r2h-seek-mode` move it
            // between the URL and `Range`, another seek param or `r2h-seek-name` replace it, so
            // its holder may add no catch-up param at all.
            const SEEK_TIMES: [&str; 4] = ["playseek", "tvdr", "r2h-start", "r2h-seek-name"];
            let fixed_time = SEEK_TIMES
                .iter()
                .copied()
                .chain(seek_params.iter().map(String::as_str))
                .any(|p| query.get(p).is_some());
            let mut added = Vec::new();
            for (name, value) in extra {
                let repeated = query.get(name).is_some() || added.iter().any(|(k, _)| k == name);
                let catchup = path.starts_with("/rtsp/") && is_catchup_param(name, seek_params);
                if !(ADDABLE_PARAMS.contains(&name.as_str()) || catchup)
                    || repeated
                    || (catchup && fixed_time)
                {
                    return Err(TokenRefusal::Override(name.chars().take(64).collect()));
                }
                // `r2h-seek-name` picks the param the gateway reads as a time and then shifts
                // or removes: naming one the token fixes (`ChannelID=1234`) would change or
                // drop it, so it counts as setting that param.
                if name == "r2h-seek-name" && query.get(value).is_some() {
                    return Err(TokenRefusal::Override(value.chars().take(64).collect()));
                }
                added.push((name.clone(), value.clone()));
            }
            query.merge_missing(added);
        }
    }
    Ok(query)
}

/// Whether `path` (what follows a token) is already normal: no `.` or `..` segment, plain or
/// percent-encoded (`%2e`), and no empty segment (`//`). A scope is matched on the path as sent,
/// while a front end may hand it on verbatim (`rtsp://h:554{path}`), where `/ch1/../../vod/x`
/// would reach a sibling the scope never named; such a path is refused instead.
pub fn is_normal_path(path: &str) -> bool {
    if path.is_empty() {
        // `/_token_T` alone: nothing to walk out of (and no endpoint there).
        return true;
    }
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    if rest.is_empty() {
        return true;
    }
    // An encoded slash or backslash (or a backslash itself, or a NUL) hides a segment boundary
    // from this check that a server decoding before it normalises would see.
    let lower = rest.to_ascii_lowercase();
    if ["%2f", "%5c", "\\", "%00"]
        .iter()
        .any(|s| lower.contains(s))
    {
        return false;
    }
    let segments: Vec<&str> = rest.split('/').collect();
    let last = segments.len() - 1;
    segments.iter().enumerate().all(|(i, seg)| {
        // A trailing `/` (an empty last segment) names a directory; any other empty one is `//`.
        if seg.is_empty() {
            return i == last;
        }
        let decoded = seg.to_ascii_lowercase().replace("%2e", ".");
        // `..;x` is `..` to servers that take `;` as the start of a segment's parameters.
        let name = decoded.split(';').next().unwrap_or("");
        name != "." && name != ".."
    })
}

/// Whether a token scope entry opens `path`: one ending in `/` opens everything under it (an
/// endpoint family, `/proxy/hls/`); any other opens that path alone and what lies below it
/// (`/proxy/stream` and `/proxy/stream/name.mp4`), so a playlist entry's `/udp/G:P` does not
/// open `/udp/G:P0` or another group. An [`exact_scope`] entry opens its path alone.
fn opens(scope: &str, path: &str) -> bool {
    if let Some(exact) = scope.strip_prefix(EXACT) {
        return path == exact;
    }
    if scope.ends_with('/') {
        return path.starts_with(scope);
    }
    path.strip_prefix(scope)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The one answer to every token failure: same status, body and headers whatever went wrong.
pub fn refusal() -> Response<Body> {
    let mut resp = Response::new(body::full(REFUSAL_BODY));
    *resp.status_mut() = StatusCode::UNAUTHORIZED;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

const REFUSAL_BODY: &str = r#"{"detail":"invalid token"}"#;

/// Unix seconds now.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn random_nonce() -> [u8; sealed::NONCE_LEN] {
    let mut nonce = [0u8; sealed::NONCE_LEN];
    // The OS generator failing is not recoverable: a fixed nonce would break the cipher.
    getrandom::getrandom(&mut nonce).expect("operating system random generator");
    nonce
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(accept_mediaflow: bool) -> TokenGate {
        TokenGate::new(&AuthConfig {
            api_password: "pw".into(),
            accept_mediaflow_tokens: accept_mediaflow,
            child_token_ttl_secs: 100,
            ..AuthConfig::default()
        })
        .unwrap()
    }

    fn pairs(q: &[(&str, &str)]) -> Vec<(String, String)> {
        q.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn only_normal_paths_follow_a_token() {
        for ok in [
            "",
            "/",
            "/rtsp/h/live/ch1",
            "/proxy/hls/",
            "/udp/239.1.2.3:5000",
            "/a/...b/c.d",
        ] {
            assert!(is_normal_path(ok), "{ok}");
        }
        for bad in [
            "/rtsp/h/live/ch1/../../vod/x",
            "/rtsp/h/live/ch1/..",
            "/rtsp/h/./x",
            "/rtsp/h/live/ch1/%2e%2e/x",
            "/rtsp/h/live/ch1/%2E./x",
            "/rtsp/h/live/ch1/.%2E",
            "/rtsp/h//x",
            "//rtsp/h",
            "rtsp/h",
            "/rtsp/h/live/ch1/..%2F..%2Fvod%2Fx",
            "/rtsp/h/live/ch1/..%2f..%2fvod",
            "/rtsp/h/live/ch1/..%5Cvod",
            "/rtsp/h/live/ch1/..\\vod",
            "/rtsp/h/live/ch1/..;x/vod",
            "/rtsp/h/live/ch1/%00",
        ] {
            assert!(!is_normal_path(bad), "{bad}");
        }
    }

    #[test]
    fn minted_child_expires_at_ttl_or_parent() {
        let g = gate(true);
        let t = g.mint(&pairs(&[("d", "x")]), &["/proxy/hls/"], None, true, 1000);
        let o = g.open(&t, IP, 1000).unwrap();
        assert_eq!(o.scope.exp, Some(1100));
        assert_eq!(o.scope.paths, Some(vec!["/proxy/hls/".to_string()]));
        assert!(matches!(g.open(&t, IP, 1101), Err(TokenRefusal::Expired)));
        let parent = TokenScope {
            exp: Some(1050),
            ip: None,
            paths: None,
        };
        let t = g.mint(&[], &["/proxy/hls/"], Some(&parent), true, 1000);
        assert_eq!(g.open(&t, IP, 1000).unwrap().scope.exp, Some(1050));
        let t = g.mint(&[], &CHANNEL_SCOPE, None, false, 1000);
        assert_eq!(g.open(&t, IP, u64::MAX).unwrap().scope.exp, None);
    }

    #[test]
    fn mediaflow_tokens_need_the_password_and_can_be_turned_off() {
        let key = TokenKey::new("pw");
        let with = key.encrypt(
            &pairs(&[("d", "x"), ("api_password", "pw")]),
            None,
            None,
            [1; 16],
        );
        let without = key.encrypt(&pairs(&[("d", "x")]), None, None, [1; 16]);
        let wrong = key.encrypt(&pairs(&[("api_password", "pX")]), None, None, [1; 16]);
        let o = gate(true).open(&with, IP, 0).unwrap();
        assert_eq!(o.params, pairs(&[("d", "x")]));
        assert_eq!(o.scope.paths, None);
        assert!(matches!(
            gate(true).open(&without, IP, 0),
            Err(TokenRefusal::NoPassword)
        ));
        assert!(matches!(
            gate(true).open(&wrong, IP, 0),
            Err(TokenRefusal::NoPassword)
        ));
        assert!(matches!(
            gate(false).open(&with, IP, 0),
            Err(TokenRefusal::MediaFlowOff)
        ));
    }

    #[test]
    fn sealed_scope_and_overrides() {
        let g = gate(true);
        let t = g.mint(&pairs(&[("d", "x")]), &["/proxy/hls/"], None, true, 0);
        let o = g.open(&t, IP, 0).unwrap();
        let q = scoped_query(
            &o,
            "/proxy/hls/segment.ts",
            &Query::parse("_HLS_msn=3&token=t"),
            &[],
        )
        .unwrap();
        assert_eq!(
            q.pairs(),
            pairs(&[("d", "x"), ("_HLS_msn", "3")]).as_slice()
        );
        assert!(matches!(
            scoped_query(&o, "/proxy/stream", &Query::parse(""), &[]),
            Err(TokenRefusal::OutOfScope)
        ));
        for q in [
            "d=y",
            "h_authorization=x",
            "key_id=1",
            "_HLS_msn=1&_HLS_msn=2",
        ] {
            let r = scoped_query(&o, "/proxy/hls/x", &Query::parse(q), &[]);
            assert!(matches!(r, Err(TokenRefusal::Override(_))), "{q}");
        }
    }

    fn config(password: &str, legacy: bool, ttl: u64) -> AuthConfig {
        AuthConfig {
            api_password: password.into(),
            seal_with_legacy_key: legacy,
            child_token_ttl_secs: ttl,
            ..AuthConfig::default()
        }
    }

    #[test]
    fn the_switch_seals_under_the_legacy_key_that_older_nodes_hold() {
        let grant_of = |gate: &TokenGate| {
            let token = gate.mint(&pairs(&[("d", "x")]), &["/proxy/hls/"], None, true, 1000);
            let old_node = SealedKey::legacy("pw").open(&token);
            let opened = gate.open(&token, IP, 1000).map(|o| o.params);
            (old_node, opened)
        };
        let on = TokenGate::new(&config("pw", true, 100)).unwrap();
        let (old_node, opened) = grant_of(&on);
        assert_eq!(old_node.unwrap().params, pairs(&[("d", "x")]));
        assert_eq!(opened.unwrap(), pairs(&[("d", "x")]));
        let off = TokenGate::new(&config("pw", false, 100)).unwrap();
        let (old_node, opened) = grant_of(&off);
        assert_eq!(old_node, Err(SealedError::Authentication));
        assert_eq!(opened.unwrap(), pairs(&[("d", "x")]));
        // Turned on by a reload with the same password: the key is kept, the switch followed.
        let (old_node, _) =
            grant_of(&TokenGate::reloaded(&config("pw", true, 100), Some(&off)).unwrap());
        assert!(old_node.is_ok());
    }

    #[test]
    fn a_reload_keeps_the_key_and_children_only_while_nothing_they_hang_on_changed() {
        let child = |gate: &TokenGate| {
            gate.mint_child(&pairs(&[("d", "x")]), &["/proxy/hls/"], None, IP, 1000)
        };
        let entry =
            |gate: &TokenGate| gate.mint_entry(&pairs(&[("d", "x")]), &["/proxy/hls/"], None, IP);
        let running = TokenGate::new(&config("pw", false, 100)).unwrap();
        let before = child(&running);
        let entry_before = entry(&running);
        // Same password, key settings and lifetime (another MediaFlow choice): same child URL.
        let mut same = config("pw", false, 100);
        same.accept_mediaflow_tokens = false;
        let kept = TokenGate::reloaded(&same, Some(&running)).unwrap();
        assert_eq!(child(&kept), before);
        assert_eq!(entry(&kept), entry_before);
        assert!(kept.open(&before, IP, 1000).is_ok());
        // A new password: a new key, the old children refused, none handed out again.
        let moved = TokenGate::reloaded(&config("pw2", false, 100), Some(&kept)).unwrap();
        assert_ne!(child(&moved), before);
        assert_ne!(entry(&moved), entry_before);
        assert!(matches!(
            moved.open(&before, IP, 1000),
            Err(TokenRefusal::Sealed(SealedError::Authentication))
        ));
        // The switch or the lifetime changed: the key is the same, the children start over.
        for changed in [config("pw", true, 100), config("pw", false, 50)] {
            let gate = TokenGate::reloaded(&changed, Some(&kept)).unwrap();
            assert_ne!(child(&gate), before);
            assert!(gate.open(&before, IP, 1000).is_ok());
        }
        // Without a password there is no gate, and a first password derives one.
        assert!(TokenGate::reloaded(&config("", false, 100), Some(&kept)).is_none());
        assert!(TokenGate::reloaded(&config("pw", false, 100), None).is_some());
    }

    #[test]
    fn an_exact_scope_opens_its_path_alone_and_older_scopes_open_what_they_did() {
        for (path, scope) in [
            ("/rtsp/h:554/live", "/rtsp/h:554/live/other"),
            ("/rtsp/h/", "/rtsp/h/any/path"),
            ("/udp/", "/udp/239.1.1.1:5000"),
            ("/udp/239.1.1.1:5000", "/udp/239.1.1.1:5000/x"),
        ] {
            let exact = exact_scope(path);
            assert!(opens(&exact, path), "{exact} opens {path}");
            assert!(!opens(&exact, scope), "{exact} opens {scope}");
            assert!(!opens(&exact, &format!("{path}x")), "{exact}");
            // Tokens minted before keep their prefix meaning.
            assert!(opens(path, scope), "{path} opens {scope}");
        }
        assert!(!opens("/proxy/stream", "/proxy/streamx"));
    }

    /// A forged token tested a password (charged as a wrong one); a refusal of a token this
    /// server made, or of one that tested none, did not.
    #[test]
    fn only_a_token_made_under_another_password_is_a_guess() {
        let g = gate(true);
        let foreign = |pw: &str| {
            let claims = pairs(&[("d", "x"), ("api_password", pw)]);
            TokenKey::new(pw).encrypt(&claims, None, None, [2; 16])
        };
        let sealed_grant = Grant {
            params: pairs(&[("d", "x")]),
            scope: vec!["/proxy/stream".into()],
            exp: None,
            ip: None,
        };
        let legacy_forgery = SealedKey::legacy("guess").seal(&sealed_grant, [3; 24]);
        let no_password = TokenKey::new("pw").encrypt(&pairs(&[("d", "x")]), None, None, [2; 16]);
        for token in [foreign("guess"), legacy_forgery, no_password] {
            let why = g.open(&token, IP, 0).unwrap_err();
            assert!(why.is_guess(), "{why}");
        }
        let with = foreign("pw");
        let expired =
            TokenKey::new("pw").encrypt(&pairs(&[("api_password", "pw")]), Some(1), None, [2; 16]);
        let elsewhere = g.mint(
            &[],
            &["/proxy/"],
            Some(&TokenScope {
                exp: None,
                ip: Some("10.9.9.9".into()),
                paths: None,
            }),
            false,
            0,
        );
        for (gate, token) in [
            (&g, expired),
            (&g, elsewhere),
            (&g, "garbage".to_string()),
            (&g, "s1.!!".to_string()),
            (&gate(false), with),
        ] {
            let why = gate.open(&token, IP, 10).unwrap_err();
            assert!(!why.is_guess(), "{why}");
        }
        for why in [
            TokenRefusal::NoKey,
            TokenRefusal::OutOfScope,
            TokenRefusal::Override("d".into()),
            TokenRefusal::UnnormalPath,
        ] {
            assert!(!why.is_guess(), "{why}");
        }
    }

    /// Merged-playlist entries were remembered in the children's reuse memory (65,536 tokens, a
    /// quarter per network once full): a merge longer than that evicted its own earliest entries
    /// before the next fetch came back to them, so every fetch was new tokens and new shares.
    /// Derived nonces need no memory: any number of entries come out the same for one network,
    /// another network's differ, and each opens to its own grant.
    #[test]
    fn entries_are_the_same_at_every_fetch_for_one_network_however_many() {
        let g = gate(false);
        let scope = ["=/proxy/hls/manifest.m3u8"];
        let params = |i: usize| pairs(&[("d", &format!("http://o/ch{i}.m3u8"))]);
        let here: IpAddr = "10.0.0.1".parse().unwrap();
        let there: IpAddr = "10.0.0.2".parse().unwrap();
        const N: usize = 70_000;
        let first: Vec<String> = (0..N)
            .map(|i| g.mint_entry(&params(i), &scope, None, here))
            .collect();
        for (i, token) in first.iter().enumerate() {
            assert_eq!(
                &g.mint_entry(&params(i), &scope, None, here),
                token,
                "entry {i} fetched again"
            );
            let o = g.open(token, IP, u64::MAX).unwrap();
            assert_eq!(o.params, params(i), "entry {i}");
            assert_eq!(o.scope.paths, Some(vec![scope[0].to_string()]));
            assert_eq!(o.scope.exp, None);
        }
        let distinct: std::collections::HashSet<&String> = first.iter().collect();
        assert_eq!(distinct.len(), N);
        for (i, token) in first.iter().enumerate() {
            let elsewhere = g.mint_entry(&params(i), &scope, None, there);
            assert_ne!(&elsewhere, token, "entry {i} for another network");
            if i % 1000 == 0 {
                assert_eq!(g.open(&elsewhere, IP, 0).unwrap().params, params(i));
            }
        }
    }

    /// The nonce is derived from the grant, the client network and a per-password secret: an
    /// IPv6 /64 is one network, a parent's limits are part of the grant, and the unknown clients
    /// (the unspecified address) are one network too (finding: with a random nonce each, a client
    /// that made itself unknown got a new share at every fetch).
    #[test]
    fn an_entry_follows_its_grant_and_network_and_the_unknown_clients_share_one() {
        let g = gate(false);
        let params = pairs(&[("d", "http://o/ch1.m3u8")]);
        let scope = ["=/proxy/hls/manifest.m3u8"];
        let entry = |g: &TokenGate, parent: Option<&TokenScope>, client: &str| {
            g.mint_entry(&params, &scope, parent, client.parse().unwrap())
        };
        assert_eq!(
            entry(&g, None, "2001:db8::1"),
            entry(&g, None, "2001:db8::2"),
            "one /64"
        );
        assert_ne!(
            entry(&g, None, "2001:db8::1"),
            entry(&g, None, "2001:db8:0:1::1")
        );
        assert_eq!(
            entry(&g, None, "::ffff:10.0.0.1"),
            entry(&g, None, "10.0.0.1")
        );
        let parent = |exp: u64, ip: Option<&str>| TokenScope {
            exp: Some(exp),
            ip: ip.map(str::to_string),
            paths: Some(vec!["/playlist/playlist".to_string()]),
        };
        let a = entry(&g, Some(&parent(1000, None)), "10.0.0.1");
        assert_eq!(a, entry(&g, Some(&parent(1000, None)), "10.0.0.1"));
        assert_eq!(g.open(&a, IP, 1000).unwrap().scope.exp, Some(1000));
        for other in [parent(2000, None), parent(1000, Some("127.0.0.1"))] {
            let b = entry(&g, Some(&other), "10.0.0.1");
            assert_ne!(a, b, "{other:?}");
            assert_eq!(g.open(&b, IP, 1000).unwrap().scope.exp, other.exp);
        }
        for unknown in ["0.0.0.0", "::", "::ffff:0.0.0.0"] {
            let one = entry(&g, None, unknown);
            assert_eq!(one, entry(&g, None, unknown), "{unknown}");
            assert_ne!(one, entry(&g, None, "10.0.0.1"), "{unknown}");
            assert_eq!(g.open(&one, IP, 0).unwrap().params, params);
        }
        // Another gate for the same password (a restart) draws another secret.
        assert_ne!(
            entry(&gate(false), None, "10.0.0.1"),
            entry(&g, None, "10.0.0.1")
        );
    }

    /// RFC 4231 test case 2.
    #[test]
    fn hmac_sha256_is_rfc_2104s() {
        assert_eq!(
            hex(&hmac_sha256(
                b"Jefe",
                &[b"what do ya ", b"want for nothing?"]
            )),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn refusal_is_fixed() {
        let a = refusal();
        let b = refusal();
        assert_eq!(a.status(), b.status());
        assert_eq!(a.headers(), b.headers());
    }
}
