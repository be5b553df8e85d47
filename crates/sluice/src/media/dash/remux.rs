//! `segment.ts`: one DASH segment fetched with its init segment, decrypted when keys are given,
//! and remuxed to MPEG-TS for players that cannot play fMP4. The remuxing itself lives in
//! `sluice_media::remux`.
//!
//! Each response starts its continuity counters at 0: requests are independent, so the state
//! one segment ends with is not known to the next. Players demux segment by segment and ignore
//! the jump at a segment boundary; within a segment the counters are continuous.

use std::time::Instant;

use http::{Response, StatusCode};
use sluice_media::dash::proxy::{self, SegmentRequest};
use sluice_media::remux::{RemuxError, RemuxState, Remuxer};

use super::segment::{clear_init, decrypt, raw_init};
use super::{bad_request, params_for, respond, upstream_headers, Dash};
use crate::app::RequestContext;
use crate::body::Body;
use crate::error::{ProxyError, Side};

const TS_TYPE: &str = "video/mp2t";

/// `/proxy/mpd/segment.ts`.
pub async fn segment_ts(dash: &Dash, ctx: &RequestContext) -> Result<Response<Body>, ProxyError> {
    let req = SegmentRequest::from_query(&ctx.query, true)?;
    let Some(part) = req.segment.clone() else {
        return Err(bad_request("missing required parameter `segment_url`"));
    };
    let Some(init_part) = req.init.clone() else {
        return Err(bad_request(
            "missing required parameter `init_url` (MPEG-TS output needs the init segment)",
        ));
    };
    let params = params_for(&ctx.query, &part.url)?;
    let headers = upstream_headers(&params)?;
    let keys = proxy::key_ring(&ctx.query).map_err(bad_request)?;
    dash.prefetcher.segment_fetched(&part, &headers);
    let init = async {
        match &keys {
            Some(keys) => {
                let (clear, info) = clear_init(dash, &init_part, keys, &headers).await?;
                Ok((clear, Some(info)))
            }
            None => Ok((raw_init(dash, &init_part, &headers).await?, None)),
        }
    };
    let ((init, info), media) =
        tokio::try_join!(init, dash.prefetcher.get_or_fetch(&part, &headers))?;
    let media = match (&keys, &info) {
        (Some(keys), Some(info)) if info.is_protected() => decrypt(dash, &media, info, keys)?,
        _ => media,
    };
    let start = Instant::now();
    let remuxer = Remuxer::new(&init).map_err(remux_error)?;
    let ts = remuxer
        .segment(&media, &mut RemuxState::default())
        .map_err(remux_error)?;
    dash.remux_seconds.observe(start.elapsed().as_secs_f64());
    respond(ts, TS_TYPE, &params)
}

/// Still encrypted means the caller gave no keys: a 400 saying so. Anything else is content the
/// remuxer cannot carry: a 502 with the reason.
fn remux_error(e: RemuxError) -> ProxyError {
    match e {
        RemuxError::Encrypted { .. } => ProxyError::downstream(
            StatusCode::BAD_REQUEST,
            "key_required",
            "the segment is encrypted: pass key_id and key",
        ),
        other => ProxyError::new(
            Side::Upstream,
            StatusCode::BAD_GATEWAY,
            "remux",
            format!("the segment cannot be remuxed to MPEG-TS: {other}"),
        ),
    }
}
