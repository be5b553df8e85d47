//! Batched datagram receive with `recvmmsg` into a shared slab of reference-counted bytes.
//!
//! One syscall returns up to [`MAX_BATCH`] datagrams. Each lands in its own fixed-size slot of
//! a slab; the slot is split off as `Bytes` and handed on without a copy, so the slab is freed
//! when the last slot of it leaves the hub's ring. Slots are filled densely (a short batch at
//! the end of a slab rather than a fresh slab), which keeps the memory held per payload byte
//! near `slot / payload` (1536 / 1328 for a typical 7-packet RTP datagram).

use std::io;
use std::os::fd::RawFd;

use bytes::{Bytes, BytesMut};

/// Upper bound on datagrams per syscall (and on the stack arrays that describe them).
pub const MAX_BATCH: usize = 64;

/// Receives datagrams into slabs of `slots` fixed-size slots.
#[derive(Debug)]
pub struct RecvBatch {
    slab: BytesMut,
    slot: usize,
    slots: usize,
    batch: usize,
    truncated: u64,
}

impl RecvBatch {
    /// `slot` is the largest datagram accepted whole (larger ones are counted and dropped);
    /// `batch` the most datagrams taken per syscall.
    pub fn new(slot: usize, batch: usize) -> Self {
        let slots = 64;
        Self {
            slab: BytesMut::new(),
            slot: slot.max(64),
            slots,
            batch: batch.clamp(1, MAX_BATCH),
            truncated: 0,
        }
    }

    /// Datagrams dropped so far because they did not fit a slot.
    pub fn truncated(&self) -> u64 {
        self.truncated
    }

    /// Receives what is queued, without blocking, appending each datagram to `out`.
    /// Returns the number received; `WouldBlock` when the socket was empty.
    pub fn recv(&mut self, fd: RawFd, out: &mut Vec<Bytes>) -> io::Result<usize> {
        if self.slab.capacity() < self.slot {
            // Zeroed once so that every byte later exposed by `set_len` is initialised.
            self.slab = BytesMut::zeroed(self.slot * self.slots);
            self.slab.clear();
        }
        let n = self.batch.min(self.slab.capacity() / self.slot);
        let (lens, got) = self.recvmmsg(fd, n)?;
        // SAFETY: the slab was zero-filled at allocation and only ever written since, and
        // `got * slot` is within its capacity.
        unsafe { self.slab.set_len(got * self.slot) };
        for &(len, truncated) in &lens[..got] {
            let mut piece = self.slab.split_to(self.slot);
            if truncated {
                self.truncated += 1;
                continue;
            }
            piece.truncate(len);
            out.push(piece.freeze());
        }
        Ok(got)
    }

    /// One `recvmmsg` call into the first `n` free slots; returns (length, truncated) pairs and
    /// how many of them were filled (on the stack: this runs for every wakeup).
    fn recvmmsg(&mut self, fd: RawFd, n: usize) -> io::Result<([(usize, bool); MAX_BATCH], usize)> {
        let base = self.slab.spare_capacity_mut().as_mut_ptr();
        // SAFETY: all-zero is a valid value for these plain C structs.
        let mut iov: [libc::iovec; MAX_BATCH] = unsafe { std::mem::zeroed() };
        let mut msgs: [libc::mmsghdr; MAX_BATCH] = unsafe { std::mem::zeroed() };
        for (i, v) in iov.iter_mut().enumerate().take(n) {
            *v = libc::iovec {
                // SAFETY: slot `i` lies inside the spare capacity (n * slot <= capacity).
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
        // SAFETY: `msgs[..n]` describe writable, disjoint slots of the slab that outlive the call.
        let rc = unsafe {
            libc::recvmmsg(
                fd,
                msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let got = rc as usize;
        let mut lens = [(0, false); MAX_BATCH];
        for (len, m) in lens.iter_mut().zip(&msgs[..got]) {
            *len = (
                m.msg_len as usize,
                m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            );
        }
        Ok((lens, got))
    }
}
