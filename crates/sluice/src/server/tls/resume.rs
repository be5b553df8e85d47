//! TLS session resumption, on by default and kept across reloads: stateless tickets (TLS 1.3 and
//! 1.2) under a key that rotates every six hours, and a session-ID cache for TLS 1.2 clients that
//! take no tickets. The HTTPS listeners (and HTTP/3) share one set; each `[[tcp]]` TLS listener
//! has its own, since a session resumes without its certificate being shown again: shared, a
//! session from the web listeners would let a client (or an attacker who redirects it) into a
//! `[[tcp]]` listener's backend under a name that listener's certificate does not cover. With
//! 0-RTT on (HTTP/3 only), TLS 1.3 resumption is by that cache alone: each session can be
//! resumed once, which is what keeps one early-data request from being replayed (rustls offers
//! early data only that way).

use std::sync::{Arc, OnceLock};

use rustls::server::{ProducesTickets, ServerSessionMemoryCache, StoresServerSessions};
use rustls::ServerConfig;

/// Session IDs kept for TLS 1.2 clients without tickets; an entry is a few hundred bytes and
/// the map grows only as clients arrive.
const SESSION_IDS: usize = 20_000;

/// One ticket per TLS 1.3 handshake: a client that resumes gets a fresh one each time, so a second
/// only helps one that opens parallel connections, and each costs an encryption.
const TLS13_TICKETS: usize = 1;

/// What the server configs of one TLS identity share: built once, so a reload keeps the sessions
/// clients hold.
#[derive(Clone)]
struct Shared {
    /// `None` when the system gave no randomness for a ticket key (then IDs alone).
    tickets: Option<Arc<dyn ProducesTickets>>,
    ids: Arc<dyn StoresServerSessions>,
}

impl Shared {
    fn new(ids: usize) -> Shared {
        Shared {
            tickets: match crate::crypto::ticketer() {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!(error = %e, "no TLS session tickets (key generation failed)");
                    None
                }
            },
            ids: ServerSessionMemoryCache::new(ids),
        }
    }

    fn apply(&self, config: &mut ServerConfig) {
        if let Some(tickets) = &self.tickets {
            config.ticketer = tickets.clone();
        }
        config.session_storage = self.ids.clone();
        config.send_tls13_tickets = TLS13_TICKETS;
    }
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| Shared::new(SESSION_IDS))
}

/// Session IDs kept per `[[tcp]]` TLS listener (TLS 1.2 clients without tickets only).
const SESSION_IDS_APART: usize = 256;

type Apart = std::sync::Mutex<std::collections::HashMap<String, Shared>>;

fn apart() -> std::sync::MutexGuard<'static, std::collections::HashMap<String, Shared>> {
    static APART: OnceLock<Apart> = OnceLock::new();
    APART
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Turns resumption on in `config`, sharing the HTTPS listeners' sessions.
pub fn enable(config: &mut ServerConfig) {
    shared().apply(config);
}

/// Turns resumption on in `config` with sessions of its own, kept by `identity` across reloads
/// (a `[[tcp]]` listener's name with its certificate's files: a listener given another
/// certificate starts afresh): a session from any other listener does not resume here.
pub fn enable_apart(config: &mut ServerConfig, identity: &str) {
    apart()
        .entry(identity.to_string())
        .or_insert_with(|| Shared::new(SESSION_IDS_APART))
        .apply(config);
}

/// Lets go of the sessions of the identities in `gone` (listeners a reload removed or gave
/// another certificate). Only those: another `TcpProxy` in the process (tests start many) keeps
/// its own, where letting go of every identity but the committing proxy's dropped them.
pub fn forget_apart(gone: &[String]) {
    if gone.is_empty() {
        return;
    }
    apart().retain(|identity, _| !gone.contains(identity));
}

/// Resumption for a config that takes 0-RTT early data: sessions from the cache only, no
/// stateless tickets, so each ticket a client holds resumes (and carries early data) once.
pub fn single_use_sessions(config: &mut ServerConfig) {
    config.ticketer = Arc::new(NoTickets);
    config.session_storage = shared().ids.clone();
}

#[derive(Debug)]
struct NoTickets;

impl ProducesTickets for NoTickets {
    fn enabled(&self) -> bool {
        false
    }
    fn lifetime(&self) -> u32 {
        0
    }
    fn encrypt(&self, _plain: &[u8]) -> Option<Vec<u8>> {
        None
    }
    fn decrypt(&self, _cipher: &[u8]) -> Option<Vec<u8>> {
        None
    }
}
