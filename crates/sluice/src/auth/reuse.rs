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
//!
//! Playlist entries (`/playlist/playlist`, `/playlist.m3u`), which have no expiry of their own,
//! are not kept here: a merge lists up to `media.max_merged_entries` of them, which would push
//! out its own earliest before the next fetch and, meanwhile, the children live viewers reload.
//! Their tokens are sealed under a nonce derived from the grant and the client network instead
//! (`TokenGate::mint_entry`), so they are stable with nothing remembered.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use super::token::TokenScope;
use crate::net::per_ip::network_of;

/// Most tokens remembered; past it the least recently used go, those no longer reusable first.
const MAX_ENTRIES: usize = 65_536;

/// Most bytes of keys and tokens remembered, with the same consequence. A child's key and token
/// both hold its upstream URL and carried parameters, a few hundred bytes for real playlists
/// (65,536 of them fit), but up to tens of KiB each for a hostile origin's or request's.
const MAX_BYTES: usize = 32 * 1024 * 1024;

/// A client network's share of a full memory: past it, an insert that needs room evicts that
/// network's own least recently used. Below it, the memory takes the room from entries no longer
/// reusable, then the least recently used of anyone's. Enforced only once the memory is full: one
/// household can list more than a quarter on its own (a 6-hour DVR window of 2-second segments
/// with separate audio is 21,600 children, and each reload touches them all in order, so an LRU
/// smaller than that reuses none of them), and while there is room that costs no one anything.
/// Full, one network asking for 50,000-segment playlists (a token holder, or a household behind
/// one address) can push others out only until it holds a quarter.
const NET_MAX_ENTRIES: usize = MAX_ENTRIES / 4;

/// A client network's share of the bytes of a full memory, for the same reason.
const NET_MAX_BYTES: usize = MAX_BYTES / 4;

/// Minted child tokens by what they grant.
#[derive(Debug, Default)]
pub struct Reuse {
    tokens: Mutex<Tokens>,
}

#[derive(Debug, Default)]
struct Tokens {
    by_key: HashMap<Arc<str>, Entry>,
    /// Keys by last use (a tick of `clock`), least recent first.
    by_use: BTreeMap<u64, Arc<str>>,
    /// When each entry stops being reusable, and its last use: the first may be evicted early.
    by_stale: BTreeSet<(u64, u64)>,
    /// Each client network's share.
    by_net: HashMap<IpAddr, Share>,
    /// Key and token bytes in `by_key`.
    bytes: usize,
    /// Counts uses; each entry's last is unique, so it orders them.
    clock: u64,
}

#[derive(Debug)]
struct Entry {
    token: String,
    exp: Option<u64>,
    net: IpAddr,
    /// The `clock` tick of its last use.
    used: u64,
    /// The first second at which `get_or_mint` would no longer hand it out.
    stale_at: u64,
}

/// One client network's entries (by last use) and their key and token bytes.
#[derive(Debug, Default)]
struct Share {
    used: BTreeSet<u64>,
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
        let net = network_of(client);
        let key = key(params, paths, parent, net);
        let parent_exp = parent.and_then(|p| p.exp);
        let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = tokens.by_key.get(key.as_str()) {
            if now < stale_at(entry.exp, parent_exp, child_ttl) {
                let token = entry.token.clone();
                tokens.touch(&key);
                return token;
            }
        }
        let (token, exp) = mint();
        let stale_at = stale_at(exp, parent_exp, child_ttl);
        tokens.insert(key, net, token.clone(), exp, stale_at, now);
        token
    }
}

/// The first second at which a child expiring at `exp` is no longer handed out: when it expires
/// if it ends with its parent (it cannot outlive it), else once less than half the child
/// lifetime is left, so a player holding it still has a long time to use it.
fn stale_at(exp: Option<u64>, parent_exp: Option<u64>, child_ttl: u64) -> u64 {
    match exp {
        None => u64::MAX,
        Some(exp) if Some(exp) == parent_exp => exp,
        // Fresh while `exp - now >= child_ttl / 2`: up to and including `exp - child_ttl / 2`.
        Some(exp) if exp < child_ttl / 2 => 0,
        Some(exp) => (exp - child_ttl / 2).saturating_add(1).min(exp),
    }
}

impl Tokens {
    /// Marks `key` as just used.
    fn touch(&mut self, key: &str) {
        self.clock += 1;
        let now = self.clock;
        let Some(entry) = self.by_key.get_mut(key) else {
            return;
        };
        let was = std::mem::replace(&mut entry.used, now);
        if let Some(k) = self.by_use.remove(&was) {
            self.by_use.insert(now, k);
        }
        self.by_stale.remove(&(entry.stale_at, was));
        self.by_stale.insert((entry.stale_at, now));
        if let Some(share) = self.by_net.get_mut(&entry.net) {
            share.used.remove(&was);
            share.used.insert(now);
        }
    }

    /// Remembers `token` for `key` (of client network `net`), making room first if the memory is
    /// full: from the network's own least recently used while it holds at least its share, else
    /// from entries no longer reusable at `now`, then the least recently used of any network. Each
    /// insert evicts at most what earlier inserts added.
    fn insert(
        &mut self,
        key: String,
        net: IpAddr,
        token: String,
        exp: Option<u64>,
        stale_at: u64,
        now: u64,
    ) {
        self.remove(&key);
        let size = key.len() + token.len();
        if size > NET_MAX_BYTES {
            return; // Minted every time; not worth forgetting a network's others for.
        }
        while self.by_key.len() >= MAX_ENTRIES || self.bytes + size > MAX_BYTES {
            let own = self.by_net.get(&net).filter(|share| {
                share.used.len() >= NET_MAX_ENTRIES || share.bytes + size > NET_MAX_BYTES
            });
            let victim = match own {
                Some(share) => share.used.first().and_then(|u| self.by_use.get(u)),
                None => match self.by_stale.first().filter(|(at, _)| *at <= now) {
                    Some((_, used)) => self.by_use.get(used),
                    None => self.by_use.first_key_value().map(|(_, k)| k),
                },
            };
            let Some(victim) = victim.cloned() else {
                break;
            };
            self.remove(&victim);
        }
        self.clock += 1;
        let used = self.clock;
        let key: Arc<str> = key.into();
        self.by_use.insert(used, key.clone());
        self.by_stale.insert((stale_at, used));
        let share = self.by_net.entry(net).or_default();
        share.used.insert(used);
        share.bytes += size;
        self.bytes += size;
        let entry = Entry {
            token,
            exp,
            net,
            used,
            stale_at,
        };
        self.by_key.insert(key, entry);
    }

    /// Forgets `key`, from every index.
    fn remove(&mut self, key: &str) {
        let Some((key, entry)) = self.by_key.remove_entry(key) else {
            return;
        };
        let size = key.len() + entry.token.len();
        self.by_use.remove(&entry.used);
        self.by_stale.remove(&(entry.stale_at, entry.used));
        if let Some(share) = self.by_net.get_mut(&entry.net) {
            share.used.remove(&entry.used);
            share.bytes -= size;
            if share.used.is_empty() {
                self.by_net.remove(&entry.net);
            }
        }
        self.bytes -= size;
    }
}

/// Everything that shapes the grant (parameters, scope and the parent's limits), and whose network
/// it is for. Each field is length-prefixed ([`Fields`]): joined raw with separator characters, a
/// carried parameter holding them (`h_x=a\u{1}b`, which a query can carry) made two children
/// one key, so one was handed the other's token.
fn key(
    params: &[(String, String)],
    paths: &[&str],
    parent: Option<&TokenScope>,
    client: IpAddr,
) -> String {
    let mut out = Fields::default();
    out.grant(params, paths);
    match parent {
        None => out.tag('-'),
        Some(p) => {
            out.tag('+');
            out.limits(p.exp, p.ip.as_deref());
            match &p.paths {
                None => out.tag('-'),
                Some(paths) => {
                    out.tag('+');
                    out.list(paths.iter().map(String::as_str));
                }
            }
        }
    }
    out.field(&client.to_string());
    out.0
}

/// What a sealed token grants, in one form: its parameters, scope, expiry and address, each
/// field length-prefixed. Two seals of one grant (each under a fresh nonce, so two spellings)
/// give the same bytes; two grants never do.
pub fn grant_bytes(
    params: &[(String, String)],
    paths: &[impl AsRef<str>],
    exp: Option<u64>,
    ip: Option<&str>,
) -> Vec<u8> {
    let mut out = Fields::default();
    out.grant(params, paths);
    out.limits(exp, ip);
    out.0.into_bytes()
}

/// Text made of fields that cannot run into each other: each is its length in decimal, `:`, then
/// its bytes; lists and optional values say how many follow.
#[derive(Default)]
struct Fields(String);

impl Fields {
    fn field(&mut self, s: &str) {
        self.0.push_str(&s.len().to_string());
        self.0.push(':');
        self.0.push_str(s);
    }

    fn tag(&mut self, t: char) {
        self.0.push(t);
    }

    fn list<'a>(&mut self, items: impl ExactSizeIterator<Item = &'a str>) {
        self.0.push_str(&items.len().to_string());
        self.0.push('#');
        for item in items {
            self.field(item);
        }
    }

    fn grant(&mut self, params: &[(String, String)], paths: &[impl AsRef<str>]) {
        self.0.push_str(&params.len().to_string());
        self.0.push('#');
        for (k, v) in params {
            self.field(k);
            self.field(v);
        }
        self.list(paths.iter().map(AsRef::as_ref));
    }

    fn limits(&mut self, exp: Option<u64>, ip: Option<&str>) {
        match exp {
            None => self.tag('-'),
            Some(exp) => {
                self.tag('+');
                self.field(&exp.to_string());
            }
        }
        match ip {
            None => self.tag('-'),
            Some(ip) => {
                self.tag('+');
                self.field(ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mint(reuse: &Reuse, d: &str, token: &str) -> String {
        mint_for(reuse, "10.0.0.1", d, token)
    }

    fn mint_for(reuse: &Reuse, client: &str, d: &str, token: &str) -> String {
        mint_at(reuse, client, d, token, 100, 1000)
    }

    /// Asks at `now` (child lifetime 60 s) for child `d` of `client`, minting `token` expiring
    /// at `exp` if none is reused.
    fn mint_at(reuse: &Reuse, client: &str, d: &str, token: &str, now: u64, exp: u64) -> String {
        let params = [("d".to_string(), d.to_string())];
        let client = client.parse().unwrap();
        reuse.get_or_mint(&params, &["/proxy/hls/"], None, client, now, 60, || {
            (token.to_string(), Some(exp))
        })
    }

    /// Every index agrees with `by_key`, the byte counts are exact and the bounds hold.
    fn assert_consistent(tokens: &Tokens) {
        let counted: usize = tokens
            .by_key
            .iter()
            .map(|(k, e)| k.len() + e.token.len())
            .sum();
        assert_eq!(counted, tokens.bytes);
        assert!(tokens.bytes <= MAX_BYTES, "{}", tokens.bytes);
        assert!(tokens.by_key.len() <= MAX_ENTRIES);
        assert_eq!(tokens.by_use.len(), tokens.by_key.len());
        assert_eq!(tokens.by_stale.len(), tokens.by_key.len());
        let mut per_net: HashMap<IpAddr, (usize, usize)> = HashMap::new();
        for (k, e) in &tokens.by_key {
            assert_eq!(tokens.by_use.get(&e.used), Some(k));
            assert!(tokens.by_stale.contains(&(e.stale_at, e.used)));
            assert!(tokens.by_net[&e.net].used.contains(&e.used));
            let n = per_net.entry(e.net).or_default();
            n.0 += 1;
            n.1 += k.len() + e.token.len();
        }
        assert_eq!(per_net.len(), tokens.by_net.len());
        for (net, share) in &tokens.by_net {
            assert_eq!((share.used.len(), share.bytes), per_net[net], "{net}");
        }
    }

    /// How many entries client network `net` holds.
    fn held(reuse: &Reuse, net: &str) -> usize {
        let tokens = reuse.tokens.lock().unwrap();
        let net: IpAddr = net.parse().unwrap();
        tokens.by_net.get(&net).map_or(0, |s| s.used.len())
    }

    #[test]
    fn memory_is_bounded_in_bytes_as_well_as_entries() {
        let reuse = Reuse::default();
        assert_eq!(mint(&reuse, "http://o/a", "t1"), "t1");
        assert_eq!(mint(&reuse, "http://o/a", "t2"), "t1", "reused");
        // Children of 1 MiB each from eight networks: evicted rather than pass either byte bound.
        let big = "x".repeat(1 << 20);
        for i in 0..100 {
            let client = format!("10.0.0.{}", i % 8);
            mint_for(&reuse, &client, &format!("http://o/{i}/{big}"), &big);
            assert_consistent(&reuse.tokens.lock().unwrap());
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

    #[test]
    fn a_live_window_sliding_past_the_bound_keeps_every_listed_child() {
        // 50 viewers of live channels listing 200 segments, 50 new ones a reload: 10,000 children
        // listed at a time, 82,500 minted in all. Each segment keeps its URL while it is listed
        // (before, the memory started over past 65,536 and every listed URL changed at once).
        let reuse = Reuse::default();
        for round in 0..30u32 {
            for n in 0..50 {
                let client = format!("10.1.0.{n}");
                for seg in round * 50..round * 50 + 200 {
                    let d = format!("http://o/{n}/{seg}.ts");
                    let got = mint_for(&reuse, &client, &d, &format!("{n}-{seg}-{round}"));
                    // The round that first listed it.
                    let first = if seg < 200 { 0 } else { (seg - 150) / 50 };
                    assert_eq!(got, format!("{n}-{seg}-{first}"), "round {round}");
                }
            }
        }
        let tokens = reuse.tokens.lock().unwrap();
        assert_eq!(
            tokens.by_key.len(),
            MAX_ENTRIES,
            "scrolled-out segments are forgotten"
        );
        assert_consistent(&tokens);
    }

    #[test]
    fn a_household_over_a_quarter_keeps_every_child_while_the_memory_has_room() {
        // Two TVs behind one address on two 6-hour DVR channels (or one with separate audio):
        // 21,600 children, more than a quarter, each reload touching them all in order. With the
        // share enforced on a memory with room, its least recently used was always the next one
        // asked for: no child was reused and every segment URL changed at every reload.
        let reuse = Reuse::default();
        assert_eq!(mint_for(&reuse, "10.0.0.2", "http://o/b", "b1"), "b1");
        let children = 2 * 10_800;
        assert!(children > NET_MAX_ENTRIES);
        for round in 0..3 {
            for i in 0..children {
                let d = format!("http://o/{i}.ts");
                let got = mint_for(&reuse, "10.0.0.1", &d, &format!("{i}-{round}"));
                assert_eq!(got, format!("{i}-0"), "round {round}");
            }
        }
        assert_eq!(held(&reuse, "10.0.0.1"), children);
        assert_eq!(mint_for(&reuse, "10.0.0.2", "http://o/b", "b2"), "b1");
        assert_consistent(&reuse.tokens.lock().unwrap());
    }

    #[test]
    fn one_network_past_its_share_evicts_only_its_own_children() {
        // A full memory: four networks of 16,383 children, then two more networks' one each.
        let reuse = Reuse::default();
        for n in 0..4 {
            for i in 0..NET_MAX_ENTRIES - 1 {
                mint_for(
                    &reuse,
                    &format!("10.4.0.{n}"),
                    &format!("http://o/{i}"),
                    "f",
                );
            }
        }
        assert_eq!(mint_for(&reuse, "10.0.0.2", "http://o/b", "b1"), "b1");
        assert_eq!(mint_for(&reuse, "2001:db8::1", "http://o/c", "c1"), "c1");
        assert_eq!(reuse.tokens.lock().unwrap().by_key.len(), MAX_ENTRIES - 2);
        // Two 50,000-segment playlists, from two hosts of one /64: past the first two, each
        // insert takes the least recently used (network 10.4.0.0's) until it holds its share,
        // then only its own.
        for i in 0..100_000 {
            let client = if i < 50_000 {
                "2001:db8:1::1"
            } else {
                "2001:db8:1::2"
            };
            mint_for(&reuse, client, &format!("http://o/{i}"), &format!("a{i}"));
        }
        assert_eq!(held(&reuse, "2001:db8:1::"), NET_MAX_ENTRIES);
        assert_eq!(held(&reuse, "10.4.0.0"), 1);
        for n in 1..4 {
            assert_eq!(held(&reuse, &format!("10.4.0.{n}")), NET_MAX_ENTRIES - 1);
        }
        assert_eq!(mint_for(&reuse, "10.0.0.2", "http://o/b", "b2"), "b1");
        assert_eq!(mint_for(&reuse, "2001:db8::2", "http://o/c", "c2"), "c1");
        // Its own least recently used went; its newest stay.
        assert_eq!(
            mint_for(&reuse, "2001:db8:1::3", "http://o/99999", "x"),
            "a99999"
        );
        assert_eq!(mint_for(&reuse, "2001:db8:1::3", "http://o/0", "y"), "y");
        assert_consistent(&reuse.tokens.lock().unwrap());

        // The same in bytes: a memory full of children of 1 MiB (each over 2 MiB with its key,
        // so 15 fit in 32 MiB and three in a network's 8 MiB), then 40 more from one network.
        let reuse = Reuse::default();
        let big = "x".repeat(1 << 20);
        for n in 0..5 {
            for i in 0..3 {
                let client = format!("10.5.0.{n}");
                mint_for(&reuse, &client, &format!("http://o/{i}/{big}"), &big);
            }
        }
        assert_eq!(mint_for(&reuse, "10.0.0.2", "http://o/b", "b1"), "b1");
        for i in 0..40 {
            mint_for(&reuse, "10.0.0.1", &format!("http://o/{i}/{big}"), &big);
        }
        assert_eq!(mint_for(&reuse, "10.0.0.2", "http://o/b", "b2"), "b1");
        assert_eq!(held(&reuse, "10.0.0.1"), 3);
        assert_eq!(held(&reuse, "10.5.0.0"), 0);
        for n in 1..5 {
            assert_eq!(held(&reuse, &format!("10.5.0.{n}")), 3);
        }
        assert_consistent(&reuse.tokens.lock().unwrap());
    }

    #[test]
    fn a_full_memory_evicts_the_least_recently_used_not_everything() {
        let reuse = Reuse::default();
        let per_net = MAX_ENTRIES / 5; // 13,107: 65,535 in all.
        for n in 0..5 {
            for i in 0..per_net {
                mint_for(
                    &reuse,
                    &format!("10.2.0.{n}"),
                    &format!("http://o/{i}"),
                    "t",
                );
            }
        }
        // Viewer 0 reloads (its children reused), so viewer 1's are now the least recent.
        for i in 0..per_net {
            mint_for(&reuse, "10.2.0.0", &format!("http://o/{i}"), "again");
        }
        // 100 more: the first fits, the other 99 each take one of viewer 1's oldest.
        for i in 0..100 {
            mint_for(&reuse, "10.2.0.5", &format!("http://o/{i}"), "t");
        }
        assert_eq!(held(&reuse, "10.2.0.0"), per_net);
        assert_eq!(held(&reuse, "10.2.0.1"), per_net - 99);
        assert_eq!(held(&reuse, "10.2.0.2"), per_net);
        assert_eq!(held(&reuse, "10.2.0.5"), 100);
        assert_consistent(&reuse.tokens.lock().unwrap());
        assert_eq!(mint_for(&reuse, "10.2.0.1", "http://o/99", "new"), "t");
        assert_eq!(mint_for(&reuse, "10.2.0.1", "http://o/98", "new"), "new");
        assert_eq!(mint_for(&reuse, "10.2.0.0", "http://o/0", "new"), "t");
    }

    #[test]
    fn children_no_longer_reusable_are_evicted_before_the_least_recently_used() {
        let reuse = Reuse::default();
        for n in 0..6 {
            for i in 0..(MAX_ENTRIES - 10) / 6 {
                mint_for(
                    &reuse,
                    &format!("10.3.0.{n}"),
                    &format!("http://o/{i}"),
                    "t",
                );
            }
        }
        // Ten children with 50 s left at 100; at 200 they are past use (less than 30 s left).
        for i in 0..10 {
            mint_at(&reuse, "10.3.0.6", &format!("http://o/{i}"), "s", 100, 150);
        }
        assert_eq!(reuse.tokens.lock().unwrap().by_key.len(), MAX_ENTRIES);
        for i in 0..10 {
            mint_at(&reuse, "10.3.0.7", &format!("http://o/{i}"), "u", 200, 1000);
        }
        assert_eq!(held(&reuse, "10.3.0.6"), 0, "the ten past use went");
        assert_eq!(
            held(&reuse, "10.3.0.0"),
            (MAX_ENTRIES - 10) / 6,
            "not the oldest in use"
        );
        assert_eq!(
            mint_at(&reuse, "10.3.0.0", "http://o/0", "new", 200, 1000),
            "t"
        );
        assert_consistent(&reuse.tokens.lock().unwrap());
    }

    /// Keys were the fields joined raw with `\u{1}`..`\u{3}`: a carried parameter holding those
    /// characters made another child's key, and was handed that child's token.
    #[test]
    fn a_parameter_holding_the_old_separators_makes_no_other_childs_key() {
        let client: IpAddr = "10.0.0.1".parse().unwrap();
        let p = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let pairs = [
            // One parameter whose value spells a second one, against those two parameters.
            (
                p(&[("d", "http://o/a"), ("h_x", "1\u{2}h_y\u{1}2")]),
                p(&[("d", "http://o/a"), ("h_x", "1"), ("h_y", "2")]),
            ),
            // A name that spells a first parameter and the start of a second.
            (
                p(&[("h_x\u{1}1\u{2}h_y", "2")]),
                p(&[("h_x", "1"), ("h_y", "2")]),
            ),
        ];
        for (a, b) in &pairs {
            let ka = key(a, &["/proxy/hls/"], None, client);
            let kb = key(b, &["/proxy/hls/"], None, client);
            assert_ne!(ka, kb, "{a:?} / {b:?}");
        }
        // Through the memory: the second child is minted, not handed the first one's token.
        let reuse = Reuse::default();
        let (a, b) = &pairs[0];
        let mint = |params: &[(String, String)], token: &str| {
            reuse.get_or_mint(params, &["/proxy/hls/"], None, client, 100, 60, || {
                (token.to_string(), Some(1000))
            })
        };
        assert_eq!(mint(a, "ta"), "ta");
        assert_eq!(mint(b, "tb"), "tb");
        assert_eq!(mint(a, "again"), "ta");
        // A parent's limits are fields too, and a grant's bytes tell its fields apart.
        let parent = |ip: &str| TokenScope {
            exp: Some(5),
            ip: Some(ip.to_string()),
            paths: None,
        };
        assert_ne!(
            key(a, &[], Some(&parent("1.2.3.4")), client),
            key(a, &[], Some(&parent("1.2.3.5")), client)
        );
        assert_ne!(
            grant_bytes(&p(&[("d", "x")]), &["/a", "/b"], None, None),
            grant_bytes(&p(&[("d", "x")]), &["/a/b"], None, None)
        );
        assert_ne!(
            grant_bytes(&p(&[("d", "x")]), &["/a"], Some(1), None),
            grant_bytes(&p(&[("d", "x")]), &["/a"], None, Some("1"))
        );
        assert_eq!(
            grant_bytes(&p(&[("d", "x")]), &["/a"], Some(1), Some("1.2.3.4")),
            grant_bytes(&p(&[("d", "x")]), &["/a"], Some(1), Some("1.2.3.4"))
        );
    }
}
