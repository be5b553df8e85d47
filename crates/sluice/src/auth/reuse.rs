//! Child tokens reused across manifest reloads: the same child of the same parent gets the same
//! token while that token still has at least half the child lifetime ahead of it.
//!
//! A live playlist is fetched again every few seconds, and players compare the segment URLs of
//! one reload with the last (hls.js refuses a live playlist whose segment paths changed under the
//! same sequence number). A fresh random nonce per reload would give every segment a new URL each
//! time; reusing the token keeps URLs stable for as long as a segment stays listed.
//!
//! Reuse is per client network (an IPv4 address, an IPv6 /64): children are counted per token
//! (`media.max_requests_per_token`), and one token shared by every viewer of a channel would make
//! that one cap for all of them, which a single viewer holding slow requests fills.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

use super::token::TokenScope;
use crate::net::per_ip::network_of;

/// Most tokens remembered; past it the memory starts over (a reload then mints anew once).
const MAX_ENTRIES: usize = 65_536;

/// Most bytes of keys and tokens remembered, with the same consequence. A child's key and token
/// both hold its upstream URL and carried parameters, a few hundred bytes for real playlists
/// (65,536 of them fit), but up to tens of KiB each for a hostile origin's or request's.
const MAX_BYTES: usize = 32 * 1024 * 1024;

/// Minted child tokens by what they grant.
#[derive(Debug, Default)]
pub struct Reuse {
    tokens: Mutex<Tokens>,
}

#[derive(Debug, Default)]
struct Tokens {
    by_key: HashMap<String, (String, Option<u64>)>,
    /// Key and token bytes in `by_key`.
    bytes: usize,
}

impl Reuse {
    /// The token remembered for this child of a request from `client`, or the one `mint` makes
    /// (then remembered). `mint` returns the token and its expiry. A child is reused for the
    /// client's network only: a viewer keeps stable URLs across reloads, and never shares a
    /// child token, nor so the token's request cap, with viewers elsewhere whose parents carry
    /// the same grant (password parents, or playlist entries without `ip`).
    #[allow(clippy::too_many_arguments)]
    pub fn get_or_mint(
        &self,
        params: &[(String, String)],
        paths: &[&str],
        parent: Option<&TokenScope>,
        client: IpAddr,
        now: u64,
        child_ttl: u64,
        mint: impl FnOnce() -> (String, Option<u64>),
    ) -> String {
        let key = key(params, paths, parent, network_of(client));
        let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((token, exp)) = tokens.by_key.get(&key) {
            // Reused only while a player holding it still has a long time to use it.
            let from_parent = *exp == parent.and_then(|p| p.exp);
            let fresh = exp.is_none_or(|exp| {
                exp > now && (from_parent || exp.saturating_sub(now) >= child_ttl / 2)
            });
            if fresh {
                return token.clone();
            }
        }
        let (token, exp) = mint();
        tokens.insert(key, token.clone(), exp);
        token
    }
}

impl Tokens {
    /// Remembers `token` for `key`, starting over first when the memory is full.
    fn insert(&mut self, key: String, token: String, exp: Option<u64>) {
        if let Some((old, _)) = self.by_key.remove(&key) {
            self.bytes -= key.len() + old.len();
        }
        let size = key.len() + token.len();
        if size > MAX_BYTES {
            return; // Minted every time; not worth forgetting everyone else for.
        }
        if self.by_key.len() >= MAX_ENTRIES || self.bytes + size > MAX_BYTES {
            self.by_key.clear();
            self.bytes = 0;
        }
        self.bytes += size;
        self.by_key.insert(key, (token, exp));
    }
}

/// Everything that shapes the grant (parameters, scope and the parent's limits), and whose network
/// it is for.
fn key(
    params: &[(String, String)],
    paths: &[&str],
    parent: Option<&TokenScope>,
    client: IpAddr,
) -> String {
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
    out.push_str(&format!("\u{5}{client}"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mint(reuse: &Reuse, d: &str, token: &str) -> String {
        mint_for(reuse, "10.0.0.1", d, token)
    }

    fn mint_for(reuse: &Reuse, client: &str, d: &str, token: &str) -> String {
        let params = [("d".to_string(), d.to_string())];
        let client = client.parse().unwrap();
        reuse.get_or_mint(&params, &["/proxy/hls/"], None, client, 100, 60, || {
            (token.to_string(), Some(1000))
        })
    }

    #[test]
    fn memory_is_bounded_in_bytes_as_well_as_entries() {
        let reuse = Reuse::default();
        assert_eq!(mint(&reuse, "http://o/a", "t1"), "t1");
        assert_eq!(mint(&reuse, "http://o/a", "t2"), "t1", "reused");
        // Children of 1 MiB each: the memory starts over rather than pass MAX_BYTES.
        let big = "x".repeat(1 << 20);
        for i in 0..100 {
            mint(&reuse, &format!("http://o/{i}/{big}"), &big);
            let tokens = reuse.tokens.lock().unwrap();
            assert!(tokens.bytes <= MAX_BYTES, "{}", tokens.bytes);
            let counted: usize = tokens
                .by_key
                .iter()
                .map(|(k, (t, _))| k.len() + t.len())
                .sum();
            assert_eq!(counted, tokens.bytes);
        }
        // One child over the whole bound is minted but not remembered.
        let huge = "y".repeat(MAX_BYTES);
        assert_eq!(mint(&reuse, "http://o/h", &huge).len(), MAX_BYTES);
        assert_eq!(mint(&reuse, "http://o/h", "t3"), "t3");
    }

    #[test]
    fn children_are_reused_per_client_network_only() {
        let reuse = Reuse::default();
        let for_ = |client: &str, token: &str| mint_for(&reuse, client, "http://o/s", token);
        assert_eq!(for_("10.0.0.1", "a1"), "a1");
        assert_eq!(for_("10.0.0.1", "a2"), "a1", "the same client reloads");
        assert_eq!(
            for_("10.0.0.2", "b1"),
            "b1",
            "another client, its own token"
        );
        assert_eq!(for_("10.0.0.2", "b2"), "b1");
        // An IPv6 host is its /64 (and a mapped IPv4 address is that address).
        assert_eq!(for_("2001:db8::1", "c1"), "c1");
        assert_eq!(for_("2001:db8::ffff:2", "c2"), "c1");
        assert_eq!(for_("2001:db8:0:1::1", "d1"), "d1");
        assert_eq!(for_("::ffff:10.0.0.1", "a3"), "a1");
    }
}
