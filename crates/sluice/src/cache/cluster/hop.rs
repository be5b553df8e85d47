//! The hop marker: a request one node sends another carries `sluice-hop: <from> <unix secs>
//! <hmac>`, an HMAC-SHA256 under the cluster secret of the sender, the time, the method, the
//! authority and the target. A request with a valid marker is served by the node it reached and
//! never forwarded again (no loops); a client cannot forge one, and a marker is accepted only
//! for 60 s around its time and only for the request it was made for.

use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use http::HeaderValue;
use sha2::Sha256;

/// The header that marks a request from another node.
pub const HOP_HEADER: &str = "sluice-hop";

/// The header a relayed miss names the claim part of its cache key in, as the node that took
/// it from the client made it ([`sluice_http::forwarded::claimed_scope`]; `none` for none): the
/// owner keys the request so, not by the relaying node's forwarding fields taken as a trusted
/// proxy's (an `X-Forwarded-Proto: https` that was the node's own scheme made another key there,
/// a second copy no purge by the first key reached). Covered by the marker
/// ([`vouched_target`]); honoured only under a vouched marker, and removed from every request.
pub const CLAIM_HEADER: &str = "sluice-cache-claim";

/// How far a marker's time may be from ours (clock skew plus a slow network).
const WINDOW_SECS: u64 = 60;

/// Signs and checks hop markers with the cluster secret.
#[derive(Clone)]
pub struct HopKey {
    key: Vec<u8>,
}

impl std::fmt::Debug for HopKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HopKey(********)")
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl HopKey {
    pub fn new(secret: &str) -> HopKey {
        HopKey {
            key: secret.as_bytes().to_vec(),
        }
    }

    fn mac(&self, from: &str, secs: u64, method: &str, authority: &str, target: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
        for part in [from, &secs.to_string(), method, authority, target] {
            mac.update(part.as_bytes());
            mac.update(b"\n");
        }
        let out = mac.finalize().into_bytes();
        out.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The marker for a request from node `from`.
    pub fn sign(&self, from: &str, method: &str, authority: &str, target: &str) -> HeaderValue {
        let secs = now_secs();
        let mac = self.mac(from, secs, method, authority, target);
        HeaderValue::from_str(&format!("{from} {secs} {mac}")).expect("ascii marker")
    }

    /// The sending node when `value` is a valid marker for this request, `None` otherwise.
    pub fn verify(
        &self,
        value: &HeaderValue,
        method: &str,
        authority: &str,
        target: &str,
    ) -> Option<String> {
        let text = value.to_str().ok()?;
        let mut it = text.split(' ');
        let (from, secs, mac) = (it.next()?, it.next()?, it.next()?);
        if it.next().is_some() || from.is_empty() {
            return None;
        }
        let secs: u64 = secs.parse().ok()?;
        if now_secs().abs_diff(secs) > WINDOW_SECS {
            return None;
        }
        let want = self.mac(from, secs, method, authority, target);
        use subtle::ConstantTimeEq;
        bool::from(want.as_bytes().ct_eq(mac.as_bytes())).then(|| from.to_string())
    }
}

/// What a relayed miss's marker vouches for besides its request line: its forwarding fields
/// (`X-Forwarded-*`, `Forwarded`, `X-Real-IP`, `Via`, every value in order) and the other
/// proxies' fields a trusted peer's request keeps (`X-Forwarded-Scheme`, `-Port`,
/// `X-Original-Host`..., `forwarded::PROXY_FIELDS`), so the owner may take them as a trusted
/// proxy's, and nothing on the way can change or add one (a replay with `X-Forwarded-Scheme:
/// http` added would shape an answer cached for everyone). Signed as `<target>\n<this>` in the
/// target's place. Older nodes sign [`forwarding_target`] (the forwarding fields alone) or the
/// target alone: either still marks a peer's request, but vouches for no field
/// (`Cluster::take_hop`).
pub fn vouched_target(target: &str, headers: &http::HeaderMap) -> String {
    digest_target(target, headers, true)
}

/// The target as a node before [`vouched_target`] covered the other proxies' fields signed it:
/// the forwarding fields alone. The same as [`vouched_target`] when no such field is there; when
/// one is (a load balancer adds `X-Forwarded-Port`), nodes of the two versions agree on this
/// form only, so the owner accepts it as a peer's request without vouching for any field.
pub fn forwarding_target(target: &str, headers: &http::HeaderMap) -> String {
    digest_target(target, headers, false)
}

fn digest_target(target: &str, headers: &http::HeaderMap, proxies: bool) -> String {
    use sha2::Digest;
    let mut h = Sha256::new();
    for name in sluice_http::forwarded::FIELDS.iter() {
        hash_field(&mut h, name, headers);
    }
    // Only those present: a request without any hashes as an older node's does.
    if proxies {
        for name in sluice_http::forwarded::PROXY_FIELDS.iter() {
            if headers.contains_key(name) {
                hash_field(&mut h, name, headers);
            }
        }
        let claim = http::HeaderName::from_static(CLAIM_HEADER);
        if headers.contains_key(&claim) {
            hash_field(&mut h, &claim, headers);
        }
    }
    format!("{target}\n{}", sluice_media::keys::to_hex(&h.finalize()))
}

/// Whether `Connection` names a field a marker covers: the hop-by-hop stripping after the check
/// would remove it, so the fields the marker was checked with are not those that go on (a
/// replay adding `Connection: x-forwarded-scheme` would drop a covered field).
pub fn connection_names_covered(headers: &http::HeaderMap) -> bool {
    sluice_http::hop::connection_names(headers).iter().any(|n| {
        sluice_http::forwarded::FIELDS.contains(n)
            || sluice_http::forwarded::is_proxy_field(n.as_str())
    })
}

/// Feeds `name: v1\n v2\n ... \n` to `h` (values cannot hold a line break, so it is unambiguous).
fn hash_field(h: &mut Sha256, name: &http::HeaderName, headers: &http::HeaderMap) {
    use sha2::Digest;
    h.update(name.as_str().as_bytes());
    h.update(b":");
    for v in headers.get_all(name) {
        // As an HTTP/1.1 parser keeps it (without the spaces around it): the owner reads the
        // relayed head so, and a value that came with them over HTTP/2 or HTTP/3 would
        // otherwise never verify there.
        h.update(v.as_bytes().trim_ascii());
        h.update(b"\n");
    }
    h.update(b"\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The claim a relayed miss names for its key is vouched for: a replay that adds or changes
    /// it no longer verifies (it would store an answer made for one claim under another's key).
    #[test]
    fn the_claim_header_is_vouched_for() {
        let mut h = http::HeaderMap::new();
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        let bare = vouched_target("/a", &h);
        let older = forwarding_target("/a", &h);
        h.insert(CLAIM_HEADER, HeaderValue::from_static("none"));
        let none = vouched_target("/a", &h);
        assert_ne!(none, bare);
        h.insert(CLAIM_HEADER, HeaderValue::from_static("5:https6:a.test"));
        assert_ne!(vouched_target("/a", &h), none);
        // An older node's form (the forwarding fields alone) does not cover it.
        assert_eq!(forwarding_target("/a", &h), older);
    }

    #[test]
    fn markers_bind_the_request_and_the_secret() {
        let k = HopKey::new("0123456789abcdef");
        let v = k.sign("10.0.0.1:8888", "GET", "shop.test", "/a?b");
        assert_eq!(
            k.verify(&v, "GET", "shop.test", "/a?b").as_deref(),
            Some("10.0.0.1:8888")
        );
        assert!(k.verify(&v, "GET", "shop.test", "/a?c").is_none());
        assert!(k.verify(&v, "HEAD", "shop.test", "/a?b").is_none());
        assert!(k.verify(&v, "GET", "other.test", "/a?b").is_none());
        let other = HopKey::new("fedcba9876543210");
        assert!(other.verify(&v, "GET", "shop.test", "/a?b").is_none());
        // A marker from long ago, or a made-up one, is refused.
        let old = format!("n1 {} {}", now_secs() - 600, "00".repeat(32));
        assert!(k
            .verify(&HeaderValue::from_str(&old).unwrap(), "GET", "h", "/")
            .is_none());
        assert!(k
            .verify(&HeaderValue::from_static("n1"), "GET", "h", "/")
            .is_none());
    }

    #[test]
    fn a_vouched_target_binds_the_forwarding_fields() {
        let mut h = http::HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("192.0.2.7"));
        h.insert("accept", HeaderValue::from_static("*/*"));
        let a = vouched_target("/a", &h);
        // Other fields do not matter; a forwarding field changed, added or removed does.
        h.insert("accept", HeaderValue::from_static("text/html"));
        assert_eq!(vouched_target("/a", &h), a);
        h.append("x-forwarded-for", HeaderValue::from_static("6.6.6.6"));
        assert_ne!(vouched_target("/a", &h), a);
        h.remove("x-forwarded-for");
        assert_ne!(vouched_target("/a", &h), a);
        // Spaces around a value (which an HTTP/1.1 parser drops) do not.
        h.insert("x-forwarded-for", HeaderValue::from_static(" 192.0.2.7 "));
        assert_eq!(vouched_target("/a", &h), a);
        assert!(a.starts_with("/a\n"));
    }

    /// A marker made for one set of fields does not vouch for the request with another
    /// proxy's field added (a replay within the minute with `X-Forwarded-Scheme: http`).
    #[test]
    fn a_vouched_target_binds_the_other_proxies_fields() {
        let k = HopKey::new("0123456789abcdef");
        let mut h = http::HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("192.0.2.7"));
        let marker = k.sign("n1", "GET", "shop.test", &vouched_target("/a", &h));
        let verifies = |h: &http::HeaderMap| {
            k.verify(&marker, "GET", "shop.test", &vouched_target("/a", h))
                .is_some()
        };
        assert!(verifies(&h));
        for name in sluice_http::forwarded::PROXY_FIELDS.iter() {
            let mut added = h.clone();
            added.insert(name, HeaderValue::from_static("http"));
            assert!(!verifies(&added), "{name} added");
        }
        // One made with such a field does not vouch for the request with it changed or gone.
        h.insert("x-forwarded-scheme", HeaderValue::from_static("https"));
        let marker = k.sign("n1", "GET", "shop.test", &vouched_target("/a", &h));
        let mut changed = h.clone();
        changed.insert("x-forwarded-scheme", HeaderValue::from_static("http"));
        let mut gone = h.clone();
        gone.remove("x-forwarded-scheme");
        for (other, what) in [(&h, true), (&changed, false), (&gone, false)] {
            assert_eq!(
                k.verify(&marker, "GET", "shop.test", &vouched_target("/a", other))
                    .is_some(),
                what
            );
        }
    }
}
