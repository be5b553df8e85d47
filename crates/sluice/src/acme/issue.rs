//! One order (RFC 8555 section 7.4): challenges opened, answered, closed again whatever happens;
//! a new key and CSR; the chain fetched. Failures say why, in the CA's words where it gave any.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use instant_acme::{
    Account, AuthorizationStatus, CertificateIdentifier, ChallengeType, Identifier, NewOrder,
    OrderStatus, RetryPolicy,
};

use super::certs::Certs;
use super::config::Challenge;
use super::dns::Updater;

/// Why an order failed; the outcome label says what kind.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    /// The CA refused for its rate limits (`rateLimited`).
    #[error("rate limited by the CA: {0}")]
    RateLimited(String),
    /// A challenge was not validated, or the CA refused the names.
    #[error("not authorized: {0}")]
    Invalid(String),
    /// The CA could not be reached, answered an error, or took too long.
    #[error("CA error: {0}")]
    Ca(String),
    /// Ours, this host's setup: a challenge could not be set up (DNS update refused, ...), or the
    /// CA would not make the account as configured (`[acme.eab]`).
    #[error("set-up failed: {0}")]
    Setup(String),
    /// The state directory could not take the certificate.
    #[error("state directory: {0}")]
    Store(String),
    /// Another node holds this name's lock (it is ordering it now).
    #[error("another node is ordering this name")]
    Locked,
    /// Not ordered: as many of this node's state-directory steps as it allows are waiting on
    /// the directory (a stalled network file system).
    #[error("the state directory is not answering; not ordered now")]
    Busy,
    /// Not ordered: this node's own `acme.orders_per_hour` is used up (for an on-demand name: its
    /// half); a place frees in the time given.
    #[error("acme.orders_per_hour ({0}) reached; not ordered (a place frees in {secs} s)", secs = .1.as_secs())]
    Throttled(u32, Duration),
}

impl OrderError {
    /// The `outcome` label of `sluice_acme_orders_total`.
    pub fn label(&self) -> &'static str {
        match self {
            OrderError::RateLimited(_) => "rate_limited",
            OrderError::Invalid(_) => "invalid",
            OrderError::Ca(_) => "ca_error",
            OrderError::Setup(_) => "setup_error",
            OrderError::Store(_) => "store_error",
            OrderError::Locked => "locked",
            OrderError::Busy => "busy",
            OrderError::Throttled(..) => "throttled",
        }
    }
}

impl From<instant_acme::Error> for OrderError {
    fn from(e: instant_acme::Error) -> Self {
        match &e {
            instant_acme::Error::Api(p) => {
                let kind = p.r#type.as_deref().unwrap_or("");
                // RFC 8555 §6.7: the problems of a validation that failed, and of names the
                // CA will not issue for, are the order's (invalid), not the CA's.
                const INVALID: [&str; 7] = [
                    ":unauthorized",
                    ":rejectedIdentifier",
                    ":caa",
                    ":connection",
                    ":dns",
                    ":incorrectResponse",
                    ":tls",
                ];
                if kind.ends_with(":rateLimited") {
                    OrderError::RateLimited(p.to_string())
                } else if INVALID.iter().any(|k| kind.ends_with(k)) {
                    OrderError::Invalid(p.to_string())
                } else {
                    OrderError::Ca(p.to_string())
                }
            }
            _ => OrderError::Ca(e.to_string()),
        }
    }
}

/// Whether an order refused as a renewal (`replaces`, RFC 9773 §5) is placed again as a plain
/// order at once. Naming the certificate it replaces is a courtesy to the CA, so a CA without ARI,
/// or one that refuses the request (a 4xx problem: `alreadyReplaced` when an earlier order of
/// ours finished at the CA but never reached the state directory, `malformed`, `conflict`) is
/// asked plainly; asking again with the same field would fail the same way at every retry until
/// the certificate expired. Its rate limits, its own failures (5xx) and a CA out of reach (a
/// transport error) are not worked around: the retry's backoff handles those. A CA that took
/// the order without echoing the field is asked plainly too (its order is left unfinished).
fn plain_order_after(e: &instant_acme::Error) -> bool {
    match e {
        instant_acme::Error::Unsupported(_) => true,
        instant_acme::Error::Api(p) => {
            p.status.is_some_and(|s| (400..500).contains(&s))
                && !p
                    .r#type
                    .as_deref()
                    .is_some_and(|t| t.ends_with(":rateLimited"))
        }
        instant_acme::Error::Other(e) => e.to_string().starts_with("replaces field mismatch"),
        _ => false,
    }
}

/// Why the CA's renewal information could not be had.
#[derive(Debug)]
pub struct AriFailure {
    /// The CA gave no answer (rather than an error or an answer not understood).
    pub unreachable: bool,
    pub error: String,
}

/// What an issued order yields.
pub struct Issued {
    pub chain_pem: String,
    pub key_pem: String,
}

/// A challenge set up for one authorization, undone after the order.
enum Opened {
    Http(String),
    Alpn(String),
    Dns(String, String),
}

/// Places orders for one account.
pub struct Issuer {
    pub account: Account,
    pub certs: Arc<Certs>,
    pub dns: Option<Arc<Updater>>,
    pub challenges: Vec<Challenge>,
    pub timeout: Duration,
}

impl Issuer {
    /// Orders a certificate for `name` (`replaces`: the one it renews, for ARI).
    pub async fn order(
        &self,
        name: &str,
        replaces: Option<CertificateIdentifier<'static>>,
    ) -> Result<Issued, OrderError> {
        let mut opened = Vec::new();
        let result = tokio::time::timeout(self.timeout, self.run(name, replaces, &mut opened))
            .await
            .unwrap_or_else(|_| {
                Err(OrderError::Ca(format!(
                    "no certificate within {} s",
                    self.timeout.as_secs()
                )))
            });
        for o in opened {
            match o {
                Opened::Http(token) => {
                    let certs = self.certs.clone();
                    let _ =
                        tokio::task::spawn_blocking(move || certs.close_http_token(&token)).await;
                }
                Opened::Alpn(name) => {
                    let certs = self.certs.clone();
                    let _ = tokio::task::spawn_blocking(move || certs.close_alpn_challenge(&name))
                        .await;
                }
                Opened::Dns(name, value) => {
                    if let Some(dns) = &self.dns {
                        if let Err(e) = dns.remove_txt(&name, &value).await {
                            tracing::warn!(%name, error = %e, "cannot remove the DNS-01 TXT record");
                        }
                    }
                }
            }
        }
        result
    }

    async fn run(
        &self,
        name: &str,
        replaces: Option<CertificateIdentifier<'static>>,
        opened: &mut Vec<Opened>,
    ) -> Result<Issued, OrderError> {
        let identifiers = [Identifier::Dns(name.to_string())];
        let plain = NewOrder::new(&identifiers);
        let mut order = match replaces {
            Some(r) => match self.account.new_order(&plain.replaces(r)).await {
                Ok(order) => order,
                Err(e) if plain_order_after(&e) => {
                    tracing::info!(%name, error = %e, "acme: not taken as a renewal; ordering anew");
                    self.account.new_order(&NewOrder::new(&identifiers)).await?
                }
                Err(e) => return Err(e.into()),
            },
            None => self.account.new_order(&plain).await?,
        };
        let mut authorizations = order.authorizations();
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz?;
            match authz.status {
                AuthorizationStatus::Valid => continue,
                AuthorizationStatus::Pending => {}
                other => return Err(OrderError::Invalid(format!("authorization is {other:?}"))),
            }
            let wildcard = authz.wildcard;
            let Identifier::Dns(domain) = authz.identifier().identifier.clone() else {
                return Err(OrderError::Invalid("not a DNS identifier".into()));
            };
            let offered: Vec<ChallengeType> =
                authz.challenges.iter().map(|c| c.r#type.clone()).collect();
            let Some(kind) = self.pick(wildcard, &offered) else {
                return Err(OrderError::Invalid(format!(
                    "no configured challenge type among those offered for {domain}: {offered:?}"
                )));
            };
            let mut challenge = authz
                .challenge(wire_type(kind))
                .ok_or_else(|| OrderError::Invalid("challenge vanished".into()))?;
            let key_auth = challenge.key_authorization();
            match kind {
                Challenge::Http01 => {
                    // Pushed first, so the close runs even when the order times out during
                    // the write. (A write still running then may finish after the close and
                    // leave its record behind: the start-up sweep takes it.)
                    opened.push(Opened::Http(challenge.token.clone()));
                    let (certs, token) = (self.certs.clone(), challenge.token.clone());
                    let key_auth = key_auth.as_str().to_string();
                    let _ = tokio::task::spawn_blocking(move || {
                        certs.open_http_token(&token, &key_auth)
                    })
                    .await;
                }
                Challenge::TlsAlpn01 => {
                    opened.push(Opened::Alpn(domain.clone()));
                    let (certs, name) = (self.certs.clone(), domain.clone());
                    let digest = key_auth.digest().as_ref().to_vec();
                    tokio::task::spawn_blocking(move || certs.open_alpn_challenge(&name, &digest))
                        .await
                        .map_err(|e| OrderError::Setup(e.to_string()))?
                        .map_err(|e| OrderError::Setup(e.to_string()))?;
                }
                Challenge::Dns01 => {
                    let dns = self
                        .dns
                        .as_ref()
                        .ok_or_else(|| OrderError::Setup("no [acme.dns]".into()))?;
                    let value = key_auth.dns_value();
                    // Listed before it is sent: an update the server applied but whose answer
                    // never came (or came after the order's time ran out) is removed too.
                    opened.push(Opened::Dns(domain.clone(), value.clone()));
                    dns.add_txt(&domain, &value)
                        .await
                        .map_err(|e| OrderError::Setup(format!("{e:#}")))?;
                }
            }
            challenge.set_ready().await?;
        }
        let polling = RetryPolicy::new()
            .initial_delay(Duration::from_millis(250))
            .backoff(1.5)
            .timeout(self.timeout);
        let status = order.poll_ready(&polling).await?;
        if status != OrderStatus::Ready {
            return Err(OrderError::Invalid(challenge_errors(&mut order).await));
        }
        let key_pem = order.finalize().await?;
        let chain_pem = order.poll_certificate(&polling).await?;
        Ok(Issued { chain_pem, key_pem })
    }

    /// The CA's suggested renewal window for a certificate (RFC 9773) and when to ask again;
    /// `None` when the CA offers no ARI.
    pub async fn renewal_window(
        &self,
        id: &CertificateIdentifier<'_>,
    ) -> Result<Option<(SystemTime, SystemTime, Duration)>, AriFailure> {
        match self.account.renewal_info(id).await {
            Ok((info, ask_again)) => Ok(Some((
                SystemTime::from(info.suggested_window.start),
                SystemTime::from(info.suggested_window.end),
                ask_again,
            ))),
            Err(instant_acme::Error::Unsupported(_)) => Ok(None),
            Err(e) => Err(AriFailure {
                // A transport failure or a cut exchange (`client::Bounded`): no answer at all.
                unreachable: matches!(
                    e,
                    instant_acme::Error::Other(_) | instant_acme::Error::Hyper(_)
                ),
                error: e.to_string(),
            }),
        }
    }

    /// The first configured challenge type the CA offers (a wildcard: DNS-01 only).
    fn pick(&self, wildcard: bool, offered: &[ChallengeType]) -> Option<Challenge> {
        self.challenges
            .iter()
            .copied()
            .filter(|c| !wildcard || *c == Challenge::Dns01)
            .find(|c| offered.contains(&wire_type(*c)))
    }
}

fn wire_type(c: Challenge) -> ChallengeType {
    match c {
        Challenge::Http01 => ChallengeType::Http01,
        Challenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
        Challenge::Dns01 => ChallengeType::Dns01,
    }
}

/// The CA's reasons for an invalid order, from its authorizations' challenges.
async fn challenge_errors(order: &mut instant_acme::Order) -> String {
    let mut reasons = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(Ok(mut authz)) = authorizations.next().await {
        let ident = authz.identifier().to_string();
        if let Ok(state) = authz.refresh().await {
            for c in &state.challenges {
                if let Some(p) = &c.error {
                    reasons.push(format!("{ident} {:?}: {p}", c.r#type));
                }
            }
        }
    }
    if reasons.is_empty() {
        "the order became invalid".into()
    } else {
        reasons.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(kind: &str, status: u16) -> instant_acme::Error {
        instant_acme::Error::Api(instant_acme::Problem {
            r#type: Some(format!("urn:ietf:params:acme:error:{kind}")),
            detail: Some("no".into()),
            status: Some(status),
            subproblems: Vec::new(),
        })
    }

    #[test]
    fn a_refused_renewal_is_ordered_plainly_unless_rate_limited_failing_or_unreachable() {
        // The held certificate was already replaced by an order we never stored, or the CA
        // refuses the field: a plain order, not the same refusal at every retry.
        assert!(plain_order_after(&problem("alreadyReplaced", 409)));
        assert!(plain_order_after(&problem("malformed", 400)));
        assert!(plain_order_after(&instant_acme::Error::Unsupported("ARI")));
        assert!(plain_order_after(&instant_acme::Error::Other(
            "replaces field mismatch: expected .., found None".into()
        )));
        // The CA's limits, its own failure and a CA out of reach are not worked around.
        assert!(!plain_order_after(&problem("rateLimited", 429)));
        assert!(!plain_order_after(&problem("serverInternal", 500)));
        assert!(!plain_order_after(&instant_acme::Error::Other(
            "connection refused".into()
        )));
        assert!(!plain_order_after(&instant_acme::Error::Timeout(None)));
    }

    #[test]
    fn a_failed_validation_is_the_orders_fault_and_a_server_error_the_cas() {
        for kind in [
            "connection",
            "dns",
            "incorrectResponse",
            "tls",
            "caa",
            "unauthorized",
        ] {
            assert_eq!(
                OrderError::from(problem(kind, 400)).label(),
                "invalid",
                "{kind}"
            );
        }
        assert_eq!(
            OrderError::from(problem("rateLimited", 429)).label(),
            "rate_limited"
        );
        assert_eq!(
            OrderError::from(problem("serverInternal", 500)).label(),
            "ca_error"
        );
    }
}
