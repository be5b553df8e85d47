//! Automatic HTTPS: certificates from an ACME CA (RFC 8555) for the configured hostnames and,
//! behind the operator's `ask` check, for names first seen in a handshake; renewed before expiry
//! (RFC 9773 renewal windows when the CA offers them); kept in a state directory several nodes
//! share, one order per name at a time across them.
//!
//! The TLS server asks [`Certs`] for a name's certificate in each handshake; this module only
//! fills it. HTTP-01 is answered on the plain listener of `acme.http_listen` (`http01`),
//! TLS-ALPN-01 in the handshake (`certs`), DNS-01 by RFC 2136 updates (`dns`).

mod certs;
mod client;
pub mod config;
mod dns;
mod eab;
mod http01;
mod issue;
mod metrics;
mod ondemand;
mod store;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use instant_acme::{Account, AccountCredentials, CertificateIdentifier, NewAccount};
use prometheus_client::registry::Registry;
use tokio::sync::{Notify, OnceCell};

pub use certs::{Certs, ACME_TLS_ALPN};
pub use config::AcmeConfig;
pub use dns::parse_key_file;
use issue::{Issuer, OrderError};
use metrics::{AcmeMetrics, NameLabels};
use ondemand::{Gate, OnDemand};
use store::Store;

/// The ACME service: one account, one store, one set of live certificates.
pub struct Acme {
    config: AcmeConfig,
    names: Vec<String>,
    certs: Arc<Certs>,
    store: Store,
    metrics: AcmeMetrics,
    issuer: OnceCell<Issuer>,
    dns: Option<Arc<dns::Updater>>,
    eab: Option<eab::Eab>,
    on_demand: Option<OnDemand>,
    /// The orders of the last hour (`acme.orders_per_hour`).
    orders: Mutex<Budget>,
    /// Wakes the renewal loop early (an on-demand name was added).
    wake: Notify,
    /// On-demand names whose renewal the ask URL refused: once their certificate expires, a
    /// handshake for one asks and orders again (other failed renewals are the loop's to retry,
    /// with its backoff).
    ask_refused: Mutex<std::collections::HashSet<String>>,
    /// State-directory look-ups for other nodes' TLS-ALPN-01 challenges running at once.
    alpn_lookups: Arc<tokio::sync::Semaphore>,
    /// State-directory look-ups for certificates other nodes issued on demand running at once.
    store_lookups: Arc<tokio::sync::Semaphore>,
    /// An order's state-directory steps running at once (`STATE_STEPS`).
    state_steps: Arc<tokio::sync::Semaphore>,
    /// Stored files refused (another name's certificate, an expired one over one held, a broken
    /// one), by name, with the file's time and inode: not read again until either changes.
    /// Only configured and held names are remembered, so it holds at most one entry for each.
    refused: Mutex<HashMap<String, store::CertStamp>>,
}

/// Look-ups of other nodes' TLS-ALPN-01 challenges at once (a file read each, off the runtime's
/// threads); a validation handshake that finds none free within `ALPN_LOOKUP_TIME` goes on
/// without, so made-up `acme-tls/1` handshakes cannot tie up the blocking threads.
const ALPN_LOOKUPS: usize = 4;

/// How long such a look-up may take (a slow network file system).
const ALPN_LOOKUP_TIME: Duration = Duration::from_secs(2);

/// Look-ups of a certificate another node may have issued on demand, at once (a file read each,
/// off the runtime's threads, the place held by the read itself); a name that finds none free
/// within `STORE_LOOKUP_TIME`, or whose read takes longer, is asked about anyway.
const STORE_LOOKUPS: usize = 4;

/// How long an on-demand name waits for its stored certificate to be read before it is asked
/// about anyway.
const STORE_LOOKUP_TIME: Duration = Duration::from_secs(2);

/// Runs `read` (a state-directory read) on the blocking pool once one of `places` is free,
/// waiting at most `within` for both. The place is held by the read itself, so a read that
/// outlives the wait still counts against the bound.
async fn bounded_read(
    places: &Arc<tokio::sync::Semaphore>,
    within: Duration,
    read: impl FnOnce() + Send + 'static,
) {
    let places = places.clone();
    let _ = tokio::time::timeout(within, async move {
        let place = places.acquire_owned().await.ok()?;
        tokio::task::spawn_blocking(move || {
            read();
            drop(place);
        })
        .await
        .ok()
    })
    .await;
}

/// An order's state-directory steps (its lock, the re-read under it, the write of what was
/// issued) on the blocking pool at once. A stalled network file system holds each one's thread
/// until the server is back: past this many (after [`STATE_STEP_WAIT`]), an order is not tried
/// now (an on-demand name is put off for `retry_min_secs`), so handshakes for allowed names
/// cannot fill the blocking pool every other `spawn_blocking` of the process (resolver, disk
/// cache, reloads) needs.
const STATE_STEPS: usize = 4;

/// How long an order waits for one of the [`STATE_STEPS`] places before it is not tried now.
const STATE_STEP_WAIT: Duration = Duration::from_millis(500);

/// Runs `work` (state-directory I/O) on the blocking pool: the directory may be on a network
/// file system, where a call stalls for as long as the server is away, and a runtime thread
/// stalled there stops every connection it serves.
async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, OrderError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| OrderError::Store(format!("a state directory task failed: {e}")))
}

/// What a look at the state directory for the account found.
enum StoredAccount {
    Found(String),
    /// None, and this node holds the account lock: it creates the account.
    Create(store::NameLock),
    /// None, and another node holds the lock (it is creating the account).
    Wait,
}

/// The end of an on-demand name's try, reported once: by [`Ending::finish`], or as "not issued"
/// if its task ends any other way (a panic), so the name is not left in progress for good.
struct Ending {
    acme: Arc<Acme>,
    name: String,
    tx: Option<tokio::sync::watch::Sender<Option<bool>>>,
}

impl Ending {
    fn finish(mut self, issued: bool) {
        self.report(issued);
        if issued {
            self.acme.wake.notify_one();
        }
    }

    fn report(&mut self, issued: bool) {
        if let (Some(tx), Some(od)) = (self.tx.take(), &self.acme.on_demand) {
            od.done(&self.name, tx, issued);
        }
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        self.report(false);
    }
}

/// Per-name state of the renewal loop.
#[derive(Default)]
struct Schedule {
    /// Failures in a row, when to try again, and the held certificate's file time then (a new
    /// certificate, from a handshake's order or another node, ends the wait).
    retry: HashMap<String, (u32, Instant, Option<SystemTime>)>,
    /// The ARI renewal time chosen for a certificate, when to ask again, and the window it was
    /// chosen in.
    ari: HashMap<String, Ari>,
    /// ARI asks that failed in a row for a name, and when to ask again (until then its renewal
    /// time is the one kept, or the lifetime's).
    ari_failed: HashMap<String, (u32, Instant)>,
}

/// What one pass of the renewal loop has learnt.
#[derive(Default)]
struct Pass {
    /// The CA did not answer (or no account could be had) this pass: the other names' renewal
    /// times are not asked for (each ask could take `client::EXCHANGE`), so due orders do not
    /// wait behind them.
    ca_unreachable: bool,
}

/// Which share of `acme.orders_per_hour` an order draws on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A configured name, or the renewal of a held certificate (the renewal loop's): the whole
    /// budget.
    Kept,
    /// A name first seen in a handshake: at most half the budget, so names the ask URL allows
    /// cannot starve the renewals.
    OnDemand,
}

/// The orders started in the last hour, and of which kind.
#[derive(Default)]
struct Budget {
    started: VecDeque<(Instant, Kind)>,
}

impl Budget {
    /// Counts an order of `kind` started at `now` if `per_hour` allows it (an on-demand one: if
    /// on-demand orders have not used half of it); else how long until a place frees.
    fn take(&mut self, per_hour: u32, kind: Kind, now: Instant) -> Result<(), Duration> {
        let hour = Duration::from_secs(3600);
        while self
            .started
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) >= hour)
        {
            self.started.pop_front();
        }
        let frees = |t: Instant| (t + hour).saturating_duration_since(now);
        if self.started.len() >= per_hour as usize {
            return Err(self.started.front().map_or(hour, |(t, _)| frees(*t)));
        }
        if kind == Kind::OnDemand {
            let mut on_demand = self.started.iter().filter(|(_, k)| *k == Kind::OnDemand);
            if on_demand.clone().count() >= (per_hour / 2) as usize {
                return Err(on_demand.next().map_or(hour, |(t, _)| frees(*t)));
            }
        }
        self.started.push_back((now, kind));
        Ok(())
    }
}

/// A renewal time chosen in the window the CA suggested (ACME Renewal Information).
struct Ari {
    at: SystemTime,
    ask_again: Instant,
    window: (SystemTime, SystemTime),
    /// The held certificate's file time this was asked for: a renewal by another node (or an
    /// order here) makes it stale.
    of: SystemTime,
}

/// What a kept ARI answer is worth now.
#[derive(Debug, PartialEq, Eq)]
enum Still {
    /// The time it chose, for the certificate held.
    Good(SystemTime),
    /// Time to ask the CA again (`ask_again` passed); a window it gives again keeps its time.
    AskAgain,
    /// It was for another certificate (the one held replaced it: another node renewed the name,
    /// or this one did), so it says nothing about the one held.
    Other,
}

impl Ari {
    fn still(&self, held: SystemTime, now: Instant) -> Still {
        if self.of != held {
            Still::Other
        } else if now < self.ask_again {
            Still::Good(self.at)
        } else {
            Still::AskAgain
        }
    }
}

impl Acme {
    /// Builds the service when the section asks for anything (`route_hosts`: the `[[routes]]`
    /// hosts), and loads what the state directory already holds. Nothing is ordered yet.
    pub fn from_config(
        config: &AcmeConfig,
        route_hosts: &[String],
        registry: &mut Registry,
    ) -> anyhow::Result<Option<Arc<Acme>>> {
        if !config.active(route_hosts) {
            return Ok(None);
        }
        let dir = config.state_path();
        let store =
            Store::open(&dir).with_context(|| format!("acme state directory {}", dir.display()))?;
        let dns = match &config.dns {
            Some(d) => Some(Arc::new(dns::Updater::new(d)?)),
            None => None,
        };
        let eab = config.eab.as_ref().map(eab::Eab::load).transpose()?;
        let on_demand = match config.on_demand.enabled {
            true => Some(OnDemand::new(&config.on_demand)?),
            false => None,
        };
        let acme = Acme {
            config: config.clone(),
            names: config.all_names(route_hosts),
            certs: Arc::new(Certs::sharing(store.clone())),
            store,
            metrics: AcmeMetrics::register(registry),
            issuer: OnceCell::new(),
            dns,
            eab,
            on_demand,
            orders: Mutex::default(),
            wake: Notify::new(),
            ask_refused: Mutex::default(),
            alpn_lookups: Arc::new(tokio::sync::Semaphore::new(ALPN_LOOKUPS)),
            store_lookups: Arc::new(tokio::sync::Semaphore::new(STORE_LOOKUPS)),
            state_steps: Arc::new(tokio::sync::Semaphore::new(STATE_STEPS)),
            refused: Mutex::default(),
        };
        for name in acme.store.stored_names() {
            acme.refresh_from_store(&name);
        }
        Ok(Some(Arc::new(acme)))
    }

    /// The live certificates the SNI resolver reads.
    pub fn certs(&self) -> &Arc<Certs> {
        &self.certs
    }

    /// Whether handshakes for unknown names may start orders.
    pub fn on_demand(&self) -> bool {
        self.on_demand.is_some()
    }

    /// Whether TLS handshakes go through [`Acme::accept`], which reads the ClientHello first:
    /// for on-demand issuance, and to answer TLS-ALPN-01 validations of orders other nodes
    /// sharing the state directory placed.
    pub fn reads_hellos(&self) -> bool {
        self.on_demand()
            || self
                .config
                .challenges
                .contains(&config::Challenge::TlsAlpn01)
    }

    /// Binds `acme.http_listen` with `bind` (the server's, which takes a socket handed over by
    /// the previous process on a binary upgrade and records it for the next one) and starts the
    /// renewal loop; returns the plain listeners' addresses.
    pub fn start(self: &Arc<Self>, bind: http01::Bind) -> anyhow::Result<Vec<SocketAddr>> {
        let bound = http01::start(
            &self.config.http_listen,
            self.certs.clone(),
            bind,
            self.metrics.clone(),
        )?;
        for addr in &bound {
            tracing::info!(%addr, "acme: plain listener for HTTP-01 and redirects");
        }
        tokio::spawn(self.clone().run());
        Ok(bound)
    }

    /// Completes a TLS handshake, first obtaining a certificate on demand when the ClientHello
    /// names a host nothing covers yet (within `acme.on_demand.wait_secs`), or, for a TLS-ALPN-01
    /// validation of a name with no challenge open here, taking up another node's from the
    /// state directory.
    pub async fn accept<IO>(
        self: &Arc<Self>,
        io: IO,
        settings: Arc<rustls::ServerConfig>,
    ) -> std::io::Result<tokio_rustls::server::TlsStream<IO>>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let acceptor = rustls::server::Acceptor::default();
        let start = tokio_rustls::LazyConfigAcceptor::new(acceptor, io).await?;
        let hello = start.client_hello();
        let challenge = hello
            .alpn()
            .is_some_and(|mut protocols| protocols.any(|p| p == ACME_TLS_ALPN));
        let name = hello.server_name().map(sni_name);
        match (name, challenge) {
            (Some(name), false) if self.orders_at_handshake(&name) => {
                self.obtain(&name).await;
            }
            (Some(name), true) if !self.certs.has_own_alpn_challenge(&name) => {
                self.borrow_alpn_challenge(name).await;
            }
            _ => {}
        }
        start.into_stream(settings).await
    }

    fn ask_refused(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.ask_refused.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a handshake for `name` may start on-demand issuance: nothing covers it, or only
    /// an expired certificate the renewal loop stopped renewing because the ask URL said no (it
    /// asks again only after `retry_max_secs`). An expired one whose renewals fail at the CA is
    /// left to the loop's backoff, so handshakes do not add orders the CA would refuse too.
    fn orders_at_handshake(&self, name: &str) -> bool {
        if self.certs.covers(name, SystemTime::now()) {
            return false;
        }
        self.certs.held(name).is_none() || self.ask_refused().contains(name)
    }

    /// Takes up another node's TLS-ALPN-01 challenge for `name` (or lets go of one it closed)
    /// from the state directory, within `ALPN_LOOKUP_TIME`.
    async fn borrow_alpn_challenge(&self, name: String) {
        let certs = self.certs.clone();
        bounded_read(&self.alpn_lookups, ALPN_LOOKUP_TIME, move || {
            certs.borrow_alpn_challenge(&name)
        })
        .await;
    }

    /// On-demand issuance for `name`; true when a certificate not expired covers it afterwards.
    pub async fn obtain(self: &Arc<Self>, name: &str) -> bool {
        let Some(od) = &self.on_demand else {
            return false;
        };
        // A configured name (or one under a configured wildcard) is the renewal loop's to order,
        // not the ask URL's to allow.
        if self.names.iter().any(|n| covered_by(n, name)) {
            return false;
        }
        let mut rx = match od.gate(name) {
            Gate::Refused(why) => {
                self.metrics.decision(why);
                tracing::debug!(%name, why, "acme: on-demand issuance refused");
                return false;
            }
            Gate::Wait(rx) => rx,
            Gate::Start(tx) => {
                let rx = tx.subscribe();
                let ending = Ending {
                    acme: self.clone(),
                    name: name.to_string(),
                    tx: Some(tx),
                };
                tokio::spawn(async move {
                    let issued = ending.acme.stored_or_ordered(&ending.name).await;
                    ending.finish(issued);
                });
                rx
            }
        };
        let wait = Duration::from_secs(od.config.wait_secs);
        let _ = tokio::time::timeout(wait, rx.wait_for(|v| v.is_some())).await;
        self.certs.covers(name, SystemTime::now())
    }

    /// An on-demand name past the gate (so a well-formed name, at most once per
    /// `per_name_secs`): another node on the same state directory may have issued it already,
    /// and its stored certificate is taken up before the ask URL or the CA is troubled; else,
    /// once it has one of the ask places, ask (the place is let go once the ask has answered),
    /// then order.
    async fn stored_or_ordered(self: &Arc<Self>, name: &str) -> bool {
        let Some(od) = &self.on_demand else {
            return false;
        };
        // Off the runtime's threads: the directory may be on a network file system.
        let (me, stored) = (self.clone(), name.to_string());
        bounded_read(&self.store_lookups, STORE_LOOKUP_TIME, move || {
            me.refresh_from_store(&stored)
        })
        .await;
        if self
            .certs
            .held(name)
            .is_some_and(|h| h.not_after > SystemTime::now())
        {
            self.metrics.decision("from_store");
            tracing::info!(%name, "acme: certificate another node issued on demand taken up");
            return true;
        }
        let Some(place) = od.place(name).await else {
            self.metrics.decision("busy");
            tracing::info!(%name, "acme: on-demand issuance put off: no ask place came within wait_secs");
            return false;
        };
        self.ask_and_issue(name, place).await
    }

    async fn ask_and_issue(
        self: &Arc<Self>,
        name: &str,
        place: tokio::sync::OwnedSemaphorePermit,
    ) -> bool {
        let Some(od) = &self.on_demand else {
            return false;
        };
        let answer = od.ask(name).await;
        drop(place);
        match answer {
            Ok(true) if !od.may_order(name) => {
                self.metrics.decision("rate_limited");
                tracing::info!(%name, per_minute = od.config.per_minute, "acme: on-demand issuance allowed by the ask URL but put off: too many orders this minute");
                false
            }
            Ok(true) => {
                self.metrics.decision("allowed");
                let mut started = false;
                let result = self.issue_started(name, Kind::OnDemand, &mut started).await;
                // No order placed (another node's certificate found, its lock held, no account,
                // the hour used up): the minute's place is given back.
                if !started {
                    od.give_back(name);
                }
                match result {
                    Ok(()) => true,
                    // Another node is ordering it now: the next handshake for the name looks in
                    // the directory again.
                    Err(OrderError::Locked) => {
                        od.forget(name);
                        false
                    }
                    // The directory is not answering: the name's handshakes are put off for
                    // `retry_min_secs` (at every one they would ask the ask URL again, while the
                    // outage lasts).
                    Err(OrderError::Busy) => {
                        od.put_off(name, Duration::from_secs(self.config.retry_min_secs));
                        false
                    }
                    // The hour's on-demand orders are used up: the name's handshakes are
                    // refused until a place frees (not asked about, each, again), and the first
                    // after that tries again, not one `per_name_secs` later.
                    Err(OrderError::Throttled(_, frees_in)) => {
                        od.put_off(name, frees_in);
                        false
                    }
                    Err(_) => false,
                }
            }
            Ok(false) => {
                self.metrics.decision("refused_by_ask");
                tracing::info!(%name, "acme: the ask URL refused on-demand issuance");
                false
            }
            Err(e) => {
                self.metrics.decision("ask_failed");
                tracing::warn!(%name, error = %e, "acme: the ask URL did not answer; no on-demand issuance");
                false
            }
        }
    }

    /// Reads `name`'s stored certificate if the file is newer than the one held (another node
    /// may have renewed it), and puts it in use if its leaf names `name` (and, with one held, has
    /// not expired): a file holding another name's certificate is neither served for this one
    /// nor counts as covering it. A broken, foreign or expired file is logged and left: the held
    /// certificate stays, and with none held the name is ordered. Reads a file: at run time,
    /// call it off the runtime's threads ([`Acme::refresh_off_runtime`]).
    ///
    /// A file refused is not read (nor warned about) again until its time or inode changes
    /// (`write_bundle` replaces it whole): it stays newer than the one held, and each pass and
    /// handshake would read, parse and warn anew.
    fn refresh_from_store(&self, name: &str) {
        let Some(stamp) = self.store.cert_stamp(name) else {
            return;
        };
        let newer = |modified| self.certs.held(name).is_none_or(|h| h.modified < modified);
        if !newer(stamp.0) || self.refused().get(name) == Some(&stamp) {
            return;
        }
        let Some((pem, modified)) = self.store.read_cert(name) else {
            return;
        };
        if !newer(modified) {
            return;
        }
        match self
            .certs
            .install_stored(name, &pem, modified, SystemTime::now())
        {
            Ok(()) => {
                self.refused().remove(name);
                self.export_expiry(name)
            }
            Err(e) => {
                // One entry per configured or held name, at most: another name's file is read
                // again when asked for (an on-demand name: once per `per_name_secs`).
                // (The stamp is of the file read unless it was replaced between.)
                let remembered =
                    self.names.iter().any(|n| n == name) || self.certs.held(name).is_some();
                if remembered && modified == stamp.0 {
                    self.refused().insert(name.to_string(), stamp);
                }
                tracing::warn!(%name, error = %format!("{e:#}"), "acme: stored certificate unusable")
            }
        }
    }

    fn refused(&self) -> std::sync::MutexGuard<'_, HashMap<String, store::CertStamp>> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Acme::refresh_from_store`] on the blocking pool.
    async fn refresh_off_runtime(self: &Arc<Self>, name: &str) {
        let (me, name) = (self.clone(), name.to_string());
        if let Err(e) = off_runtime(move || me.refresh_from_store(&name)).await {
            tracing::error!(error = %e, "acme: reading a stored certificate failed");
        }
    }

    fn export_expiry(&self, name: &str) {
        if let Some(h) = self.certs.held(name) {
            let secs = h
                .not_after
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            self.metrics
                .expiry
                .get_or_create(&NameLabels {
                    name: name.to_string(),
                })
                .set(secs as i64);
        }
    }

    /// The account (created, or read from the state directory) and the order machinery.
    async fn issuer(&self) -> Result<&Issuer, OrderError> {
        self.issuer
            .get_or_try_init(|| async {
                let account = self.account().await?;
                Ok(Issuer {
                    account,
                    certs: self.certs.clone(),
                    dns: self.dns.clone(),
                    challenges: self.config.challenges.clone(),
                    timeout: Duration::from_secs(self.config.order_timeout_secs),
                })
            })
            .await
    }

    /// The CA's HTTPS client: the roots upstream TLS trusts (bundled and system), plus
    /// `acme.directory_ca`.
    fn account_builder(&self) -> anyhow::Result<instant_acme::AccountBuilder> {
        let extra = match &self.config.directory_ca {
            Some(path) => read_pem_certs(path)?,
            None => Vec::new(),
        };
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(http1_client_config(&extra))
            .https_only()
            .enable_http1()
            .build();
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build::<_, instant_acme::BodyWrapper<bytes::Bytes>>(https);
        // Every exchange with the CA bounded in time and size (`client`).
        Ok(Account::builder_with_http(Box::new(client::Bounded::new(
            client,
        ))))
    }

    /// The account: stored, or created (with `[acme.eab]` when given). A CA that asks for a
    /// binding, or refuses the one given, is a setup error (this host's config), not the CA's.
    async fn account(&self) -> Result<Account, OrderError> {
        self.load_or_create_account().await.map_err(|e| {
            let problem = e.chain().find_map(|c| match c.downcast_ref() {
                Some(instant_acme::Error::Api(p)) => p.r#type.clone(),
                _ => None,
            });
            let binding = problem.as_deref().is_some_and(|t| {
                [":externalAccountRequired", ":unauthorized", ":malformed"]
                    .iter()
                    .any(|k| t.ends_with(k))
            });
            match (problem.as_deref(), &self.eab) {
                (Some(t), None) if t.ends_with(":externalAccountRequired") => {
                    OrderError::Setup(format!(
                        "{e:#}; this CA binds accounts to one of its own: set [acme.eab] key_id and mac_key_file"
                    ))
                }
                // Some CAs also refuse a bound account without a contact address.
                (Some(_), Some(_)) if binding => OrderError::Setup(format!(
                    "{e:#}; check [acme.eab] key_id and mac_key_file, and acme.contact"
                )),
                _ => OrderError::Ca(format!("{e:#}")),
            }
        })
    }

    async fn load_or_create_account(&self) -> anyhow::Result<Account> {
        let url = self.config.directory_url();
        // Another node may be creating the account: wait for its lock, then read what it wrote.
        let mut lock = None;
        for _ in 0..300 {
            let (store, dir) = (self.store.clone(), url.to_string());
            let look = off_runtime(move || -> std::io::Result<StoredAccount> {
                if let Some(json) = store.read_account(&dir) {
                    return Ok(StoredAccount::Found(json));
                }
                let Some(lock) = store.try_lock("account")? else {
                    return Ok(StoredAccount::Wait);
                };
                // The lock's previous holder may have just written it.
                Ok(match store.read_account(&dir) {
                    Some(json) => StoredAccount::Found(json),
                    None => StoredAccount::Create(lock),
                })
            })
            .await??;
            match look {
                StoredAccount::Found(json) => {
                    let creds: AccountCredentials =
                        serde_json::from_str(&json).context("unreadable stored ACME account")?;
                    if let Some(eab) = &self.eab {
                        tracing::info!(
                            directory = url,
                            key_id = eab.key_id.as_str(),
                            "acme: the stored account is used; [acme.eab] binds only an account being created (remove its account-*.json from the state directory to bind anew)"
                        );
                    }
                    return self
                        .account_builder()?
                        .from_credentials(creds)
                        .await
                        .with_context(|| format!("ACME directory {url}"));
                }
                StoredAccount::Create(l) => {
                    lock = Some(l);
                    break;
                }
                StoredAccount::Wait => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let _lock = lock.context("another node holds the account lock")?;
        let contact: Vec<&str> = self.config.contact.iter().map(String::as_str).collect();
        let new = NewAccount {
            contact: &contact,
            terms_of_service_agreed: true,
            only_return_existing: false,
        };
        let binding = self.eab.as_ref().map(eab::Eab::key);
        let (account, creds) = self
            .account_builder()?
            .create(&new, url.to_string(), binding.as_ref())
            .await
            .with_context(|| format!("ACME directory {url}"))?;
        let (store, dir, json) = (
            self.store.clone(),
            url.to_string(),
            serde_json::to_string(&creds)?,
        );
        off_runtime(move || store.write_account(&dir, &json))
            .await?
            .context("writing the ACME account")?;
        tracing::info!(
            directory = url,
            bound = self.eab.as_ref().map(|e| e.key_id.as_str()),
            "acme: account created"
        );
        Ok(account)
    }

    /// Whether `acme.orders_per_hour` allows one more order of `kind` now (and counts it); else
    /// how long until a place frees.
    fn take_order_budget(&self, kind: Kind) -> Result<(), Duration> {
        let mut budget = self.orders.lock().unwrap_or_else(|e| e.into_inner());
        budget.take(self.config.orders_per_hour, kind, Instant::now())
    }

    /// Orders `name` unless another node is on it (then its certificate is picked up later),
    /// stores and installs the result, and counts the outcome.
    async fn issue(self: &Arc<Self>, name: &str, kind: Kind) -> Result<(), OrderError> {
        self.issue_started(name, kind, &mut false).await
    }

    /// [`Acme::issue`], setting `started` once the order is placed with the CA (until then,
    /// none of the orders counted was used).
    async fn issue_started(
        self: &Arc<Self>,
        name: &str,
        kind: Kind,
        started: &mut bool,
    ) -> Result<(), OrderError> {
        let result = self.issue_locked(name, kind, started).await;
        match &result {
            Ok(true) => self.metrics.order("issued"),
            // Logged where it was found (another node's lock, or a directory not answering).
            Ok(false) | Err(OrderError::Locked | OrderError::Busy) => {}
            // An on-demand name waiting for the hour's place: its handshakes are put off until
            // then (`OnDemand::put_off`), so this is no news at every one.
            Err(e @ OrderError::Throttled(..)) if kind == Kind::OnDemand => {
                self.metrics.order(e.label());
                tracing::debug!(%name, error = %e, "acme: on-demand order put off");
            }
            Err(e) => {
                self.metrics.order(e.label());
                tracing::warn!(%name, outcome = e.label(), error = %e, "acme: order failed");
            }
        }
        result.map(|_| ())
    }

    /// True when this call ordered the certificate; false when another node's is now in use.
    /// The state directory is used from the blocking pool only (see [`off_runtime`]).
    async fn issue_locked(
        self: &Arc<Self>,
        name: &str,
        kind: Kind,
        started: &mut bool,
    ) -> Result<bool, OrderError> {
        let store_err = |e: std::io::Error| OrderError::Store(e.to_string());
        let before = self.certs.held(name).map(|h| h.modified);
        let (store, key) = (self.store.clone(), name.to_string());
        let Some(_lock) = self
            .state_step(name, move || store.try_lock(&key))
            .await?
            .map_err(store_err)?
        else {
            tracing::info!(%name, "acme: another node is ordering this name; its certificate is read when stored");
            return Err(OrderError::Locked);
        };
        // The lock's previous holder may have just ordered it: then that one is in use now.
        let (me, key) = (self.clone(), name.to_string());
        self.state_step(name, move || me.refresh_from_store(&key))
            .await?;
        let held = self.certs.held(name);
        if held.as_ref().map(|h| h.modified) != before {
            return Ok(false);
        }
        let replaces = held.and_then(|h| self.config.ari.then(|| cert_id(&h)).flatten());
        if replaces.is_some() {
            tracing::debug!(%name, "acme: ordering as the renewal of the held certificate (ARI)");
        }
        // The account is set up first (once; it is kept), so a CA that cannot be reached at
        // start uses up none of the hour's orders.
        let issuer = self.issuer().await?;
        if let Err(frees_in) = self.take_order_budget(kind) {
            return Err(OrderError::Throttled(self.config.orders_per_hour, frees_in));
        }
        *started = true;
        let issued = issuer.order(name, replaces).await?;
        // What the CA issued is not dropped for want of a place: it waits for one (no thread
        // waits with it).
        let place = self.state_steps.clone().acquire_owned().await;
        let (me, key) = (self.clone(), name.to_string());
        off_runtime(move || {
            let stored = me.store_issued(&key, &issued);
            drop(place);
            stored
        })
        .await??;
        tracing::info!(%name, "acme: certificate issued");
        Ok(true)
    }

    /// `work`, one of an order's state-directory steps, on the blocking pool, holding one of
    /// the [`STATE_STEPS`] places while it runs (a step stalled on the directory keeps it):
    /// with none free within [`STATE_STEP_WAIT`], `name` is not ordered now
    /// ([`OrderError::Busy`]).
    async fn state_step<T: Send + 'static>(
        &self,
        name: &str,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, OrderError> {
        // A burst of orders (on-demand names arriving together) frees its places within
        // milliseconds; only places held this long say the directory is not answering.
        let wait = tokio::time::timeout(STATE_STEP_WAIT, self.state_steps.clone().acquire_owned());
        let Ok(Ok(place)) = wait.await else {
            tracing::info!(%name, steps = STATE_STEPS, "acme: the state directory is not answering (as many of its steps are waiting on it); not ordered now");
            return Err(OrderError::Busy);
        };
        off_runtime(move || {
            let done = work();
            drop(place);
            done
        })
        .await
    }

    /// Checks what the CA issued (a chain and key that parse and match, a leaf for `name` not
    /// expired) before it replaces the stored file, then stores and installs it. An unusable one
    /// is the CA's failure, and the stored certificate, still good, is kept. Writes and reads a
    /// file: call it off the runtime's threads.
    fn store_issued(&self, name: &str, issued: &issue::Issued) -> Result<(), OrderError> {
        let store_err = |e: std::io::Error| OrderError::Store(e.to_string());
        let bundle = store::bundle(&issued.chain_pem, &issued.key_pem);
        self.certs
            .check_issued(name, bundle.as_bytes(), SystemTime::now())
            .map_err(|e| {
                OrderError::Ca(format!(
                    "the certificate issued is unusable ({e:#}); the stored one is kept"
                ))
            })?;
        self.store.write_bundle(name, &bundle).map_err(store_err)?;
        let (pem, modified) = self
            .store
            .read_cert(name)
            .ok_or_else(|| OrderError::Store("the stored certificate vanished".into()))?;
        self.certs
            .install(name, &pem, modified)
            .map_err(|e| OrderError::Store(format!("{e:#}")))?;
        self.export_expiry(name);
        Ok(())
    }

    /// Without ARI: when `renew_remaining` of the lifetime is left.
    fn fallback_renew_at(&self, held: &certs::Held) -> SystemTime {
        held.renew_at(self.config.renew_remaining)
    }

    /// When `name` is due: now without a certificate; the CA's ARI window when it offers one;
    /// else by lifetime.
    ///
    /// A CA found out of reach earlier in the pass is not asked again in it, and a name whose ask
    /// failed is asked again only after a backoff (`retry_min_secs` doubled up to
    /// `retry_max_secs`): meanwhile the time kept from its last answer, or the lifetime's, holds.
    async fn renew_at(&self, name: &str, schedule: &mut Schedule, pass: &mut Pass) -> SystemTime {
        let Some(held) = self.certs.held(name) else {
            return SystemTime::UNIX_EPOCH;
        };
        let fallback = self.fallback_renew_at(&held);
        if !self.config.ari {
            return fallback;
        }
        match schedule
            .ari
            .get(name)
            .map(|a| a.still(held.modified, Instant::now()))
        {
            Some(Still::Good(at)) => return at,
            Some(Still::Other) => {
                schedule.ari.remove(name);
            }
            Some(Still::AskAgain) | None => {}
        }
        // The time chosen in the window last given for this certificate, while the CA cannot
        // be asked.
        let kept = schedule
            .ari
            .get(name)
            .filter(|a| a.of == held.modified)
            .map_or(fallback, |a| a.at);
        if pass.ca_unreachable
            || schedule
                .ari_failed
                .get(name)
                .is_some_and(|(_, until)| Instant::now() < *until)
        {
            return kept;
        }
        let Some(id) = cert_id(&held) else {
            return fallback;
        };
        let issuer = match self.issuer().await {
            Ok(issuer) => issuer,
            Err(e) => {
                tracing::debug!(error = %e, "acme: no account; renewal times by lifetime this pass");
                pass.ca_unreachable = true;
                return kept;
            }
        };
        match issuer.renewal_window(&id).await {
            Err(failure) => {
                pass.ca_unreachable |= failure.unreachable;
                let failures = schedule.ari_failed.get(name).map_or(0, |f| f.0) + 1;
                let wait = self.backoff(failures, &OrderError::Ca(String::new()));
                tracing::debug!(%name, error = %failure.error, ask_again_in_secs = wait.as_secs(), "acme: no renewal information");
                schedule
                    .ari_failed
                    .insert(name.to_string(), (failures, Instant::now() + wait));
                kept
            }
            Ok(Some((start, end, ask_again))) => {
                schedule.ari_failed.remove(name);
                // One uniform pick per window (RFC 9773 §4.2): the same window asked again keeps
                // its time, as picking anew at every poll would pull renewals toward its start.
                // Never later than a sixth of the lifetime before expiry, whatever the window
                // says: an order takes time, and a late window must not outlive the certificate.
                let at = match schedule.ari.get(name) {
                    Some(ari) if ari.window == (start, end) => ari.at,
                    _ => pick_in(start, end).min(held.renew_at(self.config.renew_remaining / 2.0)),
                };
                tracing::debug!(%name, "acme: renewal time chosen in the CA's window (ARI)");
                let ask_again =
                    ask_again.clamp(Duration::from_secs(60), Duration::from_secs(6 * 3600));
                schedule.ari.insert(
                    name.to_string(),
                    Ari {
                        at,
                        ask_again: Instant::now() + ask_again,
                        window: (start, end),
                        of: held.modified,
                    },
                );
                at
            }
            Ok(None) => fallback,
        }
    }

    /// Every name the loop looks after: the configured ones, then, with on-demand issuance on,
    /// the other names held (issued on demand). A certificate held for a name in neither (taken
    /// out of the config) is still served until it expires, and not renewed.
    fn managed_names(&self) -> Vec<String> {
        let mut names = self.names.clone();
        if self.on_demand.is_none() {
            return names;
        }
        for (name, _) in self.certs.expiries() {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    /// Before an on-demand name (one not configured) is renewed, the ask URL is asked again, as
    /// before its first order: `Ok(false)` when it says no (a 4xx, or any other status but 2xx,
    /// 429 and 5xx, which are its trouble rather than a no, and are tried again as a failed
    /// order is).
    async fn still_allowed(&self, name: &str) -> Result<bool, OrderError> {
        let Some(od) = self
            .on_demand
            .as_ref()
            .filter(|_| !self.names.iter().any(|n| n == name))
        else {
            return Ok(true);
        };
        match od.ask_status(name).await {
            Ok(s) if s.is_success() => Ok(true),
            Ok(s) if s.is_server_error() || s == http::StatusCode::TOO_MANY_REQUESTS => {
                Err(OrderError::Setup(format!("the ask URL answered {s}")))
            }
            Ok(_) => Ok(false),
            Err(e) => Err(OrderError::Setup(format!(
                "the ask URL did not answer: {e:#}"
            ))),
        }
    }

    /// The renewal loop: passes one after another, each in a task of its own, so a pass that
    /// panics (a bug, here or in the ACME crate) is logged and tried again after a backoff
    /// instead of ending renewals for good.
    async fn run(self: Arc<Self>) {
        let schedule = Arc::new(tokio::sync::Mutex::new(Schedule::default()));
        let me = self.clone();
        supervise(
            move || {
                let (me, schedule) = (me.clone(), schedule.clone());
                async move {
                    let mut schedule = schedule.lock_owned().await;
                    me.pass(&mut schedule).await
                }
            },
            &self.wake,
            |panics| self.backoff(panics, &OrderError::Ca(String::new())),
        )
        .await
    }

    /// One pass: re-read the store, order what is missing or due, back off on failure; returns
    /// when the next is due.
    async fn pass(self: &Arc<Self>, schedule: &mut Schedule) -> Instant {
        let check = Duration::from_secs(self.config.check_secs);
        let mut pass = Pass::default();
        let mut next = Instant::now() + check;
        for name in self.managed_names() {
            self.refresh_off_runtime(&name).await;
            let modified = self.certs.held(&name).map(|h| h.modified);
            if let Some((_, at, of)) = schedule.retry.get(&name) {
                if *of != modified {
                    schedule.retry.remove(&name);
                    self.ask_refused().remove(&name);
                } else if Instant::now() < *at {
                    next = next.min(*at);
                    continue;
                }
            }
            let due = self.renew_at(&name, schedule, &mut pass).await;
            if let Ok(wait) = due.duration_since(SystemTime::now()) {
                next = next.min(Instant::now() + wait);
                continue;
            }
            let issued = match self.still_allowed(&name).await {
                Ok(true) => self.issue(&name, Kind::Kept).await,
                Ok(false) => {
                    // Asked again after `retry_max_secs` (the ask URL may allow it again);
                    // another node's renewal is still read from the directory meanwhile.
                    let wait = Duration::from_secs(self.config.retry_max_secs);
                    tracing::info!(%name, ask_again_in_secs = wait.as_secs(), "acme: the ask URL no longer allows this on-demand name; not renewed (its certificate is served until it expires)");
                    let at = Instant::now() + wait;
                    schedule.retry.insert(name.clone(), (0, at, modified));
                    self.ask_refused().insert(name.clone());
                    next = next.min(at);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(%name, error = %e, "acme: renewal of an on-demand name put off");
                    Err(e)
                }
            };
            match issued {
                Ok(()) => {
                    schedule.retry.remove(&name);
                    schedule.ari.remove(&name);
                    // The new certificate's renewal information is asked for at once.
                    schedule.ari_failed.remove(&name);
                    self.ask_refused().remove(&name);
                }
                Err(e) => {
                    // Waiting for the hour's budget is no failure of the name's.
                    let failed = u32::from(!matches!(e, OrderError::Throttled(..)));
                    let failures = schedule.retry.get(&name).map_or(0, |r| r.0) + failed;
                    let wait = self.backoff(failures, &e);
                    tracing::info!(%name, retry_in_secs = wait.as_secs(), "acme: will try again");
                    let at = Instant::now() + wait;
                    schedule
                        .retry
                        .insert(name.clone(), (failures, at, modified));
                    next = next.min(at);
                }
            }
        }
        next
    }

    /// `retry_min_secs` doubled per failure in a row, up to `retry_max_secs`; another node's
    /// order in progress is looked at again after the minimum.
    fn backoff(&self, failures: u32, e: &OrderError) -> Duration {
        let min = self.config.retry_min_secs;
        match e {
            OrderError::Locked | OrderError::Busy => return Duration::from_secs(min),
            // Tried again when an order of the hour's leaves it, not later.
            OrderError::Throttled(_, frees_in) => return (*frees_in).max(Duration::from_secs(1)),
            _ => {}
        }
        let secs = min.saturating_mul(1u64 << failures.saturating_sub(1).min(30));
        Duration::from_secs(secs.min(self.config.retry_max_secs))
    }
}

/// Runs `pass` again and again, each run in a task of its own, sleeping until the time it returns
/// or until `wake`. A run that panics is logged and the next starts after `after_panic(panics in
/// a row)`; the loop ends only with the runtime.
async fn supervise<F, P>(mut pass: F, wake: &Notify, after_panic: impl Fn(u32) -> Duration)
where
    F: FnMut() -> P,
    P: std::future::Future<Output = Instant> + Send + 'static,
{
    let mut panics = 0u32;
    loop {
        let next = match tokio::spawn(pass()).await {
            Ok(next) => {
                panics = 0;
                next
            }
            Err(e) if e.is_panic() => {
                panics = panics.saturating_add(1);
                let wait = after_panic(panics);
                tracing::error!(error = %e, retry_in_secs = wait.as_secs(), "acme: a renewal pass panicked; the renewal loop goes on");
                Instant::now() + wait
            }
            // Cancelled: the runtime is shutting down.
            Err(_) => return,
        };
        tokio::select! {
            _ = tokio::time::sleep_until(next.into()) => {}
            _ = wake.notified() => {}
        }
    }
}

/// The name a ClientHello's SNI asks for, as certificates are kept: lower-cased, without the
/// one trailing dot of a fully qualified name.
fn sni_name(raw: &str) -> String {
    let name = raw.strip_suffix('.').unwrap_or(raw);
    name.to_ascii_lowercase()
}

/// Upstream TLS's client settings (bundled and system roots, plus `extra`) without ALPN, which
/// the HTTPS connector sets itself.
pub(crate) fn http1_client_config(
    extra: &[rustls::pki_types::CertificateDer<'static>],
) -> rustls::ClientConfig {
    let mut config = (*crate::upstream::tls::client_config(true, false, extra)).clone();
    config.alpn_protocols.clear();
    config
}

/// The certificates of a PEM file (`acme.directory_ca`).
fn read_pem_certs(
    path: &std::path::Path,
) -> anyhow::Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    use rustls::pki_types::pem::PemObject;
    let certs = rustls::pki_types::CertificateDer::pem_file_iter(path)
        .with_context(|| format!("opening acme.directory_ca {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("reading acme.directory_ca {}", path.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "acme.directory_ca {} holds no PEM certificate",
        path.display()
    );
    Ok(certs)
}

/// The ARI identifier of a held certificate (its issuer's key id and its serial).
fn cert_id(held: &certs::Held) -> Option<CertificateIdentifier<'static>> {
    let leaf = held.key.cert.first()?;
    CertificateIdentifier::try_from(leaf)
        .ok()
        .map(CertificateIdentifier::into_owned)
}

/// Whether configured name `pattern` (`example.com`, `*.example.com`) names `name`; a wildcard
/// covers one label.
fn covered_by(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(parent) => name
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest.eq_ignore_ascii_case(parent)),
        None => pattern.eq_ignore_ascii_case(name),
    }
}

/// A uniformly random time in `[start, end]` (RFC 9773 section 4.2: spread renewals out).
fn pick_in(start: SystemTime, end: SystemTime) -> SystemTime {
    let span = end.duration_since(start).unwrap_or_default();
    let mut r = [0u8; 8];
    let _ = getrandom::getrandom(&mut r);
    let frac = (u64::from_le_bytes(r) >> 11) as f64 / (1u64 << 53) as f64;
    start + span.mul_f64(frac)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// What the fake CA's renewal-information endpoint does.
    #[derive(Clone, Copy)]
    enum AriAnswer {
        /// A window, with `Retry-After: 18446744073709551615`.
        HugeRetryAfter,
        /// No answer: a transport failure.
        Down,
    }

    /// A CA behind `client::Bounded`, as sluice's own client is: a directory, and renewal
    /// information answered as `ari` says (counted in `asks`).
    struct FakeCa {
        ari: AriAnswer,
        asks: Arc<AtomicUsize>,
    }

    impl client::Exchange for FakeCa {
        type Body = http_body_util::Full<bytes::Bytes>;

        fn send(
            &self,
            req: http::Request<instant_acme::BodyWrapper<bytes::Bytes>>,
        ) -> client::Answer<Self::Body> {
            let path = req.uri().path().to_string();
            let (ari, asks) = (self.ari, self.asks.clone());
            Box::pin(async move {
                let ok = |body: &str| {
                    http::Response::builder()
                        .status(200)
                        .header("content-type", "application/json")
                        .header("retry-after", "18446744073709551615")
                        .body(http_body_util::Full::new(bytes::Bytes::from(
                            body.to_string(),
                        )))
                        .unwrap()
                };
                if path == "/dir" {
                    return Ok(ok(
                        r#"{"newNonce":"https://ca.test/nonce","newAccount":"https://ca.test/acct","newOrder":"https://ca.test/order","renewalInfo":"https://ca.test/ari"}"#,
                    ));
                }
                asks.fetch_add(1, Ordering::SeqCst);
                match ari {
                    AriAnswer::HugeRetryAfter => Ok(ok(
                        r#"{"suggestedWindow":{"start":"2035-01-01T00:00:00Z","end":"2035-01-02T00:00:00Z"}}"#,
                    )),
                    AriAnswer::Down => Err("connection refused".into()),
                }
            })
        }
    }

    async fn fake_account(ari: AriAnswer, asks: Arc<AtomicUsize>) -> Account {
        use base64::Engine;
        let key = rcgen::KeyPair::generate().unwrap();
        let pkcs8 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key.serialize_der());
        let creds: AccountCredentials = serde_json::from_str(&format!(
            r#"{{"id":"https://ca.test/acct/1","key_pkcs8":"{pkcs8}","directory":"https://ca.test/dir"}}"#
        ))
        .unwrap();
        Account::builder_with_http(Box::new(client::Bounded::new(FakeCa { ari, asks })))
            .from_credentials(creds)
            .await
            .unwrap()
    }

    /// A stored bundle for `name` from a throwaway CA (its leaf has the authority key id ARI
    /// names a certificate by).
    fn issued_pem(name: &str) -> String {
        leaf_pem(name, |_| {})
    }

    /// A stored bundle for `name` whose leaf `adjust` has changed.
    fn leaf_pem(name: &str, adjust: impl FnOnce(&mut rcgen::CertificateParams)) -> String {
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let issuer = rcgen::Issuer::new(ca, rcgen::KeyPair::generate().unwrap());
        let key = rcgen::KeyPair::generate().unwrap();
        let mut leaf = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        leaf.use_authority_key_identifier_extension = true;
        adjust(&mut leaf);
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        store::bundle(&cert.pem(), &key.serialize_pem())
    }

    fn acme_in(dir: &std::path::Path, names: &[&str]) -> Arc<Acme> {
        let config = AcmeConfig {
            names: names.iter().map(|n| n.to_string()).collect(),
            state_dir: Some(dir.to_path_buf()),
            challenges: vec![config::Challenge::TlsAlpn01],
            retry_min_secs: 60,
            retry_max_secs: 600,
            ..AcmeConfig::default()
        };
        Acme::from_config(&config, &[], &mut Registry::default())
            .unwrap()
            .unwrap()
    }

    /// Sets `acme`'s account to one at a CA that does not answer (nothing here gets as far as
    /// asking it).
    async fn unreachable_issuer(acme: &Acme) {
        let issuer = Issuer {
            account: fake_account(AriAnswer::Down, Arc::default()).await,
            certs: acme.certs.clone(),
            dns: None,
            challenges: vec![config::Challenge::TlsAlpn01],
            timeout: Duration::from_secs(60),
        };
        assert!(acme.issuer.set(issuer).is_ok());
    }

    /// An ask URL that allows every name: each request answered 200 (and counted in `asks`).
    async fn ask_allowing_all(asks: Arc<AtomicUsize>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let asks = asks.clone();
                tokio::spawn(async move {
                    let (mut head, mut buf) = (Vec::new(), [0u8; 1024]);
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
                            _ => return,
                        }
                    }
                    asks.fetch_add(1, Ordering::SeqCst);
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                    let _ = conn.write_all(ok).await;
                });
            }
        });
        format!("http://{addr}/ask")
    }

    fn hold(acme: &Acme, name: &str) {
        let pem = issued_pem(name);
        acme.certs
            .install(name, pem.as_bytes(), SystemTime::now())
            .unwrap();
    }

    #[tokio::test]
    async fn a_huge_retry_after_from_the_ca_panics_nothing() {
        // instant-acme adds the CA's delay to the clock unchecked: u64::MAX seconds panicked
        // the renewal loop at its first ARI ask.
        let asks = Arc::new(AtomicUsize::new(0));
        let account = fake_account(AriAnswer::HugeRetryAfter, asks.clone()).await;
        let pem = issued_pem("a.example.com");
        use rustls::pki_types::pem::PemObject;
        let leaf = rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
            .next()
            .unwrap()
            .unwrap();
        let id = CertificateIdentifier::try_from(&leaf).unwrap();
        let (_, ask_again) = account.renewal_info(&id).await.unwrap();
        assert!(ask_again <= client::MOST_RETRY_AFTER, "{ask_again:?}");
        assert!(ask_again > Duration::from_secs(3600), "{ask_again:?}");
        assert_eq!(asks.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_renewal_pass_that_panics_does_not_end_the_loop() {
        let passes = Arc::new(AtomicUsize::new(0));
        let wake = Arc::new(Notify::new());
        let counted = passes.clone();
        let looping = tokio::spawn(async move {
            supervise(
                move || {
                    let n = counted.fetch_add(1, Ordering::SeqCst);
                    async move {
                        if n.is_multiple_of(2) {
                            panic!("a pass failed");
                        }
                        Instant::now() + Duration::from_millis(10)
                    }
                },
                &wake,
                |_| Duration::from_millis(20),
            )
            .await
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!looping.is_finished());
        assert!(passes.load(Ordering::SeqCst) >= 6, "{passes:?}");
        looping.abort();
    }

    #[test]
    fn on_demand_orders_use_half_the_hour_and_a_throttled_order_waits_for_a_place() {
        let mut budget = Budget::default();
        let start = Instant::now();
        for i in 0..5 {
            let at = start + Duration::from_secs(i * 60);
            assert_eq!(budget.take(10, Kind::OnDemand, at), Ok(()));
        }
        // Half of 10 used by on-demand names: the sixth waits until the first leaves the hour.
        let at = start + Duration::from_secs(600);
        assert_eq!(
            budget.take(10, Kind::OnDemand, at),
            Err(Duration::from_secs(3000))
        );
        // Configured names and renewals still have the other half.
        for _ in 0..5 {
            assert_eq!(budget.take(10, Kind::Kept, at), Ok(()));
        }
        // All used: a place frees when the oldest order leaves the hour, not a doubled wait.
        assert_eq!(
            budget.take(10, Kind::Kept, at),
            Err(Duration::from_secs(3000))
        );
        let dir = tempfile::tempdir().unwrap();
        let acme = acme_in(dir.path(), &["a.example.com"]);
        let throttled = OrderError::Throttled(10, Duration::from_secs(3000));
        for failures in [1, 5, 30] {
            assert_eq!(
                acme.backoff(failures, &throttled),
                Duration::from_secs(3000)
            );
        }
        assert_eq!(
            budget.take(10, Kind::Kept, start + Duration::from_secs(3600)),
            Ok(())
        );
    }

    #[test]
    fn an_unusable_certificate_from_the_ca_leaves_the_stored_one() {
        let dir = tempfile::tempdir().unwrap();
        let acme = acme_in(dir.path(), &["a.example.com"]);
        let good = issued_pem("a.example.com");
        acme.store.write_bundle("a.example.com", &good).unwrap();
        let other = issued_pem("other.example.com");
        let (other_chain, other_key) =
            other.split_at(other.find("-----BEGIN PRIVATE KEY").unwrap());
        let mismatched = issued_pem("a.example.com");
        let (_, foreign_key) =
            mismatched.split_at(mismatched.find("-----BEGIN PRIVATE KEY").unwrap());
        let (good_chain, _) = good.split_at(good.find("-----BEGIN PRIVATE KEY").unwrap());
        for (chain, key) in [
            ("garbage", "more garbage"),
            (other_chain, other_key),
            (good_chain, foreign_key),
        ] {
            let issued = issue::Issued {
                chain_pem: chain.to_string(),
                key_pem: key.to_string(),
            };
            let err = acme.store_issued("a.example.com", &issued).unwrap_err();
            assert_eq!(err.label(), "ca_error", "{err}");
            let (stored, _) = acme.store.read_cert("a.example.com").unwrap();
            assert_eq!(stored, good.as_bytes(), "{err}");
        }
        let fine = issued_pem("a.example.com");
        let (chain, key) = fine.split_at(fine.find("-----BEGIN PRIVATE KEY").unwrap());
        let issued = issue::Issued {
            chain_pem: chain.to_string(),
            key_pem: key.to_string(),
        };
        acme.store_issued("a.example.com", &issued).unwrap();
        assert!(acme.certs.held("a.example.com").is_some());
    }

    #[tokio::test]
    async fn a_ca_out_of_reach_is_asked_once_a_pass_and_each_name_backs_off() {
        let dir = tempfile::tempdir().unwrap();
        let names = ["a.example.com", "b.example.com", "c.example.com"];
        let acme = acme_in(dir.path(), &names);
        for n in names {
            hold(&acme, n);
        }
        let asks = Arc::new(AtomicUsize::new(0));
        let issuer = Issuer {
            account: fake_account(AriAnswer::Down, asks.clone()).await,
            certs: acme.certs.clone(),
            dns: None,
            challenges: vec![config::Challenge::TlsAlpn01],
            timeout: Duration::from_secs(60),
        };
        assert!(acme.issuer.set(issuer).is_ok());
        let mut schedule = Schedule::default();
        let mut pass = Pass::default();
        for n in names {
            let at = acme.renew_at(n, &mut schedule, &mut pass).await;
            assert_eq!(at, acme.fallback_renew_at(&acme.certs.held(n).unwrap()));
        }
        assert_eq!(asks.load(Ordering::SeqCst), 1, "one ask for the pass");
        // The next pass: the name that failed waits out its backoff; the others are asked.
        let mut pass = Pass::default();
        for n in names {
            acme.renew_at(n, &mut schedule, &mut pass).await;
        }
        assert_eq!(asks.load(Ordering::SeqCst), 2);
        // Their backoffs over.
        for failed in schedule.ari_failed.values_mut() {
            failed.1 = Instant::now();
        }
        let mut pass = Pass::default();
        for n in names {
            acme.renew_at(n, &mut schedule, &mut pass).await;
        }
        assert_eq!(asks.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_stalled_state_directory_leaves_the_runtime_serving() {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::OpenOptionsExt;
        let dir = tempfile::tempdir().unwrap();
        let config = AcmeConfig {
            names: vec!["a.example.com".into()],
            state_dir: Some(dir.path().to_path_buf()),
            challenges: vec![config::Challenge::TlsAlpn01],
            // No order is placed: the CA is never troubled.
            orders_per_hour: 0,
            ..AcmeConfig::default()
        };
        let acme = Acme::from_config(&config, &[], &mut Registry::default())
            .unwrap()
            .unwrap();
        unreachable_issuer(&acme).await;
        // The name's lock file is a FIFO: opening it to write waits for a reader, as an open
        // on a network file system whose server is away waits for the server.
        let fifo = dir.path().join("locks/a.example.com.lock");
        let path = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        let stall = Duration::from_secs(2);
        let reader = std::thread::spawn(move || {
            std::thread::sleep(stall);
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&fifo)
        });
        let ordering = acme.clone();
        let order = tokio::spawn(async move { ordering.issue("a.example.com", Kind::Kept).await });
        // This test's runtime has one thread: timers that fire on time show it is not the one
        // waiting in the open.
        let start = Instant::now();
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(start.elapsed() < stall / 2, "{:?}", start.elapsed());
        assert!(!order.is_finished());
        let _reader = reader.join().unwrap().unwrap();
        let result = tokio::time::timeout(Duration::from_secs(10), order)
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(result, Err(OrderError::Throttled(0, _))),
            "{result:?}"
        );
    }

    /// An on-demand service in `dir` whose ask URL allows every name (its asks counted), with
    /// `orders_per_hour` and one order a minute.
    async fn on_demand_in(
        dir: &std::path::Path,
        orders_per_hour: u32,
        asks: Arc<AtomicUsize>,
    ) -> Arc<Acme> {
        let config = AcmeConfig {
            state_dir: Some(dir.to_path_buf()),
            challenges: vec![config::Challenge::TlsAlpn01],
            // A CA that is not there: no account can be had.
            directory: "https://127.0.0.1:1/dir".into(),
            orders_per_hour,
            on_demand: config::OnDemandConfig {
                enabled: true,
                ask: Some(ask_allowing_all(asks).await),
                per_name_secs: 600,
                per_minute: 1,
                max_names: 100,
                wait_secs: 5,
            },
            ..AcmeConfig::default()
        };
        Acme::from_config(&config, &[], &mut Registry::default())
            .unwrap()
            .unwrap()
    }

    #[tokio::test]
    async fn an_on_demand_order_the_hour_has_no_place_for_gives_its_minute_back() {
        let dir = tempfile::tempdir().unwrap();
        let asks = Arc::new(AtomicUsize::new(0));
        // On-demand names may use half of one order an hour: none.
        let acme = on_demand_in(dir.path(), 1, asks.clone()).await;
        unreachable_issuer(&acme).await;
        let od = acme.on_demand.as_ref().unwrap();
        let name = "a.example.com";
        assert!(!acme.obtain(name).await);
        assert_eq!(asks.load(Ordering::SeqCst), 1);
        // No order was started: the minute's one order is still there for another name.
        assert!(od.may_order("b.example.com"));
        // Until the hour has a place (here: `per_name_secs`, sooner), the name's handshakes
        // are refused at the gate: no second look in the directory, ask, lock or warning each.
        for _ in 0..3 {
            assert!(!acme.obtain(name).await);
        }
        assert!(matches!(od.gate(name), Gate::Refused("recently_tried")));
        assert_eq!(asks.load(Ordering::SeqCst), 1);
    }

    /// Finding (a review of the mend): with every state-directory place held by steps stalled
    /// on the directory, an on-demand order ended as "another node's lock" and the name was
    /// forgotten, so each handshake for an allowed name asked the ask URL again for as long as
    /// the outage lasted. Now the name is put off for `retry_min_secs`.
    #[tokio::test]
    async fn a_name_not_ordered_for_a_stalled_directory_is_not_asked_about_again() {
        let dir = tempfile::tempdir().unwrap();
        let asks = Arc::new(AtomicUsize::new(0));
        let acme = on_demand_in(dir.path(), 100, asks.clone()).await;
        unreachable_issuer(&acme).await;
        // Every place taken, as by steps waiting on a directory that does not answer.
        let _stalled = acme
            .state_steps
            .clone()
            .acquire_many_owned(STATE_STEPS as u32)
            .await
            .unwrap();
        let name = "a.example.com";
        assert!(!acme.obtain(name).await);
        assert_eq!(asks.load(Ordering::SeqCst), 1);
        for _ in 0..3 {
            assert!(!acme.obtain(name).await);
        }
        assert_eq!(asks.load(Ordering::SeqCst), 1);
        let od = acme.on_demand.as_ref().unwrap();
        assert!(matches!(od.gate(name), Gate::Refused("recently_tried")));
        // Its minute's place was given back.
        assert!(od.may_order("b.example.com"));
    }

    #[tokio::test]
    async fn an_on_demand_order_not_placed_gives_its_minute_back() {
        let dir = tempfile::tempdir().unwrap();
        let acme = on_demand_in(dir.path(), 100, Arc::default()).await;
        let od = acme.on_demand.as_ref().unwrap();
        // Another node issued the name just before this one took its lock: that certificate is
        // used, no order placed.
        let name = "a.example.com";
        let Gate::Start(tx) = od.gate(name) else {
            panic!("starts")
        };
        acme.store.write_bundle(name, &issued_pem(name)).unwrap();
        let place = od.place(name).await.unwrap();
        assert!(acme.ask_and_issue(name, place).await);
        od.done(name, tx, true);
        assert!(od.may_order("c.example.com"), "the minute's order kept");
        od.give_back("c.example.com");
        // No account could be had (the CA is not there): no order placed either.
        let name = "b.example.com";
        let Gate::Start(tx) = od.gate(name) else {
            panic!("starts")
        };
        let place = od.place(name).await.unwrap();
        assert!(!acme.ask_and_issue(name, place).await);
        od.done(name, tx, false);
        assert!(acme.issuer.get().is_none());
        assert!(od.may_order("c.example.com"), "the minute's order kept");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn orders_waiting_on_a_stalled_state_directory_are_bounded() {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::OpenOptionsExt;
        let dir = tempfile::tempdir().unwrap();
        let acme = acme_in(dir.path(), &["x.example.com"]);
        unreachable_issuer(&acme).await;
        // Each name's lock file is a FIFO: opening it waits for a reader, as an open on a
        // network file system whose server is away waits for the server.
        let names: Vec<String> = (0..STATE_STEPS).map(|i| format!("n{i}.test")).collect();
        let fifos: Vec<_> = names
            .iter()
            .map(|n| dir.path().join(format!("locks/{n}.lock")))
            .collect();
        for fifo in &fifos {
            let path = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
            // SAFETY: a NUL-terminated path that outlives the call.
            assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        }
        /// The server back, whatever this test asserted: a reader opens each FIFO, so no
        /// blocking thread stays in its open (the runtime's end would wait for it).
        struct Unstall(Vec<std::path::PathBuf>);
        impl Drop for Unstall {
            fn drop(&mut self) {
                for fifo in &self.0 {
                    let _ = std::fs::OpenOptions::new()
                        .read(true)
                        .custom_flags(libc::O_NONBLOCK)
                        .open(fifo);
                }
            }
        }
        let unstall = Unstall(fifos);
        let stalled: Vec<_> = names
            .iter()
            .map(|n| {
                let (acme, n) = (acme.clone(), n.clone());
                tokio::spawn(async move { acme.issue(&n, Kind::OnDemand).await })
            })
            .collect();
        // Time for each to reach its open.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(stalled.iter().all(|o| !o.is_finished()));
        // One more is not tried: no thread more waits on the directory, and its lock file is
        // never opened.
        let more = tokio::time::timeout(
            Duration::from_secs(1),
            acme.issue("more.test", Kind::OnDemand),
        )
        .await
        .unwrap();
        assert!(matches!(more, Err(OrderError::Busy)), "{more:?}");
        assert!(!dir.path().join("locks/more.test.lock").exists());
        // The server is back: the stalled steps end and give their places back.
        drop(unstall);
        for order in stalled {
            let done = tokio::time::timeout(Duration::from_secs(10), order)
                .await
                .unwrap()
                .unwrap();
            // A FIFO takes no flock: the order goes no further.
            assert!(done.is_err(), "{done:?}");
        }
        assert_eq!(acme.state_steps.available_permits(), STATE_STEPS);
    }

    #[test]
    fn a_refused_stored_file_is_not_read_again_until_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let a = "a.example.com";
        let acme = acme_in(dir.path(), &[a]);
        let early = SystemTime::UNIX_EPOCH + Duration::from_secs(1);
        acme.certs
            .install(a, issued_pem(a).as_bytes(), early)
            .unwrap();
        let path = acme.store.cert_path(a);
        let set_time = |t: SystemTime| {
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(t)
                .unwrap()
        };
        let then = SystemTime::now() - Duration::from_secs(100);
        acme.store
            .write_bundle(a, &issued_pem("other.example.com"))
            .unwrap();
        set_time(then);
        acme.refresh_from_store(a);
        assert_eq!(acme.certs.held(a).unwrap().modified, early);
        // The same file unchanged: remembered as refused.
        acme.refresh_from_store(a);
        assert_eq!(acme.certs.held(a).unwrap().modified, early);
        assert_eq!(acme.refused().len(), 1);
        // Rewritten in place within the same time (a writer that truncates and writes, read half
        // written before): its length tells it from the refused one; read, and taken up.
        std::fs::write(&path, issued_pem(a)).unwrap();
        set_time(then);
        acme.refresh_from_store(a);
        assert_eq!(acme.certs.held(a).unwrap().modified, then);
        assert!(acme.refused().is_empty());
        // A new time: read, and taken up.
        let now = SystemTime::now();
        set_time(now);
        acme.refresh_from_store(a);
        assert_eq!(acme.certs.held(a).unwrap().modified, now);
        assert!(acme.refused().is_empty());
        // Refused again; then another file put in its place (a node's `write_bundle`) with the
        // same time is read.
        std::fs::write(&path, issued_pem("other.example.com")).unwrap();
        let later = now + Duration::from_secs(1);
        set_time(later);
        acme.refresh_from_store(a);
        assert_eq!(acme.certs.held(a).unwrap().modified, now);
        acme.store.write_bundle(a, &issued_pem(a)).unwrap();
        set_time(later);
        acme.refresh_from_store(a);
        assert_eq!(acme.certs.held(a).unwrap().modified, later);
    }

    #[test]
    fn a_stored_certificate_for_another_name_is_never_used_nor_an_expired_one_over_one_held() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let (a, b) = ("a.example.com", "b.example.com");
        store
            .write_bundle(a, &issued_pem("other.example.com"))
            .unwrap();
        let expired = leaf_pem(b, |leaf| {
            leaf.not_before = rcgen::date_time_ymd(2000, 1, 1);
            leaf.not_after = rcgen::date_time_ymd(2001, 1, 1);
        });
        store.write_bundle(b, &expired).unwrap();
        let acme = acme_in(dir.path(), &[a, b]);
        let now = SystemTime::now();
        assert!(acme.certs.held(a).is_none());
        assert!(acme.certs.certificate(a).is_none());
        assert!(!acme.certs.covers(a, now));
        // With none held, an expired one of the name's own is served (a client sees why it
        // fails) but covers nothing, so it is ordered again.
        assert!(acme.certs.held(b).is_some());
        assert!(!acme.certs.covers(b, now));
        // A good certificate held stays when a newer file on disk holds a foreign one, or an
        // expired one of its own.
        let early = SystemTime::UNIX_EPOCH + Duration::from_secs(1);
        for (name, file) in [(a, issued_pem("other.example.com")), (b, expired)] {
            acme.certs
                .install(name, issued_pem(name).as_bytes(), early)
                .unwrap();
            store.write_bundle(name, &file).unwrap();
            acme.refresh_from_store(name);
            assert_eq!(acme.certs.held(name).unwrap().modified, early, "{name}");
            assert!(acme.certs.covers(name, now), "{name}");
        }
        // A good one written there is taken up.
        store.write_bundle(a, &issued_pem(a)).unwrap();
        acme.refresh_from_store(a);
        assert_ne!(acme.certs.held(a).unwrap().modified, early);
        assert!(acme.certs.covers(a, now));
    }

    #[test]
    fn a_fully_qualified_sni_names_the_same_host() {
        assert_eq!(sni_name("A.Example.com."), "a.example.com");
        assert_eq!(sni_name("a.example.com"), "a.example.com");
    }

    #[test]
    fn a_kept_renewal_time_holds_for_its_own_certificate_only() {
        let held = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let at = held + Duration::from_secs(50_000);
        let now = Instant::now();
        let ari = Ari {
            at,
            ask_again: now + Duration::from_secs(3600),
            window: (at, at + Duration::from_secs(10)),
            of: held,
        };
        assert_eq!(ari.still(held, now), Still::Good(at));
        assert_eq!(
            ari.still(held, now + Duration::from_secs(3601)),
            Still::AskAgain
        );
        // Another node renewed the name: the time chosen for the old certificate would have
        // this node order a second new one when it comes.
        let renewed = held + Duration::from_secs(40_000);
        assert_eq!(ari.still(renewed, now), Still::Other);
        assert_eq!(
            ari.still(renewed, now + Duration::from_secs(3601)),
            Still::Other
        );
    }

    #[test]
    fn configured_names_and_wildcards_cover_one_label() {
        assert!(covered_by("a.example.com", "a.example.com"));
        assert!(covered_by("a.example.com", "A.Example.com"));
        assert!(!covered_by("a.example.com", "b.example.com"));
        assert!(covered_by("*.example.com", "a.example.com"));
        assert!(!covered_by("*.example.com", "example.com"));
        assert!(!covered_by("*.example.com", "a.b.example.com"));
        assert!(!covered_by("*.example.com", ".example.com"));
        assert!(!covered_by("*.example.com", "aexample.com"));
    }
}
