//! `init.mp4` and `segment.mp4`: init segments with their protection boxes removed, media segments
//! decrypted (every `moof`/`mdat` pair) with the caller's keys. Without keys both pass through as
//! fetched, as MediaFlow does, so a player with its own ClearKey support still works.

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Response, StatusCode};
use prometheus_client::metrics::histogram::Histogram;
use sluice_media::cenc::{decrypt_segment, rewrite_init, CencError, InitInfo};
use sluice_media::dash::proxy::{self, Part, SegmentRequest};
use sluice_media::keys::KeyRing;

use super::clear::ClearKey;
use super::{bad_request, link_scope, params_for, respond, upstream_headers, Dash};
use crate::body::Body;
use crate::error::{ProxyError, Side};
use crate::media::cache::CacheKind;
use crate::media::links;
use crate::request::RequestContext;

/// `/proxy/mpd/segment.mp4`; `head` for a HEAD request, which fetches nothing ahead.
pub async fn segment(
    dash: &Dash,
    ctx: &RequestContext,
    head: bool,
) -> Result<Response<Body>, ProxyError> {
    let req = SegmentRequest::from_query(&ctx.query, true)?;
    let Some(part) = req.segment.clone() else {
        return Err(bad_request("missing required parameter `segment_url`"));
    };
    let params = params_for(&ctx.query, &part.url)?;
    let link_headers = upstream_headers(&params)?;
    // The segment and its init each get the credentials decided for their own URL.
    let scope = link_scope(dash, &ctx.query, &part.url)?;
    let headers = links::scoped_headers(&link_headers, scope.reach(&part.url));
    let init_headers = req
        .init
        .as_ref()
        .map(|i| links::scoped_headers(&link_headers, scope.reach(&i.url)));
    let keys = proxy::key_ring(&ctx.query).map_err(bad_request)?;
    // Start fetching what follows before waiting for this one; a HEAD is not playback.
    if !head {
        let hosts = &dash.settings.credential_hosts;
        dash.prefetcher.segment_fetched(&part, &headers, hosts);
    }
    let init = async {
        match (&req.init, &init_headers, &keys) {
            (Some(init), Some(h), Some(keys)) => {
                let (clear, info) = clear_init(dash, init, keys, h).await?;
                Ok(Some((clear, Some(info))))
            }
            (Some(init), Some(h), None) if !req.use_map => {
                Ok(Some((raw_init(dash, init, h).await?, None)))
            }
            _ => Ok(None),
        }
    };
    let (init, media) = tokio::try_join!(init, dash.prefetcher.get_or_fetch(&part, &headers))?;
    let init_request = req.init.as_ref().zip(init_headers.as_ref());
    let media = match (
        &keys,
        init.as_ref().and_then(|(_, info)| info.as_ref()),
        init_request,
    ) {
        (Some(keys), Some(info), Some((init_part, init_headers))) if info.is_protected() => {
            let key = clear_key(&part, &headers, init_part, init_headers, keys.clone());
            let (seconds, info, keys) = (dash.decrypt_seconds.clone(), info.clone(), keys.clone());
            dash.clear
                .get_or_decrypt(key, move || decrypt(&seconds, &media, &info, &keys))
                .await?
        }
        _ => media,
    };
    let body = match init {
        Some((init, _)) if !req.use_map => {
            let mut joined = BytesMut::with_capacity(init.len() + media.len());
            joined.extend_from_slice(&init);
            joined.extend_from_slice(&media);
            joined.freeze()
        }
        _ => media,
    };
    respond(body, req.content_type, &params)
}

/// What a clear (or remuxed) segment is cached under: [`ClearKey::new`], the only way to build
/// one (its fields are private), which takes the init's request with the segment's.
pub(super) fn clear_key(
    segment: &Part,
    headers: &HeaderMap,
    init: &Part,
    init_headers: &HeaderMap,
    keys: KeyRing,
) -> ClearKey {
    ClearKey::new(segment, headers, init, init_headers, keys)
}

/// `/proxy/mpd/init.mp4`.
pub async fn init(dash: &Dash, ctx: &RequestContext) -> Result<Response<Body>, ProxyError> {
    let req = SegmentRequest::from_query(&ctx.query, false)?;
    let Some(part) = req.init.clone() else {
        return Err(bad_request("missing required parameter `init_url`"));
    };
    let params = params_for(&ctx.query, &part.url)?;
    let scope = link_scope(dash, &ctx.query, &part.url)?;
    let headers = links::scoped_headers(&upstream_headers(&params)?, scope.reach(&part.url));
    let bytes = match proxy::key_ring(&ctx.query).map_err(bad_request)? {
        Some(keys) => clear_init(dash, &part, &keys, &headers).await?.0,
        None => raw_init(dash, &part, &headers).await?,
    };
    respond(bytes, req.content_type, &params)
}

/// The init segment as fetched (cached by URL and upstream headers; a byte range shares the
/// file's slices).
pub(super) async fn raw_init(
    dash: &Dash,
    part: &Part,
    headers: &HeaderMap,
) -> Result<Bytes, ProxyError> {
    let fetched = dash
        .cache
        .fetch(
            CacheKind::Init,
            part,
            headers,
            dash.settings.max_segment_bytes,
            None,
        )
        .await?;
    Ok(fetched.bytes)
}

/// The init segment without protection boxes, and its track facts; refuses keys that leave a
/// protected track without a key. The raw bytes come from the cache; removing protection needs
/// no key and takes microseconds on an init segment of a few KiB, so it runs per request rather
/// than holding a second, derived copy.
pub(super) async fn clear_init(
    dash: &Dash,
    part: &Part,
    keys: &KeyRing,
    headers: &HeaderMap,
) -> Result<(Bytes, Arc<InitInfo>), ProxyError> {
    let raw = raw_init(dash, part, headers).await?;
    let (clear, info) = rewrite_init(&raw).map_err(|e| {
        ProxyError::new(
            Side::Upstream,
            StatusCode::BAD_GATEWAY,
            "bad_init",
            format!("the init segment cannot be used: {e}"),
        )
    })?;
    let info = Arc::new(info);
    if let Some(kid) = proxy::unkeyed_kid(&info, keys) {
        return Err(missing_key(&kid));
    }
    Ok((clear.into(), info))
}

/// Decrypts every `moof`/`mdat` pair of `media`, timed into `seconds`. CPU work: callers run it
/// through [`super::clear::ClearSegments`], which keeps it off the runtime's workers.
pub(super) fn decrypt(
    seconds: &Histogram,
    media: &[u8],
    info: &InitInfo,
    keys: &KeyRing,
) -> Result<Bytes, ProxyError> {
    let start = Instant::now();
    let clear = decrypt_segment(media, info, keys).map_err(|e| match e {
        CencError::MissingKey { kid } => missing_key(&kid),
        other => ProxyError::new(
            Side::Upstream,
            StatusCode::BAD_GATEWAY,
            "decrypt",
            format!("the segment cannot be decrypted: {other}"),
        ),
    })?;
    seconds.observe(start.elapsed().as_secs_f64());
    Ok(Bytes::from(clear))
}

pub(super) fn missing_key(kid: &str) -> ProxyError {
    ProxyError::downstream(
        StatusCode::BAD_REQUEST,
        "key_missing",
        format!("no key for KID {kid}: add it to key_id/key (or key=kid:key)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With per-URL credentials a segment on a CDN is fetched without the viewer's cookie and its
    /// init on the viewer's origin with it: two viewers with one segment request but different
    /// init requests (another cookie, so possibly another init) get separate clear segments.
    #[test]
    fn the_clear_key_covers_the_inits_request() {
        let part = |u: &str| Part {
            url: url::Url::parse(u).unwrap(),
            range: None,
        };
        let (segment, init) = (
            part("https://cdn.example/s1.m4s"),
            part("https://o.example/i.mp4"),
        );
        let headers = |cookie: Option<&str>| {
            let mut h = HeaderMap::new();
            h.insert("referer", "https://player.example/".parse().unwrap());
            if let Some(c) = cookie {
                h.insert("cookie", c.parse().unwrap());
            }
            h
        };
        let keys = KeyRing::default();
        let a = clear_key(
            &segment,
            &headers(None),
            &init,
            &headers(Some("s=a")),
            keys.clone(),
        );
        let b = clear_key(
            &segment,
            &headers(None),
            &init,
            &headers(Some("s=b")),
            keys.clone(),
        );
        assert!(a != b, "one clear segment for two init requests");
        let again = clear_key(&segment, &headers(None), &init, &headers(Some("s=a")), keys);
        assert!(a == again);
    }
}
