//! The application traffic secrets of the handshake being polled, kept for the connection's own
//! record layer (`own`), which needs them to follow key updates: rustls hands them to a key log
//! only, so sluice's key log passes them to the handshake that is running on this thread, and
//! nowhere else (nothing is written, nothing outlives the connection).

use std::cell::RefCell;
use std::future::Future;
use std::pin::pin;

use rustls::crypto::tls13::OkmBlock;

/// The two secrets of one TLS 1.3 handshake, as they are derived.
#[derive(Default)]
pub struct Secrets {
    pub client: Option<OkmBlock>,
    pub server: Option<OkmBlock>,
}

thread_local! {
    /// The secrets of the handshake this thread is polling, while it polls it.
    static POLLING: RefCell<Option<Secrets>> = const { RefCell::new(None) };
}

/// The key log of the listeners' TLS settings: it keeps the two application traffic secrets
/// of a handshake polled through `capture`, and ignores every other label and handshake
/// (QUIC's, the TCP proxy's, TLS 1.2's).
#[derive(Debug)]
pub struct KeepTrafficSecrets;

impl rustls::KeyLog for KeepTrafficSecrets {
    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        POLLING.with(|p| {
            if let Some(s) = p.borrow_mut().as_mut() {
                let block = Some(OkmBlock::new(secret));
                match label {
                    "CLIENT_TRAFFIC_SECRET_0" => s.client = block,
                    "SERVER_TRAFFIC_SECRET_0" => s.server = block,
                    _ => {}
                }
            }
        })
    }

    fn will_log(&self, label: &str) -> bool {
        matches!(label, "CLIENT_TRAFFIC_SECRET_0" | "SERVER_TRAFFIC_SECRET_0")
    }
}

/// Runs the handshake `fut`, keeping the traffic secrets it derives.
pub async fn capture<F: Future>(fut: F) -> (F::Output, Secrets) {
    let mut fut = pin!(fut);
    let mut mine = Some(Secrets::default());
    let out = std::future::poll_fn(|cx| {
        POLLING.with(|p| *p.borrow_mut() = mine.take());
        // Emptied again however the poll ends, a panic included.
        let _clear = Clear;
        let r = fut.as_mut().poll(cx);
        mine = POLLING.with(|p| p.borrow_mut().take());
        r
    })
    .await;
    (out, mine.unwrap_or_default())
}

struct Clear;

impl Drop for Clear {
    fn drop(&mut self) {
        POLLING.with(|p| p.borrow_mut().take());
    }
}
