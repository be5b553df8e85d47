//! MediaFlow's outgoing proxy settings (`proxy_url`, `all_proxy`, `transport_routes`) read into
//! the same route table as sluice's own `[[upstream.routes]]`.
//!
//! MediaFlow (Python) and MediaFlow Proxy Light take `transport_routes` as a JSON object in an
//! environment variable (`TRANSPORT_ROUTES`, `APP__PROXY__TRANSPORT_ROUTES`); Light's TOML file
//! writes it as a table per pattern. sluice reads both in `[upstream]`:
//!
//! ```toml
//! [upstream]
//! proxy_url = "socks5h://vpn:1080"
//! transport_routes = '{"all://*.example.com": {"proxy": true}, "all://direct.example.net": {"proxy": false}}'
//! # or
//! [upstream.transport_routes."all://*.example.com"]
//! proxy = true
//! verify_ssl = false
//! ```
//!
//! Each entry becomes one route with the pattern as written: `proxy_url` if it names one, else
//! `[upstream] proxy_url` when `proxy` is true (the default), else direct; `verify_ssl` (default
//! true) is `verify_tls`. `all_proxy = true` adds an `all` route through `proxy_url` unless an
//! entry already covers `all://`. No I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::config::{RouteConfig, UpstreamConfig};

/// `transport_routes` as either spelling.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TransportRoutes {
    /// A table per pattern (Light's TOML file).
    Table(BTreeMap<String, TransportRoute>),
    /// The JSON object of MediaFlow's environment variable.
    Json(String),
}

impl Default for TransportRoutes {
    fn default() -> Self {
        TransportRoutes::Table(BTreeMap::new())
    }
}

/// One `transport_routes` entry, with MediaFlow's field names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportRoute {
    /// Through a proxy (this entry's `proxy_url`, else `[upstream] proxy_url`); false: direct.
    #[serde(default = "yes")]
    pub proxy: bool,
    /// This entry's own proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_url: Option<String>,
    /// Verify TLS certificates of these hosts.
    #[serde(default = "yes")]
    pub verify_ssl: bool,
}

fn yes() -> bool {
    true
}

/// Why MediaFlow-style settings cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TransportRoutesError {
    #[error(
        "transport_routes is not a JSON object of pattern -> {{proxy, proxy_url, verify_ssl}}: {0}"
    )]
    Json(String),
    #[error("pattern {0:?} is in both upstream.routes and upstream.transport_routes")]
    Twice(String),
}

impl TransportRoutes {
    /// The entries by pattern, whichever spelling they came in.
    pub fn entries(&self) -> Result<BTreeMap<String, TransportRoute>, TransportRoutesError> {
        match self {
            TransportRoutes::Table(t) => Ok(t.clone()),
            TransportRoutes::Json(text) if text.trim().is_empty() => Ok(BTreeMap::new()),
            TransportRoutes::Json(text) => {
                serde_json::from_str(text).map_err(|e| TransportRoutesError::Json(e.to_string()))
            }
        }
    }
}

impl TransportRoutes {
    /// For logs: every proxy URL's credentials masked (the JSON form is read to do so, or
    /// replaced whole when it does not read).
    pub fn masked(&self) -> TransportRoutes {
        match self.entries() {
            Ok(entries) => TransportRoutes::Table(
                entries
                    .into_iter()
                    .map(|(k, mut r)| {
                        r.proxy_url = r.proxy_url.map(|u| crate::redact::mask_userinfo(&u));
                        (k, r)
                    })
                    .collect(),
            ),
            Err(_) => TransportRoutes::Json("********".into()),
        }
    }
}

/// MediaFlow's settings as routes, in pattern order.
pub fn to_routes(
    routes: &TransportRoutes,
    proxy_url: &str,
    all_proxy: bool,
) -> Result<Vec<RouteConfig>, TransportRoutesError> {
    let proxy_url = proxy_url.trim();
    let mut out: Vec<RouteConfig> = routes
        .entries()?
        .into_iter()
        .map(|(pattern, r)| RouteConfig {
            pattern,
            proxy: match r.proxy_url.as_deref().map(str::trim) {
                Some(own) if !own.is_empty() => own.to_string(),
                _ if r.proxy => proxy_url.to_string(),
                _ => String::new(),
            },
            verify_tls: r.verify_ssl,
        })
        .collect();
    let covers_all = out.iter().any(|r| is_all(&r.pattern));
    if all_proxy && !proxy_url.is_empty() && !covers_all {
        out.push(RouteConfig {
            pattern: "all".into(),
            proxy: proxy_url.to_string(),
            verify_tls: true,
        });
    }
    Ok(out)
}

/// `all`, `*`, `all://`, `all://*`: every host, every scheme.
fn is_all(pattern: &str) -> bool {
    let p = pattern.trim().to_ascii_lowercase();
    let p = p.strip_prefix("all://").unwrap_or(&p).trim_end_matches('/');
    matches!(p, "" | "all" | "*")
}

impl UpstreamConfig {
    /// Every outgoing route: `[[upstream.routes]]`, then MediaFlow's `transport_routes` (and
    /// `all_proxy`). A pattern given in both is an error, not a silent choice.
    pub fn route_entries(&self) -> Result<Vec<RouteConfig>, TransportRoutesError> {
        let extra = to_routes(&self.transport_routes, &self.proxy_url, self.all_proxy)?;
        let key = |p: &str| {
            let p = p.trim().to_ascii_lowercase();
            let p = p.strip_prefix("all://").unwrap_or(&p).trim_end_matches('/');
            if matches!(p, "" | "all" | "*") {
                "all".to_string()
            } else {
                p.to_string()
            }
        };
        for r in &extra {
            if self
                .routes
                .iter()
                .any(|own| key(&own.pattern) == key(&r.pattern))
            {
                return Err(TransportRoutesError::Twice(r.pattern.clone()));
            }
        }
        let mut all = self.routes.clone();
        all.extend(extra);
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn triples(routes: &[RouteConfig]) -> Vec<(&str, &str, bool)> {
        routes
            .iter()
            .map(|r| (r.pattern.as_str(), r.proxy.as_str(), r.verify_tls))
            .collect()
    }

    const JSON: &str = r#"{"all://*.streaming.com": {"proxy": true},
        "https://cdn.example.org": {"proxy_url": "socks5://other:1080", "verify_ssl": false},
        "all://direct.example.net": {"proxy": false}}"#;

    #[test]
    fn json_and_table_read_alike() {
        let json = TransportRoutes::Json(JSON.into());
        let table: toml::Table = r#"
            [t."all://*.streaming.com"]
            proxy = true
            [t."https://cdn.example.org"]
            proxy_url = "socks5://other:1080"
            verify_ssl = false
            [t."all://direct.example.net"]
            proxy = false
        "#
        .parse()
        .unwrap();
        let table: TransportRoutes = table["t"].clone().try_into().unwrap();
        let want = vec![
            ("all://*.streaming.com", "http://corp:3128", true),
            ("all://direct.example.net", "", true),
            ("https://cdn.example.org", "socks5://other:1080", false),
        ];
        for spelling in [json, table] {
            let routes = to_routes(&spelling, "http://corp:3128", false).unwrap();
            assert_eq!(triples(&routes), want);
        }
    }

    #[test]
    fn all_proxy_adds_a_default_route_unless_one_exists() {
        let none = TransportRoutes::default();
        assert_eq!(
            triples(&to_routes(&none, "socks5h://vpn:1080", true).unwrap()),
            vec![("all", "socks5h://vpn:1080", true)]
        );
        assert!(to_routes(&none, "", true).unwrap().is_empty());
        assert!(to_routes(&none, "socks5h://vpn:1080", false)
            .unwrap()
            .is_empty());
        let own_all = TransportRoutes::Json(r#"{"all://": {"proxy": false}}"#.into());
        assert_eq!(
            triples(&to_routes(&own_all, "socks5h://vpn:1080", true).unwrap()),
            vec![("all://", "", true)]
        );
    }

    #[test]
    fn bad_json_and_a_pattern_given_twice_are_errors() {
        for bad in [
            "{not json",
            "[1]",
            r#"{"all://x": {"proxy": "yes"}}"#,
            r#"{"all://x": {"via": 1}}"#,
        ] {
            let e = to_routes(&TransportRoutes::Json(bad.into()), "", false).unwrap_err();
            assert!(matches!(e, TransportRoutesError::Json(_)), "{bad}: {e}");
        }
        let mut c = UpstreamConfig {
            transport_routes: TransportRoutes::Json(r#"{"ALL://*.Example.com/": {}}"#.into()),
            ..Default::default()
        };
        c.routes.push(RouteConfig {
            pattern: "all://*.example.com".into(),
            proxy: String::new(),
            verify_tls: true,
        });
        assert_eq!(
            c.route_entries().unwrap_err(),
            TransportRoutesError::Twice("ALL://*.Example.com/".into())
        );
        c.routes[0].pattern = "*.example.com".into();
        assert!(
            c.route_entries().is_err(),
            "the same hosts, spelled as sluice does"
        );
        c.routes[0].pattern = "https://*.example.com".into();
        assert_eq!(c.route_entries().unwrap().len(), 2);
    }
}
