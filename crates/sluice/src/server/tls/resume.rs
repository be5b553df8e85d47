//! TLS session resumption, on by default and shared by every listener across reloads: stateless
//! tickets (TLS 1.3 and 1.2) under a key that rotates every six hours, and a session-ID cache for
//! TLS 1.2 clients that take no tickets. With 0-RTT on (HTTP/3 only), TLS 1.3 resumption is by
//! that cache alone: each session can be resumed once, which is what keeps one early-data
//! request from being replayed (rustls offers early data only that way).

use std::sync::{Arc, OnceLock};

use rustls::server::{ProducesTickets, ServerSessionMemoryCache, StoresServerSessions};
use rustls::ServerConfig;

/// Session IDs kept for TLS 1.2 clients without tickets; an entry is a few hundred bytes and
/// the map grows only as clients arrive.
const SESSION_IDS: usize = 20_000;

/// One ticket per TLS 1.3 handshake: a client that resumes gets a fresh one each time, so a second
/// only helps one that opens parallel connections, and each costs an encryption.
const TLS13_TICKETS: usize = 1;

/// What every server config shares: built once, so a reload keeps the sessions clients hold.
struct Shared {
    /// `None` when the system gave no randomness for a ticket key (then IDs alone).
    tickets: Option<Arc<dyn ProducesTickets>>,
    ids: Arc<dyn StoresServerSessions>,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| Shared {
        tickets: match crate::crypto::ticketer() {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "no TLS session tickets (key generation failed)");
                None
            }
        },
        ids: ServerSessionMemoryCache::new(SESSION_IDS),
    })
}

/// Turns resumption on in `config`.
pub fn enable(config: &mut ServerConfig) {
    let shared = shared();
    if let Some(tickets) = &shared.tickets {
        config.ticketer = tickets.clone();
    }
    config.session_storage = shared.ids.clone();
    config.send_tls13_tickets = TLS13_TICKETS;
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
