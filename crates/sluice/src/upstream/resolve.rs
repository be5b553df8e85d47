//! Name resolution for upstream connections: an asynchronous caching resolver (answers kept for their
//! TTL), `/etc/hosts` first, and `localhost` answered locally as RFC 6761 asks. Without the `dns`
//! feature (the router build) names go to the C library's resolver on the blocking pool, at most
//! [`MAX_FALLBACK_LOOKUPS`] at once (others wait for a place).
//!
//! `/etc/hosts` is read again when its modification time or length changes, so a name an operator
//! adds there is used without a restart: a lookup at most every [`HOSTS_CHECK_EVERY`] finds the
//! check due (an atomic compare, no system call) and starts it on the blocking pool without
//! waiting for it; lookups go on with the hosts they have until the new ones are in. (The C
//! library's resolver reads the file at each lookup itself.)

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
#[cfg(feature = "dns")]
use std::path::PathBuf;
#[cfg(feature = "dns")]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(feature = "dns")]
use std::sync::{Arc, Mutex};
#[cfg(feature = "dns")]
use std::time::{Duration, SystemTime};

use tokio::sync::Semaphore;

#[cfg(feature = "dns")]
use arc_swap::ArcSwap;
#[cfg(feature = "dns")]
use hickory_resolver::{
    config::{LookupIpStrategy, ResolveHosts},
    Hosts, ResolverBuilder, TokioResolver,
};

/// Records the resolver cache keeps; each answer expires with its own TTL.
#[cfg(feature = "dns")]
const CACHE_RECORDS: usize = 4096;

/// The hosts file the resolver answers from before DNS.
#[cfg(feature = "dns")]
const HOSTS_PATH: &str = "/etc/hosts";

/// How often the hosts file is looked at for a change, at most: one `stat` per this, not per
/// lookup.
#[cfg(feature = "dns")]
const HOSTS_CHECK_EVERY: Duration = Duration::from_secs(5);

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
    dns: Option<Arc<Dns>>,
}

/// The DNS resolver with the hosts file it answers from first, read again when it changes.
#[cfg(feature = "dns")]
struct Dns {
    /// Swapped whole for a copy with the new hosts when the file changes; the copies share one
    /// cache and one set of connections.
    resolver: ArcSwap<TokioResolver>,
    hosts: HostsFile,
}

/// Where the hosts file is, what of it was read last, and when to look at it again.
#[cfg(feature = "dns")]
struct HostsFile {
    path: PathBuf,
    every: Duration,
    /// The clock's zero for [`HostsFile::due`].
    epoch: tokio::time::Instant,
    /// When the next check is due, in milliseconds from `epoch`.
    due: AtomicU64,
    /// A check is under way: no second one starts beside it.
    checking: AtomicBool,
    /// The file as last read, or last found unreadable (`None`: there was none, or it could not
    /// be opened).
    seen: Mutex<Option<Stamp>>,
    /// Checks made (each one `stat`), for tests.
    checks: AtomicU64,
    /// Reads of the file made by checks, for tests.
    reads: AtomicU64,
}

/// What tells a hosts file's versions apart.
#[cfg(feature = "dns")]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
}

#[cfg(feature = "dns")]
impl HostsFile {
    /// Reads `path` now (at start, as the resolver's builder would have), to check every `every`.
    fn load(path: PathBuf, every: Duration) -> (HostsFile, Hosts) {
        let (seen, hosts) = read_hosts(&path);
        let file = HostsFile {
            path,
            every,
            epoch: tokio::time::Instant::now(),
            due: AtomicU64::new(every.as_millis() as u64),
            checking: AtomicBool::new(false),
            seen: Mutex::new(seen),
            checks: AtomicU64::new(0),
            reads: AtomicU64::new(0),
        };
        (file, hosts.unwrap_or_default())
    }

    /// Whether a check is due, and if so claims it (one caller of many): an atomic compare on the
    /// poll's cached clock, nothing more, on every lookup.
    fn due(&self) -> bool {
        let now = crate::runtime::recent::recent()
            .saturating_duration_since(self.epoch)
            .as_millis() as u64;
        let due = self.due.load(Ordering::Relaxed);
        now >= due
            && self
                .due
                .compare_exchange(
                    due,
                    now.saturating_add(self.every.as_millis() as u64),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
            && !self.checking.swap(true, Ordering::Acquire)
    }
}

#[cfg(feature = "dns")]
impl Dns {
    fn new(resolver: TokioResolver, path: PathBuf, every: Duration) -> Dns {
        let (hosts, read) = HostsFile::load(path, every);
        let mut resolver = resolver;
        resolver.set_hosts(Arc::new(read));
        Dns {
            resolver: ArcSwap::from_pointee(resolver),
            hosts,
        }
    }

    /// Starts a check of the hosts file when one is due; the caller does not wait for it. The
    /// claim is let go by a guard the task owns from the start, so it is let go however the
    /// task ends, even dropped before its first poll (with its runtime).
    fn refresh_if_due(self: &Arc<Self>) {
        if self.hosts.due() {
            let done = Done(self.clone());
            tokio::spawn(async move { done.0.clone().check().await });
        }
    }

    /// Looks at the hosts file on the blocking pool and, when its modification time or length
    /// changed, reads it and answers from it from then on. A file that cannot be read is
    /// warned about once per change: its stamp is recorded and the hosts before it kept. One
    /// that cannot be opened (but is there) is looked at again at the next check.
    async fn check(self: Arc<Self>) {
        let dns = self.clone();
        let job = tokio::task::spawn_blocking(move || {
            let hosts = &dns.hosts;
            hosts.checks.fetch_add(1, Ordering::Relaxed);
            let seen = *hosts.seen.lock().unwrap_or_else(|e| e.into_inner());
            if stamp_of(&hosts.path) == seen {
                return None;
            }
            hosts.reads.fetch_add(1, Ordering::Relaxed);
            Some(read_hosts(&hosts.path))
        })
        .await;
        if let Ok(Some((stamp, read))) = job {
            let read_ok = read.is_some();
            if let Some(read) = read {
                let mut resolver = TokioResolver::clone(&self.resolver.load());
                resolver.set_hosts(Arc::new(read));
                self.resolver.store(Arc::new(resolver));
                tracing::info!(path = %self.hosts.path.display(), "hosts file changed; read again");
            }
            // Not when it could not be opened: the stamp of the file last read stays, so the next
            // check tries again.
            if read_ok || stamp.is_some() {
                *self.hosts.seen.lock().unwrap_or_else(|e| e.into_inner()) = stamp;
            }
        }
    }
}

/// A claimed check of the hosts file ([`HostsFile::due`]): lets the next one start when
/// dropped, however the check ends or if it never runs.
#[cfg(feature = "dns")]
struct Done(Arc<Dns>);

#[cfg(feature = "dns")]
impl Drop for Done {
    fn drop(&mut self) {
        self.0.hosts.checking.store(false, Ordering::Release);
    }
}

#[cfg(all(test, feature = "dns"))]
impl Dns {
    /// Claims a due check and runs it to its end.
    async fn check_if_claimed(self: Arc<Self>) {
        assert!(self.hosts.due(), "a check is due");
        let done = Done(self.clone());
        done.0.clone().check().await;
    }
}

/// The hosts file's stamp now, without reading it.
#[cfg(feature = "dns")]
fn stamp_of(path: &std::path::Path) -> Option<Stamp> {
    std::fs::metadata(path).ok().map(|m| Stamp {
        modified: m.modified().ok(),
        len: m.len(),
    })
}

/// The hosts file's stamp and its entries, both from the one open file; no file (`NotFound`) is
/// no entries. `None` entries when it could not be opened for another reason (no stamp either:
/// it is looked at again at the next check) or opened but not read (its stamp: it is read again
/// when it changes); the previous entries are kept.
#[cfg(feature = "dns")]
fn read_hosts(path: &std::path::Path) -> (Option<Stamp>, Option<Hosts>) {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return (None, Some(Hosts::default())),
        Err(e) => {
            // A full descriptor table (EMFILE), permissions: not "no file", which would drop
            // every name the file gives.
            tracing::warn!(path = %path.display(), error = %e, "cannot open the hosts file");
            return (None, None);
        }
    };
    let stamp = file.metadata().ok().map(|m| Stamp {
        modified: m.modified().ok(),
        len: m.len(),
    });
    let mut hosts = Hosts::default();
    match hosts.read_hosts_conf(file) {
        Ok(()) => (stamp, Some(hosts)),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the hosts file");
            (stamp, None)
        }
    }
}

impl Resolver {
    #[cfg(not(feature = "dns"))]
    pub fn from_system() -> Self {
        Resolver {}
    }

    #[cfg(feature = "dns")]
    pub fn from_system() -> Self {
        let dns = match TokioResolver::builder_tokio() {
            Ok(builder) => Some(Arc::new(Dns::new(
                build(builder),
                PathBuf::from(HOSTS_PATH),
                HOSTS_CHECK_EVERY,
            ))),
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
                .answer()
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

#[cfg(feature = "dns")]
impl Dns {
    /// The resolver for one lookup, starting a check of the hosts file when one is due.
    fn answer(self: &Arc<Self>) -> Arc<TokioResolver> {
        self.refresh_if_due();
        self.resolver.load_full()
    }
}

/// The resolver `builder` makes with sluice's options; the hosts file is [`Dns`]'s to read.
#[cfg(feature = "dns")]
fn build(
    mut builder: ResolverBuilder<hickory_resolver::name_server::TokioConnectionProvider>,
) -> TokioResolver {
    let opts = builder.options_mut();
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    opts.use_hosts_file = ResolveHosts::Never;
    opts.cache_size = CACHE_RECORDS;
    builder.build()
}

/// A resolver failure in words a user reads: the resolver's own text is a debug dump of the
/// query, and it ends up in a JSON error and in logs.
#[cfg(feature = "dns")]
fn plain(e: &hickory_resolver::ResolveError) -> io::Error {
    use hickory_resolver::proto::ProtoErrorKind;
    use io::ErrorKind;
    // An I/O error of this host's (EMFILE opening the query's socket, say) is kept as the OS
    // error it is: callers tell this side's exhaustion, booked on no server, from a server's
    // failure by its code.
    if let Some(ProtoErrorKind::Io(io)) = e.proto().map(|p| p.kind()) {
        if let Some(code) = io.raw_os_error() {
            tracing::debug!(error = %e, "name resolution failed");
            return io::Error::from_raw_os_error(code);
        }
    }
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

    /// Finding: `plain` gave every resolver I/O error the same words and no OS code, so a
    /// lookup that failed for want of a descriptor (EMFILE) looked like an unreachable DNS
    /// server, and the callers that book such failures on no server never saw it. The OS error
    /// is now kept; the others keep their plain words.
    #[cfg(feature = "dns")]
    #[test]
    fn resolver_io_errors_keep_their_os_code() {
        use hickory_resolver::ResolveError;
        let emfile = ResolveError::from(io::Error::from_raw_os_error(libc::EMFILE));
        assert_eq!(plain(&emfile).raw_os_error(), Some(libc::EMFILE));
        let refused = ResolveError::from(io::Error::from_raw_os_error(libc::ECONNREFUSED));
        assert_eq!(plain(&refused).raw_os_error(), Some(libc::ECONNREFUSED));
        let timeout = ResolveError::from(io::Error::from(io::ErrorKind::TimedOut));
        let e = plain(&timeout);
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(e.to_string(), "the DNS server did not answer");
        let other = ResolveError::from(io::Error::other("no route"));
        assert_eq!(
            plain(&other).to_string(),
            "the DNS server could not be reached"
        );
    }

    /// A name added to the hosts file (or moved to another address) is answered from the new file
    /// once a check is due, without a restart; until then lookups neither look at the file nor
    /// wait for it. Before, the file was read once, when the resolver was built.
    #[cfg(feature = "dns")]
    #[tokio::test]
    async fn the_hosts_file_is_read_again_when_it_changes() {
        use hickory_resolver::config::ResolverConfig;
        use hickory_resolver::name_server::TokioConnectionProvider;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        std::fs::write(&path, "192.0.2.1 upstream.test\n").unwrap();
        // No name servers: a name the file does not hold fails, without the network.
        let builder = TokioResolver::builder_with_config(
            ResolverConfig::new(),
            TokioConnectionProvider::default(),
        );
        let dns = Arc::new(Dns::new(
            build(builder),
            path.clone(),
            Duration::from_secs(3600),
        ));
        let r = Resolver {
            dns: Some(dns.clone()),
        };
        let ip = |a: io::Result<Vec<SocketAddr>>| a.ok().map(|a| a[0].ip().to_string());
        assert_eq!(
            ip(r.lookup("upstream.test", 80).await).as_deref(),
            Some("192.0.2.1")
        );
        assert!(r.lookup("added.test", 80).await.is_err());
        std::fs::write(
            &path,
            "192.0.2.2 upstream.test\n# an operator's edit\n192.0.2.3 added.test\n",
        )
        .unwrap();
        // Before a check is due: the hosts read at start, and not one look at the file.
        for _ in 0..100 {
            assert_eq!(
                ip(r.lookup("upstream.test", 80).await).as_deref(),
                Some("192.0.2.1")
            );
        }
        tokio::task::yield_now().await;
        assert_eq!(dns.hosts.checks.load(Ordering::Relaxed), 0);
        // Once due, a lookup starts the check (it does not wait for it); later ones see the file.
        dns.hosts.due.store(0, Ordering::Relaxed);
        let mut answer = None;
        for _ in 0..500 {
            answer = ip(r.lookup("added.test", 80).await);
            if answer.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(answer.as_deref(), Some("192.0.2.3"));
        assert_eq!(
            ip(r.lookup("upstream.test", 80).await).as_deref(),
            Some("192.0.2.2")
        );
        // One check, and the next is an interval away however many lookups come.
        for _ in 0..100 {
            r.lookup("upstream.test", 80).await.unwrap();
        }
        tokio::task::yield_now().await;
        assert_eq!(dns.hosts.checks.load(Ordering::Relaxed), 1);
        // A check that finds the file as it was reads nothing again; a name taken out is gone.
        dns.hosts.due.store(0, Ordering::Relaxed);
        dns.clone().check_if_claimed().await;
        assert_eq!(dns.hosts.checks.load(Ordering::Relaxed), 2);
        std::fs::write(&path, "192.0.2.2 upstream.test\n").unwrap();
        dns.hosts.due.store(0, Ordering::Relaxed);
        dns.clone().check_if_claimed().await;
        assert!(r.lookup("added.test", 80).await.is_err());
        assert_eq!(
            ip(r.lookup("upstream.test", 80).await).as_deref(),
            Some("192.0.2.2")
        );
    }

    /// A resolver with no name servers answering from the hosts file at `path`, checked only
    /// when a test makes a check due.
    #[cfg(feature = "dns")]
    fn hosts_only(path: &std::path::Path) -> (Arc<Dns>, Resolver) {
        use hickory_resolver::config::ResolverConfig;
        use hickory_resolver::name_server::TokioConnectionProvider;
        let builder = TokioResolver::builder_with_config(
            ResolverConfig::new(),
            TokioConnectionProvider::default(),
        );
        let dns = Arc::new(Dns::new(
            build(builder),
            path.to_path_buf(),
            Duration::from_secs(3600),
        ));
        let r = Resolver {
            dns: Some(dns.clone()),
        };
        (dns, r)
    }

    /// A check whose task is dropped before it first runs (its runtime shut down with it queued)
    /// lets the next one start. Before, the claim was let go by a guard the check built once
    /// running, so a task never polled left `checking` set and the file was never looked at
    /// again.
    #[cfg(feature = "dns")]
    #[test]
    fn a_check_dropped_before_it_runs_lets_the_next_one_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        std::fs::write(&path, "192.0.2.1 upstream.test\n").unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (dns, _r) = {
            let _in = runtime.enter();
            hosts_only(&path)
        };
        dns.hosts.due.store(0, Ordering::Relaxed);
        {
            let _in = runtime.enter();
            dns.refresh_if_due();
        }
        assert!(
            dns.hosts.checking.load(Ordering::Acquire),
            "claimed, queued"
        );
        drop(runtime);
        assert_eq!(dns.hosts.checks.load(Ordering::Relaxed), 0, "never ran");
        assert!(
            !dns.hosts.checking.load(Ordering::Acquire),
            "the claim outlived its task"
        );
        dns.hosts.due.store(0, Ordering::Relaxed);
        assert!(dns.hosts.due(), "the next check starts");
    }

    /// A hosts file that is there but cannot be opened (here a path through a regular file,
    /// `ENOTDIR`; in production a full descriptor table or its permissions) keeps the hosts read
    /// before and is looked at again at the next check. Before, any failure to open it was "no
    /// file": every name it gave was dropped.
    #[cfg(feature = "dns")]
    #[tokio::test]
    async fn a_hosts_file_that_cannot_be_opened_keeps_the_hosts_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc");
        std::fs::create_dir(&etc).unwrap();
        let path = etc.join("hosts");
        std::fs::write(&path, "192.0.2.1 upstream.test\n").unwrap();
        let (dns, r) = hosts_only(&path);
        let ip = |a: io::Result<Vec<SocketAddr>>| a.ok().map(|a| a[0].ip().to_string());
        assert_eq!(
            ip(r.lookup("upstream.test", 80).await).as_deref(),
            Some("192.0.2.1")
        );
        std::fs::remove_dir_all(&etc).unwrap();
        std::fs::write(&etc, "not a directory").unwrap();
        assert_ne!(
            std::fs::File::open(&path).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        for _ in 0..2 {
            dns.hosts.due.store(0, Ordering::Relaxed);
            dns.clone().check_if_claimed().await;
            assert_eq!(
                ip(r.lookup("upstream.test", 80).await).as_deref(),
                Some("192.0.2.1")
            );
        }
        assert_eq!(dns.hosts.reads.load(Ordering::Relaxed), 2, "tried again");
        // Once it opens again, it is read.
        std::fs::remove_file(&etc).unwrap();
        std::fs::create_dir(&etc).unwrap();
        std::fs::write(&path, "192.0.2.2 upstream.test\n").unwrap();
        dns.hosts.due.store(0, Ordering::Relaxed);
        dns.clone().check_if_claimed().await;
        assert_eq!(
            ip(r.lookup("upstream.test", 80).await).as_deref(),
            Some("192.0.2.2")
        );
        // A file taken away is no names.
        std::fs::remove_file(&path).unwrap();
        dns.hosts.due.store(0, Ordering::Relaxed);
        dns.clone().check_if_claimed().await;
        assert!(r.lookup("upstream.test", 80).await.is_err());
    }

    /// A hosts file that cannot be read (a byte that is not UTF-8) keeps the hosts before it and
    /// is read (and warned about) once, not at every check until it changes; once it changes it
    /// is read again. Before, its stamp was not recorded and every check read it again.
    #[cfg(feature = "dns")]
    #[tokio::test]
    async fn an_unreadable_hosts_file_is_read_once_until_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        std::fs::write(&path, "192.0.2.1 upstream.test\n").unwrap();
        let (dns, r) = hosts_only(&path);
        let ip = |a: io::Result<Vec<SocketAddr>>| a.ok().map(|a| a[0].ip().to_string());
        std::fs::write(&path, b"192.0.2.2 upstream.test\n192.0.2.3 caf\xe9.test\n").unwrap();
        for _ in 0..3 {
            dns.hosts.due.store(0, Ordering::Relaxed);
            dns.clone().check_if_claimed().await;
            assert_eq!(
                ip(r.lookup("upstream.test", 80).await).as_deref(),
                Some("192.0.2.1")
            );
        }
        assert_eq!(dns.hosts.checks.load(Ordering::Relaxed), 3);
        assert_eq!(dns.hosts.reads.load(Ordering::Relaxed), 1, "read once");
        std::fs::write(&path, "192.0.2.2 upstream.test\n").unwrap();
        dns.hosts.due.store(0, Ordering::Relaxed);
        dns.clone().check_if_claimed().await;
        assert_eq!(dns.hosts.reads.load(Ordering::Relaxed), 2);
        assert_eq!(
            ip(r.lookup("upstream.test", 80).await).as_deref(),
            Some("192.0.2.2")
        );
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
