//! Password guessing, bounded and seen: wrong passwords are counted per client network in a fixed
//! window, and a network past [`MAX_FAILURES`] of them is refused (429 with `Retry-After`) before
//! any password it offers is compared, the right one included (otherwise the limit itself would
//! tell a right guess from a wrong one). A success does not clear a network's count: the window
//! runs out on its own. Every place that compares the API password asks here first (the gate,
//! the pages' Basic login, `/admin/reload`, `/playlist/link`, the XC paths and the URL
//! generators, whose 200 tells a right password from a wrong one by the token's form, when the
//! URL is for this server). A token is a credential too: a request carrying one is checked here
//! before it is opened ([`Guesses::check`]), and a token forged under a guessed password (a
//! MediaFlow token, keyed by the password itself, or a sealed one under the legacy key) is
//! charged as a wrong password ([`Guesses::charge`], `auth::token::TokenRefusal::is_guess`).
//!
//! A network is the client's address as `auth.trusted_proxies` make it out, an IPv6 one by its
//! /64 ([`network_of`]); an IPv6 /48 (a site's allocation, free from tunnel brokers, with 65,536
//! /64s) is also counted whole against [`FAILURES_PER_48`] of them. The table holds at most
//! [`MAX_ENTRIES`] windows: expired ones go first, and past the cap the oldest window goes (its
//! network starts afresh), so that a flood of networks cannot make every other client share one
//! refused bucket. Nothing is exempt: a password-free server compares no password.
//!
//! The window is checked and charged in two short locks around the comparison, each on one worker
//! thread without an await between: a network gets past [`MAX_FAILURES`] by at most the number of
//! runtime workers less one.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::atomic::Counter;
use crate::error::ProxyError;
use crate::net::per_ip::{network_of, site_of};

/// Wrong passwords one client network may offer per [`WINDOW`]; past them every request of its
/// that comes to a password check (right, wrong or none offered) is refused until the window
/// ends. 20 a minute is far above a person
/// mistyping, far below a guesser's thousands a second.
pub const MAX_FAILURES: u32 = 20;

/// How many wrong passwords one IPv6 /48 may offer per [`WINDOW`] over all its /64s: 16 busy
/// hosts' worth, as `net::per_ip::SHARES_PER_48` counts connections.
pub const FAILURES_PER_48: u32 = MAX_FAILURES * 16;

/// The fixed window wrong passwords are counted in: it starts at a network's first failure and
/// its count is dropped when it ends.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Most windows held at once (/64s, IPv4 addresses and /48s together, about 80 bytes each).
pub const MAX_ENTRIES: usize = 65_536;

/// Wrong tokens remembered per network window: the same token offered again tests no new
/// password, so it is charged once. A player still polling with a token minted before a password
/// change would otherwise lock its whole network (and the new password) out every minute.
pub const SEEN_TOKENS: usize = 32;

/// What a window counts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    /// An IPv4 address or an IPv6 /64.
    Network(IpAddr),
    /// An IPv6 /48.
    Site(Ipv6Addr),
}

impl Key {
    fn limit(self) -> u32 {
        match self {
            Key::Network(_) => MAX_FAILURES,
            Key::Site(_) => FAILURES_PER_48,
        }
    }
}

#[derive(Debug)]
struct Window {
    since: Instant,
    failures: u32,
    /// Hashes of the wrong tokens charged in this window (at most [`SEEN_TOKENS`]).
    seen: Vec<u64>,
}

#[derive(Debug, Default)]
struct Table {
    windows: HashMap<Key, Window>,
    /// Each window's key in the order the windows started (oldest first): a window starts only
    /// after the one before it for the same key ended, so this holds one entry per window once
    /// the ended ones are dropped from its front.
    order: VecDeque<(Key, Instant)>,
}

impl Table {
    /// Drops the windows ended by `now`, then the oldest past `cap - room`.
    fn trim(&mut self, now: Instant, cap: usize, room: usize) {
        while let Some(&(key, since)) = self.order.front() {
            let ended = now.saturating_duration_since(since) >= WINDOW;
            if !ended && self.order.len() + room <= cap {
                break;
            }
            self.order.pop_front();
            if self.windows.get(&key).is_some_and(|w| w.since == since) {
                self.windows.remove(&key);
            }
        }
    }

    /// Seconds until `key`'s window ends, when it is at its limit at `now`.
    fn refused(&self, key: Key, now: Instant) -> Option<u64> {
        let w = self.windows.get(&key)?;
        let left = WINDOW.checked_sub(now.saturating_duration_since(w.since))?;
        (!left.is_zero() && w.failures >= key.limit()).then(|| left.as_secs_f64().ceil() as u64)
    }

    /// Whether `key` has a window that has not ended at `now`.
    fn live(&self, key: Key, now: Instant) -> bool {
        self.windows
            .get(&key)
            .is_some_and(|w| now.saturating_duration_since(w.since) < WINDOW)
    }

    fn charge(&mut self, key: Key, now: Instant) {
        match self.windows.get_mut(&key) {
            Some(w) if now.saturating_duration_since(w.since) < WINDOW => {
                w.failures = w.failures.saturating_add(1);
            }
            // (An ended window's record has left `order` in `trim`, or is dropped there later:
            // it no longer matches the window's start.)
            _ => {
                self.windows.insert(
                    key,
                    Window {
                        since: now,
                        failures: 1,
                        seen: Vec::new(),
                    },
                );
                self.order.push_back((key, now));
            }
        }
    }
}

/// The failure windows of one server, and the two counters that make guessing seen.
#[derive(Debug)]
pub struct Guesses {
    table: Mutex<Table>,
    cap: usize,
    /// `sluice_auth_failures_total`: wrong passwords offered, wherever.
    failures: Counter,
    /// `sluice_auth_limited_total`: requests refused by the limit, their password not compared.
    limited: Counter,
    /// Keys the hashes of wrong tokens, differently in every process.
    hasher: std::collections::hash_map::RandomState,
}

/// A request refused by the limit: its password was not compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    /// Seconds until the window that refused it ends (at least 1).
    pub retry_after: u64,
}

impl From<Limited> for ProxyError {
    fn from(limited: Limited) -> ProxyError {
        ProxyError::downstream(
            StatusCode::TOO_MANY_REQUESTS,
            "auth_limited",
            format!(
                "too many wrong passwords from this network: at most {MAX_FAILURES} a minute; no \
                 password is checked until the window ends"
            ),
        )
        .with_retry_after(limited.retry_after.max(1))
    }
}

impl Guesses {
    pub fn new(failures: Counter, limited: Counter) -> Arc<Guesses> {
        Self::with_cap(MAX_ENTRIES, failures, limited)
    }

    fn with_cap(cap: usize, failures: Counter, limited: Counter) -> Arc<Guesses> {
        Arc::new(Guesses {
            table: Mutex::default(),
            cap: cap.max(2),
            failures,
            limited,
            hasher: Default::default(),
        })
    }

    /// Compares a password `client` offers with `check`, unless its network (or /48) is past its
    /// wrong passwords for the window: then `Err` and `check` is not called. `Ok(false)` for a
    /// wrong one, which is charged when one was offered (`None` is no guess: no password at all).
    pub fn attempt(
        &self,
        client: IpAddr,
        offered: Option<&str>,
        check: impl FnOnce(Option<&str>) -> bool,
    ) -> Result<bool, Limited> {
        self.attempt_at(client, offered, check, Instant::now())
    }

    fn attempt_at(
        &self,
        client: IpAddr,
        offered: Option<&str>,
        check: impl FnOnce(Option<&str>) -> bool,
        now: Instant,
    ) -> Result<bool, Limited> {
        self.check_at(client, now)?;
        if check(offered) {
            return Ok(true);
        }
        if offered.is_some() {
            self.charge_at(client, now);
        }
        Ok(false)
    }

    /// `Err` when `client`'s network (or /48) is past its wrong passwords for the window: for a
    /// credential compared elsewhere (a token, opened by the token gate), asked before it is.
    pub fn check(&self, client: IpAddr) -> Result<(), Limited> {
        self.check_at(client, Instant::now())
    }

    /// Books one wrong guess to `client`'s network (and /48): a credential that failed to
    /// authenticate where [`Guesses::attempt`] does not compare it (a forged token).
    pub fn charge(&self, client: IpAddr) {
        self.charge_at(client, Instant::now())
    }

    /// Books `token`, refused for its password, as one wrong guess to `client`'s network, once
    /// per window: the same token again tests no new password ([`SEEN_TOKENS`]).
    pub fn charge_token(&self, client: IpAddr, token: &str) {
        self.charge_token_at(client, token, Instant::now())
    }

    fn charge_token_at(&self, client: IpAddr, token: &str, now: Instant) {
        use std::hash::BuildHasher;
        let hash = self.hasher.hash_one(token);
        let network = Key::Network(network_of(client));
        let seen = |table: &Table| {
            table.live(network, now)
                && table
                    .windows
                    .get(&network)
                    .is_some_and(|w| w.seen.contains(&hash))
        };
        if seen(&self.lock()) {
            return;
        }
        self.charge_at(client, now);
        let mut table = self.lock();
        if let Some(w) = table.windows.get_mut(&network) {
            if w.seen.len() < SEEN_TOKENS && !w.seen.contains(&hash) {
                w.seen.push(hash);
            }
        }
    }

    fn check_at(&self, client: IpAddr, now: Instant) -> Result<(), Limited> {
        let table = self.lock();
        let wait = keys(client)
            .iter()
            .flatten()
            .filter_map(|k| table.refused(*k, now))
            .max();
        match wait {
            Some(retry_after) => {
                self.limited.inc();
                Err(Limited { retry_after })
            }
            None => Ok(()),
        }
    }

    fn charge_at(&self, client: IpAddr, now: Instant) {
        self.failures.inc();
        let keys = keys(client);
        let mut table = self.lock();
        // Room for the windows this failure starts (none for a network already counting).
        let room = keys
            .iter()
            .flatten()
            .filter(|k| !table.live(**k, now))
            .count();
        table.trim(now, self.cap, room);
        for key in keys.into_iter().flatten() {
            table.charge(key, now);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        let table = self.lock();
        assert_eq!(table.windows.len(), table.order.len());
        table.windows.len()
    }
}

/// The windows a client counts against: its network, and an IPv6 one's /48.
fn keys(client: IpAddr) -> [Option<Key>; 2] {
    [
        Some(Key::Network(network_of(client))),
        site_of(client).map(Key::Site),
    ]
}

/// One request's way to [`Guesses`] where the password is compared far from the gate (the URL
/// generators, which read it from a JSON body): left in the request's extensions by dispatch.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub guesses: Arc<Guesses>,
    /// The client's address as `auth.trusted_proxies` make it out.
    pub client: IpAddr,
}

impl Attempt {
    /// [`Guesses::attempt`] for this request's client.
    pub fn attempt(
        &self,
        offered: Option<&str>,
        check: impl FnOnce(Option<&str>) -> bool,
    ) -> Result<bool, Limited> {
        self.guesses.attempt(self.client, offered, check)
    }

    /// [`Guesses::check`] for this request's client.
    pub fn check(&self) -> Result<(), Limited> {
        self.guesses.check(self.client)
    }

    /// [`Guesses::charge_token`] for this request's client.
    pub fn charge_token(&self, token: &str) {
        self.guesses.charge_token(self.client, token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn guesses(cap: usize) -> Arc<Guesses> {
        Guesses::with_cap(cap, Counter::default(), Counter::default())
    }

    /// Offers `pw` ("right" is right) from `client` at `now`.
    fn offer(g: &Guesses, client: &str, pw: &str, now: Instant) -> Result<bool, Limited> {
        g.attempt_at(ip(client), Some(pw), |p| p == Some("right"), now)
    }

    #[test]
    fn a_network_past_its_failures_is_refused_until_its_window_ends() {
        let g = guesses(MAX_ENTRIES);
        let t0 = Instant::now();
        for i in 0..MAX_FAILURES {
            let at = t0 + Duration::from_secs(u64::from(i));
            assert_eq!(offer(&g, "203.0.113.7", "wrong", at), Ok(false), "{i}");
        }
        // The right password too, uncompared; so is a missing one. Another client is not.
        let at = t0 + Duration::from_secs(30);
        assert_eq!(
            offer(&g, "203.0.113.7", "right", at),
            Err(Limited { retry_after: 30 })
        );
        let compared = std::cell::Cell::new(false);
        let none = g.attempt_at(ip("203.0.113.7"), None, |_| compared.replace(true), at);
        assert!(none.is_err() && !compared.get());
        assert_eq!(offer(&g, "203.0.113.8", "right", at), Ok(true));
        assert_eq!(g.limited.get(), 2);
        assert_eq!(g.failures.get(), u64::from(MAX_FAILURES));
        // A success does not clear the count; the window ending does.
        let end = t0 + WINDOW;
        assert!(offer(&g, "203.0.113.7", "right", end - Duration::from_millis(1)).is_err());
        assert_eq!(offer(&g, "203.0.113.7", "right", end), Ok(true));
        assert_eq!(offer(&g, "203.0.113.7", "wrong", end), Ok(false));
        // A missing password is no guess.
        for _ in 0..2 * MAX_FAILURES {
            let none = g.attempt_at(ip("203.0.113.9"), None, |p| p == Some("right"), end);
            assert_eq!(none, Ok(false));
        }
        assert_eq!(offer(&g, "203.0.113.9", "right", end), Ok(true));
    }

    /// A credential compared elsewhere (a token) is checked and charged against the same window.
    #[test]
    fn a_check_and_a_charge_share_the_window_with_passwords() {
        let g = guesses(MAX_ENTRIES);
        let now = Instant::now();
        for _ in 0..MAX_FAILURES / 2 {
            assert_eq!(g.check_at(ip("203.0.113.7"), now), Ok(()));
            g.charge_at(ip("203.0.113.7"), now);
            offer(&g, "203.0.113.7", "wrong", now).unwrap();
        }
        assert!(g.check_at(ip("203.0.113.7"), now).is_err());
        assert!(offer(&g, "203.0.113.7", "right", now).is_err());
        assert_eq!(g.check_at(ip("203.0.113.8"), now), Ok(()));
        assert_eq!(g.failures.get(), u64::from(MAX_FAILURES));
        assert_eq!(g.limited.get(), 2);
    }

    /// The same wrong token offered again is one guess (a player polling with a token minted
    /// before a password change); distinct ones are a guess each, as forged tokens are.
    #[test]
    fn a_token_offered_again_is_charged_once() {
        let g = guesses(MAX_ENTRIES);
        let now = Instant::now();
        for _ in 0..10 * MAX_FAILURES {
            g.charge_token_at(ip("203.0.113.7"), "s1.stale", now);
        }
        assert_eq!(g.check_at(ip("203.0.113.7"), now), Ok(()));
        assert_eq!(g.failures.get(), 1);
        for i in 1..MAX_FAILURES {
            g.charge_token_at(ip("203.0.113.7"), &format!("s1.forged-{i}"), now);
        }
        assert!(g.check_at(ip("203.0.113.7"), now).is_err());
        // A new window forgets what the last one saw.
        let later = now + WINDOW;
        g.charge_token_at(ip("203.0.113.7"), "s1.stale", later);
        assert_eq!(g.failures.get(), u64::from(MAX_FAILURES) + 1);
    }

    #[test]
    fn ipv6_counts_by_64_and_by_48() {
        let g = guesses(MAX_ENTRIES);
        let now = Instant::now();
        for _ in 0..MAX_FAILURES {
            offer(&g, "2001:db8:1:1::1", "wrong", now).unwrap();
        }
        // Another address of the same /64 is the same network; the next /64 is not.
        assert!(offer(&g, "2001:db8:1:1::ffff", "right", now).is_err());
        assert_eq!(offer(&g, "2001:db8:1:2::1", "right", now), Ok(true));
        // The /48 as a whole holds FAILURES_PER_48.
        for n in 2..(FAILURES_PER_48 / MAX_FAILURES + 1) {
            for _ in 0..MAX_FAILURES {
                offer(&g, &format!("2001:db8:1:{n:x}::1"), "wrong", now).unwrap();
            }
        }
        assert!(offer(&g, "2001:db8:1:ffff::1", "right", now).is_err());
        assert_eq!(offer(&g, "2001:db8:2::1", "right", now), Ok(true));
        // An IPv4-mapped client is its IPv4 address.
        for _ in 0..MAX_FAILURES {
            offer(&g, "::ffff:198.51.100.1", "wrong", now).unwrap();
        }
        assert!(offer(&g, "198.51.100.1", "right", now).is_err());
    }

    #[test]
    fn the_table_is_bounded_and_its_windows_expire() {
        let cap = 64;
        let g = guesses(cap);
        let t0 = Instant::now();
        // Far more networks than the cap: it never holds more, and the oldest go first.
        for i in 0..10 * cap as u32 {
            let at = t0 + Duration::from_millis(u64::from(i));
            let client = std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string();
            offer(&g, &client, "wrong", at).unwrap();
            assert!(g.held() <= cap, "{i}");
        }
        assert_eq!(g.held(), cap);
        // IPv6 clients take two windows each; still bounded.
        for i in 0..cap as u32 {
            let client = format!("2001:db8:{i:x}::1");
            offer(&g, &client, "wrong", t0 + Duration::from_secs(1)).unwrap();
            assert!(g.held() <= cap, "{i}");
        }
        // A network pushed out starts afresh; one still held keeps its count.
        let hot = "192.0.2.1";
        let at = t0 + Duration::from_secs(2);
        for _ in 0..MAX_FAILURES {
            offer(&g, hot, "wrong", at).unwrap();
        }
        assert!(offer(&g, hot, "right", at).is_err());
        // Every window has ended a WINDOW later: the next failure leaves only itself.
        let later = at + WINDOW;
        assert_eq!(offer(&g, hot, "right", later), Ok(true));
        offer(&g, "192.0.2.2", "wrong", later).unwrap();
        assert_eq!(g.held(), 1);
    }
}
