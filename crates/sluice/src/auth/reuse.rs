//! Child tokens reused across manifest reloads: the same child of the same parent gets the same
//! token while that token still has at least half the child lifetime ahead of it.
//!
//! A live playlist is fetched again every few seconds, and players compare the segment URLs of
//! one reload with the last (hls.js refuses a live playlist whose segment paths changed under the
//! same sequence number). A fresh random nonce per reload would give every segment a new URL each
//! time; reusing the token keeps URLs stable for as long as a segment stays listed.

use std::collections::HashMap;
use std::sync::Mutex;

use super::token::TokenScope;

/// Most tokens remembered; past it the memory starts over (a reload then mints anew once).
const MAX_ENTRIES: usize = 65_536;

/// Minted child tokens by what they grant.
#[derive(Debug, Default)]
pub struct Reuse {
    tokens: Mutex<HashMap<String, (String, Option<u64>)>>,
}

impl Reuse {
    /// The token remembered for this child, or the one `mint` makes (then remembered). `mint`
    /// returns the token and its expiry.
    pub fn get_or_mint(
        &self,
        params: &[(String, String)],
        paths: &[&str],
        parent: Option<&TokenScope>,
        now: u64,
        child_ttl: u64,
        mint: impl FnOnce() -> (String, Option<u64>),
    ) -> String {
        let key = key(params, paths, parent);
        let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((token, exp)) = tokens.get(&key) {
            // Reused only while a player holding it still has a long time to use it.
            let from_parent = *exp == parent.and_then(|p| p.exp);
            let fresh = exp.is_none_or(|exp| {
                exp > now && (from_parent || exp.saturating_sub(now) >= child_ttl / 2)
            });
            if fresh {
                return token.clone();
            }
        }
        if tokens.len() >= MAX_ENTRIES {
            tokens.clear();
        }
        let (token, exp) = mint();
        tokens.insert(key, (token.clone(), exp));
        token
    }
}

/// Everything that shapes the grant: parameters, scope and the parent's limits.
fn key(params: &[(String, String)], paths: &[&str], parent: Option<&TokenScope>) -> String {
    let mut out = String::new();
    for (k, v) in params {
        out.push_str(k);
        out.push('\u{1}');
        out.push_str(v);
        out.push('\u{2}');
    }
    for p in paths {
        out.push_str(p);
        out.push('\u{3}');
    }
    if let Some(p) = parent {
        out.push_str(&format!("{:?}\u{4}{:?}\u{4}{:?}", p.exp, p.ip, p.paths));
    }
    out
}
