//! The media front end in a cache cluster: a fetch whose key another node owns is filled there
//! (one origin fetch for the whole cluster), through the cluster's signed fill hop. The order
//! carries everything the key is made of (URL, every header sluice sends), so the owner keys it
//! exactly as this node would: one user's headers never fetch bytes for another.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use sluice_media::dash::proxy::Part;
use url::Url;

use super::cache::{request_key, CacheKind, MediaCache};
use crate::error::ProxyError;

/// The name of the media fill on the cluster's control listener.
pub const FILL: &str = "media";

/// One media fetch, as a peer asks the owner for it.
#[derive(Debug, Serialize, Deserialize)]
struct Order {
    kind: String,
    url: String,
    headers: Vec<(String, FieldValue)>,
    range: Option<(u64, u64)>,
    max_age: Option<u64>,
}

/// A header value in an order: text when it is visible ASCII (what every node reads), its bytes
/// otherwise (a cookie with a Latin-1 byte), so no header the key is made of is lost on the way:
/// the owner would fetch without it, and key it as another viewer's. A node before this reads
/// the bytes form as a bad order and refuses it, so the asking node fills on its own.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum FieldValue {
    Text(String),
    Bytes(Vec<u8>),
}

fn kind_name(kind: CacheKind) -> &'static str {
    match kind {
        CacheKind::Mpd => "mpd",
        CacheKind::Sidx => "sidx",
        CacheKind::Init => "init",
        CacheKind::Segment => "segment",
    }
}

fn kind_of(name: &str) -> Option<CacheKind> {
    Some(match name {
        "mpd" => CacheKind::Mpd,
        "sidx" => CacheKind::Sidx,
        "init" => CacheKind::Init,
        "segment" => CacheKind::Segment,
        _ => return None,
    })
}

/// The order for a fetch of `part` with `headers`.
pub fn order(kind: CacheKind, part: &Part, headers: &HeaderMap, max_age: Option<u64>) -> Bytes {
    let order = Order {
        kind: kind_name(kind).into(),
        url: part.url.to_string(),
        headers: headers
            .iter()
            .map(|(k, v)| {
                let v = match v.to_str() {
                    Ok(text) => FieldValue::Text(text.to_string()),
                    Err(_) => FieldValue::Bytes(v.as_bytes().to_vec()),
                };
                (k.as_str().to_string(), v)
            })
            .collect(),
        range: part.range,
        max_age,
    };
    Bytes::from(serde_json::to_vec(&order).unwrap_or_default())
}

/// Lets the cluster's peers run media fills on this node (when there is a cluster).
pub fn register(media: &Arc<MediaCache>) {
    let Some(cluster) = media.cache().and_then(|c| c.cluster()) else {
        return;
    };
    let weak: Weak<MediaCache> = Arc::downgrade(media);
    cluster.register_fill(
        FILL,
        Arc::new(move |body: Bytes| {
            let weak = weak.clone();
            Box::pin(async move {
                let Some(media) = weak.upgrade() else {
                    return bad("the media front end was reloaded");
                };
                answer(run(&media, &body).await)
            })
        }),
    );
}

/// A fill's answer to the asking node. This node's own refusal (no cache, a bad order) is marked,
/// so the asking node fills on its own; unmarked, it was passed on as the origin's answer (a 400
/// for every key this node owns). The origin's answers and failures go as they are.
fn answer(
    result: Result<http::Response<crate::body::Body>, ProxyError>,
) -> http::Response<crate::body::Body> {
    match result {
        Ok(resp) => resp,
        Err(e) if e.kind == REFUSED => crate::cache::cluster::refused_fill(e.into_response()),
        Err(e) => e.into_response(),
    }
}

/// The error kind of this node's refusals to run a fill.
const REFUSED: &str = "cluster_fill";

fn bad(why: &'static str) -> http::Response<crate::body::Body> {
    crate::cache::cluster::refused_fill(
        ProxyError::downstream(http::StatusCode::BAD_REQUEST, REFUSED, why).into_response(),
    )
}

/// The headers an order carries, in order; `None` when one is not a valid header.
fn headers_of(order: &Order) -> Option<HeaderMap> {
    let mut headers = HeaderMap::new();
    for (k, v) in &order.headers {
        let v = match v {
            FieldValue::Text(t) => HeaderValue::from_str(t).ok()?,
            FieldValue::Bytes(b) => HeaderValue::from_bytes(b).ok()?,
        };
        headers.append(HeaderName::from_bytes(k.as_bytes()).ok()?, v);
    }
    Some(headers)
}

async fn run(
    media: &MediaCache,
    body: &[u8],
) -> Result<http::Response<crate::body::Body>, ProxyError> {
    let refuse =
        |why: &'static str| ProxyError::downstream(http::StatusCode::BAD_REQUEST, REFUSED, why);
    let order: Order = serde_json::from_slice(body).map_err(|_| refuse("bad fill order"))?;
    let kind = kind_of(&order.kind).ok_or_else(|| refuse("bad fill kind"))?;
    let url = Url::parse(&order.url).map_err(|_| refuse("bad fill url"))?;
    let headers = headers_of(&order).ok_or_else(|| refuse("bad fill header"))?;
    let Some(cache) = media.cache() else {
        return Err(refuse("no cache here"));
    };
    let part = Part {
        url,
        range: order.range,
    };
    let key = request_key(&part.url, &headers);
    let mut resp = media
        .serve_local(cache, &key, kind, &part, &headers, order.max_age)
        .await?;
    if let Some(cluster) = cache.cluster() {
        cluster.name_node(resp.headers_mut());
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_nodes_refusals_are_marked_and_the_origins_answers_are_not() {
        let marked = |r: &http::Response<crate::body::Body>| {
            r.headers().contains_key("sluice-cluster-error")
        };
        assert!(marked(&bad("the media front end was reloaded")));
        let refused =
            ProxyError::downstream(http::StatusCode::BAD_REQUEST, REFUSED, "no cache here");
        let r = answer(Err(refused));
        assert_eq!(r.status(), 400);
        assert!(marked(&r));
        let origin =
            ProxyError::upstream_status(http::StatusCode::NOT_FOUND, "origin.test", "segment");
        assert!(!marked(&answer(Err(origin))));
    }

    /// A header value that is not ASCII (a cookie with a Latin-1 byte) reaches the owner whole,
    /// so it fetches and keys the object with the same headers as the asking node.
    #[test]
    fn an_order_carries_every_header_byte_for_byte() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "cookie",
            HeaderValue::from_bytes(b"a=1; b=\xe9t\xe9").unwrap(),
        );
        headers.append("x-a", HeaderValue::from_static("one"));
        headers.append("x-a", HeaderValue::from_static("two"));
        let part = Part {
            url: Url::parse("http://origin.test/seg/1.m4s").unwrap(),
            range: Some((0, 99)),
        };
        let body = order(CacheKind::Segment, &part, &headers, Some(5));
        let parsed: Order = serde_json::from_slice(&body).unwrap();
        let got = headers_of(&parsed).unwrap();
        assert_eq!(got, headers);
        assert_eq!(got["cookie"].as_bytes(), b"a=1; b=\xe9t\xe9");
        assert_eq!(
            request_key(&part.url, &got),
            request_key(&part.url, &headers)
        );
        // An ASCII value travels as text, as a node before this reads it.
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.contains(r#"["x-a","one"]"#), "{text}");
    }
}
