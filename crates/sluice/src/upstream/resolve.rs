//! Name resolution for upstream connections: an asynchronous caching resolver (answers kept for their
//! TTL), `/etc/hosts` first, and `localhost` answered locally as RFC 6761 asks. Without the `dns`
//! feature (the router build) names go to the C library's resolver on the blocking pool, at most
//! [`MAX_FALLBACK_LOOKUPS`] at once.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};

#[cfg(feature = "dns")]
use hickory_resolver::{
    config::{LookupIpStrategy, ResolveHosts},
    TokioResolver,
};

/// Records the resolver cache keeps; each answer expires with its own TTL.
#[cfg(feature = "dns")]
const CACHE_RECORDS: usize = 4096;

/// C library lookups under way at once, over the process. Each holds a blocking-pool thread until
/// the C resolver gives up (tens of seconds against a silent DNS server), and a request's deadline
/// ends the request but not the thread: names that never answer, asked for faster than they time
/// out, took every blocking thread (file reads and other lookups queued behind them). Past it a
/// lookup fails at once as a DNS error.
const MAX_FALLBACK_LOOKUPS: usize = 64;

/// The bound on C library lookups.
static FALLBACK: Gate = Gate::new(MAX_FALLBACK_LOOKUPS);

/// Counts blocking jobs under way; a job's place is held by its thread, not by the future
/// waiting for it.
struct Gate {
    busy: AtomicUsize,
    max: usize,
}

/// One job's place in a [`Gate`], given back when the job ends.
struct Slot(&'static Gate);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Gate {
    const fn new(max: usize) -> Gate {
        Gate {
            busy: AtomicUsize::new(0),
            max,
        }
    }

    /// Runs `job` on the blocking pool if a place is free.
    async fn run<T: Send + 'static>(
        &'static self,
        job: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let taken = self
            .busy
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max).then_some(n + 1)
            });
        if taken.is_err() {
            return Err(io::Error::other("too many name lookups under way"));
        }
        let slot = Slot(self);
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            job()
        })
        .await
        .map_err(|_| io::Error::other("the name lookup failed"))?
    }
}

/// `host` through the C library's resolver, within [`MAX_FALLBACK_LOOKUPS`].
async fn fallback_lookup(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    let host = host.to_string();
    FALLBACK
        .run(move || Ok((host.as_str(), port).to_socket_addrs()?.collect()))
        .await
}

/// The shared resolver. Without a usable system DNS configuration (no `/etc/resolv.conf`, as in
/// some containers) it falls back to the C library's resolver on the blocking pool.
#[derive(Clone)]
pub struct Resolver {
    #[cfg(feature = "dns")]
    dns: Option<TokioResolver>,
}

impl Resolver {
    #[cfg(not(feature = "dns"))]
    pub fn from_system() -> Self {
        Resolver {}
    }

    #[cfg(feature = "dns")]
    pub fn from_system() -> Self {
        let dns = match TokioResolver::builder_tokio() {
            Ok(mut builder) => {
                let opts = builder.options_mut();
                opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
                opts.use_hosts_file = ResolveHosts::Always;
                opts.cache_size = CACHE_RECORDS;
                Some(builder.build())
            }
            Err(e) => {
                tracing::warn!(error = %e, "no system DNS configuration; using getaddrinfo");
                None
            }
        };
        Resolver { dns }
    }

    /// Every address of `host` (a name or an IP literal) with `port`, in the resolver's order.
    pub async fn lookup(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let lower = host.trim_end_matches('.').to_ascii_lowercase();
        if lower == "localhost" || lower.ends_with(".localhost") {
            return Ok(vec![
                SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), port),
                SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
            ]);
        }
        #[cfg(feature = "dns")]
        let addrs: Vec<SocketAddr> = match &self.dns {
            Some(dns) => dns
                .lookup_ip(host)
                .await
                .map_err(|e| plain(&e))?
                .iter()
                .map(|ip| SocketAddr::new(ip, port))
                .collect(),
            None => fallback_lookup(host, port).await?,
        };
        #[cfg(not(feature = "dns"))]
        let addrs: Vec<SocketAddr> = fallback_lookup(host, port).await?;
        if addrs.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no addresses"));
        }
        Ok(addrs)
    }
}

/// A resolver failure in words a user reads: the resolver's own text is a debug dump of the
/// query, and it ends up in a JSON error and in logs.
#[cfg(feature = "dns")]
fn plain(e: &hickory_resolver::ResolveError) -> io::Error {
    use hickory_resolver::proto::ProtoErrorKind;
    use io::ErrorKind;
    let (kind, text) = match e.proto().map(|p| p.kind()) {
        _ if e.is_nx_domain() => (ErrorKind::NotFound, "no such name in DNS"),
        Some(ProtoErrorKind::NoRecordsFound { .. }) => {
            (ErrorKind::NotFound, "the name has no address in DNS")
        }
        Some(ProtoErrorKind::Timeout) => (ErrorKind::TimedOut, "the DNS server did not answer"),
        Some(ProtoErrorKind::RequestRefused) => {
            (ErrorKind::Other, "the DNS server refused the query")
        }
        Some(ProtoErrorKind::NoConnections | ProtoErrorKind::Io(_) | ProtoErrorKind::Busy) => {
            (ErrorKind::Other, "the DNS server could not be reached")
        }
        _ => (ErrorKind::Other, "the name could not be resolved"),
    };
    tracing::debug!(error = %e, "name resolution failed");
    io::Error::new(kind, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn literals_and_localhost_need_no_dns() {
        let r = Resolver::from_system();
        assert_eq!(
            r.lookup("127.0.0.1", 80).await.unwrap(),
            vec!["127.0.0.1:80".parse().unwrap()]
        );
        assert_eq!(
            r.lookup("::1", 81).await.unwrap(),
            vec!["[::1]:81".parse().unwrap()]
        );
        let local = r.lookup("LocalHost.", 82).await.unwrap();
        assert!(local.contains(&"127.0.0.1:82".parse().unwrap()));
        assert!(local.iter().all(|a| a.ip().is_loopback()));
    }

    /// Lookups whose callers gave up still hold their places until their threads end, and one
    /// past the bound fails at once instead of taking another thread. Before, each was a
    /// `lookup_host` with no bound.
    #[tokio::test]
    async fn blocking_lookups_are_bounded_past_their_callers_deadlines() {
        static GATE: Gate = Gate::new(2);
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let hold = std::sync::Arc::new(std::sync::Mutex::new(hold));
        let started = std::sync::Arc::new(AtomicUsize::new(0));
        for _ in 0..2 {
            let (hold, started) = (hold.clone(), started.clone());
            // A lookup that never answers, given up by its caller's deadline.
            let stuck = GATE.run(move || {
                started.fetch_add(1, Ordering::SeqCst);
                let _ = hold.lock().unwrap().recv();
                Ok(())
            });
            let given_up = tokio::time::timeout(Duration::from_millis(50), stuck).await;
            assert!(given_up.is_err());
        }
        let err = GATE.run(|| Ok(1)).await.unwrap_err();
        assert_eq!(err.to_string(), "too many name lookups under way");
        assert_eq!(GATE.busy.load(Ordering::SeqCst), 2);
        // The threads end: their places come back.
        release.send(()).unwrap();
        release.send(()).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while GATE.busy.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(GATE.run(|| Ok(7)).await.unwrap(), 7);
        assert_eq!(started.load(Ordering::SeqCst), 2);
        // The real bound, through the C library: an address literal needs no DNS server.
        let addrs = fallback_lookup("127.0.0.1", 80).await.unwrap();
        assert_eq!(addrs, vec!["127.0.0.1:80".parse().unwrap()]);
    }
}
