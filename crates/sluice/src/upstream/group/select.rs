//! Pure balancing algorithms, no sockets and no clocks: smooth weighted round robin as a precomputed
//! sequence, a weighted consistent-hash ring, and the least-loaded order.

/// A stable 64-bit hash (FNV-1a with a murmur3 finaliser): the same key picks the same server in
/// every process and across reloads, which `std`'s randomly keyed hasher does not promise.
pub fn hash64(bytes: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// One full cycle of nginx's smooth weighted round robin: server indexes in the order they are
/// picked, each appearing `weight / gcd` times, spread out rather than in runs (weights 5,1,1 give
/// a a b a c a a). Precomputing the cycle lets readers pick with one atomic increment, no lock.
pub fn smooth_weighted_sequence(weights: &[u32]) -> Vec<usize> {
    let g = weights.iter().copied().fold(0, gcd).max(1);
    let weights: Vec<i64> = weights.iter().map(|&w| i64::from(w.max(1) / g)).collect();
    let total: i64 = weights.iter().sum();
    let mut current = vec![0i64; weights.len()];
    let mut out = Vec::with_capacity(total as usize);
    for _ in 0..total {
        let mut best = 0;
        for (i, w) in weights.iter().enumerate() {
            current[i] += w;
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total;
        out.push(best);
    }
    out
}

/// A consistent-hash ring with virtual nodes (Karger et al.; Ketama's layout): each server owns
/// `VNODES × weight` points, a key belongs to the first point at or after its hash. Adding a
/// server moves only the keys that land on its new points, about 1/n of them, and none between the
/// old servers (Maglev would balance slightly better but reshuffles several percent among the old
/// servers, measured at up to 2× the minimum for small groups).
#[derive(Debug, Clone)]
pub struct HashRing {
    /// (point, server index), sorted by point.
    points: Vec<(u64, u32)>,
}

/// Points per weight unit: keeps each server's share within a few percent of its weight.
const VNODES: u32 = 160;

impl HashRing {
    /// Builds the ring for servers named `names` (their identity: the same name keeps its points
    /// when other servers come and go) with `weights`.
    pub fn new(names: &[&str], weights: &[u32]) -> HashRing {
        assert_eq!(names.len(), weights.len());
        // Common factors removed and points per server capped, so weights up to MAX_WEIGHT cannot
        // blow the ring up (shares stay proportional until the cap, 100 × VNODES points).
        let g = weights.iter().copied().fold(0, gcd).max(1);
        let mut points = Vec::new();
        for (i, (name, &w)) in names.iter().zip(weights).enumerate() {
            for v in 0..VNODES * (w.max(1) / g).min(100) {
                let label = format!("{name}#{v}");
                points.push((hash64(label.as_bytes(), 1), i as u32));
            }
        }
        points.sort_unstable();
        HashRing { points }
    }

    /// The position a key hashes to.
    pub fn slot(&self, key: &[u8]) -> usize {
        let h = hash64(key, 0);
        let at = self.points.partition_point(|&(p, _)| p < h);
        if at == self.points.len() {
            0
        } else {
            at
        }
    }

    /// The first server at or after `slot` (wrapping) that `usable` accepts: with the owner down,
    /// its keys spread over the others (by their interleaved points) instead of one neighbour.
    pub fn pick(&self, slot: usize, usable: impl Fn(usize) -> bool) -> Option<usize> {
        let n = self.points.len();
        (0..n)
            .map(|i| self.points[(slot + i) % n].1 as usize)
            .find(|&s| usable(s))
    }

    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }
}

/// Orders candidates by load relative to weight (`in_flight / weight`), fewest first; ties keep the
/// incoming order, which the caller rotates so ties do not always favour the first server.
pub fn order_by_load(candidates: &mut [(usize, u64, u32)]) {
    // (id, in_flight, weight): compare a/wa < b/wb as a*wb < b*wa, no floats.
    candidates.sort_by(|a, b| {
        (u128::from(a.1) * u128::from(b.2)).cmp(&(u128::from(b.1) * u128::from(a.2)))
    });
}

#[cfg(test)]
mod tests;
