//! Pure balancing algorithms, no sockets and no clocks: smooth weighted round robin as a precomputed
//! sequence, weighted Maglev consistent hashing, and the least-loaded order.

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

/// A weighted Maglev lookup table (Eisenbud et al., NSDI 2016): every slot names a server, each
/// server owns a share of slots proportional to its weight, and adding or removing one server moves
/// only about its share of keys.
#[derive(Debug, Clone)]
pub struct Maglev {
    table: Vec<u32>,
}

/// Table sizes are primes with at least ~100 slots per weight unit, so shares stay within ~1%. The
/// size must not change when a server is added (every key would move), so there are only two: the
/// small one covers any group up to 655 weight units.
const TABLE_SIZES: [usize; 2] = [65537, 1_048_573];

impl Maglev {
    /// Builds the table for servers named `names` (their identity: the same name keeps its slots
    /// when other servers come and go) with `weights`.
    pub fn new(names: &[&str], weights: &[u32]) -> Maglev {
        assert_eq!(names.len(), weights.len());
        if names.is_empty() {
            return Maglev { table: Vec::new() };
        }
        let units: usize = weights.iter().map(|&w| w.max(1) as usize).sum();
        let size = TABLE_SIZES
            .iter()
            .copied()
            .find(|&m| m >= units * 100)
            .unwrap_or(TABLE_SIZES[TABLE_SIZES.len() - 1]);
        let m = size as u64;
        let perms: Vec<(u64, u64)> = names
            .iter()
            .map(|n| {
                let offset = hash64(n.as_bytes(), 1) % m;
                let skip = hash64(n.as_bytes(), 2) % (m - 1) + 1;
                (offset, skip)
            })
            .collect();
        let mut next = vec![0u64; names.len()];
        let mut table = vec![u32::MAX; size];
        let mut filled = 0;
        'fill: loop {
            for (i, &(offset, skip)) in perms.iter().enumerate() {
                for _ in 0..weights[i].max(1) {
                    let mut slot = ((offset + next[i] * skip) % m) as usize;
                    while table[slot] != u32::MAX {
                        next[i] += 1;
                        slot = ((offset + next[i] * skip) % m) as usize;
                    }
                    table[slot] = i as u32;
                    next[i] += 1;
                    filled += 1;
                    if filled == size {
                        break 'fill;
                    }
                }
            }
        }
        Maglev { table }
    }

    /// The slot a key hashes to.
    pub fn slot(&self, key: &[u8]) -> usize {
        (hash64(key, 0) % self.table.len().max(1) as u64) as usize
    }

    /// The first server at or after `slot` (wrapping) that `usable` accepts: with the owner down,
    /// its keys spread over the others instead of all landing on one neighbour.
    pub fn pick(&self, slot: usize, usable: impl Fn(usize) -> bool) -> Option<usize> {
        let n = self.table.len();
        (0..n)
            .map(|i| self.table[(slot + i) % n] as usize)
            .find(|&s| usable(s))
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
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
