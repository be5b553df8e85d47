//! `ratelimit`: per-host pacing of upstream requests for CDNs that ban clients who ask too often.
//!
//! In process, no shared store: each paced host has the instant its next request may start. A
//! request reserves the next free slot, then sleeps until it, so requests to one host start at
//! least one interval apart in the order they arrived. A request whose slot lies further out than
//! `max_wait_secs` is not queued: it gets a 503 with `Retry-After`, as MediaFlow answers during its
//! cooldown (MediaFlow answers every request in the cooldown that way; sluice queues those that
//! fit, so a player's segment fetch is served late rather than failed).
//!
//! Which interval applies: the longest of the operator's `[media.ratelimit] hosts` entry for the
//! destination (always on) and the request's `ratelimit` parameter (MediaFlow's `vidoza` = 5 s,
//! `aggressive` = 3 s, `none`, or a number of milliseconds). A client can make pacing stricter,
//! never looser than the operator's.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use http::StatusCode;
use sluice_media::query::{ProxyParams, Query};
use tokio::time::Instant;

use super::config::ratelimit::{RateLimitConfig, MAX_INTERVAL_MS};
use crate::error::ProxyError;
use crate::request::RequestContext;

/// Paces requests per upstream host.
#[derive(Debug)]
pub struct Pacer {
    /// Configured domains (lowercase) and their intervals.
    rules: Vec<(String, Duration)>,
    max_wait: Duration,
    max_hosts: usize,
    /// Host → the instant its next request may start. Entries in the past are idle and may go.
    next_start: Mutex<HashMap<String, Instant>>,
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
            next_start: Mutex::new(HashMap::new()),
        }
    }

    /// `true` when requests for this destination are paced (a bad `ratelimit` value counts as
    /// paced: [`Pacer::wait`] refuses it).
    pub fn paces(&self, ctx: &RequestContext, params: &ProxyParams) -> bool {
        !matches!(self.interval(&ctx.query, params), Ok(None))
    }

    /// Waits for this request's turn at its destination host, or refuses it.
    pub async fn wait(&self, ctx: &RequestContext, params: &ProxyParams) -> Result<(), ProxyError> {
        let Some(interval) = self.interval(&ctx.query, params)? else {
            return Ok(());
        };
        let host = host_of(params);
        let slot = self.reserve(&host, interval, Instant::now())?;
        tokio::time::sleep_until(slot).await;
        Ok(())
    }

    /// The pacing interval for this request, if any.
    fn interval(
        &self,
        query: &Query,
        params: &ProxyParams,
    ) -> Result<Option<Duration>, ProxyError> {
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
        Ok(asked.max(configured))
    }

    /// Takes the next free start slot of `host`, or refuses when it is too far out or when the
    /// table is full of hosts that are all still busy.
    fn reserve(&self, host: &str, interval: Duration, now: Instant) -> Result<Instant, ProxyError> {
        let mut table = self
            .next_start
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let slot = table.get(host).copied().filter(|t| *t > now).unwrap_or(now);
        let wait = slot - now;
        if wait > self.max_wait {
            return Err(busy(wait));
        }
        if !table.contains_key(host) && table.len() >= self.max_hosts {
            table.retain(|_, next| *next > now);
            if table.len() >= self.max_hosts {
                // Every tracked host has a request pending: forgetting one would break its pacing.
                let soonest = table.values().min().map_or(interval, |t| *t - now);
                return Err(busy(soonest));
            }
        }
        table.insert(host.to_string(), slot + interval);
        Ok(slot)
    }

    /// Hosts tracked now (for tests and the bound).
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.next_start.lock().map_or(0, |t| t.len())
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

    #[test]
    fn interval_is_the_longest_of_config_and_request() {
        let p = pacer(&[("cdn.example", 2_000)], 30, 10);
        let q = |s: &str| Query::parse(s);
        let sec = Duration::from_secs;
        let at = |query: &str, url: &str| p.interval(&q(query), &params(url)).unwrap();
        assert_eq!(at("", "http://cdn.example/a"), Some(sec(2)));
        assert_eq!(at("", "http://edge3.CDN.example./a"), Some(sec(2)));
        assert_eq!(at("", "http://notcdn.example/a"), None);
        assert_eq!(at("ratelimit=none", "http://cdn.example/a"), Some(sec(2)));
        assert_eq!(at("ratelimit=vidoza", "http://cdn.example/a"), Some(sec(5)));
        assert_eq!(at("ratelimit=Aggressive", "http://other/a"), Some(sec(3)));
        assert_eq!(
            at("ratelimit=250", "http://other/a"),
            Some(Duration::from_millis(250))
        );
        for bad in ["fast", "0", "60001", "-5"] {
            let e = p
                .interval(&q(&format!("ratelimit={bad}")), &params("http://x/"))
                .unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn slots_are_spaced_and_a_slot_too_far_out_is_refused() {
        let p = pacer(&[], 2, 10);
        let t0 = Instant::now();
        let i = Duration::from_millis(900);
        assert_eq!(p.reserve("h", i, t0).unwrap(), t0);
        assert_eq!(p.reserve("h", i, t0).unwrap(), t0 + i);
        assert_eq!(p.reserve("h", i, t0).unwrap(), t0 + i * 2);
        let e = p.reserve("h", i, t0).unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.retry_after, Some(3));
        // Another host is not held up, and the first one frees up as time passes.
        assert_eq!(p.reserve("g", i, t0).unwrap(), t0);
        let later = t0 + Duration::from_secs(10);
        assert_eq!(p.reserve("h", i, later).unwrap(), later);
    }

    #[test]
    fn the_table_is_bounded_idle_hosts_go_first() {
        let p = pacer(&[], 30, 2);
        let t0 = Instant::now();
        let i = Duration::from_secs(1);
        p.reserve("a", i, t0).unwrap();
        p.reserve("b", i, t0).unwrap();
        // Both busy until t0 + 1 s: a third host is refused, not let through unpaced.
        let e = p.reserve("c", i, t0).unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(p.tracked(), 2);
        // Once they are idle, they are forgotten to make room.
        let later = t0 + Duration::from_secs(2);
        assert_eq!(p.reserve("c", i, later).unwrap(), later);
        assert_eq!(p.tracked(), 1);
    }
}
