//! Child URLs for rewritten manifests: back through this proxy, in the parent's auth mode, with the
//! parent's parameters carried.
//!
//! When a password is configured children are sealed path tokens (`/_token_<T>/proxy/...`) scoped
//! to the one endpoint the child is for ([`child_scope`]), expiring after `auth.child_token_ttl_secs` or with the parent,
//! and bound to the parent's address, so the password never appears in a URL and a time- or
//! IP-bound parent cannot mint unbounded children. A reload from the same client network gets the
//! same child tokens while they have half their lifetime left, so live playlists keep stable URLs
//! (`auth::reuse`). Without a password children are plain query URLs.

use std::net::IpAddr;
use std::sync::Arc;

use sluice_media::query::Query;

use crate::auth::token::{self, TokenGate, TokenScope};
use crate::request::RequestContext;

/// Builds child URLs for one parent request.
#[derive(Debug, Clone)]
pub struct Links {
    /// `scheme://host[:port]` as the client addressed us, or empty for path-absolute URLs.
    origin: String,
    gate: Option<Arc<TokenGate>>,
    parent: Option<TokenScope>,
    /// Who asked: child tokens are reused for this client's network only (`auth::reuse`).
    client: IpAddr,
}

impl Links {
    /// Links for children of the request in `ctx`.
    pub fn new(ctx: &RequestContext, gate: Option<&Arc<TokenGate>>) -> Self {
        let origin = match &ctx.host {
            Some(host) => format!("{}://{}", if ctx.secure { "https" } else { "http" }, host),
            None => String::new(),
        };
        Links {
            origin,
            gate: gate.cloned(),
            parent: ctx.token.clone(),
            client: ctx.client_ip,
        }
    }

    /// The URL of `endpoint` (a path such as `/proxy/hls/segment.ts`) with `params`.
    pub fn url(&self, endpoint: &str, params: &[(String, String)]) -> String {
        match &self.gate {
            Some(gate) => {
                let scope = child_scope(endpoint);
                let parent = self.parent.as_ref();
                let token = gate.mint_child(params, &[&scope], parent, self.client, token::now());
                format!("{}/_token_{token}{endpoint}", self.origin)
            }
            None => format!(
                "{}{endpoint}?{}",
                self.origin,
                Query::from_pairs(params.to_vec()).encode()
            ),
        }
    }
}

/// The scope a child token for `endpoint` opens: that endpoint alone ([`token::exact_scope`]).
/// Scoped to the endpoint's family (`/proxy/hls/`), a manifest's child opened
/// `/proxy/hls/segment.ts` too, which pipes the token's `d` back byte for byte: the holder of a
/// variant playlist's token read the upstream playlist as written, with the URLs (an XC panel's
/// account, a hidden source) the rewrite hides. Two endpoints open more: `/proxy/stream` opens the
/// paths below it too (`/proxy/stream/name.mp4`, the same bytes under a file name), and a DASH
/// out template (`/proxy/mpd/out/$Number$/$Time$/segment.mp4`, filled in by the player) opens
/// the directory its segments are named in.
pub fn child_scope(endpoint: &str) -> String {
    if let Some(at) = endpoint.find('$') {
        let dir = endpoint[..at].rfind('/').map_or(0, |i| i + 1);
        return endpoint[..dir].to_string();
    }
    if endpoint == "/proxy/stream" {
        return endpoint.to_string();
    }
    token::exact_scope(endpoint)
}

/// The parent's parameters that children inherit: everything except the destination, credentials,
/// LL-HLS delivery directives and the names `drop` rejects.
pub fn carried(query: &Query, drop: impl Fn(&str) -> bool) -> Vec<(String, String)> {
    query
        .pairs()
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "d" | "api_password" | "token" | "exp" | "ip"))
        // LL-HLS delivery directives name one reload of one playlist, never a child's.
        .filter(|(k, _)| !k.starts_with("_HLS_"))
        .filter(|(k, _)| !drop(k))
        .cloned()
        .collect()
}

/// Upstream headers bound to the origin of the parent's `d`: a viewer's credentials, and `Host`
/// (the virtual host asked for there). Like a redirect to another origin (`upstream::relay`), a
/// child URL on another origin never gets them: a segment on another CDN is asked for under its
/// own name, not the first origin's. A host `media.credential_hosts` names gets the credentials,
/// never `Host` ([`Reach::Credentials`]).
fn origin_bound() -> impl Iterator<Item = http::HeaderName> {
    crate::upstream::CREDENTIAL_FIELDS
        .into_iter()
        .chain([http::header::HOST])
}

/// The query parameter naming the origin a DASH segment link's credentials were given for, when
/// its segment and init are on different origins: each is fetched with the credentials decided
/// for its own URL against it. Without it, the link's segment (or init) URL stands for `d`.
pub const CREDENTIAL_ORIGIN: &str = "cred_origin";

/// How much of a viewer's origin-bound headers one upstream URL gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reach {
    /// None of them: another origin.
    Nothing,
    /// The credentials but not `Host` (which names a virtual host of `d`'s origin): a host
    /// `media.credential_hosts` names.
    Credentials,
    /// All of them: the origin (scheme, host, port) of the request's `d`.
    All,
}

/// `media.credential_hosts`: hosts (`name` or `*.domain`) that get a viewer's credentials besides
/// the origin of its `d`. Host names only: an IP literal is never listed.
#[derive(Debug, Clone, Default)]
pub struct CredentialHosts(Arc<[sluice_http::route::HostPattern]>);

/// What to write instead of a host pattern that is refused for being spelled as a person would
/// (non-ASCII labels, a trailing dot): the punycode form, with no trailing dot. Empty for any
/// other entry.
fn written_as_ascii(entry: &str) -> String {
    let t = entry.trim();
    if t.is_ascii() && !t.ends_with('.') {
        return String::new();
    }
    let (wild, name) = match t.strip_prefix("*.") {
        Some(rest) => ("*.", rest),
        None => ("", t),
    };
    let ascii = match url::Host::parse(name.trim_end_matches('.')) {
        Ok(url::Host::Domain(d)) => Some(format!("{wild}{d}")),
        _ => None,
    }
    .filter(|fixed| sluice_http::route::HostPattern::parse(fixed).is_ok());
    match ascii {
        Some(fixed) if t.is_ascii() => format!("; write it with no trailing dot (`{fixed}`)"),
        Some(fixed) => format!("; write the punycode form (`{fixed}`), no trailing dot"),
        None => "; write a name in its punycode form (`*.xn--bcher-kva.example` for \
                 `*.bücher.example`), no trailing dot"
            .to_string(),
    }
}

impl CredentialHosts {
    /// Parses the configured list: exact names and `*.domain`, no ports, schemes or `*` alone, no
    /// IP addresses (a name whose last label is all digits), and no wildcard over a public suffix
    /// (the Public Suffix List's ICANN and private sections: `*.com`, `*.co.uk`,
    /// `*.cloudfront.net`, `*.github.io`...), under which anyone can own a name.
    pub fn parse(list: &[String]) -> anyhow::Result<Self> {
        use sluice_http::route::HostPattern;
        let mut out = Vec::with_capacity(list.len());
        for entry in list {
            let pattern = HostPattern::parse(entry).map_err(|e| {
                anyhow::anyhow!("media.credential_hosts: {e}{}", written_as_ascii(entry))
            })?;
            let name = match &pattern {
                HostPattern::Any => anyhow::bail!(
                    "media.credential_hosts: {entry:?} would send credentials to every host; \
                     name hosts or `*.domain`"
                ),
                HostPattern::Exact(name) => name.as_str(),
                HostPattern::Wildcard(suffix) => &suffix[1..],
            };
            // `*.0.0.1` would name 127.0.0.1: addresses are not host names.
            if name.rsplit('.').next().is_some_and(all_digits) {
                anyhow::bail!(
                    "media.credential_hosts: {entry:?} names IP addresses; list host names"
                );
            }
            if let HostPattern::Wildcard(_) = &pattern {
                if !name.contains('.') {
                    anyhow::bail!(
                        "media.credential_hosts: {entry:?} names a whole top-level domain; \
                         use `*.domain.tld`"
                    );
                }
                if is_public_suffix(name) {
                    anyhow::bail!(
                        "media.credential_hosts: {entry:?} covers every name under `{name}`, a \
                         public suffix (Public Suffix List) where anyone can own a name; list \
                         the exact host instead (such as `dXXXX.cloudfront.net`)"
                    );
                }
            }
            out.push(pattern);
        }
        Ok(CredentialHosts(out.into()))
    }

    /// The configured list, checked at load (`MediaConfig::validate`); a list it would refuse
    /// names no host.
    pub fn from_config(list: &[String]) -> Self {
        Self::parse(list).unwrap_or_default()
    }

    /// Whether `host` (a name, never an IP literal) is listed.
    fn lists(&self, host: &str) -> bool {
        let name = host.trim_end_matches('.');
        if name.starts_with('[') || name.parse::<IpAddr>().is_ok() {
            return false;
        }
        self.0.iter().any(|p| match p {
            // A wildcard names the hosts of one owner's domain: not a host under a public
            // suffix inside it (`*.amazonaws.com` must not reach `bucket.s3.amazonaws.com`,
            // which anyone can own), which the list's check at load cannot see.
            sluice_http::route::HostPattern::Wildcard(dot_domain) => {
                p.matches(host) && public_suffix_len(&name.to_ascii_lowercase()) < dot_domain.len()
            }
            _ => p.matches(host),
        })
    }

    /// Whether `self` and `other` are one parsed list (not two parses of the same text).
    #[cfg(test)]
    pub(crate) fn is_same_list(&self, other: &CredentialHosts) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

fn all_digits(label: &str) -> bool {
    !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit())
}

/// The length of `name`'s public suffix (the Public Suffix List's, as [`is_public_suffix`]
/// reads it); 0 when it has none.
fn public_suffix_len(name: &str) -> usize {
    use psl::Psl;
    psl::List
        .suffix(name.as_bytes())
        .map_or(0, |s| s.as_bytes().len())
}

/// Whether `name` (lowercase, no trailing dot) is itself a public suffix: a rule of the Public
/// Suffix List (ICANN or private section, `*` rules and exceptions applied), or a top-level
/// domain the list does not know (its default rule).
fn is_public_suffix(name: &str) -> bool {
    use psl::Psl;
    psl::List
        .suffix(name.as_bytes())
        .is_some_and(|s| s.as_bytes() == name.as_bytes())
}

/// Where a viewer's credentials go: the origin of the `d` they came with (all of them, `Host`
/// too), and, over https (or http when `d` itself is http), the hosts `media.credential_hosts`
/// names (the credentials without `Host`). Nowhere else.
#[derive(Debug, Clone)]
pub struct CredentialScope {
    home: url::Origin,
    home_http: bool,
    hosts: CredentialHosts,
}

impl CredentialScope {
    /// The scope of credentials given with `d`.
    pub fn new(d: &url::Url, hosts: CredentialHosts) -> Self {
        CredentialScope {
            home: d.origin(),
            home_http: d.scheme() == "http",
            hosts,
        }
    }

    /// The scope a DASH segment or init link's credentials were given for: its
    /// [`CREDENTIAL_ORIGIN`] when it names one, else `own` (the URL the link fetches, as `d`).
    /// A value that is no http(s) origin is the client's fault.
    pub fn of_link(
        query: &sluice_media::query::Query,
        own: &url::Url,
        hosts: CredentialHosts,
    ) -> Result<Self, String> {
        let Some(named) = query.get(CREDENTIAL_ORIGIN) else {
            return Ok(Self::new(own, hosts));
        };
        match url::Url::parse(named) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {
                Ok(Self::new(&u, hosts))
            }
            _ => Err(format!("`{CREDENTIAL_ORIGIN}` is not an http(s) origin")),
        }
    }

    /// The listed hosts this scope reaches besides `d`'s origin.
    #[cfg(test)]
    pub(crate) fn hosts(&self) -> &CredentialHosts {
        &self.hosts
    }

    /// `d`'s origin as a [`CREDENTIAL_ORIGIN`] value.
    pub fn home(&self) -> String {
        self.home.ascii_serialization()
    }

    /// How much of the viewer's origin-bound headers `url` gets.
    pub fn reach(&self, url: &url::Url) -> Reach {
        if url.origin() == self.home {
            return Reach::All;
        }
        let scheme_ok = match url.scheme() {
            "https" => true,
            "http" => self.home_http,
            _ => false,
        };
        // A name only: an IP literal is never listed.
        let listed = match url.host() {
            Some(url::Host::Domain(name)) => self.hosts.lists(name),
            _ => false,
        };
        match scheme_ok && listed {
            true => Reach::Credentials,
            false => Reach::Nothing,
        }
    }
}

/// Whether the query parameter `key` sets an origin-bound header upstream (`h_authorization`,
/// `h_Cookie`, `h_ proxy-authorization`, `h_host`...: the header name as `ProxyParams` reads it,
/// trimmed and lowercased; the prefix in any case).
pub fn is_credential_param(key: &str) -> bool {
    let Some(prefix) = key.get(..2) else {
        return false;
    };
    prefix.eq_ignore_ascii_case("h_")
        && origin_bound().any(|c| key[2..].trim().eq_ignore_ascii_case(c.as_str()))
}

/// Whether `key` is `h_host` in any spelling.
fn is_host_param(key: &str) -> bool {
    key.get(..2).is_some_and(|p| p.eq_ignore_ascii_case("h_"))
        && key[2..].trim().eq_ignore_ascii_case("host")
}

/// Whether a carried parameter goes on a link (or fetch) of `reach`.
pub fn param_reaches(key: &str, reach: Reach) -> bool {
    match reach {
        Reach::All => true,
        Reach::Credentials => !is_host_param(key),
        Reach::Nothing => !is_credential_param(key),
    }
}

/// The `carried` parameters a child of `reach` gets.
pub fn scoped_params(
    carried: &[(String, String)],
    reach: Reach,
) -> impl Iterator<Item = (String, String)> + '_ {
    carried
        .iter()
        .filter(move |(k, _)| param_reaches(k, reach))
        .cloned()
}

/// `carried` for a child on another origin than the parent's `d`: without the credentials and
/// `h_host`.
pub fn without_credentials(carried: &[(String, String)]) -> Vec<(String, String)> {
    scoped_params(carried, Reach::Nothing).collect()
}

/// Takes the credential headers and `Host` out of a set of upstream headers (for a fetch on
/// another origin than the one they were given for).
pub fn strip_credentials(headers: &mut http::HeaderMap) -> bool {
    let mut any = false;
    for name in origin_bound() {
        any |= headers.remove(name).is_some();
    }
    any
}

/// The upstream headers a fetch of `reach` gets out of the viewer's `headers`.
pub fn scoped_headers(headers: &http::HeaderMap, reach: Reach) -> http::HeaderMap {
    let mut headers = headers.clone();
    match reach {
        Reach::All => {}
        Reach::Credentials => {
            headers.remove(http::header::HOST);
        }
        Reach::Nothing => {
            strip_credentials(&mut headers);
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::AuthConfig;

    fn ctx(token: Option<TokenScope>) -> RequestContext {
        RequestContext {
            peer: "127.0.0.1:5000".parse().unwrap(),
            client_ip: "127.0.0.1".parse().unwrap(),
            query: Query::parse("d=http%3A%2F%2Fo%2Fm.m3u8&h_referer=r&api_password=pw&r_x=1"),
            path: "/proxy/hls/manifest.m3u8".into(),
            host: Some("proxy.example:8888".into()),
            secure: false,
            token,
        }
    }

    #[test]
    fn plain_links_without_password() {
        let c = ctx(None);
        let carried = carried(&c.query, |k| k.starts_with("r_"));
        assert_eq!(carried, vec![("h_referer".to_string(), "r".to_string())]);
        let mut params = vec![("d".to_string(), "http://o/s 1.ts".to_string())];
        params.extend(carried);
        assert_eq!(
            Links::new(&c, None).url("/proxy/hls/segment.ts", &params),
            "http://proxy.example:8888/proxy/hls/segment.ts?d=http%3A%2F%2Fo%2Fs+1.ts&h_referer=r"
        );
    }

    #[test]
    fn credential_params_in_every_spelling() {
        for key in [
            "h_authorization",
            "h_Authorization",
            "H_AUTHORIZATION",
            "h_ cookie ",
            "h_COOKIE",
            "h_proxy-authorization",
            "h_host",
            "h_Host ",
        ] {
            assert!(is_credential_param(key), "{key}");
        }
        for key in [
            "h_referer",
            "h_x-authorization",
            "authorization",
            "h_",
            "h",
            "d",
            "r_cookie",
        ] {
            assert!(!is_credential_param(key), "{key}");
        }
        let carried = vec![
            ("h_referer".to_string(), "r".to_string()),
            ("h_Cookie".to_string(), "c".to_string()),
            ("h_HOST".to_string(), "first-origin.example".to_string()),
            ("rp_x".to_string(), "1".to_string()),
        ];
        let names: Vec<_> = without_credentials(&carried)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(names, ["h_referer", "rp_x"]);
        let mut headers = http::HeaderMap::new();
        headers.insert("authorization", "Bearer x".parse().unwrap());
        headers.insert("cookie", "a=b".parse().unwrap());
        headers.insert("referer", "r".parse().unwrap());
        headers.insert("host", "first-origin.example".parse().unwrap());
        assert!(strip_credentials(&mut headers));
        assert_eq!(headers.len(), 1);
        assert!(!strip_credentials(&mut headers));
    }

    #[test]
    fn listed_hosts_get_the_credentials_but_not_the_virtual_host() {
        let u = |s: &str| url::Url::parse(s).unwrap();
        let hosts =
            CredentialHosts::parse(&["*.example.com".into(), "cdn.other.net".into()]).unwrap();
        let https = CredentialScope::new(&u("https://www.example.com/m.m3u8"), hosts.clone());
        assert_eq!(https.reach(&u("https://www.example.com/a.ts")), Reach::All);
        assert_eq!(
            https.reach(&u("https://cdn.example.com:8443/a.ts")),
            Reach::Credentials
        );
        assert_eq!(
            https.reach(&u("https://CDN.other.net/a.ts")),
            Reach::Credentials
        );
        // https only, unless `d` itself is http.
        assert_eq!(
            https.reach(&u("http://cdn.example.com/a.ts")),
            Reach::Nothing
        );
        assert_eq!(https.reach(&u("https://example.com/a.ts")), Reach::Nothing);
        assert_eq!(https.reach(&u("https://x.other.net/a.ts")), Reach::Nothing);
        assert_eq!(
            https.reach(&u("https://evil.example.com.x/a")),
            Reach::Nothing
        );
        let http = CredentialScope::new(&u("http://www.example.com/m.m3u8"), hosts);
        assert_eq!(
            http.reach(&u("http://cdn.example.com/a.ts")),
            Reach::Credentials
        );
        // Another port of `d`'s own host is another origin (scheme, host, port).
        let ip = CredentialScope::new(&u("http://10.0.0.5:8080/m"), CredentialHosts::default());
        assert_eq!(ip.reach(&u("http://10.0.0.5:8081/a.ts")), Reach::Nothing);
        // Listed: the credentials, not `h_host`.
        let carried = vec![
            ("h_cookie".to_string(), "c".to_string()),
            ("h_Host".to_string(), "www.example.com".to_string()),
            ("h_referer".to_string(), "r".to_string()),
        ];
        let names = |r| -> Vec<String> { scoped_params(&carried, r).map(|(k, _)| k).collect() };
        assert_eq!(names(Reach::All), ["h_cookie", "h_Host", "h_referer"]);
        assert_eq!(names(Reach::Credentials), ["h_cookie", "h_referer"]);
        assert_eq!(names(Reach::Nothing), ["h_referer"]);
        let mut headers = http::HeaderMap::new();
        headers.insert("cookie", "c".parse().unwrap());
        headers.insert("host", "www.example.com".parse().unwrap());
        let listed = scoped_headers(&headers, Reach::Credentials);
        assert!(listed.contains_key("cookie") && !listed.contains_key("host"));
        // Names and `*.domain` only.
        for bad in [
            "*",
            "",
            "*.com",
            "cdn.example.com:443",
            "https://cdn.example.com",
            "a b",
        ] {
            assert!(CredentialHosts::parse(&[bad.to_string()]).is_err(), "{bad}");
        }
        // A marker that is no origin is the client's fault.
        let q = Query::parse("cred_origin=javascript%3Ax");
        assert!(CredentialScope::of_link(&q, &u("http://o/s"), Default::default()).is_err());
        let q = Query::parse("cred_origin=http%3A%2F%2Fa%3A81");
        let scope = CredentialScope::of_link(&q, &u("http://o/s"), Default::default()).unwrap();
        assert_eq!(scope.reach(&u("http://a:81/i.mp4")), Reach::All);
        assert_eq!(scope.reach(&u("http://o/s")), Reach::Nothing);
    }

    /// An entry written as a person would (an internationalised name, a trailing dot) was
    /// refused with only "not a host name or `*.domain`", which gave no clue what was wrong: the
    /// error now says to write the punycode form with no trailing dot, and gives it.
    #[test]
    fn a_non_ascii_or_dotted_entry_is_told_the_form_to_write() {
        let err = |entry: &str| {
            CredentialHosts::parse(&[entry.to_string()])
                .err()
                .unwrap_or_else(|| panic!("{entry} was accepted"))
                .to_string()
        };
        let e = err("*.bücher.example");
        assert!(e.contains("is not a host name"), "{e}");
        assert!(
            e.contains("write the punycode form (`*.xn--bcher-kva.example`), no trailing dot"),
            "{e}"
        );
        let e = err("bücher.example.");
        assert!(
            e.contains("write the punycode form (`xn--bcher-kva.example`), no trailing dot"),
            "{e}"
        );
        let e = err("*.cdn.example.");
        assert!(e.contains("no trailing dot (`*.cdn.example`)"), "{e}");
        // What is written that way is accepted.
        assert!(CredentialHosts::parse(&["*.xn--bcher-kva.example".to_string()]).is_ok());
        // Another bad entry gets no such advice.
        let e = err("a b");
        assert!(
            !e.contains("punycode") && !e.contains("trailing dot"),
            "{e}"
        );
    }

    /// Attack: an operator lists `*.cloudfront.net` for their distribution; anyone can make a
    /// distribution under it, so an ad-break child there would get the viewer's cookie. A
    /// wildcard over a public suffix (ICANN or private section) is refused at load, naming the
    /// entry and what to list instead; so is a pattern over IP addresses, and an IP literal is
    /// never listed.
    #[test]
    fn wildcards_over_public_suffixes_and_addresses_are_refused() {
        for bad in [
            "*.cloudfront.net",
            "*.akamaized.net",
            "*.co.uk",
            "*.github.io",
            "*.s3.amazonaws.com",
            "*.com",
            "*.unknown-tld",
            "*.0.0.1",
            "*.1",
            "127.0.0.1",
        ] {
            let err = CredentialHosts::parse(&[bad.to_string()])
                .err()
                .unwrap_or_else(|| panic!("{bad} was accepted"))
                .to_string();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
        let err = CredentialHosts::parse(&["*.CloudFront.net".to_string()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("public suffix"), "{err}");
        assert!(err.contains("dXXXX.cloudfront.net"), "{err}");
        // A name under a public suffix is someone's own: its subdomains and exact hosts are fine.
        for good in [
            "*.example.com",
            "*.bbc.co.uk",
            "*.someone.github.io",
            "*.corp.internal",
            "d111abcdef8.cloudfront.net",
            "cloudfront.net",
            "cdn1.example.com",
        ] {
            assert!(
                CredentialHosts::parse(&[good.to_string()]).is_ok(),
                "{good}"
            );
        }
        // An address is never listed, whatever the patterns say.
        use sluice_http::route::HostPattern;
        let hosts = CredentialHosts(Arc::from(vec![
            HostPattern::Wildcard(".0.0.1".into()),
            HostPattern::Exact("10.0.0.7".into()),
            HostPattern::Exact("::1".into()),
        ]));
        let u = |s: &str| url::Url::parse(s).unwrap();
        let scope = CredentialScope::new(&u("https://www.example.com/m.m3u8"), hosts);
        for url in [
            "https://127.0.0.1/a.ts",
            "https://10.0.0.7/a.ts",
            "https://[::1]/a.ts",
        ] {
            assert_eq!(scope.reach(&u(url)), Reach::Nothing, "{url}");
        }
        // A wildcard over a domain with public suffixes inside it (`s3.amazonaws.com` is one)
        // reaches the domain's own hosts, never a host under such a suffix: anyone's bucket.
        let hosts = CredentialHosts::parse(&["*.amazonaws.com".to_string()]).unwrap();
        let scope = CredentialScope::new(&u("https://www.example.com/m.m3u8"), hosts);
        assert_eq!(
            scope.reach(&u("https://attacker-bucket.s3.amazonaws.com/a.ts")),
            Reach::Nothing
        );
        assert_eq!(
            scope.reach(&u("https://mediapackage.amazonaws.com/a.ts")),
            Reach::Credentials
        );
    }

    #[test]
    fn token_links_keep_claims_and_hide_password() {
        // Long enough that a random base64url token cannot contain it by chance.
        let password = "hunter2-server-secret";
        let gate = Arc::new(
            TokenGate::new(&AuthConfig {
                api_password: password.into(),
                ..AuthConfig::default()
            })
            .unwrap(),
        );
        let c = ctx(Some(TokenScope {
            exp: Some(4_000_000_000),
            ip: Some("1.2.3.4".into()),
            paths: None,
        }));
        let params = vec![("d".to_string(), "http://o/s.ts".to_string())];
        let url = Links::new(&c, Some(&gate)).url("/proxy/hls/segment.ts", &params);
        assert!(!url.contains(password));
        let rest = url
            .strip_prefix("http://proxy.example:8888/_token_")
            .unwrap();
        let (token, endpoint) = rest.split_once('/').unwrap();
        assert_eq!(endpoint, "proxy/hls/segment.ts");
        let opened = gate
            .open(token, "1.2.3.4".parse().unwrap(), token::now())
            .unwrap();
        // The child TTL is sooner than the parent's far-away expiry.
        let exp = opened.scope.exp.unwrap();
        assert!(exp < 4_000_000_000 && exp > token::now());
        assert_eq!(opened.scope.ip.as_deref(), Some("1.2.3.4"));
        assert_eq!(
            opened.scope.paths,
            Some(vec![token::exact_scope("/proxy/hls/segment.ts")])
        );
        assert_eq!(opened.params, params);
        assert_eq!(
            child_scope("/proxy/mpd/playlist.m3u8"),
            token::exact_scope("/proxy/mpd/playlist.m3u8")
        );
        assert_eq!(child_scope("/proxy/stream"), "/proxy/stream");
        assert_eq!(
            child_scope("/proxy/mpd/out/$Number$/-/segment.mp4"),
            "/proxy/mpd/out/"
        );
        assert_eq!(
            child_scope("/proxy/mpd/out/-/$Time$/segment.mp4"),
            "/proxy/mpd/out/-/"
        );
    }
}
