//! `ratelimit`: per-host pacing of upstream requests for CDNs that ban clients who ask too often.
//!
//! In process, no shared store: each paced host has the instant its next request may start. A
//! request reserves the next free slot, then sleeps until it, so requests to one host start at
//! least one interval apart in the order they arrived. A request whose slot lies further out than
//! `max_wait_secs` is not queued: it gets a 503 with `Retry-After`, as MediaFlow answers during its
//! cooldown (MediaFlow answers every request in the cooldown that way; sluice queues those that
//! fit, so a player's segment fetch is served late rather than failed).
//!
//! Two intervals, kept apart. The operator's `[media.ratelimit] hosts` entry for the destination
//! (always on) paces every client's requests to that host: one slot per host, shared. The
//! request's `ratelimit` parameter (MediaFlow's `vidoza` = 5 s, `aggressive` = 3 s, `none`, or a
//! number of milliseconds) paces only the requests of the client network that asked (an address,
//! an IPv6 one by its /64): one slot per client network and host, which no other client waits
//! for. A client can make its own pacing stricter, never looser than the operator's, and never
//! anyone else's (one `ratelimit=60000` used to move the shared slot a minute out, and every other
//! viewer of the host got a 503). A request paced both ways waits for its own slot, then takes the
//! shared one, the two waits together bounded by `max_wait_secs`.
//!
//! The table holds at most `max_hosts` entries; one client network creates at most
//! [`per_client`] of them, so a flood of made-up hosts from one client fills its own share only.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use http::StatusCode;
use sluice_media::query::{ProxyParams, Query};
use tokio::time::Instant;

use super::config::ratelimit::{RateLimitConfig, MAX_INTERVAL_MS};
use crate::error::ProxyError;
use crate::net::per_ip::network_of;
use crate::request::RequestContext;

/// Most entries one client network may create: a quarter of `max_hosts`, at most 64.
fn per_client(max_hosts: usize) -> usize {
    // At least 2: a request paced both ways holds an own entry and may need a shared one.
    (max_hosts / 4).clamp(2, 64)
}

/// Whose slot an entry is: the shared one of a host, or one client network's own for a host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Shared(String),
    Own(IpAddr, String),
}

/// One tracked slot: when the next request may start, and the client network that created it
/// (counted against that network's share until it is forgotten).
#[derive(Debug, Clone, Copy)]
struct Slot {
    next: Instant,
    owner: IpAddr,
}

#[derive(Debug, Default)]
struct Table {
    slots: HashMap<Key, Slot>,
    /// Entries of `slots` per creating client network.
    created: HashMap<IpAddr, usize>,
}

impl Table {
    /// Forgets the idle entries (their instant has passed) that `which` selects.
    fn forget_idle(&mut self, now: Instant, which: impl Fn(&Slot) -> bool) {
        let created = &mut self.created;
        self.slots.retain(|_, slot| {
            let keep = slot.next > now || !which(slot);
            if !keep {
                crate::net::per_ip::release(created, &slot.owner);
            }
            keep
        });
    }

    /// The soonest instant one of the entries `which` selects frees up, as a wait from `now`.
    fn soonest(&self, now: Instant, which: impl Fn(&Slot) -> bool) -> Option<Duration> {
        self.slots
            .values()
            .filter(|s| which(s))
            .map(|s| s.next.saturating_duration_since(now))
            .min()
    }
}

/// Paces requests per upstream host.
#[derive(Debug)]
pub struct Pacer {
    /// Configured domains (lowercase) and their intervals.
    rules: Vec<(String, Duration)>,
    max_wait: Duration,
    max_hosts: usize,
    table: Mutex<Table>,
}

impl Pacer {
    pub fn new(config: &RateLimitConfig) -> Self {
        Pacer {
            rules: config
                .hosts
                .iter()
                .map(|(host, ms)| (host.to_ascii_lowercase(), Duration::from_millis(*ms)))
                .collect(),
            max_wait: Duration::from_secs(config.max_wait_secs),
            max_hosts: config.max_hosts,
            table: Mutex::new(Table::default()),
        }
    }

    /// `true` when requests for this destination are paced (a bad `ratelimit` value counts as
    /// paced: [`Pacer::wait`] refuses it).
    pub fn paces(&self, ctx: &RequestContext, params: &ProxyParams) -> bool {
        !matches!(self.intervals(&ctx.query, params), Ok((None, None)))
    }

    /// Waits for this request's turn at its destination host, or refuses it.
    pub async fn wait(&self, ctx: &RequestContext, params: &ProxyParams) -> Result<(), ProxyError> {
        let (asked, configured) = self.intervals(&ctx.query, params)?;
        if asked.is_none() && configured.is_none() {
            return Ok(());
        }
        let host = host_of(params);
        let client = network_of(ctx.client_ip);
        let arrived = Instant::now();
        // The client's own interval first, when it is stricter than the operator's: it holds up
        // this client alone and takes no shared slot while it waits.
        if let Some(asked) = asked.filter(|a| configured.is_none_or(|c| *a > c)) {
            let key = Key::Own(client, host.clone());
            let slot = self.reserve(key, client, asked, arrived, Duration::ZERO)?;
            tokio::time::sleep_until(slot).await;
        }
        if let Some(configured) = configured {
            // The shared slot is judged against `max_wait` alone: the client's own interval is
            // its choice, and counting it here refused a request that had waited out its slot.
            let now = Instant::now();
            let slot = self.reserve(Key::Shared(host), client, configured, now, Duration::ZERO)?;
            tokio::time::sleep_until(slot).await;
        }
        Ok(())
    }

    /// The request's own interval (`ratelimit`) and the operator's for its host.
    fn intervals(
        &self,
        query: &Query,
        params: &ProxyParams,
    ) -> Result<(Option<Duration>, Option<Duration>), ProxyError> {
        let asked = parse_param(query.get("ratelimit"))?;
        let host = host_of(params);
        let configured = self
            .rules
            .iter()
            .filter(|(domain, _)| {
                host == *domain
                    || host
                        .strip_suffix(domain.as_str())
                        .is_some_and(|sub| sub.ends_with('.'))
            })
            .map(|(_, d)| *d)
            .max();
        Ok((asked, configured))
    }

    /// Takes the next free start slot of `key` for `client`, or refuses when it is further out
    /// than what is left of `max_wait` after `waited`, when `client` already created its share of
    /// entries and each is still busy, or when the table is full of busy entries.
    fn reserve(
        &self,
        key: Key,
        client: IpAddr,
        interval: Duration,
        now: Instant,
        waited: Duration,
    ) -> Result<Instant, ProxyError> {
        let mut table = self
            .table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let slot = table
            .slots
            .get(&key)
            .map(|s| s.next)
            .filter(|t| *t > now)
            .unwrap_or(now);
        let wait = slot - now;
        if waited + wait > self.max_wait {
            return Err(busy(wait));
        }
        if let Some(entry) = table.slots.get_mut(&key) {
            entry.next = slot + interval;
            return Ok(slot);
        }
        // A new entry: within the client's share, then within the table. Idle entries go first;
        // forgetting a busy one would break its pacing.
        let mine = |s: &Slot| s.owner == client;
        if table.created.get(&client).copied().unwrap_or(0) >= per_client(self.max_hosts) {
            table.forget_idle(now, mine);
            if table.created.get(&client).copied().unwrap_or(0) >= per_client(self.max_hosts) {
                return Err(busy(table.soonest(now, mine).unwrap_or(interval)));
            }
        }
        if table.slots.len() >= self.max_hosts {
            table.forget_idle(now, |_| true);
            if table.slots.len() >= self.max_hosts {
                return Err(busy(table.soonest(now, |_| true).unwrap_or(interval)));
            }
        }
        table.slots.insert(
            key,
            Slot {
                next: slot + interval,
                owner: client,
            },
        );
        *table.created.entry(client).or_default() += 1;
        Ok(slot)
    }

    /// Entries tracked now (for tests and the bound).
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.table.lock().map_or(0, |t| t.slots.len())
    }
}

/// MediaFlow's profiles, `none`, or milliseconds.
fn parse_param(raw: Option<&str>) -> Result<Option<Duration>, ProxyError> {
    let ms = match raw.map(|r| r.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("none") => return Ok(None),
        Some("vidoza") => 5_000,
        Some("aggressive") => 3_000,
        Some(other) => match other.parse::<u64>() {
            Ok(ms) if (1..=MAX_INTERVAL_MS).contains(&ms) => ms,
            _ => {
                return Err(ProxyError::downstream(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    format!(
                        "`ratelimit` must be vidoza, aggressive, none or milliseconds \
                         between requests (1..={MAX_INTERVAL_MS}), not `{other}`"
                    ),
                ))
            }
        },
    };
    Ok(Some(Duration::from_millis(ms)))
}

fn host_of(params: &ProxyParams) -> String {
    params
        .destination
        .host_str()
        .unwrap_or_default()
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

/// The refusal names no host: the holder of a token for `/proxy/stream` may not learn its hidden
/// destination, and a client that gave the destination itself knows it. (Marking the host as the
/// error's `upstream` instead would log a warning per refusal for token holders, at their rate.)
fn busy(wait: Duration) -> ProxyError {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    ProxyError::downstream(
        StatusCode::SERVICE_UNAVAILABLE,
        "rate_limited",
        format!("requests to this destination are paced; retry in {secs} s"),
    )
    .with_retry_after(secs.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn pacer(hosts: &[(&str, u64)], max_wait: u64, max_hosts: usize) -> Pacer {
        Pacer::new(&RateLimitConfig {
            hosts: hosts
                .iter()
                .map(|(h, ms)| (h.to_string(), *ms))
                .collect::<BTreeMap<_, _>>(),
            max_wait_secs: max_wait,
            max_hosts,
        })
    }

    fn params(url: &str) -> ProxyParams {
        ProxyParams::from_query(&Query::parse(&format!("d={url}"))).unwrap()
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 2));

    fn shared(host: &str) -> Key {
        Key::Shared(host.to_string())
    }

    fn own(client: IpAddr, host: &str) -> Key {
        Key::Own(client, host.to_string())
    }

    #[test]
    fn intervals_are_the_request_s_and_the_operator_s() {
        let p = pacer(&[("cdn.example", 2_000)], 30, 10);
        let q = |s: &str| Query::parse(s);
        let sec = |n| Some(Duration::from_secs(n));
        let at = |query: &str, url: &str| p.intervals(&q(query), &params(url)).unwrap();
        assert_eq!(at("", "http://cdn.example/a"), (None, sec(2)));
        assert_eq!(at("", "http://edge3.CDN.example./a"), (None, sec(2)));
        assert_eq!(at("", "http://notcdn.example/a"), (None, None));
        assert_eq!(at("ratelimit=none", "http://cdn.example/a"), (None, sec(2)));
        assert_eq!(
            at("ratelimit=vidoza", "http://cdn.example/a"),
            (sec(5), sec(2))
        );
        assert_eq!(at("ratelimit=Aggressive", "http://other/a"), (sec(3), None));
        assert_eq!(
            at("ratelimit=250", "http://other/a"),
            (Some(Duration::from_millis(250)), None)
        );
        for bad in ["fast", "0", "60001", "-5"] {
            let e = p
                .intervals(&q(&format!("ratelimit={bad}")), &params("http://x/"))
                .unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn slots_are_spaced_and_a_slot_too_far_out_is_refused() {
        let p = pacer(&[], 2, 10);
        let t0 = Instant::now();
        let i = Duration::from_millis(900);
        let zero = Duration::ZERO;
        assert_eq!(p.reserve(shared("h"), A, i, t0, zero).unwrap(), t0);
        assert_eq!(p.reserve(shared("h"), B, i, t0, zero).unwrap(), t0 + i);
        assert_eq!(p.reserve(shared("h"), A, i, t0, zero).unwrap(), t0 + i * 2);
        let e = p.reserve(shared("h"), A, i, t0, zero).unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.retry_after, Some(3));
        // Time already spent waiting counts against max_wait.
        let e = p
            .reserve(shared("g"), A, i, t0, Duration::from_millis(2_100))
            .unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        // Another host is not held up, and the first one frees up as time passes.
        assert_eq!(p.reserve(shared("g"), A, i, t0, zero).unwrap(), t0);
        let later = t0 + Duration::from_secs(10);
        assert_eq!(p.reserve(shared("h"), A, i, later, zero).unwrap(), later);
    }

    #[test]
    fn a_client_s_own_interval_holds_up_that_client_alone() {
        let p = pacer(&[], 30, 64);
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        let zero = Duration::ZERO;
        assert_eq!(p.reserve(own(A, "h"), A, minute, t0, zero).unwrap(), t0);
        // A's next is a minute out, past max_wait; B's own slot and the shared one are free.
        let e = p.reserve(own(A, "h"), A, minute, t0, zero).unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        let i = Duration::from_millis(100);
        assert_eq!(p.reserve(own(B, "h"), B, i, t0, zero).unwrap(), t0);
        assert_eq!(p.reserve(shared("h"), B, i, t0, zero).unwrap(), t0);
    }

    #[test]
    fn one_client_fills_its_share_not_the_table() {
        let p = pacer(&[], 30, 16);
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        let zero = Duration::ZERO;
        let share = per_client(16);
        assert_eq!(share, 4);
        for n in 0..100 {
            let r = p.reserve(own(A, &format!("h{n}.example")), A, minute, t0, zero);
            assert_eq!(r.is_ok(), n < share, "{n}");
        }
        assert_eq!(p.tracked(), share);
        // Shared slots A creates count against the same share.
        assert!(p.reserve(shared("s.example"), A, minute, t0, zero).is_err());
        // B still has room, in its own slots and the shared ones.
        assert_eq!(
            p.reserve(own(B, "h0.example"), B, minute, t0, zero)
                .unwrap(),
            t0
        );
        assert_eq!(
            p.reserve(shared("s.example"), B, minute, t0, zero).unwrap(),
            t0
        );
        // Once A's entries are idle, A may make new ones again.
        let later = t0 + Duration::from_secs(61);
        assert!(p
            .reserve(own(A, "new.example"), A, minute, later, zero)
            .is_ok());
        assert!(p.tracked() <= share + 2);
        assert_eq!(per_client(4096), 64);
        assert_eq!(per_client(1), 2);
    }

    #[test]
    fn the_table_is_bounded_idle_hosts_go_first() {
        let p = pacer(&[], 30, 2);
        let t0 = Instant::now();
        let i = Duration::from_secs(1);
        let zero = Duration::ZERO;
        p.reserve(shared("a"), A, i, t0, zero).unwrap();
        p.reserve(shared("b"), B, i, t0, zero).unwrap();
        // Both busy until t0 + 1 s: a third host is refused, not let through unpaced.
        let c = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 3));
        let e = p.reserve(shared("c"), c, i, t0, zero).unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(p.tracked(), 2);
        // Once they are idle, they are forgotten to make room.
        let later = t0 + Duration::from_secs(2);
        assert_eq!(p.reserve(shared("c"), c, i, later, zero).unwrap(), later);
        assert_eq!(p.tracked(), 1);
    }
}
