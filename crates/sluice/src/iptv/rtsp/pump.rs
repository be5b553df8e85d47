//! An RTSP hub's task: open the session, then move its RTP into the hub's pump (the same
//! strip, reorder, pack and publish path as a multicast channel), send keep-alives, and tear
//! the session down when the last viewer's linger ends, the server stops sending, or the
//! server ends the session.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::session::Session;
use super::{Context, SessionLimit};
use crate::iptv::hub::{Hub, HubKey, HubSettings, Pump};
use crate::iptv::metrics::HubMetrics;
use crate::iptv::registry::Registry;
use crate::logging::WarnLimit;

/// Creates the hub and starts its session task; called by `Hub::start` under the registry
/// lock, so the session count cannot be overshot.
pub fn start(
    key: HubKey,
    metrics: HubMetrics,
    settings: &HubSettings,
    registry: Arc<Registry>,
) -> std::io::Result<Arc<Hub>> {
    let (Some(rtsp), Some(ctx)) = (key.rtsp.clone(), settings.rtsp.clone()) else {
        return Err(std::io::Error::other("not an RTSP hub"));
    };
    let max = ctx.config.max_sessions;
    if max > 0 && ctx.sessions.load(Ordering::Acquire) >= max {
        return Err(std::io::Error::other(SessionLimit(max)));
    }
    ctx.sessions.fetch_add(1, Ordering::AcqRel);
    let mut settings = settings.clone();
    if rtsp.private != 0 {
        // A catch-up session is one viewer's: nobody else can join it, so nothing to linger for.
        settings.linger = Duration::ZERO;
    }
    let hub = Hub::new(key, metrics, &settings);
    tokio::spawn(run(hub.clone(), settings, registry));
    Ok(hub)
}

/// At most one `RTSP session failed` warning a second for the whole process; the others go
/// to debug, and the next warning says how many were left out.
static FAILURE_WARNINGS: WarnLimit = WarnLimit::new(1000);

async fn run(hub: Arc<Hub>, settings: HubSettings, registry: Arc<Registry>) {
    let (Some(rtsp), Some(ctx)) = (hub.key.rtsp.clone(), settings.rtsp.clone()) else {
        return;
    };
    let label = rtsp.label();
    let setup = Duration::from_millis(ctx.config.setup_timeout_ms);
    let mut published = hub.published.subscribe();
    // The session being set up, kept out of the setup's future: however the setup ends
    // (failed, timed out, dropped), a session the server answered SETUP for is torn down.
    let mut started = None;
    // Whether the setup connected to a server (the first, or a redirect's): a setup that
    // never did gives its client's start back (`Registry::remove_unreached`).
    let mut reached = false;
    let opened = {
        let mut opening = Box::pin(tokio::time::timeout(
            setup,
            Session::open(&rtsp.target, &ctx, &mut started, &mut reached),
        ));
        tokio::select! {
            // Setup first: when it has just finished as the hub is released, the session is
            // played, sees the release at once (`wake`) and is torn down like any other.
            biased;
            opened = &mut opening => Some(match opened {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("setup took longer than {} ms", setup.as_millis())),
            }),
            _ = published.wait_for(|p| p.closed) => None,
        }
        // The setup's future ends here, and its hold on `started` with it.
    };
    let Some(opened) = opened else {
        // Released while setting up (its starter needed the place): the setup is dropped
        // and its session place given back at once. Left to finish (up to
        // `setup_timeout_ms`, then a TEARDOWN), each released setup kept its place though no
        // longer on its client's share, so one client zapping through slow servers held every
        // place (`max_sessions`) and every other client got 503. (Counting them on the
        // client's share until they end would refuse only that client, but would keep the
        // places, and the servers' connections, taken for nothing.) A session the server has
        // already set up is then torn down, off the place like an ended session's.
        ctx.sessions.fetch_sub(1, Ordering::AcqRel);
        registry.remove(&hub);
        tracing::info!(channel = %label, "RTSP channel released while setting up");
        if let Some(session) = started {
            tear_down(&ctx, session, &label).await;
        }
        return;
    };
    let playing = opened.and_then(|()| started.take().ok_or_else(|| "no session".to_string()));
    let mut session = match playing {
        Ok(s) => s,
        Err(reason) => {
            // The reason holds the server's own words (its status line): Debug-escaped, and
            // the warning kept to one a second, as a client can make sessions fail at will.
            // The channel is named by its label alone, cut short like every line's here: the
            // whole URL was the client's path, up to a header block's worth, in each warning.
            match FAILURE_WARNINGS.allow_now() {
                Some(suppressed) => {
                    tracing::warn!(channel = %label, ?reason, suppressed, "RTSP session failed")
                }
                None => tracing::debug!(channel = %label, ?reason, "RTSP session failed"),
            }
            ctx.fail(&hub);
            if reached {
                registry.remove(&hub);
            } else {
                registry.remove_unreached(&hub);
            }
            ctx.sessions.fetch_sub(1, Ordering::AcqRel);
            // A failure after SETUP (PLAY refused or timed out, the whole setup too slow)
            // leaves a session on the server: torn down as a released setup's is.
            if let Some(session) = started {
                tear_down(&ctx, session, &label).await;
            }
            return;
        }
    };
    tracing::info!(channel = %label, keepalive_secs = session.keepalive.as_secs(), "RTSP session playing");
    // Over UDP, datagrams up to the bound come whole; larger ones are dropped as they arrive
    // and counted as malformed, as `take_datagram` drops and counts an interleaved one.
    session.set_max_datagram(settings.max_datagram, hub.metrics.malformed.clone());
    let mut pump = Pump::new(hub.clone(), settings.clone(), 0);
    let mut tick = tokio::time::interval(settings.flush_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let every = session.keepalive.max(Duration::from_secs(1));
    let mut keepalive = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let reason = loop {
        tokio::select! {
            got = session.receive() => {
                let drained = got.and_then(|()| session.drain(&mut |d| pump.take_datagram(d)));
                pump.append_released();
                if let Err(e) = drained {
                    break e.to_string();
                }
            }
            _ = tick.tick() => {
                if let Some(reason) = pump.on_tick(&registry) {
                    break reason;
                }
            }
            _ = keepalive.tick() => {
                if let Err(e) = session.keep_alive().await {
                    break format!("keep-alive failed: {e}");
                }
            }
            _ = hub.wake.notified() => {
                if let Some(reason) = pump.check_idle(&registry) {
                    break reason;
                }
            }
        }
    };
    pump.finish();
    registry.remove(&hub);
    tracing::info!(channel = %label, ?reason, "RTSP session ended");
    // The place goes back before the TEARDOWN (bounded by `timeout_ms`): the session is over
    // for the gateway, and a server slow to answer it must not keep places from other
    // clients (a client zapping, or asking for catch-up after catch-up, ends sessions as fast
    // as it starts them).
    ctx.sessions.fetch_sub(1, Ordering::AcqRel);
    tear_down(&ctx, session, &label).await;
}

/// Tears `session` down if one of the gateway's `MAX_TEARDOWNS` places is free, and one of
/// its server's `MAX_TEARDOWNS_PER_SERVER`; otherwise only closes its connection (dropped),
/// which the server notices.
async fn tear_down(ctx: &Context, session: Session, label: &str) {
    if !session.is_set_up() {
        return;
    }
    // Held until the TEARDOWN is answered or its step is up. No address: the connection is
    // gone, and the TEARDOWN would not find the server either.
    let Some(_place) = session.server().and_then(|s| ctx.teardown_place(s)) else {
        tracing::debug!(channel = %label, "too many RTSP TEARDOWNs in flight: connection closed instead");
        return;
    };
    session.teardown().await;
}
