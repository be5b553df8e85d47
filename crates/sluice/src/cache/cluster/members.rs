//! Where the member list comes from: the static `peers` list, or a DNS name re-resolved when its
//! answer's TTL runs out (A/AAAA on one port, or SRV records with their own ports and weights).
//! A DNS answer is bounded (at most [`MAX_DNS_MEMBERS`], this host's own and link-local
//! addresses refused): whoever controls it must not grow the ring, the checks and the metrics
//! without end, nor point relays at addresses the origin guard would never let through.

use std::net::SocketAddr;
#[cfg(feature = "dns")]
use std::sync::Weak;
#[cfg(feature = "dns")]
use std::time::Duration;

use super::config::ClusterConfig;
#[cfg(feature = "dns")]
use super::config::MAX_WEIGHT;
use super::ring::MemberSpec;
#[cfg(feature = "dns")]
use super::ring::Ring;

/// The static list as ring members.
pub fn static_members(config: &ClusterConfig) -> Vec<MemberSpec> {
    config
        .peers
        .iter()
        .filter_map(|p| {
            let addr: SocketAddr = p.addr().parse().ok()?;
            let control = match p.control() {
                Some(c) => c.parse().ok()?,
                None => SocketAddr::new(addr.ip(), config.control_port),
            };
            Some(MemberSpec {
                addr: addr.to_string(),
                control,
                weight: p.weight(),
            })
        })
        .collect()
}

/// Most members a DNS answer may name; past it the first of them in address order are kept (the
/// same choice on every node, so the rings agree).
#[cfg(feature = "dns")]
pub const MAX_DNS_MEMBERS: usize = 256;

/// Whether a member from DNS may have this address: not loopback, link-local, unspecified or
/// multicast (a relay to a peer is not checked by the origin guard, so a DNS answer naming
/// `127.0.0.1` or `169.254.169.254` would reach this host's own services or the metadata one).
#[cfg(feature = "dns")]
fn dns_address_allowed(ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    let ip = ip.to_canonical();
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local() || v4.is_broadcast(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    };
    !(ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() || link_local)
}

/// A DNS answer as ring members: refused addresses dropped, at most [`MAX_DNS_MEMBERS`] kept.
#[cfg(feature = "dns")]
fn bounded(name: &str, mut specs: Vec<MemberSpec>) -> Vec<MemberSpec> {
    let before = specs.len();
    specs.retain(|m| {
        m.addr
            .parse::<SocketAddr>()
            .is_ok_and(|a| dns_address_allowed(a.ip()))
    });
    if specs.len() < before {
        tracing::warn!(
            %name,
            refused = before - specs.len(),
            "cache cluster DNS answer names loopback, link-local or unspecified addresses; left out"
        );
    }
    specs.sort();
    specs.dedup_by(|a, b| a.addr == b.addr);
    if specs.len() > MAX_DNS_MEMBERS {
        tracing::warn!(
            %name,
            members = specs.len(),
            kept = MAX_DNS_MEMBERS,
            "cache cluster DNS answer names too many members; the first in address order kept"
        );
        specs.truncate(MAX_DNS_MEMBERS);
    }
    specs
}

/// Keeps the ring's members in step with DNS until the ring is dropped (or the task returned
/// is aborted).
#[cfg(feature = "dns")]
pub fn spawn_dns(
    config: &ClusterConfig,
    ring: Weak<Ring>,
    resolved: crate::atomic::Counter,
) -> tokio::task::AbortHandle {
    let resolver = dns::resolver(config.dns_server);
    let name = config.dns.clone().unwrap_or_default();
    let (min, max) = (
        Duration::from_secs(config.dns_min_refresh_secs),
        Duration::from_secs(config.dns_max_refresh_secs),
    );
    let control_port = config.control_port;
    let task = tokio::spawn(async move {
        loop {
            let wait = match dns::members(&resolver, &name, control_port).await {
                Ok((specs, ttl)) => {
                    let Some(ring) = ring.upgrade() else { return };
                    resolved.inc();
                    let specs = bounded(&name, specs);
                    if specs.is_empty() {
                        tracing::warn!(%name, "cache cluster DNS answer is empty; keeping the ring");
                    } else {
                        ring.set_members(specs);
                    }
                    ttl.clamp(min, max)
                }
                Err(e) => {
                    if ring.strong_count() == 0 {
                        return;
                    }
                    tracing::warn!(%name, error = %e, "cache cluster DNS lookup failed; keeping the ring");
                    min
                }
            };
            tokio::time::sleep(wait).await;
        }
    });
    task.abort_handle()
}

#[cfg(feature = "dns")]
mod dns {
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};

    use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig};
    use hickory_resolver::name_server::TokioConnectionProvider;
    use hickory_resolver::proto::rr::rdata::SRV;
    use hickory_resolver::TokioResolver;

    use super::{MemberSpec, MAX_WEIGHT};

    pub fn resolver(server: Option<SocketAddr>) -> TokioResolver {
        let mut builder = match server {
            Some(s) => TokioResolver::builder_with_config(
                ResolverConfig::from_parts(
                    None,
                    vec![],
                    NameServerConfigGroup::from_ips_clear(&[s.ip()], s.port(), true),
                ),
                TokioConnectionProvider::default(),
            ),
            None => TokioResolver::builder_tokio().unwrap_or_else(|_| {
                TokioResolver::builder_with_config(
                    ResolverConfig::default(),
                    TokioConnectionProvider::default(),
                )
            }),
        };
        let opts = builder.options_mut();
        opts.ip_strategy = hickory_resolver::config::LookupIpStrategy::Ipv4AndIpv6;
        // The loop asks again when the TTL ends; a cache would only answer from memory then.
        opts.cache_size = 0;
        builder.build()
    }

    /// Sorts SRV records by all they hold, so the first [`super::MAX_DNS_MEMBERS`] (and the
    /// weight each keeps) are the same on every node whatever order DNS gave them in: two records
    /// alike but for their weight sorted by target and port alone kept the answer's order.
    pub(super) fn in_order(records: &mut [SRV]) {
        records.sort_by_cached_key(|r| (r.target().to_utf8(), r.port(), r.priority(), r.weight()));
    }

    fn until(t: Instant) -> Duration {
        t.saturating_duration_since(Instant::now())
    }

    /// The members `name` names now, and how long the answer is good for.
    pub async fn members(
        resolver: &TokioResolver,
        name: &str,
        control_port: u16,
    ) -> Result<(Vec<MemberSpec>, Duration), String> {
        let mut out = Vec::new();
        if name.starts_with('_') {
            let srv = resolver.srv_lookup(name).await.map_err(|e| e.to_string())?;
            let mut ttl = until(srv.as_lookup().valid_until());
            // One address lookup per target: no more targets than members kept, the same ones
            // on every node.
            let mut records: Vec<_> = srv.iter().cloned().collect();
            in_order(&mut records);
            records.truncate(super::MAX_DNS_MEMBERS);
            for rec in records {
                let ips = resolver
                    .lookup_ip(rec.target().to_utf8())
                    .await
                    .map_err(|e| e.to_string())?;
                ttl = ttl.min(until(ips.valid_until()));
                for ip in ips.iter() {
                    out.push(MemberSpec {
                        addr: SocketAddr::new(ip, rec.port()).to_string(),
                        control: SocketAddr::new(ip, control_port),
                        weight: u32::from(rec.weight()).clamp(1, MAX_WEIGHT),
                    });
                }
            }
            return Ok((out, ttl));
        }
        let (host, port) = name.rsplit_once(':').ok_or("no port")?;
        let port: u16 = port.parse().map_err(|_| "bad port")?;
        let ips = resolver.lookup_ip(host).await.map_err(|e| e.to_string())?;
        for ip in ips.iter() {
            out.push(MemberSpec {
                addr: SocketAddr::new(ip, port).to_string(),
                control: SocketAddr::new(ip, control_port),
                weight: 1,
            });
        }
        Ok((out, until(ips.valid_until())))
    }
}

#[cfg(all(test, feature = "dns"))]
mod tests {
    use super::*;

    fn spec(addr: &str) -> MemberSpec {
        let a: SocketAddr = addr.parse().unwrap();
        MemberSpec {
            addr: a.to_string(),
            control: SocketAddr::new(a.ip(), 8899),
            weight: 1,
        }
    }

    /// A DNS answer naming this host, link-local or unspecified addresses loses them, and one
    /// naming thousands of members keeps 256, the same ones whatever their order.
    #[test]
    fn a_dns_answer_is_bounded_and_refuses_local_addresses() {
        let refused = [
            "127.0.0.1:8080",
            "127.9.9.9:8080",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:8080",
            "169.254.169.254:80",
            "[fe80::1]:8080",
            "0.0.0.0:8080",
            "[::]:8080",
            "224.0.0.1:8080",
            "255.255.255.255:8080",
        ];
        let mut answer: Vec<MemberSpec> = refused.iter().map(|a| spec(a)).collect();
        answer.push(spec("10.0.0.2:8080"));
        answer.push(spec("[2001:db8::2]:8080"));
        let kept: Vec<String> = bounded("n:8080", answer)
            .into_iter()
            .map(|m| m.addr)
            .collect();
        assert_eq!(kept, ["10.0.0.2:8080", "[2001:db8::2]:8080"]);

        let many: Vec<MemberSpec> = (0..5000u32)
            .map(|i| {
                spec(&format!(
                    "10.{}.{}.{}:8080",
                    i >> 16,
                    (i >> 8) & 255,
                    i & 255
                ))
            })
            .collect();
        let first = bounded("n:8080", many.clone());
        assert_eq!(first.len(), MAX_DNS_MEMBERS);
        let mut reversed = many;
        reversed.reverse();
        assert_eq!(bounded("n:8080", reversed), first);
    }

    /// SRV records alike but for their weight (or priority) are ordered the same whatever order
    /// the answer gave them in, so the cut-off keeps the same weights on every node.
    #[test]
    fn srv_records_are_ordered_by_all_they_hold() {
        use hickory_resolver::proto::rr::rdata::SRV;
        use hickory_resolver::Name;
        let name = |n: &str| Name::from_ascii(n).unwrap();
        let records = vec![
            SRV::new(0, 50, 8080, name("b.test.")),
            SRV::new(0, 10, 8080, name("b.test.")),
            SRV::new(1, 10, 8080, name("b.test.")),
            SRV::new(0, 99, 8080, name("a.test.")),
        ];
        let mut forward = records.clone();
        dns::in_order(&mut forward);
        let mut backward: Vec<SRV> = records.into_iter().rev().collect();
        dns::in_order(&mut backward);
        assert_eq!(forward, backward);
        let seen: Vec<(u16, u16)> = forward.iter().map(|r| (r.priority(), r.weight())).collect();
        assert_eq!(seen, [(0, 99), (0, 10), (0, 50), (1, 10)][..]);
    }
}
