//! Unmaps the executable's code pages once start-up is over, so only the code serving uses stays mapped.
//!
//! Every page fault on code maps the surrounding 64 KiB of already-cached file pages too (the
//! kernel's fault-around), so argument parsing, TOML, logging set-up and whatever sits next to
//! them stay in the process's mappings for its whole life: most of an idle gateway's USS. Zapping
//! the page table entries of the executable segment (`MADV_DONTNEED` on a read-only, never
//! written file mapping) drops them; the next instruction fetch on each page maps it back from the
//! page cache. Nothing is lost: code pages are never written, so the file is their only content.
//! The pages leave this process, not necessarily memory: they stay in the page cache, unmapped,
//! which is the first thing the kernel reclaims when a router runs short. See
//! `docs/decisions/footprint.md`.

use std::io::BufRead;

/// Why the executable segment was not released.
#[derive(Debug, thiserror::Error)]
pub enum ResidencyError {
    #[error("reading /proc/self/maps: {0}")]
    Maps(#[from] std::io::Error),
    #[error("no executable mapping holds this code")]
    NotFound,
    #[error("madvise: {0}")]
    Madvise(std::io::Error),
}

/// One `/proc/self/maps` line's range and permissions, when it parses.
fn parse_line(line: &str) -> Option<(usize, usize, &str)> {
    let mut fields = line.split_ascii_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    Some((
        usize::from_str_radix(start, 16).ok()?,
        usize::from_str_radix(end, 16).ok()?,
        perms,
    ))
}

/// The read-only executable mapping (`r-xp`) that holds `addr`, from `/proc/self/maps` text.
fn text_segment(maps: impl BufRead, addr: usize) -> Result<(usize, usize), ResidencyError> {
    for line in maps.lines() {
        let line = line?;
        if let Some((start, end, perms)) = parse_line(&line) {
            // Only a mapping that is executable and not writable: its pages are the file's bytes.
            if (start..end).contains(&addr) && perms.starts_with("r-x") {
                return Ok((start, end));
            }
        }
    }
    Err(ResidencyError::NotFound)
}

/// Unmaps the pages of the code segment this function lives in (the sluice executable, or the
/// test binary in tests); returns how many bytes the segment spans.
pub fn release_code_pages() -> Result<usize, ResidencyError> {
    let here = release_code_pages as fn() -> Result<usize, ResidencyError> as usize;
    let maps = std::io::BufReader::new(std::fs::File::open("/proc/self/maps")?);
    let (start, end) = text_segment(maps, here)?;
    // SAFETY: the range is a whole read-only, executable, private file mapping of this process
    // (checked above); it is never written, so MADV_DONTNEED only drops page table entries and
    // the pages fault back in unchanged from the file.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
    if rc != 0 {
        return Err(ResidencyError::Madvise(std::io::Error::last_os_error()));
    }
    Ok(end - start)
}

/// Releases the start-up code once everything is built and bound, just before serving; a failure
/// is only logged (the process works the same, with more pages mapped).
pub fn release_startup_code() {
    match release_code_pages() {
        Ok(bytes) => tracing::debug!(bytes, "start-up code pages released"),
        Err(e) => tracing::debug!(error = %e, "start-up code pages kept"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_only_the_executable_mapping_holding_the_address() {
        let maps = "\
55d0c0000000-55d0c0100000 r--p 00000000 08:01 123 /usr/bin/sluice
55d0c0100000-55d0c0300000 r-xp 00100000 08:01 123 /usr/bin/sluice
55d0c0300000-55d0c0340000 r--p 00300000 08:01 123 /usr/bin/sluice
55d0c0340000-55d0c0350000 rw-p 00340000 08:01 123 /usr/bin/sluice
7f0000000000-7f0000010000 rwxp 00000000 00:00 0
garbage line
";
        assert_eq!(
            text_segment(maps.as_bytes(), 0x55d0_c010_0042).unwrap(),
            (0x55d0_c010_0000, 0x55d0_c030_0000)
        );
        // Writable or non-executable mappings are never chosen.
        assert!(text_segment(maps.as_bytes(), 0x55d0_c000_0042).is_err());
        assert!(text_segment(maps.as_bytes(), 0x7f00_0000_0042).is_err());
        assert!(text_segment(maps.as_bytes(), 0x1000).is_err());
    }

    #[test]
    fn released_code_keeps_running() {
        let bytes = release_code_pages().unwrap();
        assert!(bytes > 0);
        // Code on released pages faults back in from the file and behaves the same.
        assert_eq!(parse_line("1-2 r-xp"), Some((1, 2, "r-xp")));
        assert!(release_code_pages().is_ok());
    }
}
