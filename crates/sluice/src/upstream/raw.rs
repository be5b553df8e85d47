//! One bodiless request over a fresh plain HTTP/1.1 connection of the client's own (address
//! guard, outgoing routes, setup limit and deadlines as for pooled requests), its response head
//! read off the socket, and the socket handed over at the first body byte: for bodies that are
//! spliced to the client instead of read. No redirects here: the caller falls back to
//! [`Upstream::send`] for those. A connection whose body was read to its end comes back to a
//! small idle pool of its own (the pooled client cannot lend its sockets out).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use sluice_http::response_head::ResponseHead;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tower_service::Service;

use super::connector::Conn;
use super::h1::{exchange, says_close, Exchange};
use super::{host_of, Upstream, UpstreamError, UpstreamRequest};

/// A response head and the socket its body follows on.
pub struct RawResponse {
    pub head: ResponseHead,
    /// Positioned after `early`.
    pub socket: TcpStream,
    /// Body bytes that arrived with the head.
    pub early: Bytes,
    /// Where the socket goes back once its body has been read to the end (`None`: the origin
    /// closes it).
    home: Option<(Arc<RawPool>, String)>,
}

impl RawResponse {
    /// Returns the socket, its body read to the end, for the next request to the same origin.
    pub fn returner(&self) -> Option<impl FnOnce(TcpStream) + Send + Sync + 'static> {
        let (pool, key) = self.home.clone()?;
        Some(move |socket| pool.checkin(key, socket))
    }
}

/// `host:port` of a plain http URL: the pool key.
fn origin_key(url: &url::Url) -> String {
    format!(
        "{}:{}",
        url.host_str().unwrap_or(""),
        url.port_or_known_default().unwrap_or(80)
    )
}

/// Idle sockets kept across all origins: a client naming many distinct origins (each
/// `/proxy/stream` URL may name its own) cannot park request rate × `pool_idle_secs` sockets.
const MAX_IDLE_TOTAL: usize = 1024;

/// Idle raw connections per origin, newest on top, each kept for at most `idle`, at most
/// `max_per_origin` per origin and at most `max_total` in all (the oldest goes first). A checkout
/// never hands out one idle past `idle`, and a reaper task closes those of every origin within
/// half of `idle` more (at least 100 ms), so an origin never asked again does not hold its
/// sockets open until the cap evicts them.
pub struct RawPool {
    idle: Mutex<Idle>,
    max_per_origin: usize,
    max_total: usize,
    timeout: Duration,
}

/// The pool's sockets and their count.
#[derive(Default)]
struct Idle {
    /// Per origin, oldest first.
    by_origin: HashMap<String, Vec<(TcpStream, Instant)>>,
    /// Sockets in `by_origin`.
    count: usize,
    /// Whether a reaper task runs; set and cleared under the lock, so a socket checked in as the
    /// reaper finds the pool empty and ends starts the next one.
    reaping: bool,
}

impl Idle {
    /// Closes the oldest socket of all origins (an expired one, if any is); false if none is left.
    fn evict_oldest(&mut self) -> bool {
        let oldest = self
            .by_origin
            .iter()
            .filter_map(|(key, s)| Some((key, s.first()?.1)))
            .min_by_key(|(_, since)| *since)
            .map(|(key, _)| key.clone());
        if let Some(key) = oldest {
            if let Some(stack) = self.by_origin.get_mut(&key) {
                stack.remove(0);
                self.count -= 1;
                if stack.is_empty() {
                    self.by_origin.remove(&key);
                }
                return true;
            }
        }
        false
    }

    /// Takes the sockets of every origin idle for `timeout` or more into `expired` (for the
    /// caller to close once it has let go of the lock); how many are left. Each origin's stack is
    /// oldest first, so only the expired ones and one more are looked at.
    fn reap(&mut self, timeout: Duration, expired: &mut Vec<TcpStream>) -> usize {
        let count = &mut self.count;
        self.by_origin.retain(|_, stack| {
            let n = stack
                .iter()
                .take_while(|(_, since)| since.elapsed() >= timeout)
                .count();
            expired.extend(stack.drain(..n).map(|(socket, _)| socket));
            *count -= n;
            !stack.is_empty()
        });
        self.count
    }
}

impl RawPool {
    pub fn new(max_per_origin: usize, timeout: Duration) -> RawPool {
        RawPool::with_total(max_per_origin, MAX_IDLE_TOTAL, timeout)
    }

    fn with_total(max_per_origin: usize, max_total: usize, timeout: Duration) -> RawPool {
        RawPool {
            idle: Mutex::new(Idle::default()),
            max_per_origin,
            max_total,
            timeout,
        }
    }

    /// The newest idle connection to `key` still open, if any.
    fn checkout(&self, key: &str) -> Option<TcpStream> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let Idle {
            by_origin, count, ..
        } = &mut *idle;
        let stack = by_origin.get_mut(key)?;
        let mut found = None;
        while let Some((socket, since)) = stack.pop() {
            *count -= 1;
            if since.elapsed() >= self.timeout {
                continue;
            }
            // An idle connection has nothing to read: EOF means the origin closed it, bytes
            // mean it sent something unasked; either way it cannot carry a request.
            let mut probe = [0u8; 1];
            match socket.try_read(&mut probe) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    found = Some(socket);
                    break;
                }
                _ => continue,
            }
        }
        if stack.is_empty() {
            by_origin.remove(key);
        }
        found
    }

    fn checkin(self: &Arc<Self>, key: String, socket: TcpStream) {
        // `pool_max_idle_per_host = 0` turns keep-alive off: the connection is dropped (closed).
        if self.max_per_origin == 0 || self.max_total == 0 {
            return;
        }
        // Bounded in origins too: an origin left with no socket is forgotten, so there are never
        // more origins than sockets.
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let stack = idle.by_origin.entry(key).or_default();
        let replaced = if stack.len() >= self.max_per_origin {
            stack.remove(0);
            true
        } else {
            false
        };
        stack.push((socket, Instant::now()));
        if !replaced {
            idle.count += 1;
        }
        // Over the overall cap the oldest of all goes (an expired one first, being older).
        while idle.count > self.max_total && idle.evict_oldest() {}
        let start = !idle.reaping;
        idle.reaping = true;
        // Spawned unlocked: a task a shut-down runtime refuses is dropped at once, and its
        // guard takes the lock.
        drop(idle);
        if start && !self.start_reaper() {
            self.idle.lock().unwrap_or_else(|e| e.into_inner()).reaping = false;
        }
    }

    /// Starts the task that closes sockets idle past the timeout, holding the pool weakly; it
    /// ends when the pool is empty or gone. False outside a runtime (none started).
    fn start_reaper(self: &Arc<Self>) -> bool {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let mut reaper = Reaper(Arc::downgrade(self));
        let period = (self.timeout / 2).max(Duration::from_millis(100));
        handle.spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let Some(pool) = reaper.0.upgrade() else {
                    return;
                };
                let mut expired = Vec::new();
                let mut idle = pool.idle.lock().unwrap_or_else(|e| e.into_inner());
                let left = idle.reap(pool.timeout, &mut expired);
                if left == 0 {
                    // Ended under the lock: a socket checked in from here starts the next one.
                    idle.reaping = false;
                    reaper.0 = Weak::new();
                }
                drop(idle);
                // Closed unlocked: checkouts and checkins do not wait on the closes.
                drop(expired);
                if left == 0 {
                    return;
                }
            }
        });
        true
    }

    /// Idle sockets held, all origins together.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        debug_assert_eq!(
            idle.count,
            idle.by_origin.values().map(Vec::len).sum::<usize>()
        );
        idle.count
    }
}

/// The pool a reaper task works for: when the task goes without ending itself (dropped with its
/// runtime, or refused by one shutting down), its drop clears the pool's `reaping`, so the next
/// checkin starts another; left set, no socket of the pool was reaped again.
struct Reaper(Weak<RawPool>);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(pool) = self.0.upgrade() {
            pool.idle.lock().unwrap_or_else(|e| e.into_inner()).reaping = false;
        }
    }
}

impl Upstream {
    /// Sends `req` (an `http` URL) on an idle raw connection to its origin or a new one, and
    /// reads the response head by `deadline` ([`Upstream::header_deadline`]; a caller that
    /// falls back to [`Upstream::send_by`] gives it the same one).
    pub async fn send_raw(
        &self,
        req: &UpstreamRequest,
        deadline: Instant,
    ) -> Result<RawResponse, UpstreamError> {
        let url = &req.url;
        let host = host_of(url);
        let protocol = |detail: String| UpstreamError::Protocol {
            host: host.clone(),
            detail,
        };
        if url.scheme() != "http" {
            return Err(protocol("only plain http is read raw".into()));
        }
        let uri: Uri = url
            .as_str()
            .parse()
            .map_err(|e: http::uri::InvalidUri| protocol(e.to_string()))?;
        self.metrics.requests.inc();
        let key = origin_key(url);
        let mut marked = req.clone();
        marked
            .headers
            .insert(super::guard::LOOP_HEADER, super::guard::loop_mark().clone());
        let head = request_head(&marked, &self.user_agent);
        // One time-to-headers deadline, as for the pooled client and `fetch`: the wait for a
        // per-host setup slot and the connect count against it, so a queue behind an origin
        // that never answers cannot hold a viewer for its length in connect timeouts.
        let timed_out = || UpstreamError::HeaderTimeout {
            host: host.clone(),
            secs: self.header_timeout.as_secs(),
        };
        loop {
            let (mut socket, reused) = match self.raw_pool.checkout(&key) {
                Some(s) => (s, true),
                None => {
                    let setup = self.connector.clone().call(uri.clone());
                    let conn = tokio::time::timeout_at(deadline, setup)
                        .await
                        .map_err(|_| timed_out())??
                        .into_inner();
                    match conn {
                        Conn::Plain(socket) => (socket, false),
                        #[cfg(feature = "tls")]
                        Conn::Tls(_) => {
                            return Err(protocol("a plain http URL got a TLS connection".into()))
                        }
                    }
                }
            };
            let got = tokio::time::timeout_at(deadline, exchange(&mut socket, &head))
                .await
                .map_err(|_| timed_out())?;
            match got {
                Ok((head, early)) => {
                    if reused {
                        self.metrics.reused.inc();
                    }
                    let reusable = head.minor_version == 1 && !says_close(&head.headers);
                    return Ok(RawResponse {
                        head,
                        socket,
                        early,
                        home: reusable.then(|| (self.raw_pool.clone(), key)),
                    });
                }
                // The origin closed an idle connection as it was reused: the request never
                // reached it, so a fresh connection may send it again.
                Err(Exchange::Closed) if reused => continue,
                Err(Exchange::Closed) => {
                    return Err(protocol("connection closed before a response head".into()))
                }
                Err(Exchange::Failed(detail)) => return Err(protocol(detail)),
            }
        }
    }

    /// How long a body may go without a byte.
    pub fn idle_read_timeout(&self) -> std::time::Duration {
        self.idle_timeout
    }

    /// Counts body bytes received from upstreams (`upstream_received_bytes`).
    pub fn count_received(&self, n: usize) {
        self.metrics.bytes.inc_by(n as u64);
    }
}

/// The request head of `req` (an `http` URL) for a kept-alive connection.
fn request_head(req: &UpstreamRequest, user_agent: &http::HeaderValue) -> Vec<u8> {
    let url = &req.url;
    let target = &url[url::Position::BeforePath..url::Position::AfterQuery];
    let host = match (url.host_str(), url.port()) {
        (Some(host), Some(port)) => format!("{host}:{port}"),
        (host, None) => host.unwrap_or("").to_string(),
        (None, Some(_)) => String::new(),
    };
    super::h1::request_head(&req.method, target, &host, &req.headers, user_agent, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_of_a_url() {
        let mut req =
            UpstreamRequest::get("http://127.0.0.1:8080/a/b.mp4?x=1&y=%20".parse().unwrap());
        req.headers
            .insert("referer", http::HeaderValue::from_static("http://r/"));
        let head = request_head(&req, &http::HeaderValue::from_static("sluice"));
        assert_eq!(
            head,
            b"GET /a/b.mp4?x=1&y=%20 HTTP/1.1\r\nhost: 127.0.0.1:8080\r\nuser-agent: sluice\r\n\
             referer: http://r/\r\n\r\n"
        );
    }

    /// `pool_max_idle_per_host = 0` (keep-alive off): a connection read to its end is closed,
    /// not pooled, and the task returning it does not panic.
    #[tokio::test]
    async fn no_idle_connections_kept_when_the_limit_is_zero() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let pool = Arc::new(RawPool::new(0, Duration::from_secs(60)));
        let key = format!("127.0.0.1:{}", addr.port());
        let returning = pool.clone();
        let key2 = key.clone();
        let checkin = tokio::spawn(async move { returning.checkin(key2, client) });
        assert!(checkin.await.is_ok(), "checkin panicked");
        assert!(pool.checkout(&key).is_none());
        // The connection was dropped, so the origin's side sees it closed.
        let mut buf = [0u8; 1];
        let n = tokio::io::AsyncReadExt::read(&mut server, &mut buf)
            .await
            .unwrap();
        assert_eq!(n, 0);
    }

    /// Many origins, one socket each: the pool keeps at most its overall cap, closing the
    /// oldest. Before, nothing bounded the sockets parked within `pool_idle_secs` below 1,024
    /// origins, and past that only expired ones were cleared.
    #[tokio::test(start_paused = true)]
    async fn idle_sockets_are_capped_across_origins_oldest_first() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let pool = Arc::new(RawPool::with_total(8, 4, Duration::from_secs(60)));
        let mut origins = Vec::new();
        for k in 0..6 {
            let client = TcpStream::connect(addr).await.unwrap();
            let (server, _) = listener.accept().await.unwrap();
            pool.checkin(format!("origin{k}:80"), client);
            origins.push(server);
            // Distinct check-in times, so "oldest" is well defined.
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        assert_eq!(pool.idle_count(), 4);
        // A second socket to a pooled origin takes a place too: the oldest left (origin2) goes.
        let client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        pool.checkin("origin5:80".into(), client);
        origins.push(server);
        assert_eq!(pool.idle_count(), 4);
        // The three oldest were closed: their origins see EOF.
        for (k, server) in origins.iter_mut().enumerate().take(3) {
            let mut buf = [0u8; 1];
            let n = tokio::io::AsyncReadExt::read(server, &mut buf).await;
            assert_eq!(n.unwrap(), 0, "origin{k} still held");
            assert!(pool.checkout(&format!("origin{k}:80")).is_none());
        }
        for k in [3, 4] {
            assert!(
                pool.checkout(&format!("origin{k}:80")).is_some(),
                "origin{k}"
            );
        }
        assert!(pool.checkout("origin5:80").is_some());
        assert!(pool.checkout("origin5:80").is_some());
        assert_eq!(pool.idle_count(), 0);
    }

    /// Sockets of origins never asked again are closed once idle past the timeout, whatever
    /// origin is checked in or out: before, an expired socket went only at a checkout of its own
    /// origin or when the overall cap evicted it, so spliced streams to many origins left up to
    /// 1,024 sockets open (in CLOSE_WAIT once the origins closed them) for good.
    #[tokio::test(start_paused = true)]
    async fn expired_sockets_of_every_origin_are_closed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let pool = Arc::new(RawPool::new(8, Duration::from_secs(1)));
        let mut origins = Vec::new();
        for k in 0..5 {
            if k == 4 {
                // The last origin's socket comes back later: it is not expired at the sweep.
                tokio::time::sleep(Duration::from_millis(600)).await;
            }
            let client = TcpStream::connect(addr).await.unwrap();
            let (server, _) = listener.accept().await.unwrap();
            pool.checkin(format!("origin{k}:80"), client);
            origins.push(server);
        }
        assert_eq!(pool.idle_count(), 5);
        // Past the timeout of the first four (and a reaper period): nobody asked for any origin.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(pool.idle_count(), 1, "expired sockets still held");
        for (k, server) in origins.iter_mut().enumerate().take(4) {
            let mut buf = [0u8; 1];
            let n = tokio::io::AsyncReadExt::read(server, &mut buf).await;
            assert_eq!(n.unwrap(), 0, "origin{k} still held");
        }
        // The last one goes too, and the reaper ends with the pool empty; a later checkin starts
        // another.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(pool.idle_count(), 0);
        assert!(!pool.idle.lock().unwrap().reaping);
        let client = TcpStream::connect(addr).await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        pool.checkin("origin9:80".into(), client);
        tokio::time::sleep(Duration::from_millis(1600)).await;
        assert_eq!(pool.idle_count(), 0);
        let mut buf = [0u8; 1];
        let n = tokio::io::AsyncReadExt::read(&mut server, &mut buf).await;
        assert_eq!(n.unwrap(), 0);
    }

    /// A reaper task dropped unfinished with its runtime clears the pool's `reaping`: left set,
    /// no later checkin started another, and the pool's sockets were closed only by checkouts
    /// of their own origin or the overall cap again.
    #[test]
    fn a_reaper_dropped_with_its_runtime_lets_the_next_one_start() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let pool = Arc::new(RawPool::new(8, Duration::from_millis(200)));
        let checkin = |rt: &tokio::runtime::Runtime, key: &str| {
            let client = std::net::TcpStream::connect(addr).unwrap();
            client.set_nonblocking(true).unwrap();
            let (server, _) = listener.accept().unwrap();
            rt.block_on(async { pool.checkin(key.into(), TcpStream::from_std(client).unwrap()) });
            server
        };
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let first = runtime();
        let _a = checkin(&first, "origin0:80");
        assert!(pool.idle.lock().unwrap().reaping);
        drop(first);
        assert!(
            !pool.idle.lock().unwrap().reaping,
            "a reaper dropped with its runtime still counts as running"
        );
        let second = runtime();
        let _b = checkin(&second, "origin1:80");
        assert!(pool.idle.lock().unwrap().reaping);
        second.block_on(async { tokio::time::sleep(Duration::from_secs(1)).await });
        assert_eq!(pool.idle_count(), 0, "no reaper closed the sockets");
    }
}
