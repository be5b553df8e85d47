//! The `Cache-Status` response field (RFC 9211): what the cache did with one request. No I/O.

use std::fmt::Write as _;

/// Why the request went forward to the origin (`fwd=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forward {
    /// Policy said not to use the cache (hit-for-pass, uncacheable answer, method).
    Bypass,
    /// The cache holds nothing for the URI.
    UriMiss,
    /// The cache holds the URI but no matching variant.
    VaryMiss,
    /// The object is known but this part (slice) was not stored.
    Miss,
    /// A stored response was stale and went to be validated.
    Stale,
    /// The client asked (`no-cache`, `max-age=0`).
    Request,
}

impl Forward {
    fn token(self) -> &'static str {
        match self {
            Forward::Bypass => "bypass",
            Forward::UriMiss => "uri-miss",
            Forward::VaryMiss => "vary-miss",
            Forward::Miss => "miss",
            Forward::Stale => "stale",
            Forward::Request => "request",
        }
    }
}

/// One cache's entry in `Cache-Status`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheStatus {
    pub hit: bool,
    pub fwd: Option<Forward>,
    /// Status of the forwarded response (`fwd-status`), e.g. 304 after a revalidation.
    pub fwd_status: Option<u16>,
    /// Whether the forwarded response was stored.
    pub stored: bool,
    /// Whether this request was coalesced behind another one's fetch.
    pub collapsed: bool,
    /// Remaining freshness in seconds (negative when served stale).
    pub ttl: Option<i64>,
    /// A short reason, e.g. `no-store`, `stale-while-revalidate`, `stale-if-error`.
    pub detail: Option<&'static str>,
}

impl CacheStatus {
    /// Renders the field value for a cache named `name` (a token such as `sluice`).
    pub fn render(&self, name: &str) -> String {
        // Room for the longest usual value, so it is built in one allocation.
        let mut out = String::with_capacity(name.len() + 64);
        out.push_str(name);
        if self.hit {
            out.push_str("; hit");
        }
        if let Some(fwd) = self.fwd {
            let _ = write!(out, "; fwd={}", fwd.token());
        }
        if let Some(status) = self.fwd_status {
            let _ = write!(out, "; fwd-status={status}");
        }
        if self.stored {
            out.push_str("; stored");
        }
        if self.collapsed {
            out.push_str("; collapsed");
        }
        if let Some(ttl) = self.ttl {
            let _ = write!(out, "; ttl={ttl}");
        }
        if let Some(detail) = self.detail {
            // Details are fixed tokens of this crate, so they never need quoting beyond this.
            let _ = write!(out, "; detail={detail}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_hit() {
        let s = CacheStatus {
            hit: true,
            ttl: Some(42),
            ..Default::default()
        };
        assert_eq!(s.render("sluice"), "sluice; hit; ttl=42");
    }

    #[test]
    fn renders_miss_stored() {
        let s = CacheStatus {
            fwd: Some(Forward::UriMiss),
            fwd_status: Some(200),
            stored: true,
            collapsed: true,
            ttl: Some(60),
            ..Default::default()
        };
        assert_eq!(
            s.render("sluice"),
            "sluice; fwd=uri-miss; fwd-status=200; stored; collapsed; ttl=60"
        );
    }

    #[test]
    fn renders_stale_and_bypass() {
        let s = CacheStatus {
            hit: true,
            ttl: Some(-3),
            detail: Some("stale-while-revalidate"),
            ..Default::default()
        };
        assert_eq!(
            s.render("sluice"),
            "sluice; hit; ttl=-3; detail=stale-while-revalidate"
        );
        let s = CacheStatus {
            fwd: Some(Forward::Bypass),
            detail: Some("no-store"),
            ..Default::default()
        };
        assert_eq!(s.render("sluice"), "sluice; fwd=bypass; detail=no-store");
    }
}
