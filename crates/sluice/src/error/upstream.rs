//! Why an upstream exchange failed: the connection setup (`ConnectError`) or the exchange before
//! a response head (`UpstreamError`). A leaf, so the proxy error can map them without importing
//! the client that raises them.

use std::io;
use std::net::IpAddr;

/// What a client is told about a refused upstream address: its class, never the address.
fn refused_text(host: &str, reason: &str) -> String {
    if reason == OWN_LISTENER {
        format!("{host} is {reason}: fetching it would make sluice its own origin (a loop)")
    } else {
        format!(
            "{host} resolves to a {reason} address; set upstream.allow_private \
             (--allow-private-upstreams) to allow it"
        )
    }
}

/// `host:port`, with an IPv6 literal in brackets.
fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A socket error as a user reads it: `connection refused`, not `Connection refused (os error
/// 111)`.
fn plain_io(e: &io::Error) -> String {
    let text = e.to_string();
    let text = text.split(" (os error").next().unwrap_or(&text);
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text.to_string(),
    }
}

/// The refusal class of an address this sluice itself listens on.
pub(crate) const OWN_LISTENER: &str = "this sluice's own listener";

/// Why a connection could not be set up. Carried through the pool as the error's source.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The message names the class only: the resolved address stays in the debug log.
    #[error("{}", refused_text(host, reason))]
    Refused {
        host: String,
        ip: IpAddr,
        reason: &'static str,
    },
    #[error("cannot resolve {host}: {source}")]
    Dns { host: String, source: io::Error },
    #[error("cannot connect to {}: {}", authority(host, *port), plain_io(source))]
    Connect {
        host: String,
        port: u16,
        source: io::Error,
    },
    #[error("connecting to {host} took longer than {secs} s")]
    Timeout { host: String, secs: u64 },
    #[error("outgoing proxy for {host} failed: {source}")]
    Proxy { host: String, source: io::Error },
    #[error("TLS with {host} failed: {source}")]
    Tls { host: String, source: io::Error },
    #[error("URL has no host")]
    NoHost,
}

/// Why an upstream exchange failed before a response head arrived.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("upstream {host} sent no response head within {secs} s")]
    HeaderTimeout { host: String, secs: u64 },
    #[error("upstream {host} redirected more than {limit} times")]
    TooManyRedirects { host: String, limit: usize },
    /// Made by [`UpstreamError::bad_redirect`], which masks and cuts `location`.
    #[error("upstream {host} sent an unusable redirect: {location}")]
    BadRedirect { host: String, location: String },
    /// A redirect to a host the caller's own host rules refuse (`[media.forward]`); `host` is
    /// the refused one.
    #[error("a redirect led to {host}, which is not allowed")]
    RedirectRefused { host: String },
    #[error("upstream {host}: {detail}")]
    Protocol { host: String, detail: String },
}

/// The most of a refused redirect's `Location` a [`UpstreamError::BadRedirect`] keeps, in bytes.
pub const REDIRECT_SHOWN: usize = 256;

impl UpstreamError {
    /// A redirect whose `Location` cannot be followed. The value is the origin's: any length up
    /// to a header block (16 of 64 KiB filled the log's 1 MiB queue) and perhaps a credential
    /// (`user:pass@`, a token in its query). It goes to the log and to the client, so it is kept
    /// masked (`redact::mask_url`, before the cut: a cut user info would no longer be found)
    /// and cut to [`REDIRECT_SHOWN`] bytes, `...` marking a cut.
    pub fn bad_redirect(host: String, location: &[u8]) -> UpstreamError {
        let masked = crate::redact::mask_url(&String::from_utf8_lossy(location));
        let location = if masked.len() <= REDIRECT_SHOWN {
            masked
        } else {
            let mut end = REDIRECT_SHOWN - 3;
            while !masked.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}...", &masked[..end])
        };
        UpstreamError::BadRedirect { host, location }
    }

    /// The upstream host the error concerns.
    pub fn host(&self) -> Option<&str> {
        match self {
            UpstreamError::Connect(ConnectError::Refused { host, .. })
            | UpstreamError::Connect(ConnectError::Dns { host, .. })
            | UpstreamError::Connect(ConnectError::Connect { host, .. })
            | UpstreamError::Connect(ConnectError::Timeout { host, .. })
            | UpstreamError::Connect(ConnectError::Proxy { host, .. })
            | UpstreamError::Connect(ConnectError::Tls { host, .. })
            | UpstreamError::HeaderTimeout { host, .. }
            | UpstreamError::TooManyRedirects { host, .. }
            | UpstreamError::BadRedirect { host, .. }
            | UpstreamError::RedirectRefused { host }
            | UpstreamError::Protocol { host, .. } => Some(host),
            UpstreamError::Connect(ConnectError::NoHost) => None,
        }
    }
}
