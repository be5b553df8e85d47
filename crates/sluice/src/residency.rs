//! Unmaps the executable's read-only pages once start-up is over, so only what serving uses stays mapped.
//!
//! Every page fault on code maps the surrounding 64 KiB of already-cached file pages too (the
//! kernel's fault-around), so argument parsing, TOML, logging set-up and whatever sits next to
//! them stay in the process's mappings for its whole life: most of an idle gateway's USS. Zapping
//! the page table entries of the program's non-writable segments (code, read-only data; found by
//! `dl_iterate_phdr`; `MADV_DONTNEED` on never written private file mappings) drops them; the next
//! access to each page maps it back from the page cache. Nothing is lost: these pages are never
//! written, so the file is their only content.
//! The pages leave this process, not necessarily memory: they stay in the page cache, unmapped,
//! which is the first thing the kernel reclaims when a router runs short. See
//! `docs/decisions/footprint.md`.

use std::ffi::c_void;

/// Why the start-up pages were not released.
#[derive(Debug, thiserror::Error)]
pub enum ResidencyError {
    #[error("the program's read-only segments were not found")]
    NotFound,
    #[error("madvise: {0}")]
    Madvise(std::io::Error),
}

/// The whole pages inside `[start, start + len)`: a page shared with a neighbouring segment is
/// never touched.
fn whole_pages(start: usize, len: usize, page: usize) -> Option<(usize, usize)> {
    let first = start.checked_add(page - 1)? / page * page;
    let end = start.checked_add(len)? / page * page;
    (end > first).then_some((first, end))
}

/// Collects the main program's loadable segments that are not writable (code, read-only data,
/// unwind tables): their pages are the file's bytes, never written. The RELRO part (relocated,
/// then made read-only) lies inside the writable segment, so it is never among them.
unsafe extern "C" fn read_only_segments(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut c_void,
) -> libc::c_int {
    // SAFETY: `data` is the `Vec` `release_code_pages` passed, and `info` is valid for this call.
    let (found, info) = unsafe { (&mut *(data as *mut Vec<(usize, usize)>), &*info) };
    if !info.dlpi_phdr.is_null() {
        // SAFETY: the loader's program headers: `dlpi_phnum` entries at `dlpi_phdr`.
        let headers =
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
        for h in headers {
            if h.p_type == libc::PT_LOAD && h.p_flags & libc::PF_W == 0 {
                found.push((
                    (info.dlpi_addr as usize).wrapping_add(h.p_vaddr as usize),
                    h.p_memsz as usize,
                ));
            }
        }
    }
    // The main program comes first; shared libraries are mapped by other processes anyway.
    1
}

/// Unmaps the pages of the main program's read-only segments (the sluice executable, or the test
/// binary in tests); returns how many bytes were released.
pub fn release_code_pages() -> Result<usize, ResidencyError> {
    let mut found: Vec<(usize, usize)> = Vec::new();
    // SAFETY: the callback only reads the loader's data and pushes into `found`, which outlives
    // the call.
    unsafe {
        libc::dl_iterate_phdr(
            Some(read_only_segments),
            &mut found as *mut Vec<(usize, usize)> as *mut c_void,
        )
    };
    // SAFETY: sysconf has no memory effects.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    };
    let ranges: Vec<(usize, usize)> = found
        .into_iter()
        .filter_map(|(start, len)| whole_pages(start, len, page))
        .collect();
    if ranges.is_empty() {
        return Err(ResidencyError::NotFound);
    }
    let advise = |advice: libc::c_int| -> Result<(), ResidencyError> {
        for &(first, end) in &ranges {
            // SAFETY: whole pages of a non-writable private file mapping of this process: never
            // written, so MADV_DONTNEED only drops page table entries (each page faults back in
            // unchanged from the file on its next use).
            let rc = unsafe { libc::madvise(first as *mut c_void, end - first, advice) };
            if rc != 0 {
                return Err(ResidencyError::Madvise(std::io::Error::last_os_error()));
            }
        }
        Ok(())
    };
    advise(libc::MADV_DONTNEED)?;
    Ok(ranges.iter().map(|(first, end)| end - first).sum())
}

/// Releases the start-up code a second after `main` starts serving: by then the server's own start
/// (spawning accept loops, the first log lines) is over too, and its pages go with the rest. A
/// failure is only logged (the process works the same, with more pages mapped).
pub async fn release_after_start() {
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    match release_code_pages() {
        Ok(bytes) => tracing::debug!(bytes, "start-up code pages released"),
        Err(e) => tracing::debug!(error = %e, "start-up code pages kept"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_pages_inside_the_segment() {
        assert_eq!(whole_pages(0x1000, 0x3000, 0x1000), Some((0x1000, 0x4000)));
        // Partial pages at either end are left alone.
        assert_eq!(whole_pages(0x1010, 0x3000, 0x1000), Some((0x2000, 0x4000)));
        assert_eq!(whole_pages(0x1000, 0x2ff0, 0x1000), Some((0x1000, 0x3000)));
        assert_eq!(whole_pages(0x1010, 0x100, 0x1000), None);
        assert_eq!(whole_pages(usize::MAX - 10, 100, 0x1000), None);
    }

    static TABLE: [u64; 4] = [3, 1, 4, 1];

    #[test]
    fn released_code_and_data_read_back_the_same() {
        let before = (TABLE.iter().sum::<u64>(), format!("{:?}", TABLE));
        let bytes = release_code_pages().unwrap();
        assert!(bytes > 0);
        // Code and read-only data on released pages fault back in from the file unchanged.
        assert_eq!((TABLE.iter().sum::<u64>(), format!("{:?}", TABLE)), before);
        assert!(release_code_pages().is_ok());
    }
}
