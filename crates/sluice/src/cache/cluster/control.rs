//! The control listener (purges from peers, this node's purge log) and the active checker: each
//! interval it pulls every peer's purge log after the last entry it applied, which is also the
//! peer's health check (a peer that answers is up; `max_fails` misses in a row take it out).

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::hop::HOP_HEADER;
use super::peer::body_digest;
use super::purge_log::{LogPage, PurgeOrder};
use super::Cluster;
use crate::body::Body;
use crate::cache::Inner;

/// Marks the control listener's own error answers.
pub(crate) const CONTROL_ERROR: &str = "sluice-cluster-error";

/// Largest control request body (one purge order).
const MAX_BODY: usize = 64 << 10;

/// What one client can hold of the control listener. Its requests are signed, but anyone who
/// can reach the port can open connections and send half a head: without these it kept each
/// one for good (hyper has no header timeout without a timer), and enough of them used up the
/// process's descriptors, which the public listeners share. The cluster's members (by address)
/// have places of their own, so a flood from elsewhere cannot keep their checks, purges and
/// fills out (a failed check takes this node out of their rings).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ControlLimits {
    /// Connections open at once from addresses that are not members; one more is closed at
    /// once.
    pub connections: usize,
    /// Of those, connections from one address (an IPv6 /64).
    pub per_ip: usize,
    /// Connections open at once from the members together (each keeps up to 64 pooled).
    pub members: usize,
    /// A request's head, from the connection's start or the end of the previous answer (an
    /// idle keep-alive connection closes then too; peers keep theirs 30 s).
    pub head: Duration,
    /// A request's body, whole.
    pub body: Duration,
}

impl Default for ControlLimits {
    fn default() -> Self {
        ControlLimits {
            connections: 256,
            per_ip: 16,
            members: 1024,
            head: Duration::from_secs(35),
            body: Duration::from_secs(10),
        }
    }
}

fn answer(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(crate::body::full(body));
    *r.status_mut() = status;
    if status != StatusCode::OK {
        // The control plane's own refusal, told apart from a fill's answer (an origin's 404).
        r.headers_mut()
            .insert(CONTROL_ERROR, http::HeaderValue::from_static("1"));
    }
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// Binds the control listener (it serves nothing until [`serve`]).
pub(crate) fn bind(bind: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let std = std::net::TcpListener::bind(bind)?;
    std.set_nonblocking(true)?;
    Ok(std)
}

/// Serves the control listener bound by [`bind`] while the cluster lives; aborting the task
/// returned closes it.
pub(crate) fn serve(
    std: std::net::TcpListener,
    cluster: Weak<Cluster>,
    cache: Weak<Inner>,
    limits: ControlLimits,
) -> std::io::Result<tokio::task::AbortHandle> {
    let listener = TcpListener::from_std(std)?;
    let places = Arc::new(tokio::sync::Semaphore::new(limits.connections));
    let member_places = Arc::new(tokio::sync::Semaphore::new(limits.members));
    let per_ip = crate::net::per_ip::PerIp::by_network(limits.per_ip, Vec::new());
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, from)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let Some(c) = cluster.upgrade() else {
                return;
            };
            let member = is_member(&c, from.ip());
            drop(c);
            let place = match member {
                true => member_places
                    .clone()
                    .try_acquire_owned()
                    .ok()
                    .map(|p| (p, None)),
                false => match per_ip.take(from.ip()) {
                    Some(ip_place) => places
                        .clone()
                        .try_acquire_owned()
                        .ok()
                        .map(|p| (p, ip_place)),
                    None => None,
                },
            };
            let Some(place) = place else {
                tracing::debug!(%from, "cache cluster control listener full: a connection closed");
                continue;
            };
            let _ = stream.set_nodelay(true);
            let (cluster, cache) = (cluster.clone(), cache.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let (cluster, cache) = (cluster.clone(), cache.clone());
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            handle(req, cluster, cache, limits.body).await,
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(limits.head)
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
                drop(place);
            });
        }
    });
    Ok(task.abort_handle())
}

/// Whether `ip` is one of the cluster's members' addresses.
fn is_member(cluster: &Cluster, ip: std::net::IpAddr) -> bool {
    let ip = ip.to_canonical();
    cluster.ring.view().members.iter().any(|m| {
        m.addr
            .parse::<SocketAddr>()
            .is_ok_and(|a| a.ip().to_canonical() == ip)
    })
}

async fn handle(
    req: Request<Incoming>,
    cluster: Weak<Cluster>,
    cache: Weak<Inner>,
    body_time: Duration,
) -> Response<Body> {
    let (Some(cluster), Some(cache)) = (cluster.upgrade(), cache.upgrade()) else {
        return answer(StatusCode::SERVICE_UNAVAILABLE, "{}".into());
    };
    let (parts, body) = req.into_parts();
    let body = match tokio::time::timeout(body_time, Limited::new(body, MAX_BODY).collect()).await {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => {
            return answer(
                StatusCode::PAYLOAD_TOO_LARGE,
                "{\"error\":\"too large\"}".into(),
            )
        }
        Err(_) => {
            return answer(
                StatusCode::REQUEST_TIMEOUT,
                "{\"error\":\"body too slow\"}".into(),
            )
        }
    };
    let body = body.to_bytes();
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let signed = parts.headers.get(HOP_HEADER).and_then(|v| {
        cluster
            .key
            .verify(v, parts.method.as_str(), &body_digest(&body), target)
    });
    if signed.is_none() {
        return answer(StatusCode::FORBIDDEN, "{\"error\":\"forbidden\"}".into());
    }
    match (parts.method.clone(), parts.uri.path()) {
        (Method::POST, "/cluster/purge") => match serde_json::from_slice::<PurgeOrder>(&body) {
            Ok(order) => {
                let n = cache.apply_order(&order, false);
                answer(StatusCode::OK, format!("{{\"purged\":{n}}}"))
            }
            Err(e) => answer(
                StatusCode::BAD_REQUEST,
                serde_json::json!({ "error": e.to_string() }).to_string(),
            ),
        },
        (Method::POST, path) if path.starts_with("/cluster/fill/") => {
            let name = &path["/cluster/fill/".len()..];
            let handler = cluster
                .fills
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(name)
                .cloned();
            match handler {
                Some(h) => {
                    cluster.metrics.hops.inc();
                    h(body).await
                }
                None => answer(StatusCode::NOT_FOUND, "{\"error\":\"no such fill\"}".into()),
            }
        }
        (Method::GET, "/cluster/log") => {
            let q = parts.uri.query().unwrap_or("");
            let get = |name: &str| {
                q.split('&')
                    .filter_map(|kv| kv.split_once('='))
                    .find(|(k, _)| *k == name)
                    .and_then(|(_, v)| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let mut page = cluster.log.page(get("boot"), get("after"));
            page.up_ms = cluster.ring.up_ms();
            answer(
                StatusCode::OK,
                serde_json::to_string(&page).unwrap_or_default(),
            )
        }
        _ => answer(StatusCode::NOT_FOUND, "{\"error\":\"not found\"}".into()),
    }
}

/// Checks every peer each `health_interval_ms` while the cache lives.
pub(crate) fn spawn_checker(
    cluster: Weak<Cluster>,
    cache: Weak<Inner>,
    interval: Duration,
) -> tokio::task::AbortHandle {
    let task = tokio::spawn(async move {
        // Members given a `member_up` series, so those that leave the ring lose theirs.
        let mut reported = std::collections::HashSet::new();
        loop {
            {
                let (Some(cluster), Some(cache)) = (cluster.upgrade(), cache.upgrade()) else {
                    return;
                };
                check_all(&cluster, &cache, &mut reported).await;
            }
            tokio::time::sleep(interval).await;
        }
    });
    task.abort_handle()
}

async fn check_all(
    cluster: &Arc<Cluster>,
    cache: &Arc<Inner>,
    reported: &mut std::collections::HashSet<String>,
) {
    let view = cluster.ring.view();
    let checks = view
        .members
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != view.self_index)
        .map(|(_, m)| async move {
            let state = &m.state;
            let boot = state.log_boot.load(std::sync::atomic::Ordering::Relaxed);
            let after = state.log_seq.load(std::sync::atomic::Ordering::Relaxed);
            let target = format!("/cluster/log?boot={boot}&after={after}");
            let got = cluster
                .peer
                .control(m, Method::GET, &target, Bytes::new())
                .await;
            let page = match got {
                Ok((StatusCode::OK, body)) => serde_json::from_slice::<LogPage>(&body).ok(),
                _ => None,
            };
            let Some(page) = page else {
                cluster.metrics.owner_failures.inc();
                if state.report_failure(cluster.config.max_fails) {
                    tracing::warn!(peer = %m.addr, "cache cluster peer is out of the ring");
                }
                return;
            };
            // Up again: first apply what it purged meanwhile, then take it back.
            for e in &page.entries {
                cache.apply_order(&e.order, true);
                cluster.metrics.purges_replayed.inc();
            }
            let last = page.entries.last().map_or(after, |e| e.seq);
            let last = if page.boot == boot {
                last
            } else {
                page.entries.last().map_or(0, |e| e.seq)
            };
            state
                .log_boot
                .store(page.boot, std::sync::atomic::Ordering::Relaxed);
            state
                .log_seq
                .store(last, std::sync::atomic::Ordering::Relaxed);
            if !state.is_up() {
                tracing::info!(peer = %m.addr, "cache cluster peer is back");
            }
            state.report_success();
            if page.up_ms > 0 {
                // Its rampup runs from its own start, as it runs its own: every node agrees
                // on who owns a key while it ramps, whenever each of them noticed it.
                state.started_ago(page.up_ms);
            }
        });
    futures_util::future::join_all(checks).await;
    let up = |m: &super::ring::Member, i| Some(i) == view.self_index || m.state.is_up();
    cluster.metrics.members.set(view.members.len() as i64);
    let states: Vec<(&str, bool)> = view
        .members
        .iter()
        .enumerate()
        .map(|(i, m)| (m.addr.as_str(), up(m, i)))
        .collect();
    publish_members(&cluster.metrics, &states, reported);
}

/// Sets `member_up` for each member, and removes the series of those `reported` before but
/// no longer on the ring (gone from DNS or the config): they stayed "up" for good.
fn publish_members(
    metrics: &super::metrics::ClusterMetrics,
    members: &[(&str, bool)],
    reported: &mut std::collections::HashSet<String>,
) {
    let labels = |member: &str| super::metrics::MemberLabels {
        member: member.to_string(),
    };
    reported.retain(|gone| {
        let kept = members.iter().any(|(addr, _)| addr == gone);
        if !kept {
            metrics.member_up.remove(&labels(gone));
        }
        kept
    });
    for (addr, up) in members {
        metrics
            .member_up
            .get_or_create(&labels(addr))
            .set(i64::from(*up));
        reported.insert((*addr).to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_that_leave_lose_their_up_series() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = super::super::metrics::ClusterMetrics::register(&mut registry);
        let text = || {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
            out
        };
        let mut reported = std::collections::HashSet::new();
        publish_members(
            &metrics,
            &[("10.0.0.1:80", true), ("10.0.0.2:80", false)],
            &mut reported,
        );
        let first = text();
        assert!(
            first.contains("member_up{member=\"10.0.0.1:80\"} 1"),
            "{first}"
        );
        assert!(
            first.contains("member_up{member=\"10.0.0.2:80\"} 0"),
            "{first}"
        );
        // 10.0.0.1 left DNS; 10.0.0.3 came.
        publish_members(
            &metrics,
            &[("10.0.0.2:80", true), ("10.0.0.3:80", true)],
            &mut reported,
        );
        let second = text();
        assert!(!second.contains("10.0.0.1"), "{second}");
        assert!(
            second.contains("member_up{member=\"10.0.0.2:80\"} 1"),
            "{second}"
        );
        assert!(
            second.contains("member_up{member=\"10.0.0.3:80\"} 1"),
            "{second}"
        );
        assert_eq!(reported.len(), 2);
    }
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Whether the server closed `s` within `within` (end of stream or a reset).
    async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 1024];
        matches!(
            tokio::time::timeout(within, s.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    /// A connection from `from` (a loopback address) to `to`.
    async fn connect_from(from: [u8; 4], to: SocketAddr) -> tokio::net::TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind((std::net::Ipv4Addr::from(from), 0).into())
            .unwrap();
        socket.connect(to).await.unwrap()
    }

    /// Half-sent heads from anyone who can reach the port: each is closed at the head timeout;
    /// past one address's share, or past the bound for every address that is not a member, one
    /// more is closed at once; a member's connection still gets its place, and the listener
    /// serves on.
    #[tokio::test]
    async fn half_sent_heads_are_bounded_and_timed_out() {
        let config = super::super::ClusterConfig {
            secret: "0123456789abcdef".into(),
            ..Default::default()
        };
        let metrics = crate::cache::metrics::CacheMetrics::new(&mut Default::default()).cluster;
        let cluster = Arc::new(
            Cluster::new(
                &config,
                metrics,
                (Duration::from_secs(1), Duration::from_secs(1)),
            )
            .unwrap(),
        );
        // 127.0.0.1 is a member; 127.0.0.2-4 are not.
        cluster
            .ring
            .set_members(vec![super::super::ring::MemberSpec {
                addr: "127.0.0.1:9".into(),
                control: "127.0.0.1:9".parse().unwrap(),
                weight: 1,
            }]);
        let limits = ControlLimits {
            connections: 8,
            per_ip: 4,
            members: 8,
            head: Duration::from_millis(700),
            body: Duration::from_millis(700),
        };
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        serve(listener, Arc::downgrade(&cluster), Weak::new(), limits).unwrap();
        let half = |mut s: tokio::net::TcpStream| async move {
            s.write_all(b"POST /cluster/purge HTTP/1.1\r\nHo")
                .await
                .unwrap();
            s
        };
        let mut held = Vec::new();
        for from in [[127, 0, 0, 2], [127, 0, 0, 3]] {
            for _ in 0..4 {
                held.push(half(connect_from(from, addr).await).await);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A fifth from one address, and the first from a third address past the bound of 8.
        for from in [[127, 0, 0, 2], [127, 0, 0, 4]] {
            let mut extra = connect_from(from, addr).await;
            assert!(
                closed_within(&mut extra, Duration::from_millis(300)).await,
                "a connection past the bounds was kept ({from:?})"
            );
        }
        // A member is answered meanwhile (this test's cache is gone: 503).
        let ask = |mut s: tokio::net::TcpStream| async move {
            s.write_all(b"GET /cluster/log HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut answer = vec![0u8; 256];
            let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut answer))
                .await
                .unwrap()
                .unwrap();
            answer.truncate(n);
            answer
        };
        let answer = ask(connect_from([127, 0, 0, 1], addr).await).await;
        assert!(answer.starts_with(b"HTTP/1.1 503"), "{answer:?}");
        for s in &mut held {
            assert!(
                closed_within(s, Duration::from_secs(3)).await,
                "a half-sent head was kept past the head timeout"
            );
        }
        // Places given back: a whole request from a non-member is answered.
        let answer = ask(connect_from([127, 0, 0, 4], addr).await).await;
        assert!(answer.starts_with(b"HTTP/1.1 503"), "{answer:?}");
    }
}
