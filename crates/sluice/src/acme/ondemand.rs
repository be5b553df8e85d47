//! On-demand issuance: which names seen in a TLS handshake may start an order. Only a name the
//! operator's `ask` URL answers 2xx for, each name at most once per `per_name_secs`, at most
//! `per_minute` orders together, and at most `max_names` names remembered (memory stays bounded
//! whatever a client sends as SNI).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::watch;

use super::config::{check_name, OnDemandConfig};

type Https = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// What the gate says about one name.
pub enum Gate {
    /// Go ahead: ask, then order; report the end through the sender.
    Start(watch::Sender<Option<bool>>),
    /// Someone else is already on it: wait for this.
    Wait(watch::Receiver<Option<bool>>),
    /// Refused, with the metric label.
    Refused(&'static str),
}

struct State {
    /// Names tried, with when (pruned once older than `per_name_secs`).
    tried: HashMap<String, Instant>,
    /// Orders for names in progress.
    pending: HashMap<String, watch::Receiver<Option<bool>>>,
    /// The current minute's start and the orders started in it.
    minute: (Instant, u32),
}

/// The on-demand gate and the `ask` client.
pub struct OnDemand {
    pub config: OnDemandConfig,
    state: Mutex<State>,
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
                pending: HashMap::new(),
                minute: (Instant::now(), 0),
            }),
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// Decides whether `name` may start an order now (cheap; no I/O).
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
        if s.tried.get(name).is_some_and(|t| now - *t < per_name) {
            return Gate::Refused("recently_tried");
        }
        if s.tried.len() >= self.config.max_names {
            s.tried.retain(|_, t| now - *t < per_name);
            if s.tried.len() >= self.config.max_names {
                return Gate::Refused("full");
            }
        }
        if now - s.minute.0 >= Duration::from_secs(60) {
            s.minute = (now, 0);
        }
        if s.minute.1 >= self.config.per_minute {
            return Gate::Refused("rate_limited");
        }
        s.minute.1 += 1;
        s.tried.insert(name.to_string(), now);
        let (tx, rx) = watch::channel(None);
        s.pending.insert(name.to_string(), rx);
        Gate::Start(tx)
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
        let Some(ask) = &self.config.ask else {
            return Ok(false);
        };
        let sep = if ask.contains('?') { '&' } else { '?' };
        let uri: http::Uri = format!("{ask}{sep}domain={name}").parse()?;
        let req = http::Request::get(uri)
            .header(http::header::USER_AGENT, "sluice-acme")
            .body(Empty::new())?;
        let resp = tokio::time::timeout(Duration::from_secs(5), self.client.request(req))
            .await
            .map_err(|_| anyhow::anyhow!("no answer in 5 s"))??;
        let ok = resp.status().is_success();
        // Read (a little of) the body so the connection can be reused; its content is not used.
        let _ = tokio::time::timeout(Duration::from_secs(1), resp.into_body().collect()).await;
        Ok(ok)
    }
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
        let g = gate(3, 1000);
        let Gate::Start(tx) = g.gate("a.example.com") else {
            panic!("first try starts")
        };
        assert!(matches!(g.gate("a.example.com"), Gate::Wait(_)));
        g.done("a.example.com", tx, false);
        assert!(matches!(
            g.gate("a.example.com"),
            Gate::Refused("recently_tried")
        ));
        assert!(matches!(g.gate("b.example.com"), Gate::Start(_)));
        assert!(matches!(g.gate("c.example.com"), Gate::Start(_)));
        assert!(matches!(
            g.gate("d.example.com"),
            Gate::Refused("rate_limited")
        ));
        assert!(matches!(g.gate("not_a name"), Gate::Refused("bad_name")));
        assert!(matches!(g.gate("*.example.com"), Gate::Refused("bad_name")));

        let g = gate(1000, 2);
        assert!(matches!(g.gate("a.example.com"), Gate::Start(_)));
        assert!(matches!(g.gate("b.example.com"), Gate::Start(_)));
        assert!(matches!(g.gate("c.example.com"), Gate::Refused("full")));
        assert_eq!(g.remembered(), 2);
    }
}
