//! On-demand issuance: which names seen in a TLS handshake may start an order. Only a name the
//! operator's `ask` URL answers 2xx for; each name asked about at most once per `per_name_secs`,
//! at most `ASKS_AT_ONCE` asks in flight (the rest wait their turn, first come first served), at
//! most `PENDING_AT_ONCE` names in progress, at most `per_minute` orders started, and at most
//! `max_names` names remembered, the oldest forgotten first: memory stays bounded whatever a
//! client sends as SNI, and made-up names cost asks, never the orders a real name needs.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use super::config::{check_name, OnDemandConfig};

type Https = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// Asks in flight at once, all names together; a name that finds them all taken waits for one,
/// in turn, up to `wait_secs`.
pub const ASKS_AT_ONCE: usize = 32;

/// Names being looked up, asked about or ordered at once; a new name past it is refused for this
/// handshake only (`busy`) and tried again at the next.
pub const PENDING_AT_ONCE: usize = 1024;

/// The most of an `ask` answer's body read (and then dropped): its status is the answer.
const ASK_BODY: usize = 16 * 1024;

/// What the gate says about one name.
pub enum Gate {
    /// Go ahead: look in the state directory, take an ask place ([`OnDemand::place`]), ask,
    /// then order; report the end through the sender ([`OnDemand::done`]).
    Start(watch::Sender<Option<bool>>),
    /// Someone else is already on it: wait for this.
    Wait(watch::Receiver<Option<bool>>),
    /// Refused, with the metric label.
    Refused(&'static str),
}

struct State {
    /// Names tried, with until when they are not tried again (`per_name_secs` after their try,
    /// or sooner: see [`OnDemand::put_off`]); `order` holds the same in the order they were
    /// tried, so the expired and (past `max_names`) the oldest are let go from its front.
    tried: HashMap<Arc<str>, Instant>,
    order: VecDeque<(Arc<str>, Instant)>,
    /// Names being looked up, asked about or ordered.
    pending: HashMap<String, watch::Receiver<Option<bool>>>,
    /// When each order of the last minute started (at most `per_minute`), and for which name.
    orders: VecDeque<(Instant, String)>,
}

impl State {
    /// Lets go of names whose time is up, then of the oldest while more than `keep` are held.
    /// (A name put off for less than `per_name_secs` may wait behind later ones in the queue,
    /// counted there; the map refuses it only until its own time.)
    fn prune(&mut self, now: Instant, keep: usize) {
        while let Some((name, until)) = self.order.front() {
            if now < *until && self.order.len() <= keep {
                break;
            }
            // The map holds the name's latest try; an earlier entry for it only leaves the queue.
            if self.tried.get(name) == Some(until) {
                self.tried.remove(name);
            }
            self.order.pop_front();
        }
    }
}

/// The on-demand gate and the `ask` client.
pub struct OnDemand {
    pub config: OnDemandConfig,
    state: Mutex<State>,
    asks: Arc<Semaphore>,
    client: Client<Https, Empty<Bytes>>,
}

impl OnDemand {
    pub fn new(config: &OnDemandConfig) -> anyhow::Result<OnDemand> {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(super::http1_client_config(&[]))
            .https_or_http()
            .enable_http1()
            .build();
        Ok(OnDemand {
            config: config.clone(),
            state: Mutex::new(State {
                tried: HashMap::new(),
                order: VecDeque::new(),
                pending: HashMap::new(),
                orders: VecDeque::new(),
            }),
            asks: Arc::new(Semaphore::new(ASKS_AT_ONCE)),
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// Decides whether `name` may be asked about now (cheap; no I/O).
    pub fn gate(&self, name: &str) -> Gate {
        if check_name(name).is_err() || name.starts_with("*.") {
            return Gate::Refused("bad_name");
        }
        let now = Instant::now();
        let per_name = Duration::from_secs(self.config.per_name_secs);
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rx) = s.pending.get(name) {
            return Gate::Wait(rx.clone());
        }
        if s.tried.get(name).is_some_and(|until| now < *until) {
            return Gate::Refused("recently_tried");
        }
        if s.pending.len() >= PENDING_AT_ONCE {
            return Gate::Refused("busy");
        }
        // Room for this one: the oldest names go first, so a flood of made-up names costs asks
        // (each name once per `per_name_secs` while remembered), never a real name's turn.
        let keep = self.config.max_names.saturating_sub(1);
        s.prune(now, keep);
        let name: Arc<str> = Arc::from(name);
        let until = later(now, per_name);
        s.tried.insert(name.clone(), until);
        s.order.push_back((name.clone(), until));
        let (tx, rx) = watch::channel(None);
        s.pending.insert(name.to_string(), rx);
        Gate::Start(tx)
    }

    /// One of the [`ASKS_AT_ONCE`] places, waited for in turn up to `wait_secs`; `None` when
    /// none came (the name is forgotten, so a later handshake tries again).
    pub async fn place(&self, name: &str) -> Option<OwnedSemaphorePermit> {
        let wait = Duration::from_secs(self.config.wait_secs);
        match tokio::time::timeout(wait, self.asks.clone().acquire_owned()).await {
            Ok(Ok(place)) => Some(place),
            _ => {
                self.forget(name);
                None
            }
        }
    }

    /// Whether an order may start now (the ask said yes): at most `per_minute` in any 60
    /// seconds, all names together. A name refused here is forgotten, so a later handshake
    /// tries again.
    pub fn may_order(&self, name: &str) -> bool {
        let now = Instant::now();
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while s
            .orders
            .front()
            .is_some_and(|(t, _)| now - *t >= Duration::from_secs(60))
        {
            s.orders.pop_front();
        }
        if s.orders.len() >= self.config.per_minute as usize {
            s.tried.remove(name);
            return false;
        }
        s.orders.push_back((now, name.to_string()));
        true
    }

    /// An order `may_order` allowed for `name` did not start (another node holds the name or
    /// has issued it, this node's hour of orders is used up, no account could be had): its
    /// place in the minute is given back, for this name or another.
    pub fn give_back(&self, name: &str) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = s.orders.iter().rposition(|(_, n)| n == name) {
            s.orders.remove(i);
        }
    }

    /// `name` cannot be ordered for `wait` (the hour's on-demand orders are used up until one
    /// leaves it): its handshakes are refused as tried until then, or `per_name_secs` if that
    /// is sooner, without another look in the directory, ask or order; the first after it tries
    /// again at once.
    pub fn put_off(&self, name: &str, wait: Duration) {
        let now = Instant::now();
        let wait = wait.min(Duration::from_secs(self.config.per_name_secs));
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let name: Arc<str> = Arc::from(name);
        let until = later(now, wait);
        s.tried.insert(name.clone(), until);
        // Its own queue entry, so the name still leaves the map when this one is let go (the
        // queue stays bounded by `max_names`, which counts it).
        s.order.push_back((name, until));
        let keep = self.config.max_names;
        s.prune(now, keep);
    }

    /// The order for `name` ended.
    pub fn done(&self, name: &str, tx: watch::Sender<Option<bool>>, issued: bool) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.pending.remove(name);
        let _ = tx.send(Some(issued));
    }

    /// Forgets that `name` was tried, so the next handshake for it may start again.
    pub fn forget(&self, name: &str) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.tried.remove(name);
    }

    /// Names remembered now.
    #[cfg(test)]
    pub fn remembered(&self) -> usize {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.tried.len()
    }

    /// `GET <ask>?domain=<name>`: `Ok(true)` on 2xx, `Ok(false)` on any other status.
    pub async fn ask(&self, name: &str) -> anyhow::Result<bool> {
        Ok(self.ask_status(name).await?.is_success())
    }

    /// `GET <ask>?domain=<name>`: the answer's status (403 without an ask URL).
    pub async fn ask_status(&self, name: &str) -> anyhow::Result<http::StatusCode> {
        let Some(ask) = &self.config.ask else {
            return Ok(http::StatusCode::FORBIDDEN);
        };
        let sep = if ask.contains('?') { '&' } else { '?' };
        let uri: http::Uri = format!("{ask}{sep}domain={name}").parse()?;
        let req = http::Request::get(uri)
            .header(http::header::USER_AGENT, "sluice-acme")
            .body(Empty::new())?;
        let resp = tokio::time::timeout(Duration::from_secs(5), self.client.request(req))
            .await
            .map_err(|_| anyhow::anyhow!("no answer in 5 s"))??;
        let status = resp.status();
        // Read a little of the body, so that a short one leaves the connection reusable; its
        // content is not used, and a longer one is not read past ASK_BODY.
        let body = http_body_util::Limited::new(resp.into_body(), ASK_BODY);
        let _ = tokio::time::timeout(Duration::from_secs(1), body.collect()).await;
        Ok(status)
    }
}

/// `now` plus `wait`, or a time that never comes for a wait past what an `Instant` holds.
fn later(now: Instant, wait: Duration) -> Instant {
    now.checked_add(wait)
        .unwrap_or_else(|| now + Duration::from_secs(u64::from(u32::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(per_minute: u32, max_names: usize) -> OnDemand {
        OnDemand::new(&OnDemandConfig {
            enabled: true,
            ask: Some("http://127.0.0.1:1/ask".into()),
            per_name_secs: 600,
            per_minute,
            max_names,
            wait_secs: 1,
        })
        .unwrap()
    }

    #[test]
    fn names_once_and_bounded() {
        let g = gate(2, 1000);
        let Gate::Start(tx) = g.gate("a.example.com") else {
            panic!("first try starts")
        };
        assert!(matches!(g.gate("a.example.com"), Gate::Wait(_)));
        g.done("a.example.com", tx, false);
        assert!(matches!(
            g.gate("a.example.com"),
            Gate::Refused("recently_tried")
        ));
        assert!(matches!(g.gate("not_a name"), Gate::Refused("bad_name")));
        assert!(matches!(g.gate("*.example.com"), Gate::Refused("bad_name")));

        // Orders, not asks, are counted per minute; a name refused there may be tried again.
        assert!(g.may_order("b.example.com"));
        assert!(g.may_order("c.example.com"));
        let Gate::Start(tx) = g.gate("d.example.com") else {
            panic!("asks are not rate-limited")
        };
        assert!(!g.may_order("d.example.com"));
        g.done("d.example.com", tx, false);
        assert!(matches!(g.gate("d.example.com"), Gate::Start(_)));
    }

    #[test]
    fn a_name_put_off_is_refused_until_its_wait_ends_not_per_name_secs() {
        let g = gate(10, 3);
        let Gate::Start(tx) = g.gate("a.test") else {
            panic!("starts")
        };
        assert!(g.may_order("a.test"));
        // The hour's orders are used up for 200 ms: the order's minute place is given back, and
        // the name's handshakes wait for the hour's place, not `per_name_secs` (600 s).
        g.give_back("a.test");
        g.put_off("a.test", Duration::from_millis(200));
        g.done("a.test", tx, false);
        assert!(matches!(g.gate("a.test"), Gate::Refused("recently_tried")));
        std::thread::sleep(Duration::from_millis(250));
        let Gate::Start(tx) = g.gate("a.test") else {
            panic!("tried again once the wait is over")
        };
        g.done("a.test", tx, false);
        // A wait past `per_name_secs` is cut to it; and the names remembered stay bounded.
        g.put_off("b.test", Duration::from_secs(1 << 40));
        for name in ["c.test", "d.test", "e.test", "f.test"] {
            g.put_off(name, Duration::from_secs(60));
        }
        assert!(g.remembered() <= 3, "{}", g.remembered());
        assert!(matches!(g.gate("f.test"), Gate::Refused("recently_tried")));
        // Ten orders a minute: the one given back is free again.
        for name in ["g.test", "h.test", "i.test", "j.test", "k.test"] {
            assert!(g.may_order(name));
        }
        for name in ["l.test", "m.test", "n.test", "o.test"] {
            assert!(g.may_order(name));
        }
        assert!(g.may_order("p.test"));
        assert!(!g.may_order("q.test"));
    }

    #[test]
    fn the_oldest_names_go_first_and_names_in_progress_are_bounded() {
        let g = gate(10, 3);
        for name in ["a.test", "b.test", "c.test", "d.test", "e.test"] {
            let Gate::Start(tx) = g.gate(name) else {
                panic!("{name} starts")
            };
            g.done(name, tx, false);
        }
        assert_eq!(g.remembered(), 3);
        // a and b were let go (asked again), e is remembered.
        assert!(matches!(g.gate("e.test"), Gate::Refused("recently_tried")));
        assert!(matches!(g.gate("a.test"), Gate::Start(_)));
        assert_eq!(g.remembered(), 3);

        let g = gate(10, 100_000);
        let started: Vec<_> = (0..PENDING_AT_ONCE)
            .map(|i| match g.gate(&format!("n{i}.test")) {
                Gate::Start(tx) => (format!("n{i}.test"), tx),
                _ => panic!("{i} starts"),
            })
            .collect();
        assert!(matches!(g.gate("late.test"), Gate::Refused("busy")));
        for (name, tx) in started {
            g.done(&name, tx, false);
        }
        // Refused as busy is not remembered as tried.
        assert!(matches!(g.gate("late.test"), Gate::Start(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn places_are_taken_in_turn_and_a_name_that_gets_none_is_forgotten() {
        let g = std::sync::Arc::new(gate(10, 1000));
        let held: Vec<_> = (0..ASKS_AT_ONCE)
            .map(|_| g.asks.clone().try_acquire_owned().unwrap())
            .collect();
        let Gate::Start(tx) = g.gate("waits.test") else {
            panic!("starts")
        };
        // None comes within `wait_secs` (1 s): forgotten, so the next handshake starts again.
        assert!(g.place("waits.test").await.is_none());
        g.done("waits.test", tx, false);
        assert!(matches!(g.gate("waits.test"), Gate::Start(_)));
        // Places let go in time are taken, in the order the names came.
        let waiter = |name: &'static str| {
            let g = g.clone();
            tokio::spawn(async move { g.place(name).await })
        };
        let first = waiter("first.test");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let second = waiter("second.test");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut held = held.into_iter();
        drop(held.next());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(first.is_finished() && !second.is_finished());
        drop(held.next());
        assert!(second.await.unwrap().is_some());
        assert!(first.await.unwrap().is_some());
    }
}
