//! AES-128 decryption of one sample in place for the four CENC schemes. No I/O, no allocation.
//!
//! Subsample records split a sample into clear and protected runs; how the protected runs are
//! decrypted depends on the scheme (ISO/IEC 23001-7):
//! - `cenc`: CTR, one keystream running across all protected runs of the sample, byte-exact.
//! - `cens`: CTR with a crypt:skip block pattern restarting at each run; the keystream only
//!   advances over encrypted blocks; a trailing partial block stays clear.
//! - `cbc1`: CBC over whole blocks, the chain running across all protected runs.
//! - `cbcs`: CBC with a pattern; every protected run restarts from the sample's IV, and the
//!   chain links only the encrypted blocks. A 0:0 pattern means every whole block.

use aes::Aes128;
use cipher::inout::InOutBuf;
use cipher::{BlockDecryptMut, InnerIvInit, StreamCipher};

use super::Scheme;

type Ctr = ctr::Ctr64BE<Aes128>;
type CtrCore = ctr::CtrCore<Aes128, ctr::flavors::Ctr64BE>;
type CbcDecryptor = cbc::Decryptor<Aes128>;

const BLOCK: usize = 16;

/// Encrypted and clear 16-byte blocks repeating over a protected run; `crypt == 0` means
/// every block is encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pattern {
    pub crypt: u8,
    pub skip: u8,
}

impl Pattern {
    pub const NONE: Pattern = Pattern { crypt: 0, skip: 0 };

    fn is_whole(self) -> bool {
        self.crypt == 0 || self.skip == 0
    }
}

/// Subsample records that do not fit the sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubsampleOverrun {
    pub covered: u64,
}

/// Decrypts `sample` in place. `subsamples` holds raw 6-byte records (16-bit clear count,
/// 32-bit protected count); empty means the whole sample is protected.
pub fn decrypt_sample(
    aes: &Aes128,
    scheme: Scheme,
    pattern: Pattern,
    iv: &[u8; 16],
    subsamples: &[u8],
    sample: &mut [u8],
) -> Result<(), SubsampleOverrun> {
    match scheme {
        Scheme::Cenc => {
            let mut ctr = Ctr::from_core(CtrCore::inner_iv_init(aes.clone(), iv.into()));
            for_each_run(sample, subsamples, |run| ctr.apply_keystream(run))
        }
        Scheme::Cens => {
            let mut ctr = Ctr::from_core(CtrCore::inner_iv_init(aes.clone(), iv.into()));
            for_each_run(sample, subsamples, |run| {
                for_each_crypt_range(run, pattern, |blocks| ctr.apply_keystream(blocks))
            })
        }
        Scheme::Cbc1 => {
            let mut cbc = CbcDecryptor::inner_iv_init(aes.clone(), iv.into());
            for_each_run(sample, subsamples, |run| {
                cbc_blocks(&mut cbc, whole_blocks(run))
            })
        }
        Scheme::Cbcs => for_each_run(sample, subsamples, |run| {
            let mut cbc = CbcDecryptor::inner_iv_init(aes.clone(), iv.into());
            for_each_crypt_range(run, pattern, |blocks| cbc_blocks(&mut cbc, blocks))
        }),
    }
}

/// Calls `f` on each protected run of the sample.
fn for_each_run(
    sample: &mut [u8],
    subsamples: &[u8],
    mut f: impl FnMut(&mut [u8]),
) -> Result<(), SubsampleOverrun> {
    if subsamples.is_empty() {
        f(sample);
        return Ok(());
    }
    let mut pos = 0usize;
    for rec in subsamples.chunks_exact(6) {
        let clear = u16::from_be_bytes([rec[0], rec[1]]) as usize;
        let protected = u32::from_be_bytes([rec[2], rec[3], rec[4], rec[5]]) as usize;
        let start = pos.saturating_add(clear);
        let end = start.saturating_add(protected);
        if end > sample.len() {
            return Err(SubsampleOverrun {
                covered: pos as u64 + clear as u64 + protected as u64,
            });
        }
        if protected > 0 {
            f(&mut sample[start..end]);
        }
        pos = end;
    }
    Ok(())
}

/// Calls `f` on each run of encrypted whole blocks that the pattern selects in `run`.
fn for_each_crypt_range(run: &mut [u8], pattern: Pattern, mut f: impl FnMut(&mut [u8])) {
    let run = whole_blocks(run);
    if pattern.is_whole() {
        f(run);
        return;
    }
    let crypt = pattern.crypt as usize * BLOCK;
    let stride = crypt + pattern.skip as usize * BLOCK;
    for group in run.chunks_mut(stride) {
        // A short last group still has its leading whole blocks encrypted.
        let n = group.len().min(crypt);
        f(&mut group[..n]);
    }
}

/// The prefix of `run` made of whole 16-byte blocks; a trailing partial block stays clear.
fn whole_blocks(run: &mut [u8]) -> &mut [u8] {
    let n = run.len() - run.len() % BLOCK;
    &mut run[..n]
}

fn cbc_blocks(cbc: &mut CbcDecryptor, blocks: &mut [u8]) {
    let (chunks, _tail) = InOutBuf::from(blocks).into_chunks();
    cbc.decrypt_blocks_inout_mut(chunks);
}
