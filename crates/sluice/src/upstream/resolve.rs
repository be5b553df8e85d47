//! Name resolution for upstream connections: an asynchronous caching resolver (answers kept for their
//! TTL), `/etc/hosts` first, and `localhost` answered locally as RFC 6761 asks. Without the `dns`
//! feature (the router build) names go to the C library's resolver on the blocking pool.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

#[cfg(feature = "dns")]
use hickory_resolver::{
    config::{LookupIpStrategy, ResolveHosts},
    TokioResolver,
};

/// Records the resolver cache keeps; each answer expires with its own TTL.
#[cfg(feature = "dns")]
const CACHE_RECORDS: usize = 4096;

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
            None => tokio::net::lookup_host((host, port)).await?.collect(),
        };
        #[cfg(not(feature = "dns"))]
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
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
}
