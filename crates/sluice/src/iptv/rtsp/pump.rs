//! An RTSP hub's task: open the session, then move its RTP into the hub's pump (the same
//! strip, reorder, pack and publish path as a multicast channel), send keep-alives, and tear
//! the session down when the last viewer's linger ends, the server stops sending, or the
//! server ends the session.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::session::{redact, Session};
use super::SessionLimit;
use crate::iptv::hub::{Hub, HubKey, HubSettings, Pump};
use crate::iptv::metrics::HubMetrics;
use crate::iptv::registry::Registry;

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

async fn run(hub: Arc<Hub>, settings: HubSettings, registry: Arc<Registry>) {
    let (Some(rtsp), Some(ctx)) = (hub.key.rtsp.clone(), settings.rtsp.clone()) else {
        return;
    };
    let label = rtsp.label();
    let setup = Duration::from_millis(ctx.config.setup_timeout_ms);
    let mut published = hub.published.subscribe();
    let (target, owned) = (rtsp.target.clone(), ctx.clone());
    let mut opening = Box::pin(tokio::time::timeout(setup, async move {
        Session::open(&target, &owned).await
    }));
    let opened = tokio::select! {
        opened = &mut opening => match opened {
            Ok(Ok(session)) => Ok(session),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("setup took longer than {} ms", setup.as_millis())),
        },
        _ = published.wait_for(|p| p.closed) => {
            // Released while setting up (its starter needed the place): the hub goes now, and
            // the setup finishes on its own, a session it opened torn down (dropped half-way,
            // the server kept it, sending to a closed port, until its own timeout); the session
            // slot is given back then.
            registry.remove(&hub);
            tracing::info!(channel = %label, "RTSP channel released while setting up");
            tokio::spawn(async move {
                if let Ok(Ok(session)) = opening.await {
                    session.teardown().await;
                }
                ctx.sessions.fetch_sub(1, Ordering::AcqRel);
            });
            return;
        }
    };
    let mut session = match opened {
        Ok(s) => s,
        Err(reason) => {
            tracing::warn!(channel = %label, url = %redact(&rtsp.target.url), %reason, "RTSP session failed");
            ctx.fail(&hub, reason);
            registry.remove(&hub);
            ctx.sessions.fetch_sub(1, Ordering::AcqRel);
            return;
        }
    };
    tracing::info!(channel = %label, keepalive_secs = session.keepalive.as_secs(), "RTSP session playing");
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
    tracing::info!(channel = %label, %reason, "RTSP session ended");
    session.teardown().await;
    ctx.sessions.fetch_sub(1, Ordering::AcqRel);
}
