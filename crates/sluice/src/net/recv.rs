//! Batched datagram receive with `recvmmsg` into one reusable scratch buffer.
//!
//! One syscall returns up to [`MAX_BATCH`] datagrams, each in its own fixed-size slot of the
//! scratch. The caller reads them as slices and copies what it keeps (the payload, without
//! its RTP header) into packed storage, so the scratch is reused by the next call, can be
//! shared by every socket drained on the same thread, and no memory is held per datagram
//! beyond the payload bytes themselves.

use std::io;
use std::os::fd::RawFd;

/// Upper bound on datagrams per syscall (and on the stack arrays that describe them).
pub const MAX_BATCH: usize = 64;

/// The largest slot: the largest UDP payload (a 16-bit length); no datagram is larger.
pub const MAX_SLOT: usize = 65_535;

/// Receives datagrams into `batch` slots of `slot` bytes.
#[derive(Debug)]
pub struct RecvBatch {
    scratch: Vec<u8>,
    slot: usize,
    batch: usize,
    lens: [(usize, bool); MAX_BATCH],
    got: usize,
}

impl RecvBatch {
    /// `slot` is the largest datagram accepted whole (larger ones are counted and dropped),
    /// held to 64..=[`MAX_SLOT`]; `batch` the most datagrams taken per syscall, held to
    /// 1..=[`MAX_BATCH`]. The scratch is `slot * batch` bytes: a product that wrapped would
    /// make a scratch smaller than the slots `recvmmsg` is told to write, so both are clamped
    /// to where it cannot (at most 65,535 × 64 bytes, 4 MiB, on any target).
    pub fn new(slot: usize, batch: usize) -> Self {
        const _: () = assert!(MAX_SLOT.checked_mul(MAX_BATCH).is_some());
        let slot = slot.clamp(64, MAX_SLOT);
        let batch = batch.clamp(1, MAX_BATCH);
        Self {
            scratch: vec![0; slot * batch],
            slot,
            batch,
            lens: [(0, false); MAX_BATCH],
            got: 0,
        }
    }

    /// The largest datagram accepted whole.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Receives what is queued, without blocking, replacing the previous batch. Returns how
    /// many datagrams were too large for a slot (dropped); `WouldBlock` when the socket was
    /// empty.
    pub fn recv(&mut self, fd: RawFd) -> io::Result<u64> {
        self.got = 0;
        let got = self.recvmmsg(fd)?;
        self.got = got;
        Ok(self.lens[..got].iter().filter(|l| l.1).count() as u64)
    }

    /// How many datagrams the last [`RecvBatch::recv`] returned, truncated ones included: a
    /// count below the batch size means the socket's queue ran out.
    pub fn received(&self) -> usize {
        self.got
    }

    /// The datagrams of the last [`RecvBatch::recv`], in arrival order, truncated ones left out.
    pub fn datagrams(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.lens[..self.got]
            .iter()
            .enumerate()
            .filter(|(_, (_, truncated))| !truncated)
            .map(|(i, &(len, _))| &self.scratch[i * self.slot..i * self.slot + len])
    }

    /// One `recvmmsg` call into the slots; records (length, truncated) pairs.
    fn recvmmsg(&mut self, fd: RawFd) -> io::Result<usize> {
        let n = self.batch;
        let base = self.scratch.as_mut_ptr();
        // SAFETY: all-zero is a valid value for these plain C structs.
        let mut iov: [libc::iovec; MAX_BATCH] = unsafe { std::mem::zeroed() };
        let mut msgs: [libc::mmsghdr; MAX_BATCH] = unsafe { std::mem::zeroed() };
        for (i, v) in iov.iter_mut().enumerate().take(n) {
            *v = libc::iovec {
                // SAFETY: slot `i < batch` lies inside the scratch (batch * slot bytes).
                iov_base: unsafe { base.add(i * self.slot) }.cast(),
                iov_len: self.slot,
            };
        }
        // Pointers are taken only after `iov` is fully written, from one base pointer.
        let iov_base = iov.as_mut_ptr();
        for (i, m) in msgs.iter_mut().enumerate().take(n) {
            // SAFETY: `i < n <= MAX_BATCH`, inside `iov`.
            m.msg_hdr.msg_iov = unsafe { iov_base.add(i) };
            m.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: `msgs[..n]` describe writable, disjoint slots of the scratch, which outlives
        // the call.
        let rc = unsafe {
            libc::recvmmsg(
                fd,
                msgs.as_mut_ptr(),
                n as libc::c_uint,
                // glibc declares the flags `int`, musl `unsigned int`: the router targets are musl.
                libc::MSG_DONTWAIT as _,
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let got = rc as usize;
        for (len, m) in self.lens.iter_mut().zip(&msgs[..got]) {
            *len = (
                (m.msg_len as usize).min(self.slot),
                m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            );
        }
        Ok(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot past the largest UDP payload is cut to it: `slot * batch` at 2^59 wrapped (in a
    /// release build) to a scratch smaller than the slots handed to `recvmmsg`.
    #[test]
    fn the_scratch_always_holds_every_slot() {
        for slot in [
            0,
            64,
            1536,
            MAX_SLOT,
            MAX_SLOT + 1,
            usize::MAX / 32 + 1,
            usize::MAX,
        ] {
            let b = RecvBatch::new(slot, MAX_BATCH);
            assert!(b.slot() <= MAX_SLOT, "slot {slot}: {}", b.slot());
            assert_eq!(b.scratch.len(), b.slot() * MAX_BATCH, "slot {slot}");
        }
        assert_eq!(RecvBatch::new(1536, MAX_BATCH).slot(), 1536);
    }
}
