//! Generated object content: seeded bytes computable at any offset, so an origin can serve any
//! byte range of a multi-GB object without storing it, and a client can hash what it expects.

use sha2::{Digest, Sha256};

/// splitmix64: one 64-bit word of well-mixed bits per input.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of an object: a function of its size only, so every object of one size has the same
/// bytes (and one digest), whatever its name.
pub fn seed_for(size: u64) -> u64 {
    mix(size ^ 0x5EED_0B1E_C7C0_FFEE)
}

/// Fills `buf` with the object's bytes starting at `offset`.
pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    let mut pos = offset;
    let mut out = 0;
    while out < buf.len() {
        let word = mix(seed ^ (pos / 8).wrapping_mul(0xD6E8_FEB8_6659_FD93)).to_le_bytes();
        let skip = (pos % 8) as usize;
        let n = (8 - skip).min(buf.len() - out);
        buf[out..out + n].copy_from_slice(&word[skip..skip + n]);
        out += n;
        pos += n as u64;
    }
}

/// SHA-256 (hex) of bytes `start..end` of the object of `size` bytes.
pub fn digest(size: u64, start: u64, end: u64) -> String {
    let seed = seed_for(size);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = start;
    while pos < end {
        let n = ((end - pos) as usize).min(buf.len());
        fill(seed, pos, &mut buf[..n]);
        h.update(&buf[..n]);
        pos += n as u64;
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_offset_gives_the_same_bytes() {
        let seed = seed_for(1000);
        let mut whole = vec![0u8; 1000];
        fill(seed, 0, &mut whole);
        for start in [0usize, 1, 7, 8, 9, 333, 999] {
            let mut part = vec![0u8; 1000 - start];
            fill(seed, start as u64, &mut part);
            assert_eq!(part, whole[start..]);
        }
        assert_ne!(whole[..8], whole[8..16]);
    }

    #[test]
    fn digest_of_a_range_is_the_digest_of_its_bytes() {
        let seed = seed_for(5000);
        let mut bytes = vec![0u8; 5000];
        fill(seed, 0, &mut bytes);
        let want: String = Sha256::digest(&bytes[100..4100])
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(digest(5000, 100, 4100), want);
    }
}
