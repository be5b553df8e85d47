//! Deterministic content: every byte of every test object is a function of (object seed, offset),
//! so origins serve any range without storing it and clients verify without keeping a copy.

/// splitmix64 finaliser: one well-mixed word per input.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of a named object (FNV-1a of the name, then mixed).
pub fn seed(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    mix(h)
}

/// Writes the object's bytes from `offset` into `buf`.
pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    let mut pos = offset;
    let mut done = 0;
    while done < buf.len() {
        let word = mix(seed ^ (pos / 8).wrapping_mul(0xA076_1D64_78BD_642F)).to_le_bytes();
        let skip = (pos % 8) as usize;
        let n = (8 - skip).min(buf.len() - done);
        buf[done..done + n].copy_from_slice(&word[skip..skip + n]);
        done += n;
        pos += n as u64;
    }
}

/// The bytes `offset..offset + len` of an object, as one buffer.
pub fn bytes(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(seed, offset, &mut v);
    v
}

/// Checks a body as it streams in against the object it should be.
pub struct Verifier {
    seed: u64,
    pos: u64,
    scratch: Vec<u8>,
    bad: bool,
}

impl Verifier {
    pub fn new(seed: u64) -> Self {
        Verifier {
            seed,
            pos: 0,
            scratch: Vec::new(),
            bad: false,
        }
    }

    /// Feeds the next chunk; false once any byte differed.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        if !self.bad {
            self.scratch.resize(chunk.len(), 0);
            fill(self.seed, self.pos, &mut self.scratch);
            self.bad = self.scratch != chunk;
        }
        self.pos += chunk.len() as u64;
        !self.bad
    }

    pub fn len(&self) -> u64 {
        self.pos
    }

    pub fn ok(&self) -> bool {
        !self.bad
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_split_verifies_and_one_changed_byte_does_not() {
        let s = seed("x");
        let whole = bytes(s, 0, 1000);
        for cut in [0usize, 1, 7, 8, 9, 500, 999] {
            let mut v = Verifier::new(s);
            assert!(v.feed(&whole[..cut]) && v.feed(&whole[cut..]));
            assert_eq!(v.len(), 1000);
        }
        let mut bad = whole.clone();
        bad[613] ^= 1;
        let mut v = Verifier::new(s);
        assert!(!v.feed(&bad));
        assert_ne!(seed("x"), seed("y"));
    }
}
