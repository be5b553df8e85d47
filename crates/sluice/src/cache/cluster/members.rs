//! Where the member list comes from: the static `peers` list, or a DNS name re-resolved when its
//! answer's TTL runs out (A/AAAA on one port, or SRV records with their own ports and weights).

use std::net::SocketAddr;
use std::sync::Weak;
use std::time::Duration;

use super::config::{ClusterConfig, MAX_WEIGHT};
use super::ring::{MemberSpec, Ring};

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
            for rec in srv.iter() {
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
