//! HPACK's Huffman code (RFC 7541 Appendix B, which QPACK reuses) coded a word at a time.
//!
//! sluice's h3-fixes.patch: the release coded a bit at a time through a copy of the string and
//! an iterator of results, which made the headers' Huffman coding the largest single part of an
//! HTTP/3 request's cost. The code table is the release's (`encode::HPACK_STRING`), read into
//! (code, length) pairs when compiling.

use bytes::BufMut;

use super::encode::HPACK_STRING;

/// The end-of-string symbol: never valid inside a string (RFC 7541 §5.2).
const EOS: u16 = 256;
const EOS_CODE: (u32, u32) = (0x3fff_ffff, 30);
const MIN_LEN: u32 = 5;
const MAX_LEN: u32 = 30;

/// Each byte's code, right-aligned, and its length in bits.
const CODES: [(u32, u32); 256] = {
    let mut table = [(0u32, 0u32); 256];
    let mut sym = 0;
    while sym < 256 {
        let value = &HPACK_STRING[sym];
        let mut code = 0u32;
        let mut rest = value.bit_count;
        let mut i = 0;
        while i < value.buffer.len() {
            let take = if rest < 8 { rest } else { 8 };
            code = (code << take) | (value.buffer[i] as u32 & ((1u32 << take) - 1));
            rest -= take;
            i += 1;
        }
        table[sym] = (code, value.bit_count);
        sym += 1;
    }
    table
};

/// A symbol's code and length, the end-of-string symbol included.
const fn code(sym: u16) -> (u32, u32) {
    if sym == EOS {
        EOS_CODE
    } else {
        CODES[sym as usize]
    }
}

/// The code is canonical: the codes of one length are consecutive and, left-aligned, above every
/// shorter one. Per length: the first code, one past the last, and where its symbols start in
/// `SYMBOLS`. A length no code has gets an empty range.
struct Lengths {
    first: [u32; MAX_LEN as usize + 1],
    end: [u32; MAX_LEN as usize + 1],
    offset: [u16; MAX_LEN as usize + 1],
    symbols: [u16; 257],
}

const TABLES: Lengths = {
    let mut t = Lengths {
        first: [0; MAX_LEN as usize + 1],
        end: [0; MAX_LEN as usize + 1],
        offset: [0; MAX_LEN as usize + 1],
        symbols: [0; 257],
    };
    let mut placed = 0u16;
    let mut len = MIN_LEN;
    while len <= MAX_LEN {
        // The smallest code of this length, and how many there are.
        let mut first = u32::MAX;
        let mut count = 0u32;
        let mut sym = 0u16;
        while sym <= EOS {
            let (c, l) = code(sym);
            if l == len {
                count += 1;
                if c < first {
                    first = c;
                }
            }
            sym += 1;
        }
        t.offset[len as usize] = placed;
        if count > 0 {
            t.first[len as usize] = first;
            t.end[len as usize] = first + count;
            let mut sym = 0u16;
            while sym <= EOS {
                let (c, l) = code(sym);
                if l == len {
                    // Consecutive codes (checked by the tests), so the code is the index.
                    t.symbols[(placed as u32 + (c - first)) as usize] = sym;
                }
                sym += 1;
            }
            placed += count as u16;
        }
        len += 1;
    }
    t
};

/// The length in bytes of `src` coded, padding included.
pub fn encoded_len(src: &[u8]) -> usize {
    let bits: usize = src.iter().map(|&b| CODES[b as usize].1 as usize).sum();
    bits.div_ceil(8)
}

/// Writes `src` coded, the last byte padded with the end-of-string code's leading ones.
pub fn encode_into<B: BufMut>(src: &[u8], dst: &mut B) {
    // Written four bytes at a time into a block on the stack, the block to `dst` when full.
    let mut block = [0u8; 256];
    let mut at = 0;
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    for &b in src {
        let (code, len) = CODES[b as usize];
        // At most 31 bits held before, 30 added.
        acc = (acc << len) | code as u64;
        bits += len;
        if bits >= 32 {
            bits -= 32;
            if at + 4 > block.len() {
                dst.put_slice(&block[..at]);
                at = 0;
            }
            block[at..at + 4].copy_from_slice(&((acc >> bits) as u32).to_be_bytes());
            at += 4;
            acc &= (1u64 << bits) - 1;
        }
    }
    // What is left, padded to a whole byte with ones.
    let pad = (8 - bits % 8) % 8;
    let tail = (acc << pad) | ((1u64 << pad) - 1);
    let bytes = ((bits + pad) / 8) as usize;
    if at + bytes > block.len() {
        dst.put_slice(&block[..at]);
        at = 0;
    }
    block[at..at + bytes].copy_from_slice(&tail.to_be_bytes()[8 - bytes..]);
    at += bytes;
    dst.put_slice(&block[..at]);
}

/// A string that is not a valid code: an end-of-string symbol in it, more than seven bits of
/// padding, or padding that is not the end-of-string code's leading ones (RFC 7541 §5.2).
#[derive(Debug, PartialEq)]
pub struct Invalid;

/// Decodes `src` onto the end of `dst`.
pub fn decode_into(src: &[u8], dst: &mut Vec<u8>) -> Result<(), Invalid> {
    // `bits` bits not yet decoded, right-aligned in `acc`; fewer than 38 at any time.
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    for &b in src {
        acc = (acc << 8) | b as u64;
        bits += 8;
        while bits >= MIN_LEN {
            match next(acc, bits) {
                Some((sym, len)) => {
                    if sym == EOS {
                        return Err(Invalid);
                    }
                    dst.push(sym as u8);
                    bits -= len;
                    acc &= (1u64 << bits) - 1;
                }
                // Thirty bits and no code: cannot happen for a complete code, but say so.
                None if bits >= MAX_LEN => return Err(Invalid),
                None => break,
            }
        }
    }
    if bits > 7 || acc != (1u64 << bits) - 1 {
        return Err(Invalid);
    }
    Ok(())
}

/// The symbol whose code begins the `bits` right-aligned bits of `acc`, and its length.
fn next(acc: u64, bits: u32) -> Option<(u16, u32)> {
    let t = &TABLES;
    let mut len = MIN_LEN;
    if bits >= 8 {
        // Most bytes of a header have codes of 8 bits or fewer: one look-up for those.
        let (sym, l) = SHORT[((acc >> (bits - 8)) & 0xff) as usize];
        if l != 0 {
            return Some((sym, l as u32));
        }
        len = 9;
    }
    let max = if bits < MAX_LEN { bits } else { MAX_LEN };
    while len <= max {
        let c = (acc >> (bits - len)) as u32;
        if c < t.end[len as usize] {
            let at = t.offset[len as usize] as u32 + (c - t.first[len as usize]);
            return Some((t.symbols[at as usize], len));
        }
        len += 1;
    }
    None
}

/// For each 8-bit prefix, the symbol whose code of 8 bits or fewer begins it and that code's
/// length; length 0 where the code is longer.
const SHORT: [(u16, u8); 256] = {
    let mut table = [(0u16, 0u8); 256];
    let mut sym = 0;
    while sym < 256 {
        let (code, len) = CODES[sym];
        if len <= 8 {
            let first = (code << (8 - len)) as usize;
            let mut i = 0;
            while i < (1usize << (8 - len)) {
                table[first + i] = (sym as u16, len as u8);
                i += 1;
            }
        }
        sym += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_is_canonical() {
        // Every code of a length is consecutive with the others of that length, and every
        // shorter code left-aligned is below them: what `next` relies on.
        let mut all: Vec<(u32, u32, u16)> = (0..=EOS).map(|s| (code(s).1, code(s).0, s)).collect();
        all.sort();
        for w in all.windows(2) {
            let ((l0, c0, _), (l1, c1, _)) = (w[0], w[1]);
            assert_eq!((c0 + 1) << (l1 - l0), c1, "{:?}", w);
        }
    }

    #[test]
    fn every_byte_round_trips_alone_and_together() {
        let all: Vec<u8> = (0..=255).collect();
        for s in all.chunks(1).chain([&all[..], b"", b"www.example.com"]) {
            let mut out = Vec::new();
            encode_into(s, &mut out);
            assert_eq!(out.len(), encoded_len(s));
            let mut back = Vec::new();
            decode_into(&out, &mut back).unwrap();
            assert_eq!(&back[..], s);
        }
    }

    #[test]
    fn the_rfc_examples() {
        // RFC 7541 C.4.1 and C.6.1.
        let mut out = Vec::new();
        encode_into(b"www.example.com", &mut out);
        assert_eq!(
            out,
            [0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff]
        );
        let mut out = Vec::new();
        encode_into(b"Mon, 21 Oct 2013 20:13:21 GMT", &mut out);
        assert_eq!(
            out,
            [
                0xd0, 0x7a, 0xbe, 0x94, 0x10, 0x54, 0xd4, 0x44, 0xa8, 0x20, 0x05, 0x95, 0x04,
                0x0b, 0x81, 0x66, 0xe0, 0x82, 0xa6, 0x2d, 0x1b, 0xff
            ]
        );
    }

    #[test]
    fn bad_padding_and_eos_are_refused() {
        let mut out = Vec::new();
        // Eight bits of padding.
        assert_eq!(decode_into(&[0xff], &mut out), Err(Invalid));
        // Padding of zeros: '0' is 00000, then 000 is not the end-of-string prefix.
        assert_eq!(decode_into(&[0x00], &mut out), Err(Invalid));
        // The end-of-string code itself.
        assert_eq!(decode_into(&[0xff, 0xff, 0xff, 0xfc], &mut out), Err(Invalid));
        // '0' then five ones of padding is fine.
        out.clear();
        decode_into(&[0x07], &mut out).unwrap();
        assert_eq!(out, b"0");
    }

    #[test]
    fn any_input_decodes_or_is_refused_and_what_decodes_codes_back_the_same() {
        // Random bytes, and valid strings with one byte changed: never a panic, and a string the
        // decoder takes is the one coding of what it decoded (the padding rules leave one).
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut taken = 0;
        for n in 0..200_000usize {
            let mut input: Vec<u8> = if n % 2 == 0 {
                (0..n % 41).map(|_| rand() as u8).collect()
            } else {
                let plain: Vec<u8> = (0..n % 23).map(|_| b"abcdefghij0123/-.:%"[rand() as usize % 19]).collect();
                let mut coded = Vec::new();
                encode_into(&plain, &mut coded);
                coded
            };
            if !input.is_empty() && n % 4 == 1 {
                let at = rand() as usize % input.len();
                input[at] ^= 1 << (rand() % 8);
            }
            let mut out = Vec::new();
            if decode_into(&input, &mut out).is_ok() {
                taken += 1;
                let mut again = Vec::new();
                encode_into(&out, &mut again);
                assert_eq!(again, input);
            }
        }
        assert!(taken > 50_000, "{}", taken);
    }

    #[test]
    fn agrees_with_the_bitwise_coder() {
        use super::super::{HpackStringDecode, HpackStringEncode};
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for n in 0..2000usize {
            let s: Vec<u8> = (0..n % 97)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed >> 24) as u8
                })
                .collect();
            let old = s.clone().hpack_encode().unwrap();
            let mut new = Vec::new();
            encode_into(&s, &mut new);
            assert_eq!(new, old);
            let mut back = Vec::new();
            decode_into(&new, &mut back).unwrap();
            let old_back: Vec<u8> = old.hpack_decode().map(|b| b.unwrap()).collect();
            assert_eq!(back, old_back);
        }
    }
}
