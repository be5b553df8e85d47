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
//!
//! Repair work is bounded per channel (`DecodeBudget`): a Reed-Solomon decode inverts a matrix
//! of up to 254 × 254, an XOR repair passes over up to 20 payloads (the parser refuses larger
//! matrices), and a hostile sender on the group could make every packet it sends such work:
//! 512 XOR packets a tick, each tried twice, is still some 40 MB of XOR a tick without it.

use std::io::Read;

use sluice_media::fec::{self, FecOutcome, MediaPacket, Recovery};
use sluice_media::rs_fec::{self, Rebuilt};
use sluice_media::rtp::{self, RtpHeader};
use socket2::Socket;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::time::{Duration, Instant};

use super::metrics::HubMetrics;
use crate::net::multicast::{self, Group};

/// Media packets remembered: twice the largest common matrix (20 × 20), a power of two.
const HISTORY_PACKETS: usize = 1024;
/// FEC datagrams queued between ticks; more means the FEC stream is not what it claims.
const MAX_QUEUED: usize = 512;
/// FEC datagrams read per wakeup, like the media socket's `DRAIN_CALLS`: a flood on the FEC
/// port must not keep the hub's task (and every channel sharing its thread) reading.
const DRAIN_DATAGRAMS: usize = 64;
/// The reorder window a FEC channel needs at least, so a packet rebuilt from column FEC (which
/// arrives a whole matrix late) is still in time. rtp2httpd uses the same.
pub const MIN_REORDER_WINDOW: usize = 512;

/// Repair work one channel may do per `BUDGET_WINDOW`: Reed-Solomon decodes in
/// `rs_fec::decode_cost` units (about a nanosecond of one core each), XOR repairs in bytes
/// XORed (`Recovery::cost`; less than a nanosecond each). Some 50 ms of CPU a second, however a
/// hostile sender shapes its blocks. A channel has one kind of FEC, so the two never share it.
/// XOR FEC passes over each media byte twice (row and column), plus the FEC payloads and
/// retries: some 6 MB a second for a 20 Mbit/s stream, 30 MB for 100 Mbit/s.
///
/// A decode's cost grows with the cube of the block size, so the budget is of work, not of
/// decodes: counted in decodes, a number that covers small blocks at real stream rates would
/// let large ones take whole cores.
/// Enough for every block of a 20 Mbit/s stream (1,900 packets a second) to lose a packet and
/// be rebuilt at k = 10 (190 blocks a second, some 1,750 decodes budgeted), k = 20 (95, some
/// 720 budgeted) or k = 100 (19, some 22 budgeted), one packet of 1,328 bytes lost per block;
/// real losses touch a fraction of the blocks. The largest block (k = 254, 34 million units) still fits.
const DECODE_BUDGET: u64 = 50_000_000;
/// The window the decode budget is counted over.
const BUDGET_WINDOW: Duration = Duration::from_secs(1);

/// A channel's FEC repair work in the current window; work past `DECODE_BUDGET` is refused
/// until the next window starts.
#[derive(Debug)]
struct DecodeBudget {
    limit: u64,
    /// When the current window started (`None` before the first decode).
    window: Option<Instant>,
    spent: u64,
}

impl DecodeBudget {
    fn new(limit: u64) -> Self {
        Self {
            limit,
            window: None,
            spent: 0,
        }
    }

    /// Whether a decode of `cost` may run at `now`; if so it is spent.
    fn allow(&mut self, now: Instant, cost: u64) -> bool {
        if self
            .window
            .is_none_or(|start| now.saturating_duration_since(start) >= BUDGET_WINDOW)
        {
            self.window = Some(now);
            self.spent = 0;
        }
        match self.spent.checked_add(cost) {
            Some(spent) if spent <= self.limit => {
                self.spent = spent;
                true
            }
            _ => false,
        }
    }
}

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
    /// Bounds the Reed-Solomon decodes and the bytes XOR repairs pass over.
    budget: DecodeBudget,
}

impl Default for FecState {
    fn default() -> Self {
        Self {
            recovery: Some(Recovery::new(HISTORY_PACKETS)),
            rs: Some(rs_fec::Recovery::new(HISTORY_PACKETS)),
            queued: Vec::new(),
            budget: DecodeBudget::new(DECODE_BUDGET),
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

    /// Reads up to `DRAIN_DATAGRAMS` waiting FEC datagrams and queues the usable ones.
    /// Returns `true` when it stopped at that budget: more may wait, and the socket's
    /// readiness was left set (only `WouldBlock` clears it), so the next `readable()` answers
    /// at once; the caller should yield first to let other tasks run.
    pub fn drain(
        &mut self,
        guard: &mut tokio::io::unix::AsyncFdReadyGuard<'_, Socket>,
        metrics: &HubMetrics,
    ) -> bool {
        let mut buf = [0u8; 2048];
        for _ in 0..DRAIN_DATAGRAMS {
            let read = guard.try_io(|s| (&mut s.get_ref()).read(&mut buf));
            let n = match read {
                Ok(Ok(n)) => n,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "FEC receive failed");
                    return false;
                }
                Err(_would_block) => return false,
            };
            self.datagram(&buf[..n], metrics);
        }
        true
    }

    /// FEC packets are queued for another try: the reorder window should keep waiting.
    pub fn waiting(&self) -> bool {
        !self.queued.is_empty()
    }

    /// Evaluates the queued FEC packets; returns the media packets they rebuilt.
    pub fn repair(&mut self, metrics: &HubMetrics) -> Vec<Rebuilt> {
        self.repair_at(Instant::now(), metrics)
    }

    /// `repair` at `now` (the decode budget's clock).
    fn repair_at(&mut self, now: Instant, metrics: &HubMetrics) -> Vec<Rebuilt> {
        if let Some(rs) = self.rs.as_mut() {
            let budget = &mut self.budget;
            let round = rs.repair_within(|cost| budget.allow(now, cost));
            metrics.fec_recovered.inc_by(round.rebuilt.len() as u64);
            metrics.fec_unrecoverable.inc_by(round.unrecoverable);
            metrics.fec_over_budget.inc_by(round.over_budget);
            return round.rebuilt;
        }
        let Some(recovery) = self.recovery.as_mut() else {
            return Vec::new();
        };
        let budget = &mut self.budget;
        let mut over_budget = 0;
        // Every try is charged, a retry too: past the budget the packet is dropped unrepaired.
        let mut offer = |payload: &[u8]| {
            // Queued packets were parsed when queued: this cannot fail.
            let Ok((header, xor)) = fec::parse_fec(payload) else {
                return Some(FecOutcome::Intact);
            };
            if !budget.allow(now, recovery.cost(&header, xor)) {
                over_budget += 1;
                return None;
            }
            Some(recovery.fec(&header, xor))
        };
        let mut rebuilt = Vec::new();
        let mut retry = Vec::new();
        for (payload, tried) in std::mem::take(&mut self.queued) {
            match offer(&payload) {
                Some(FecOutcome::Repaired(p)) => rebuilt.push(p),
                Some(FecOutcome::Intact) | None => {}
                Some(FecOutcome::Unrecoverable) if !tried => retry.push((payload, true)),
                Some(FecOutcome::Unrecoverable) => {
                    metrics.fec_unrecoverable.inc();
                }
            }
        }
        // A repair in this round may complete what another FEC packet needed.
        if !rebuilt.is_empty() {
            retry.retain(|(payload, _)| match offer(payload) {
                Some(FecOutcome::Repaired(p)) => {
                    rebuilt.push(p);
                    false
                }
                Some(FecOutcome::Intact) | None => false,
                Some(FecOutcome::Unrecoverable) => true,
            });
        }
        self.queued = retry;
        metrics.fec_over_budget.inc_by(over_budget);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iptv::metrics::{HubLabels, Metrics};

    fn metrics() -> HubMetrics {
        Metrics::default().hub(HubLabels {
            channel: "rtp://239.1.1.1:5000".into(),
            interface: String::new(),
        })
    }

    /// Attack: a flood on the FEC port. One wakeup reads `DRAIN_DATAGRAMS` and returns; the
    /// socket stays ready, and the next wakeup takes the rest.
    #[tokio::test]
    async fn drain_stops_at_its_budget_and_resumes() {
        let sock = Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
        sock.bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
        sock.set_nonblocking(true).unwrap();
        let to = sock.local_addr().unwrap().as_socket().unwrap();
        // SAFETY: as in `open`: `Socket` owns its descriptor until dropped.
        let fd = unsafe { AsyncFd::register_with_interest(sock, Interest::READABLE) }.unwrap();
        let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let sent = DRAIN_DATAGRAMS + DRAIN_DATAGRAMS / 2;
        for _ in 0..sent {
            // Not FEC: each is counted as malformed, which counts the reads.
            sender.send_to(&[1, 2, 3], to).unwrap();
        }
        let metrics = metrics();
        let mut state = FecState::default();
        let mut guard = fd.readable().await.unwrap();
        assert!(state.drain(&mut guard, &metrics), "stopped at the budget");
        assert_eq!(metrics.malformed.get(), DRAIN_DATAGRAMS as u64);
        drop(guard);
        // Still ready without a new datagram: the rest is read on the next wakeup.
        let mut guard = tokio::time::timeout(Duration::from_secs(1), fd.readable())
            .await
            .expect("readiness kept")
            .unwrap();
        assert!(!state.drain(&mut guard, &metrics), "emptied");
        assert_eq!(metrics.malformed.get(), sent as u64);
    }

    /// An RTP datagram (PT 33) of 7 TS packets whose bytes depend on `seq`.
    fn media(seq: u16) -> Vec<u8> {
        let mut d = vec![0x80, 33];
        d.extend_from_slice(&seq.to_be_bytes());
        d.extend_from_slice(&(u32::from(seq) * 3000).to_be_bytes());
        d.extend_from_slice(&7u32.to_be_bytes());
        for p in 0..7u16 {
            d.push(0x47);
            d.extend((1..188u16).map(|i| (i ^ seq.wrapping_mul(31) ^ p) as u8));
        }
        d
    }

    /// Feeds the block of `k` packets from `first` with its third packet lost, and its two
    /// parity packets; returns the lost packet's sequence number and the decode's cost.
    fn lossy_block(state: &mut FecState, metrics: &HubMetrics, first: u16, k: usize) -> (u16, u64) {
        let packets: Vec<Vec<u8>> = (0..k).map(|i| media(first + i as u16)).collect();
        let lost = first + 2;
        for p in &packets {
            let rtp = rtp::parse_rtp(p).unwrap();
            if rtp.header.sequence != lost {
                state.media(&rtp.header, &p[rtp.payload.clone()], p);
            }
        }
        let refs: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
        let parity = rs_fec::encode_block(&refs, 2, first, 127).unwrap();
        for f in &parity {
            state.datagram(f, metrics);
        }
        let (header, _) = rs_fec::parse_datagram(&parity[0]).unwrap();
        (lost, rs_fec::decode_cost(&header, 1))
    }

    /// `media(seq)` as FEC sees it.
    fn media_packet(seq: u16) -> MediaPacket {
        let d = media(seq);
        let rtp = rtp::parse_rtp(&d).unwrap();
        MediaPacket {
            sequence: seq,
            payload_type: rtp.header.payload_type,
            timestamp: rtp.header.timestamp,
            payload: d[rtp.payload].to_vec(),
        }
    }

    /// Remembers media packets `seqs`, as received.
    fn receive(state: &mut FecState, seqs: std::ops::Range<u16>) {
        for seq in seqs {
            let d = media(seq);
            let rtp = rtp::parse_rtp(&d).unwrap();
            state.media(&rtp.header, &d[rtp.payload.clone()], &d);
        }
    }

    /// The XOR FEC datagram (RTP, PT 96) protecting `column` of a matrix of `l` columns.
    fn column_fec(column: &[MediaPacket], l: u8) -> Vec<u8> {
        let mut d = vec![0x80, 96, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];
        d.extend(fec::encode_fec(
            &column.iter().collect::<Vec<_>>(),
            false,
            l,
        ));
        d
    }

    /// Column `c` of the matrix of `l` columns × `rows` rows from sequence 0.
    fn column(c: u16, l: u16, rows: u16) -> Vec<MediaPacket> {
        (0..rows).map(|r| media_packet(r * l + c)).collect()
    }

    /// Attack: XOR FEC headers claiming 255 packets (the fields allow it; SMPTE 2022-1 stops
    /// at 20 × 20 and 100) are malformed, counted and never queued for work.
    #[test]
    fn xor_fec_outside_the_standard_matrix_is_malformed() {
        let metrics = metrics();
        let mut state = FecState::default();
        receive(&mut state, 0..100);
        // The standard's largest column: L = 5, D = 20.
        let fits = column_fec(&column(0, 5, 20), 5);
        for (offset, na) in [(255, 255), (1, 255), (5, 21), (10, 20)] {
            let mut bad = fits.clone();
            bad[12 + 13] = offset;
            bad[12 + 14] = na;
            state.datagram(&bad, &metrics);
        }
        assert_eq!(metrics.malformed.get(), 4);
        assert!(!state.waiting(), "nothing queued");
        state.datagram(&fits, &metrics);
        assert!(state.waiting());
        assert_eq!(metrics.malformed.get(), 4);
    }

    fn seqs(rebuilt: Vec<Rebuilt>) -> Vec<u16> {
        rebuilt.iter().map(|r| r.sequence).collect()
    }

    /// Attack: a sender on the FEC port makes every XOR packet work (up to 512 a tick, each a
    /// pass over up to 20 payloads, an unrecoverable one twice). The bytes XORed are charged
    /// to the channel's budget: past it, packets are dropped unrepaired and counted.
    #[test]
    fn xor_repairs_past_the_budget_are_dropped_and_counted() {
        let metrics = metrics();
        let mut state = FecState::default();
        // A 10 × 10 matrix whose first row is lost: each column FEC repairs one packet.
        receive(&mut state, 10..100);
        let columns: Vec<Vec<u8>> = (0..10)
            .map(|c| column_fec(&column(c, 10, 10), 10))
            .collect();
        // Each repair XORs the FEC payload and the column's 9 other packets: 10 payloads.
        let cost = 10 * media_packet(0).payload.len() as u64;
        state.budget = DecodeBudget::new(4 * cost);
        for f in &columns {
            state.datagram(f, &metrics);
        }
        let t0 = Instant::now();
        assert_eq!(seqs(state.repair_at(t0, &metrics)), [0, 1, 2, 3]);
        assert_eq!(metrics.fec_over_budget.get(), 6);
        assert_eq!(state.budget.spent, 4 * cost, "no more work than the budget");
        assert!(!state.waiting(), "dropped, not kept for later");
        // The next window repairs again.
        for f in &columns[4..] {
            state.datagram(f, &metrics);
        }
        let rebuilt = state.repair_at(t0 + Duration::from_millis(1000), &metrics);
        assert_eq!(seqs(rebuilt), [4, 5, 6, 7]);
        assert_eq!(metrics.fec_recovered.get(), 8);
        assert_eq!(metrics.fec_over_budget.get(), 8);
    }

    /// The flood with the real budget: 512 FEC packets a 20 ms tick, each the largest column
    /// (5 × 20) over packets all received. Before, each was one pass over 21 payloads (five
    /// ticks, some 70 MB of XOR, cut by the budget); now nothing missing means nothing XORed:
    /// each costs its 20 look-ups, and a stream that loses nothing never reaches the budget.
    #[test]
    fn an_xor_fec_flood_over_an_intact_stream_does_no_xor() {
        let metrics = metrics();
        let mut state = FecState::default();
        receive(&mut state, 0..100);
        let flood = column_fec(&column(0, 5, 20), 5);
        let t0 = Instant::now();
        let mut offered = 0u64;
        for tick in 0..5 {
            for _ in 0..MAX_QUEUED {
                state.datagram(&flood, &metrics);
                offered += 1;
            }
            let rebuilt = state.repair_at(t0 + Duration::from_millis(20 * tick), &metrics);
            assert!(rebuilt.is_empty());
        }
        assert_eq!(metrics.fec_over_budget.get(), 0);
        assert_eq!(state.budget.spent, offered * 20, "look-ups only");
        assert_eq!(metrics.fec_unrecoverable.get(), 0);
    }

    #[test]
    fn decode_budget_refuses_past_its_limit_until_the_next_window() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut budget = DecodeBudget::new(100);
        assert!(budget.allow(at(0), 60));
        assert!(budget.allow(at(500), 30));
        assert!(!budget.allow(at(900), 20), "past the limit in the window");
        assert!(budget.allow(at(999), 10), "up to the limit exactly");
        assert!(!budget.allow(at(999), 1));
        // The next window: the whole budget again, counted from this decode.
        assert!(budget.allow(at(1000), 100));
        assert!(!budget.allow(at(1999), 1));
        assert!(budget.allow(at(2000), 1));
        // A decode larger than the budget never runs; an absurd cost does not overflow.
        assert!(!budget.allow(at(5000), 101));
        assert!(!budget.allow(at(5000), u64::MAX));
        assert!(budget.allow(at(5000), 100));
        // The largest block there can be fits the real budget.
        let largest = rs_fec::RsHeader {
            begin: 0,
            end: 253,
            m: 1,
            index: 0,
            fec_len: rs_fec::MAX_RTP_LEN as u16,
            rtp_len: rs_fec::MAX_RTP_LEN as u16,
        };
        assert!(DecodeBudget::new(DECODE_BUDGET).allow(t0, rs_fec::decode_cost(&largest, 1)));
    }

    /// Attack: a sender on the group makes every Reed-Solomon block a decode (a matrix
    /// inversion each). Past the channel's budget, blocks are passed on unrepaired and counted;
    /// the next window decodes again.
    #[test]
    fn rs_decodes_past_the_budget_are_passed_on_and_counted() {
        let metrics = Metrics::default().hub(HubLabels {
            channel: "rtp://239.1.1.1:5000".into(),
            interface: String::new(),
        });
        let mut state = FecState::default();
        let t0 = Instant::now();
        let (first, cost) = lossy_block(&mut state, &metrics, 100, 10);
        // Room for two decodes a window.
        state.budget = DecodeBudget::new(2 * cost);
        let (second, _) = lossy_block(&mut state, &metrics, 110, 10);
        let (_, _) = lossy_block(&mut state, &metrics, 120, 10);
        let seqs = |rebuilt: Vec<Rebuilt>| rebuilt.iter().map(|r| r.sequence).collect::<Vec<_>>();
        assert_eq!(seqs(state.repair_at(t0, &metrics)), [first, second]);
        assert_eq!(metrics.fec_over_budget.get(), 1);
        let (_, _) = lossy_block(&mut state, &metrics, 130, 10);
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(seqs(state.repair_at(at(999), &metrics)), [0u16; 0]);
        assert_eq!(metrics.fec_over_budget.get(), 2);
        let (fifth, _) = lossy_block(&mut state, &metrics, 140, 10);
        assert_eq!(seqs(state.repair_at(at(1000), &metrics)), [fifth]);
        assert_eq!(metrics.fec_recovered.get(), 3);
        assert_eq!(metrics.fec_over_budget.get(), 2);
        // Passed on, not given up on after a failed decode.
        assert_eq!(metrics.fec_unrecoverable.get(), 0);
    }
}
