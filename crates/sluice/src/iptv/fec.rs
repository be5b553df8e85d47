//! A hub's FEC (`?fec=PORT`): the FEC socket on the same group, the recent media packets the
//! FEC protects, and the lost packets it rebuilds, which rejoin the stream before the reorder
//! window. Two kinds of FEC stream are understood, told apart by their first packet: SMPTE
//! 2022-1 row/column XOR, and the Reed-Solomon blocks of payload type 127 or 97 that operators
//! send (also accepted on the media port itself, as rtp2httpd does).
//!
//! FEC datagrams are queued when they arrive and evaluated on the hub's next flush tick, so the
//! media packets they protect (on another socket, drained in another branch) are in first. An
//! XOR packet that finds two or more packets missing is tried once more a tick later, after the
//! other direction (row or column) may have filled one of them; a Reed-Solomon block stays open
//! until it has as many parity packets as it has losses, or falls out of the history.

use std::io::Read;

use sluice_media::fec::{self, FecOutcome, MediaPacket, Recovery};
use sluice_media::rs_fec::{self, Rebuilt};
use sluice_media::rtp::{self, RtpHeader};
use socket2::Socket;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::metrics::HubMetrics;
use crate::net::multicast::{self, Group};

/// Media packets remembered: twice the largest common matrix (20 × 20), a power of two.
const HISTORY_PACKETS: usize = 1024;
/// FEC datagrams queued between ticks; more means the FEC stream is not what it claims.
const MAX_QUEUED: usize = 512;
/// The reorder window a FEC channel needs at least, so a packet rebuilt from column FEC (which
/// arrives a whole matrix late) is still in time. rtp2httpd uses the same.
pub const MIN_REORDER_WINDOW: usize = 512;

/// Opens and joins the FEC socket: the channel's group and source, the FEC port.
pub fn open(group: &Group, port: u16, recv_buffer: usize) -> std::io::Result<AsyncFd<Socket>> {
    let fec_group = Group {
        port,
        ..group.clone()
    };
    let sock = multicast::open(&fec_group, recv_buffer)?;
    // SAFETY: as for the media socket: `Socket` owns its descriptor until dropped.
    Ok(unsafe { AsyncFd::register_with_interest(sock, Interest::READABLE) }?)
}

/// FEC state of one hub.
///
/// Until the first FEC packet says which kind the stream is, media is remembered for both;
/// from then on only for that kind (the other store is dropped).
#[derive(Debug)]
pub struct FecState {
    /// SMPTE 2022-1 XOR: payloads and the fields the XOR covers.
    recovery: Option<Recovery>,
    /// Reed-Solomon: whole datagrams, and the open blocks.
    rs: Option<rs_fec::Recovery>,
    /// XOR FEC payloads waiting for the next tick, and whether each was tried already.
    queued: Vec<(Vec<u8>, bool)>,
}

impl Default for FecState {
    fn default() -> Self {
        Self {
            recovery: Some(Recovery::new(HISTORY_PACKETS)),
            rs: Some(rs_fec::Recovery::new(HISTORY_PACKETS)),
            queued: Vec::new(),
        }
    }
}

/// Whether a media-socket RTP packet is in fact Reed-Solomon FEC (rtp2httpd's "mixed port").
pub fn is_rs_fec(header: &RtpHeader, payload: &[u8]) -> bool {
    rs_fec::FEC_PAYLOAD_TYPES.contains(&header.payload_type)
        && rs_fec::parse_payload(payload).is_ok()
}

impl FecState {
    /// Remembers a received media packet (one copy of it: the price of FEC).
    pub fn media(&mut self, header: &RtpHeader, payload: &[u8], datagram: &[u8]) {
        if let Some(recovery) = self.recovery.as_mut() {
            recovery.media(MediaPacket {
                sequence: header.sequence,
                payload_type: header.payload_type,
                timestamp: header.timestamp,
                payload: payload.to_vec(),
            });
        }
        if let Some(rs) = self.rs.as_mut() {
            rs.media(header.sequence, datagram);
        }
    }

    /// Takes one FEC datagram, of either kind.
    pub fn datagram(&mut self, datagram: &[u8], metrics: &HubMetrics) {
        if let Ok((header, parity)) = rs_fec::parse_datagram(datagram) {
            if let Some(rs) = self.rs.as_mut() {
                self.recovery = None;
                if !rs.fec(&header, parity) {
                    metrics.fec_unrecoverable.inc();
                }
                return;
            }
        }
        let usable = rtp::parse_rtp(datagram)
            .ok()
            .filter(|p| fec::parse_fec(&datagram[p.payload.clone()]).is_ok());
        match usable {
            Some(p) if self.recovery.is_some() && self.queued.len() < MAX_QUEUED => {
                self.rs = None;
                self.queued.push((datagram[p.payload].to_vec(), false));
            }
            Some(_) => {
                metrics.fec_unrecoverable.inc();
            }
            None => {
                metrics.malformed.inc();
            }
        }
    }

    /// Reads every waiting FEC datagram and queues the usable ones.
    pub fn drain(
        &mut self,
        guard: &mut tokio::io::unix::AsyncFdReadyGuard<'_, Socket>,
        metrics: &HubMetrics,
    ) {
        let mut buf = [0u8; 2048];
        loop {
            let read = guard.try_io(|s| (&mut s.get_ref()).read(&mut buf));
            let n = match read {
                Ok(Ok(n)) => n,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "FEC receive failed");
                    return;
                }
                Err(_would_block) => return,
            };
            self.datagram(&buf[..n], metrics);
        }
    }

    /// FEC packets are queued for another try: the reorder window should keep waiting.
    pub fn waiting(&self) -> bool {
        !self.queued.is_empty()
    }

    /// Evaluates the queued FEC packets; returns the media packets they rebuilt.
    pub fn repair(&mut self, metrics: &HubMetrics) -> Vec<Rebuilt> {
        if let Some(rs) = self.rs.as_mut() {
            let round = rs.repair();
            metrics.fec_recovered.inc_by(round.rebuilt.len() as u64);
            metrics.fec_unrecoverable.inc_by(round.unrecoverable);
            return round.rebuilt;
        }
        let Some(recovery) = self.recovery.as_mut() else {
            return Vec::new();
        };
        let mut rebuilt = Vec::new();
        let mut retry = Vec::new();
        for (payload, tried) in std::mem::take(&mut self.queued) {
            let Ok((header, xor)) = fec::parse_fec(&payload) else {
                continue;
            };
            match recovery.fec(&header, xor) {
                FecOutcome::Repaired(p) => rebuilt.push(p),
                FecOutcome::Intact => {}
                FecOutcome::Unrecoverable if !tried => retry.push((payload, true)),
                FecOutcome::Unrecoverable => {
                    metrics.fec_unrecoverable.inc();
                }
            }
        }
        // A repair in this round may complete what another FEC packet needed.
        if !rebuilt.is_empty() {
            retry.retain(|(payload, _)| {
                let Ok((header, xor)) = fec::parse_fec(payload) else {
                    return false;
                };
                match recovery.fec(&header, xor) {
                    FecOutcome::Repaired(p) => {
                        rebuilt.push(p);
                        false
                    }
                    FecOutcome::Intact => false,
                    FecOutcome::Unrecoverable => true,
                }
            });
        }
        self.queued = retry;
        metrics.fec_recovered.inc_by(rebuilt.len() as u64);
        rebuilt
            .into_iter()
            .map(|p| Rebuilt {
                sequence: p.sequence,
                payload: p.payload,
            })
            .collect()
    }
}
