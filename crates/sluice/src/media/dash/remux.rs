//! `segment.ts`: one DASH segment fetched with its init segment, decrypted when keys are given,
//! and remuxed to MPEG-TS for players that cannot play fMP4. The remuxing itself lives in
//! `sluice_media::remux`.
//!
//! Continuity counters run on from one segment to the next: the counters a segment ends with are
//! kept (bounded, for a few minutes) under its init and the decode time where it ends, which is
//! where the next segment of the same stream starts. A segment nobody requested the predecessor
//! of starts at 0, which players accept at a segment boundary.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Response, StatusCode};
use sluice_media::dash::proxy::Part;
use sluice_media::dash::proxy::{self, SegmentRequest};
use sluice_media::remux::{RemuxError, RemuxState, Remuxer};

use super::segment::{clear_init, clear_key, decrypt, raw_init};
use super::{bad_request, link_scope, params_for, respond, upstream_headers, Dash};
use crate::body::Body;
use crate::error::{ProxyError, Side};
use crate::media::links;
use crate::request::RequestContext;

const TS_TYPE: &str = "video/mp2t";

/// `/proxy/mpd/segment.ts`; `head` for a HEAD request, which fetches nothing ahead.
pub async fn segment_ts(
    dash: &Dash,
    ctx: &RequestContext,
    head: bool,
) -> Result<Response<Body>, ProxyError> {
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
    let link_headers = upstream_headers(&params)?;
    // The segment and its init each get the credentials decided for their own URL.
    let scope = link_scope(dash, &ctx.query, &part.url)?;
    let headers = links::scoped_headers(&link_headers, scope.reach(&part.url));
    let init_headers = links::scoped_headers(&link_headers, scope.reach(&init_part.url));
    let keys = proxy::key_ring(&ctx.query).map_err(bad_request)?;
    if !head {
        let hosts = &dash.settings.credential_hosts;
        dash.prefetcher.segment_fetched(&part, &headers, hosts);
    }
    let init = async {
        match &keys {
            Some(keys) => {
                let (clear, info) = clear_init(dash, &init_part, keys, &init_headers).await?;
                Ok((clear, Some(info)))
            }
            None => Ok((raw_init(dash, &init_part, &init_headers).await?, None)),
        }
    };
    let ((init, info), media) =
        tokio::try_join!(init, dash.prefetcher.get_or_fetch(&part, &headers))?;
    // One decryption and one remux per segment however many viewers ask for it: the output is a
    // function of the fetched bytes, the init and the keys (the continuity counters it starts
    // from are those the previous segment of the stream ended with, the same for every viewer).
    let key = clear_key(
        &part,
        &headers,
        &init_part,
        &init_headers,
        keys.clone().unwrap_or_default(),
    );
    let counters = Arc::clone(&dash.ts_counters);
    let (decrypt_seconds, remux_seconds) =
        (dash.decrypt_seconds.clone(), dash.remux_seconds.clone());
    let ts = dash
        .ts
        .get_or_decrypt(key, move || {
            let media = match (&keys, &info) {
                (Some(keys), Some(info)) if info.is_protected() => {
                    decrypt(&decrypt_seconds, &media, info, keys)?
                }
                _ => media,
            };
            let start = Instant::now();
            let remuxer = Remuxer::new(&init).map_err(remux_error)?;
            let span = remuxer.span(&media).map_err(remux_error)?;
            let mut state = span
                .and_then(|s| counters.take(&init_part, s.start))
                .unwrap_or_default();
            let ts = remuxer.segment(&media, &mut state).map_err(remux_error)?;
            if let Some(span) = span {
                counters.put(&init_part, span.end, state);
            }
            remux_seconds.observe(start.elapsed().as_secs_f64());
            Ok(bytes::Bytes::from(ts))
        })
        .await?;
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

/// Continuity counters left by remuxed segments, keyed by init and the decode time they end at.
pub struct Counters {
    states: Mutex<HashMap<(Part, i128), (RemuxState, Instant)>>,
}

/// Most streams whose counters are remembered; beyond it the oldest entry goes.
const MAX_STREAMS: usize = 4096;
/// How long counters wait for the next segment: longer than any sane segment duration.
const STATE_TTL: Duration = Duration::from_secs(120);

impl Default for Counters {
    fn default() -> Self {
        Counters {
            states: Mutex::new(HashMap::new()),
        }
    }
}

impl Counters {
    /// The counters of the segment of `init`'s stream that ended at `start`, if still known.
    fn take(&self, init: &Part, start: i128) -> Option<RemuxState> {
        let states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        states
            .get(&(init.clone(), start))
            .filter(|(_, at)| at.elapsed() < STATE_TTL)
            .map(|(state, _)| state.clone())
    }

    fn put(&self, init: &Part, end: i128, state: RemuxState) {
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        if states.len() >= MAX_STREAMS {
            states.retain(|_, (_, at)| at.elapsed() < STATE_TTL);
        }
        if states.len() >= MAX_STREAMS {
            if let Some(oldest) = states
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone())
            {
                states.remove(&oldest);
            }
        }
        states.insert((init.clone(), end), (state, Instant::now()));
    }
}
