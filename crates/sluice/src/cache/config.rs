//! The `[cache]` config section, the per-route cache policy keys, and byte sizes such as `"256MiB"`.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sluice_http::freshness::{FreshnessPolicy, RequestDirectives};

/// A number of bytes, written as an integer or a string with a unit (`B`, `KiB`, `MiB`, `GiB`,
/// `TiB`, or the decimal `KB`, `MB`, `GB`, `TB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parses `"256MiB"`, `"1.5GiB"`, `"4096"`.
    pub fn parse(text: &str) -> Result<ByteSize, String> {
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let num: f64 = num
            .parse()
            .map_err(|_| format!("{text:?} is not a size such as \"256MiB\""))?;
        let mult: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" | "K" => 1 << 10,
            "MiB" | "M" => 1 << 20,
            "GiB" | "G" => 1 << 30,
            "TiB" | "T" => 1 << 40,
            "KB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            other => return Err(format!("unknown size unit {other:?} in {text:?}")),
        };
        let bytes = num * mult as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(format!("{text:?} is out of range"));
        }
        Ok(ByteSize(bytes as u64))
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ByteSize, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Text(t) => ByteSize::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

/// How a client's `Cache-Control` request directives are treated (`request_directives`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RequestDirectivesConfig {
    /// RFC 9111 for shared caches: `no-cache`, `max-age`, `min-fresh`, `max-stale`, `no-store` honoured.
    #[default]
    Honor,
    /// Ignored (CDN style): a client cannot force a refetch.
    Ignore,
}

/// The slice cache service (`[cache]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Bytes of slice data the memory tier holds.
    pub memory_bytes: ByteSize,
    /// Directory of the disk tier; no disk tier without it.
    pub disk_path: Option<PathBuf>,
    /// Bytes of slice data the disk tier holds.
    pub disk_bytes: ByteSize,
    /// Size of one slice: objects are fetched, stored and coalesced in aligned slices of this size.
    pub slice_bytes: ByteSize,
    /// Objects (URL variants) whose metadata is indexed at once (their heads also count against
    /// `memory_bytes`, at most half of it).
    pub max_objects: usize,
    /// Slices being fetched from origins at once (each holds at most `slice_bytes` while in flight,
    /// shared by all its readers).
    pub max_inflight_slices: usize,
    /// Bytes a fill keeps reading for an origin that ignores `Range` after every client went away.
    pub detached_fill_bytes: ByteSize,
    /// Most bytes of one object's whole answer the tiers keep (`0`: a quarter of the largest
    /// tier, `disk_bytes` with a disk tier, else `memory_bytes`). Past it the object is
    /// forgotten and its URL passed (`object_bound`).
    pub max_object_bytes: ByteSize,
    /// Seconds an uncacheable answer keeps its URL out of the coalescing path (hit-for-pass).
    pub hit_for_pass_secs: u64,
    /// Slices waiting to be written to disk; a fill that finds the queue full waits for room
    /// (their bytes count against `memory_bytes` too).
    pub disk_queue: usize,
    /// Milliseconds a disk read may take before the slice is fetched from the origin instead.
    pub disk_read_timeout_ms: u64,
    /// Milliseconds a slice may wait for room in the disk queue, or in the queue, before it is
    /// dropped (a disk too slow for the traffic).
    pub disk_write_timeout_ms: u64,
    /// Seconds a fill waits for the origin's response head.
    pub origin_header_timeout_secs: u64,
    /// Seconds a fill waits for the next body bytes from the origin.
    pub origin_idle_timeout_secs: u64,
    /// Seconds one slice's bytes may take to arrive once no client follows the fill: past it the
    /// fill is given up (an origin that trickles bytes just inside the idle wait would otherwise
    /// hold its fill place and its share of the budget for good). A fill someone reads goes on.
    pub origin_slice_timeout_secs: u64,
    /// Key accepted for `PURGE` (in `X-Purge-Key` or `Authorization: Bearer`); the API password is
    /// accepted too. Empty and no password: purge is refused.
    pub purge_key: String,
    /// Addresses (IPs or CIDRs) allowed to purge.
    pub purge_allow: Vec<ipnet::IpNet>,
    /// Heuristic freshness as a percentage of `Date - Last-Modified` (route default).
    pub heuristic_percent: u32,
    /// Cap of a heuristic lifetime, in seconds (route default).
    pub heuristic_max_secs: u64,
    /// Lifetime of a storable response with no expiration and no `Last-Modified`; 0 is RFC
    /// behaviour (route default).
    pub default_ttl_secs: u64,
    /// Stale window for origins that send neither `stale-while-revalidate` nor `stale-if-error`
    /// (route default).
    pub grace_secs: u64,
    /// `honor` (RFC 9111) or `ignore` a client's own cache directives (route default).
    pub request_directives: RequestDirectivesConfig,
    /// Keep memory-tier slices of 64 KiB and more in shared-memory files, and send HTTP/1.1 hits
    /// of them with `sendfile(2)`: no copy into the socket, at the cost of a descriptor and a
    /// mapping per slice. Off by default (see docs/cache.md "Hits with sendfile").
    pub sendfile: bool,
    /// Several nodes as one cache (`[cache.cluster]`, docs/cache.md "Running a cluster").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<super::cluster::ClusterConfig>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            memory_bytes: ByteSize(256 << 20),
            disk_path: None,
            disk_bytes: ByteSize(10 << 30),
            slice_bytes: ByteSize(1 << 20),
            max_objects: 100_000,
            max_inflight_slices: 64,
            detached_fill_bytes: ByteSize(64 << 20),
            max_object_bytes: ByteSize(0),
            hit_for_pass_secs: 120,
            disk_queue: 64,
            disk_read_timeout_ms: 1000,
            disk_write_timeout_ms: 10_000,
            origin_header_timeout_secs: 30,
            origin_idle_timeout_secs: 30,
            origin_slice_timeout_secs: 120,
            purge_key: String::new(),
            purge_allow: vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()],
            heuristic_percent: 10,
            heuristic_max_secs: 86_400,
            default_ttl_secs: 0,
            grace_secs: 0,
            request_directives: RequestDirectivesConfig::Honor,
            sendfile: false,
            cluster: None,
        }
    }
}

/// Freshness policy keys: the `[cache]` defaults with a route's overrides applied.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyConfig {
    /// Heuristic freshness as a percentage of `Date - Last-Modified`.
    pub heuristic_percent: u32,
    /// Cap of a heuristic lifetime, in seconds.
    pub heuristic_max_secs: u64,
    /// Lifetime of a storable response with no expiration and no `Last-Modified` (0: RFC behaviour).
    pub default_ttl_secs: u64,
    /// Stale window for origins that send neither `stale-while-revalidate` nor `stale-if-error`.
    pub grace_secs: u64,
    /// `honor` (RFC 9111) or `ignore` a client's own cache directives.
    pub request_directives: RequestDirectivesConfig,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        CacheConfig::default().policy()
    }
}

impl PolicyConfig {
    /// The pure policy this config describes.
    pub fn freshness(&self) -> FreshnessPolicy {
        FreshnessPolicy {
            heuristic_fraction: f64::from(self.heuristic_percent) / 100.0,
            heuristic_max: Duration::from_secs(self.heuristic_max_secs),
            heuristic_min: Duration::ZERO,
            default_ttl: Duration::from_secs(self.default_ttl_secs),
            grace: Duration::from_secs(self.grace_secs),
            request_directives: match self.request_directives {
                RequestDirectivesConfig::Honor => RequestDirectives::Honor,
                RequestDirectivesConfig::Ignore => RequestDirectives::Ignore,
            },
            // The media front end's requests carry only cookies its own keys include; a reverse
            // route decides for itself (`RoutePolicyConfig::cache_cookies`).
            store_cookie_requests: true,
            copy_ttl_secs: None,
            store_shared_set_cookie: false,
        }
    }
}

/// Per-route overrides (`cache_*` keys on a route); unset keys take the `[cache]` value.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RoutePolicyConfig {
    pub cache_grace_secs: Option<u64>,
    pub cache_default_ttl_secs: Option<u64>,
    pub cache_request_directives: Option<RequestDirectivesConfig>,
    /// Store responses to requests with `Cookie` (off by default).
    pub cache_cookies: bool,
}

impl RoutePolicyConfig {
    /// This route's policy over the `[cache]` defaults.
    pub fn resolve(&self, defaults: &PolicyConfig) -> FreshnessPolicy {
        let mut p = defaults.clone();
        if let Some(g) = self.cache_grace_secs {
            p.grace_secs = g;
        }
        if let Some(t) = self.cache_default_ttl_secs {
            p.default_ttl_secs = t;
        }
        if let Some(r) = self.cache_request_directives {
            p.request_directives = r;
        }
        let mut f = p.freshness();
        f.store_cookie_requests = self.cache_cookies;
        f
    }
}

/// Why a `[cache]` section is unusable.
#[derive(Debug, thiserror::Error)]
pub enum CacheConfigError {
    #[error("slice_bytes must be between 16KiB and 64MiB")]
    SliceSize,
    #[error("memory_bytes must be at least 4 slices (4 × slice_bytes)")]
    MemoryTooSmall,
    #[error("disk_bytes must be at least 4 slices when disk_path is set")]
    DiskTooSmall,
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error("heuristic_percent must be at most 100")]
    Heuristic,
    #[error("[cache.cluster]: {0}")]
    Cluster(String),
}

impl CacheConfig {
    /// The route-default freshness policy keys.
    pub fn policy(&self) -> PolicyConfig {
        PolicyConfig {
            heuristic_percent: self.heuristic_percent,
            heuristic_max_secs: self.heuristic_max_secs,
            default_ttl_secs: self.default_ttl_secs,
            grace_secs: self.grace_secs,
            request_directives: self.request_directives,
        }
    }

    /// The most bytes of one object's whole answer stored (`max_object_bytes`, else a quarter
    /// of the largest tier), never less than a slice. Past it an answer (a chunked live stream
    /// that never ends, say) would push out everything else, on both tiers, again and again.
    pub fn object_bound(&self) -> u64 {
        let slice = self.slice_bytes.0;
        if self.max_object_bytes.0 > 0 {
            return self.max_object_bytes.0.max(slice);
        }
        let tier = if self.disk_path.is_some() {
            self.disk_bytes.0.max(self.memory_bytes.0)
        } else {
            self.memory_bytes.0
        };
        (tier / 4).max(slice)
    }

    /// Checks what types alone cannot.
    pub fn validate(&self) -> Result<(), CacheConfigError> {
        let slice = self.slice_bytes.0;
        if !(16 << 10..=64 << 20).contains(&slice) {
            return Err(CacheConfigError::SliceSize);
        }
        if self.memory_bytes.0 < 4 * slice {
            return Err(CacheConfigError::MemoryTooSmall);
        }
        if self.disk_path.is_some() && self.disk_bytes.0 < 4 * slice {
            return Err(CacheConfigError::DiskTooSmall);
        }
        for (name, v) in [
            ("max_objects", self.max_objects),
            ("max_inflight_slices", self.max_inflight_slices),
            ("disk_queue", self.disk_queue),
        ] {
            if v == 0 {
                return Err(CacheConfigError::Zero(name));
            }
        }
        for (name, v) in [
            ("disk_read_timeout_ms", self.disk_read_timeout_ms),
            ("disk_write_timeout_ms", self.disk_write_timeout_ms),
            (
                "origin_header_timeout_secs",
                self.origin_header_timeout_secs,
            ),
            ("origin_idle_timeout_secs", self.origin_idle_timeout_secs),
            ("origin_slice_timeout_secs", self.origin_slice_timeout_secs),
        ] {
            if v == 0 {
                return Err(CacheConfigError::Zero(name));
            }
        }
        if self.heuristic_percent > 100 {
            return Err(CacheConfigError::Heuristic);
        }
        if let Some(c) = &self.cluster {
            c.validate().map_err(CacheConfigError::Cluster)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(ByteSize::parse("256MiB"), Ok(ByteSize(256 << 20)));
        assert_eq!(ByteSize::parse("1.5GiB"), Ok(ByteSize(3 << 29)));
        assert_eq!(ByteSize::parse("10"), Ok(ByteSize(10)));
        assert_eq!(ByteSize::parse("2 MB"), Ok(ByteSize(2_000_000)));
        assert!(ByteSize::parse("lots").is_err());
        assert!(ByteSize::parse("5 parsecs").is_err());
    }

    #[test]
    fn section_parses_and_validates() {
        let c: CacheConfig = toml::from_str(
            "memory_bytes = \"64MiB\"\nslice_bytes = \"1MiB\"\ngrace_secs = 30\nrequest_directives = \"ignore\"",
        )
        .unwrap();
        assert_eq!(c.memory_bytes, ByteSize(64 << 20));
        assert_eq!(c.policy().grace_secs, 30);
        c.validate().unwrap();
        let bad: CacheConfig = toml::from_str("slice_bytes = 10").unwrap();
        assert!(bad.validate().is_err());
        assert!(toml::from_str::<CacheConfig>("nope = 1").is_err());
    }

    #[test]
    fn route_overrides() {
        let r = RoutePolicyConfig {
            cache_grace_secs: Some(9),
            ..Default::default()
        };
        let p = r.resolve(&PolicyConfig::default());
        assert_eq!(p.grace, Duration::from_secs(9));
        assert_eq!(p.heuristic_max, Duration::from_secs(86_400));
    }
}
