//! The ring: the members as last resolved, each with its live state (up or out, failures in a
//! row, since when it is up, for rampup), and the owner of a key. A new member list is swapped
//! in whole; readers never lock. Ownership is the upstream groups' consistent hash
//! (`upstream::group::select::HashRing`), keyed by each member's address, so adding or removing
//! one of N members moves about 1/N of the keys and none between the others.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::upstream::group::select::{hash64, HashRing};

/// Milliseconds since the first call, never 0.
pub(crate) fn clock_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// What one node knows about another, kept across membership changes by address.
#[derive(Debug)]
pub struct PeerState {
    up: AtomicBool,
    failures: AtomicU32,
    /// `clock_ms` when its rampup started: when it started, as it says in its check answers;
    /// before its first answer, when it joined (0 for a member of the first list: not ramped)
    /// or came back. 0: not ramped.
    up_since: AtomicU64,
    /// The peer's purge log as far as this node has applied it: its boot id and sequence.
    pub(super) log_boot: AtomicU64,
    pub(super) log_seq: AtomicU64,
}

impl PeerState {
    /// A member of the first list this node saw is not ramped up (`up_since` 0): the whole
    /// cluster starting together must not route around itself.
    pub(super) fn new(joined: bool) -> PeerState {
        PeerState {
            up: AtomicBool::new(true),
            failures: AtomicU32::new(0),
            up_since: AtomicU64::new(if joined { clock_ms() } else { 0 }),
            log_boot: AtomicU64::new(0),
            log_seq: AtomicU64::new(0),
        }
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// The peer said it started `up_ms` ago: its rampup runs from then (in this node's clock).
    pub fn started_ago(&self, up_ms: u64) {
        self.up_since
            .store(clock_ms().saturating_sub(up_ms).max(1), Ordering::Relaxed);
    }

    /// A check or fetch reached the peer: back in the ring (its rampup starts over if it was
    /// out, until its check answer says when it started).
    pub fn report_success(&self) {
        self.failures.store(0, Ordering::Relaxed);
        if !self.up.swap(true, Ordering::Relaxed) {
            self.up_since.store(clock_ms(), Ordering::Relaxed);
        }
    }

    /// A check or fetch failed; after `max_fails` in a row the peer is out until a check passes.
    /// Returns whether this report took it out.
    pub fn report_failure(&self, max_fails: u32) -> bool {
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        n >= max_fails && self.up.swap(false, Ordering::Relaxed)
    }
}

/// One member of the ring.
#[derive(Debug, Clone)]
pub struct Member {
    /// `ip:port` of its HTTP listener: its identity on the ring.
    pub addr: String,
    /// Its control listener.
    pub control: SocketAddr,
    pub weight: u32,
    pub state: Arc<PeerState>,
}

/// A member list as resolved, before states are attached.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MemberSpec {
    pub addr: String,
    pub control: SocketAddr,
    pub weight: u32,
}

/// One immutable view of the ring.
#[derive(Debug)]
pub struct View {
    pub members: Vec<Member>,
    ring: HashRing,
    /// This node's index, when it is a member (a draining node is not).
    pub self_index: Option<usize>,
}

/// Where a key's misses go.
#[derive(Debug, Clone)]
pub enum Owner {
    /// This node: fill from the origin.
    Local,
    /// Another node: fetch through it.
    Peer(Member),
}

/// The live ring.
pub struct Ring {
    self_addr: String,
    view: ArcSwap<View>,
    states: Mutex<HashMap<String, Arc<PeerState>>>,
    rampup: Duration,
    /// `clock_ms` when this node's cluster part started: its own rampup runs from there.
    started: u64,
}

impl Ring {
    pub fn new(self_addr: &str, rampup: Duration) -> Ring {
        let empty = View {
            members: Vec::new(),
            ring: HashRing::new(&[], &[]),
            self_index: None,
        };
        Ring {
            self_addr: self_addr.to_string(),
            view: ArcSwap::from_pointee(empty),
            states: Mutex::new(HashMap::new()),
            rampup,
            started: clock_ms(),
        }
    }

    /// How long this node's cluster part has run (its peers ramp it up from its start).
    pub fn up_ms(&self) -> u64 {
        clock_ms() - self.started
    }

    /// Installs a member list (sorted, duplicates removed); states of members that stay are kept.
    /// Returns whether the list changed.
    pub fn set_members(&self, mut specs: Vec<MemberSpec>) -> bool {
        specs.sort();
        specs.dedup_by(|a, b| a.addr == b.addr);
        let old = self.view.load();
        let same =
            old.members.len() == specs.len()
                && old.members.iter().zip(&specs).all(|(m, s)| {
                    m.addr == s.addr && m.weight == s.weight && m.control == s.control
                });
        if same {
            return false;
        }
        let joined = !old.members.is_empty();
        let self_index = if self.self_addr.is_empty() {
            specs.iter().position(|m| is_local(&m.addr))
        } else {
            specs.iter().position(|m| m.addr == self.self_addr)
        };
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        states.retain(|addr, _| specs.iter().any(|s| &s.addr == addr));
        let members: Vec<Member> = specs
            .into_iter()
            .enumerate()
            .map(|(i, s)| Member {
                state: states
                    .entry(s.addr.clone())
                    .or_insert_with(|| {
                        let state = PeerState::new(joined);
                        if Some(i) == self_index {
                            // This node ramps itself up from its own start, as its peers do
                            // from what its check answers say (`up_ms`).
                            state.up_since.store(self.started, Ordering::Relaxed);
                        }
                        Arc::new(state)
                    })
                    .clone(),
                addr: s.addr,
                control: s.control,
                weight: s.weight,
            })
            .collect();
        let names: Vec<&str> = members.iter().map(|m| m.addr.as_str()).collect();
        let weights: Vec<u32> = members.iter().map(|m| m.weight).collect();
        let ring = HashRing::new(&names, &ring_weights(&weights));
        tracing::info!(members = ?names, "cache cluster ring changed");
        self.view.store(Arc::new(View {
            members,
            ring,
            self_index,
        }));
        true
    }

    /// This node's address on the ring: as configured, or the member found to be local.
    pub fn self_addr(&self) -> String {
        if !self.self_addr.is_empty() {
            return self.self_addr.clone();
        }
        let view = self.view.load();
        view.self_index
            .map_or_else(|| "unknown".to_string(), |i| view.members[i].addr.clone())
    }

    pub fn view(&self) -> Arc<View> {
        self.view.load_full()
    }

    /// The owner of `key`: the first member on the ring from the key's position that is up, not
    /// `skip`, and past its rampup for this key. With nobody usable, this node.
    pub fn owner(&self, key: &str, skip: Option<&str>) -> Owner {
        let view = self.view.load();
        if view.members.is_empty() {
            return Owner::Local;
        }
        let slot = view.ring.slot(key.as_bytes());
        let now = clock_ms();
        // Where this key sits in a rampup: a member ramping up takes the keys below its share.
        let share = hash64(key.as_bytes(), 7) % 1000;
        let usable = |i: usize| {
            let m = &view.members[i];
            Some(i) == view.self_index || (m.state.is_up() && skip != Some(m.addr.as_str()))
        };
        let ramped = |i: usize| {
            let since = view.members[i].state.up_since.load(Ordering::Relaxed);
            since == 0
                || ramp_admits(
                    now.saturating_sub(since),
                    self.rampup.as_millis() as u64,
                    share,
                )
        };
        let pick = view
            .ring
            .pick(slot, |i| usable(i) && ramped(i))
            .or_else(|| view.ring.pick(slot, usable));
        match pick {
            Some(i) if Some(i) != view.self_index => Owner::Peer(view.members[i].clone()),
            _ => Owner::Local,
        }
    }
}

/// Weight units the whole ring is built from at most, before each member's round-up to one
/// (`HashRing` gives each unit 160 points): with 256 members, 163,840 points at most.
const RING_UNITS: u64 = 768;

/// The weights the ring is built from: `weights` over their common factor and capped at
/// `MAX_WEIGHT` (as `HashRing` takes them), scaled down together, rounded, when they add up past
/// `RING_UNITS`. A DNS SRV answer of 256 members weighing 100 and 99 (no common factor) built
/// 4.1 M points (65 MB formatted, hashed and sorted on a runtime worker) at each refresh.
fn ring_weights(weights: &[u32]) -> Vec<u32> {
    fn gcd(a: u32, b: u32) -> u32 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let g = weights.iter().copied().fold(0, gcd).max(1);
    let units: Vec<u64> = weights
        .iter()
        .map(|&w| u64::from((w / g).clamp(1, super::config::MAX_WEIGHT)))
        .collect();
    let sum: u64 = units.iter().sum();
    units
        .iter()
        .map(|&u| {
            let scaled = if sum > RING_UNITS {
                ((u * RING_UNITS + sum / 2) / sum).max(1)
            } else {
                u
            };
            u32::try_from(scaled).unwrap_or(1)
        })
        .collect()
}

/// Whether `addr`'s IP is one of this host's (binding to it works only then).
fn is_local(addr: &str) -> bool {
    addr.parse::<SocketAddr>()
        .is_ok_and(|a| std::net::UdpSocket::bind(SocketAddr::new(a.ip(), 0)).is_ok())
}

/// Whether a member up for `age_ms` of a `rampup_ms` rampup owns a key at `share` (0..1000) of
/// the key space: the share it takes grows linearly from nothing to all of it.
fn ramp_admits(age_ms: u64, rampup_ms: u64, share: u64) -> bool {
    rampup_ms == 0 || age_ms >= rampup_ms || share < age_ms * 1000 / rampup_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs(n: usize) -> Vec<MemberSpec> {
        (1..=n)
            .map(|i| MemberSpec {
                addr: format!("10.0.0.{i}:8888"),
                control: format!("10.0.0.{i}:8899").parse().unwrap(),
                weight: 1,
            })
            .collect()
    }

    fn owners(ring: &Ring, keys: &[String]) -> Vec<String> {
        keys.iter()
            .map(|k| match ring.owner(k, None) {
                Owner::Local => "self".to_string(),
                Owner::Peer(m) => m.addr,
            })
            .collect()
    }

    #[test]
    fn one_member_more_or_less_moves_about_one_nth_of_the_keys() {
        // A node outside the ring (draining), so every key has a peer owner.
        let ring = Ring::new("10.0.0.99:8888", Duration::ZERO);
        let keys: Vec<String> = (0..20_000)
            .map(|i| format!("2:*/6:a.test|/obj/{i}"))
            .collect();
        ring.set_members(specs(5));
        let five = owners(&ring, &keys);
        ring.set_members(specs(4));
        let four = owners(&ring, &keys);
        ring.set_members(specs(5));
        assert_eq!(
            owners(&ring, &keys),
            five,
            "the same members give the same owners"
        );
        let moved: Vec<usize> = (0..keys.len()).filter(|&i| five[i] != four[i]).collect();
        // Only the keys of the member that left move, and they are about a fifth of all.
        assert!(moved.iter().all(|&i| five[i] == "10.0.0.5:8888"));
        let share = moved.len() as f64 / keys.len() as f64;
        assert!((0.15..0.25).contains(&share), "moved {share}");
        // Each member owns about a fifth.
        for m in 1..=5 {
            let n = five
                .iter()
                .filter(|o| **o == format!("10.0.0.{m}:8888"))
                .count();
            let s = n as f64 / keys.len() as f64;
            assert!((0.15..0.25).contains(&s), "member {m} owns {s}");
        }
    }

    #[test]
    fn an_unnamed_node_finds_itself_by_its_own_address() {
        let ring = Ring::new("", Duration::ZERO);
        let mut members = specs(2);
        members.push(MemberSpec {
            addr: "127.0.0.1:8888".into(),
            control: "127.0.0.1:8899".parse().unwrap(),
            weight: 1,
        });
        ring.set_members(members);
        assert_eq!(ring.self_addr(), "127.0.0.1:8888");
        assert!(ring.view().self_index.is_some());
    }

    #[test]
    fn a_member_that_is_out_hands_its_keys_to_the_next() {
        let ring = Ring::new("10.0.0.1:8888", Duration::ZERO);
        ring.set_members(specs(3));
        let keys: Vec<String> = (0..3000).map(|i| format!("k{i}")).collect();
        let before = owners(&ring, &keys);
        let view = ring.view();
        let two = view
            .members
            .iter()
            .find(|m| m.addr == "10.0.0.2:8888")
            .unwrap();
        assert!(!two.state.report_failure(2));
        assert!(two.state.report_failure(2));
        let after = owners(&ring, &keys);
        for (b, a) in before.iter().zip(&after) {
            if b == "10.0.0.2:8888" {
                assert_ne!(a, b);
            } else {
                assert_eq!(a, b, "keys of live members stay");
            }
        }
        // Skipping one member for a retry works the same way.
        two.state.report_success();
        assert_eq!(owners(&ring, &keys), before);
    }

    #[test]
    fn a_late_member_is_ramped_alike_by_itself_and_by_the_others() {
        // Node 4 starts after node 1: node 1 had it out, and takes it back when it answers.
        let hour = Duration::from_secs(3600);
        let one = Ring::new("10.0.0.1:8888", hour);
        one.set_members(specs(4));
        let four = Ring::new("10.0.0.4:8888", hour);
        four.set_members(specs(4));
        let late = |r: &Ring| {
            let v = r.view();
            v.members
                .iter()
                .find(|m| m.addr == "10.0.0.4:8888")
                .unwrap()
                .clone()
        };
        let state = late(&one).state;
        assert!(state.report_failure(1));
        state.report_success();
        let named = |r: &Ring, keys: &[String]| -> Vec<String> {
            keys.iter()
                .map(|k| match r.owner(k, None) {
                    Owner::Local => r.self_addr(),
                    Owner::Peer(m) => m.addr,
                })
                .collect()
        };
        let keys: Vec<String> = (0..3000).map(|i| format!("k{i}")).collect();
        // Before either has a check answer from the other, they disagree on some keys.
        assert_ne!(named(&one, &keys), named(&four, &keys));
        // Check answers say when each started: both ramp each of them from there (node 4 as
        // node 4 ramps itself), and agree on every key.
        state.started_ago(four.up_ms());
        let first = four.view();
        let first = first
            .members
            .iter()
            .find(|m| m.addr == "10.0.0.1:8888")
            .unwrap();
        first.state.started_ago(one.up_ms());
        assert_eq!(named(&one, &keys), named(&four, &keys));
        assert!(
            named(&one, &keys).iter().all(|o| o != "10.0.0.4:8888"),
            "an hour's rampup has handed it nothing yet"
        );
    }

    /// A hostile SRV answer (256 members weighing 100 and 99, no common factor) builds a ring of
    /// at most 256 × 160 × 4 points, not 4.1 M; weights keep their proportions once scaled.
    #[test]
    fn many_heavy_members_build_a_bounded_ring() {
        let members = |weight: &dyn Fn(usize) -> u32| -> Vec<MemberSpec> {
            (0..256)
                .map(|i| MemberSpec {
                    addr: format!("10.0.{}.{}:8888", i / 200, i % 200 + 1),
                    control: format!("10.0.{}.{}:8899", i / 200, i % 200 + 1)
                        .parse()
                        .unwrap(),
                    weight: weight(i),
                })
                .collect()
        };
        let ring = Ring::new("10.0.9.9:8888", Duration::ZERO);
        ring.set_members(members(&|i| if i % 2 == 0 { 100 } else { 99 }));
        let points = ring.view().ring.len();
        assert!(points <= 256 * 160 * 4, "{points} points");
        // 100 and 99 both scale to 3 units: equal shares, one unit each on the ring.
        assert_eq!(ring_weights(&[100, 99].repeat(128)), vec![3; 256]);
        assert_eq!(points, 256 * 160);
        // 100 and 51: 4 units and 2, about the same two to one.
        let weights = [100, 51].repeat(128);
        assert_eq!(ring_weights(&weights), [4, 2].repeat(128));
        ring.set_members(members(&|i| weights[i]));
        assert_eq!(ring.view().ring.len(), (128 * 2 + 128) * 160);
        // A small cluster is built as before.
        assert_eq!(ring_weights(&[100, 99, 1]), vec![100, 99, 1]);
        assert_eq!(ring_weights(&[20, 40]), vec![1, 2]);
    }

    #[test]
    fn a_member_ramping_up_takes_its_share_gradually() {
        let admitted = |age| (0..1000).filter(|&s| ramp_admits(age, 10_000, s)).count();
        assert_eq!(admitted(0), 0);
        assert_eq!(admitted(2_500), 250);
        assert_eq!(admitted(5_000), 500);
        assert_eq!(admitted(10_000), 1000);
        assert!(ramp_admits(0, 0, 999), "no rampup: the whole share at once");
        // The first members are not ramped; one that joins later is, and takes none of its
        // share at first: its keys stay where they were.
        let ring = Ring::new("10.0.0.99:8888", Duration::from_secs(3600));
        ring.set_members(specs(3));
        let keys: Vec<String> = (0..3000).map(|i| format!("k{i}")).collect();
        let three = owners(&ring, &keys);
        ring.set_members(specs(4));
        assert_eq!(owners(&ring, &keys), three);
        let plain = Ring::new("10.0.0.99:8888", Duration::ZERO);
        plain.set_members(specs(4));
        let four = owners(&plain, &keys);
        assert!(four.iter().filter(|o| *o == "10.0.0.4:8888").count() > 500);
    }
}
