//! TLS session resumption, on by default and shared by every listener across reloads: stateless
//! tickets (TLS 1.3 and 1.2) under a key that rotates every six hours, and a session-ID cache for
//! TLS 1.2 clients that take no tickets.

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
