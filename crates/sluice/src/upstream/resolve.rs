//! Name resolution for upstream connections: an asynchronous caching resolver (answers kept for their
//! TTL), `/etc/hosts` first, and `localhost` answered locally as RFC 6761 asks. Without the `dns`
//! feature (the router build) names go to the C library's resolver on the blocking pool, at most
//! [`MAX_FALLBACK_LOOKUPS`] at once (others wait for a place).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};

use tokio::sync::Semaphore;

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
/// lookup waits for a place rather than fail, so a few stuck names do not fail every healthy
/// one; every caller looks up under a deadline (the connect deadline in `Inner::connect`, the
/// callers' own around `resolve_checked`), which bounds the wait.
const MAX_FALLBACK_LOOKUPS: usize = 64;

/// The bound on C library lookups.
static FALLBACK: Gate = Gate::new(MAX_FALLBACK_LOOKUPS);

/// Bounds blocking jobs under way; a job's place is held by its thread, not by the future
/// waiting for it, so a caller that gives up does not give the place back early.
struct Gate {
    places: Semaphore,
}

impl Gate {
    const fn new(max: usize) -> Gate {
        Gate {
            places: Semaphore::const_new(max),
        }
    }

    /// Runs `job` on the blocking pool once a place is free.
    async fn run<T: Send + 'static>(
        &'static self,
        job: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let place = self
            .places
            .acquire()
            .await
            .map_err(|_| io::Error::other("the name lookup failed"))?;
        tokio::task::spawn_blocking(move || {
            let _place = place;
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
    /// past the bound waits for a place instead of taking another thread, then runs once a
    /// place comes back: never more threads than the bound at once. Before, each was a
    /// `lookup_host` with no bound (then, for a while, one past the bound failed at once).
    #[tokio::test]
    async fn blocking_lookups_are_bounded_past_their_callers_deadlines() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::{mpsc, Arc, Mutex};
        static GATE: Gate = Gate::new(2);
        let (release, hold) = mpsc::channel::<()>();
        let hold = Arc::new(Mutex::new(hold));
        let started = Arc::new(AtomicUsize::new(0));
        let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        // A lookup that never answers until released, counting the threads running at once.
        let stuck = |answer: u32| {
            let (hold, started) = (hold.clone(), started.clone());
            let (running, most) = (running.clone(), most.clone());
            move || {
                started.fetch_add(1, Ordering::SeqCst);
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let _ = hold.lock().unwrap().recv();
                running.fetch_sub(1, Ordering::SeqCst);
                Ok(answer)
            }
        };
        for n in 0..2 {
            // Given up by its caller's deadline; the thread goes on.
            let given_up =
                tokio::time::timeout(Duration::from_millis(50), GATE.run(stuck(n))).await;
            assert!(given_up.is_err());
        }
        assert_eq!(GATE.places.available_permits(), 0);
        // The third waits for a place: it starts no thread while both are taken.
        let third = tokio::spawn(GATE.run(stuck(3)));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!third.is_finished());
        assert_eq!(started.load(Ordering::SeqCst), 2);
        // One stuck thread ends: its place goes to the third, which runs and answers.
        release.send(()).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while started.load(Ordering::SeqCst) < 3 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(started.load(Ordering::SeqCst), 3);
        release.send(()).unwrap();
        release.send(()).unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(5), third).await;
        assert_eq!(answer.unwrap().unwrap().unwrap(), 3);
        assert_eq!(most.load(Ordering::SeqCst), 2);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while GATE.places.available_permits() < 2 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(GATE.places.available_permits(), 2);
        assert_eq!(GATE.run(|| Ok(7)).await.unwrap(), 7);
        // The real bound, through the C library: an address literal needs no DNS server.
        let addrs = fallback_lookup("127.0.0.1", 80).await.unwrap();
        assert_eq!(addrs, vec!["127.0.0.1:80".parse().unwrap()]);
    }
}
