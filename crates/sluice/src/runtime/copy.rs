//! `memcpy` and `memmove` for the static x86-64 build (the `static-memcpy` feature), in place of
//! the generic ones its C toolchain links (docs/decisions/allocator.md, "The static build").
//!
//! glibc picks a copy routine for the CPU at run time; a static binary has no such step, and zig,
//! the static build's C toolchain, links its compiler-rt `memcpy`: a 16-byte loop for every size.
//! Most of a proxy's copies are Rust moving 100–500-byte values (futures, frames, request parts);
//! a few are bodies and TLS records of kilobytes. Here: overlapping loads and stores up to 64
//! bytes; above that a loop of 128-byte blocks with AVX where the CPU and the kernel support it;
//! otherwise a loop of 64-byte blocks (SSE2, which every x86-64 has), and from [`REP_FROM`] bytes
//! `rep movsb` where the CPU advertises fast string moves (ERMS). [`init`] checks the CPU once;
//! until it runs, every size takes the SSE2 paths. Each path loads what it stores before the stores
//! that could overwrite it, so `memmove` shares the forward paths and adds a backward loop.
//!
//! Written in assembly so that the compiler cannot turn a copy loop back into a call to `memcpy`.
//! The symbols `memcpy` and `memmove` are defined only in the static musl build with the feature
//! (where they take precedence over the toolchain's weak ones); tests call `sluice_copy_forward`
//! and `sluice_copy_move` on any x86-64 target.

use std::sync::atomic::{AtomicU8, Ordering};

/// Copies of at least this many bytes use `rep movsb` when the CPU has ERMS (glibc's threshold
/// for 16-byte vectors).
pub const REP_FROM: usize = 2048;

/// How copies of more than 64 bytes are done: bit 0 (`REP`), `rep movsb` from [`REP_FROM`] bytes
/// on; bit 1 (`AVX`), 32-byte AVX loads and stores (below [`REP_FROM`] when both are set). 0 (also
/// before [`init`] runs): the 16-byte SSE2 loop.
static COPY_MODE: AtomicU8 = AtomicU8::new(0);

const REP: u8 = 1;
const AVX: u8 = 2;

/// How copies of more than 64 bytes are done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The 64-byte SSE2 loop for every size.
    Vector,
    /// `rep movsb` from [`REP_FROM`] bytes on, SSE2 below.
    RepMovsb,
    /// The 128-byte AVX loop for every size.
    Avx,
}

/// Checks the CPU once and sets the mode; before this runs, every size takes the SSE2 paths.
/// `rep movsb` only where there is no AVX: it is the one way to copy wider than 16 bytes there,
/// while with AVX the loop is as fast up to a few KiB and within ~15 % at 12 KiB (measured), and
/// a profiler that counts instructions (callgrind) counts each byte of a `rep movsb` as one.
pub fn init() {
    set_mode(if has_avx() {
        Mode::Avx
    } else if has_erms() {
        Mode::RepMovsb
    } else {
        Mode::Vector
    });
}

/// Sets the mode (tests; [`init`]).
pub fn set_mode(mode: Mode) {
    let v = match mode {
        Mode::Vector => 0,
        Mode::RepMovsb => REP,
        Mode::Avx => AVX,
    };
    COPY_MODE.store(v, Ordering::Relaxed);
}

/// Whether the CPU advertises enhanced `rep movsb`/`stosb` (CPUID.(EAX=7,ECX=0):EBX bit 9).
pub fn has_erms() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        __cpuid(0).eax >= 7 && __cpuid_count(7, 0).ebx & (1 << 9) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether AVX instructions can run: the CPU has them and the kernel saves the YMM registers.
pub fn has_avx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
extern "C" {
    /// `memcpy`'s contract: copies `n` bytes from `src` to `dst`, returns `dst`. Also correct when
    /// `dst` is below `src` and the ranges overlap.
    pub fn sluice_copy_forward(dst: *mut u8, src: *const u8, n: usize) -> *mut u8;
    /// `memmove`'s contract: the ranges may overlap in either direction.
    pub fn sluice_copy_move(dst: *mut u8, src: *const u8, n: usize) -> *mut u8;
}

/// The routines; `$fwd` and `$mov` are extra labels at their entries (`memcpy`, `memmove`).
/// System V: rdi = dst, rsi = src, rdx = n; rax returns dst. Scratch: rcx, r8, r9, xmm0-xmm7
/// (ymm0-ymm7 on the AVX paths, which end with `vzeroupper`).
#[cfg(target_arch = "x86_64")]
macro_rules! copy_asm {
    ([$($fwd:literal),*], [$($mov:literal),*]) => {
std::arch::global_asm!(
    ".pushsection .text.sluice_copy,\"ax\",@progbits",
    ".p2align 5",
    ".globl sluice_copy_forward",
    ".type sluice_copy_forward,@function",
    "sluice_copy_forward:",
    $($fwd,)*
    "    mov rax, rdi",
    "    cmp rdx, 16",
    "    jb 20f",
    "    cmp rdx, 32",
    "    ja 3f",
    // 16..=32: two 16-byte halves that may overlap.
    "    movdqu xmm0, [rsi]",
    "    movdqu xmm1, [rsi + rdx - 16]",
    "    movdqu [rdi], xmm0",
    "    movdqu [rdi + rdx - 16], xmm1",
    "    ret",
    "3:",
    "    cmp rdx, 64",
    "    ja 4f",
    // 33..=64: the first and the last 32 bytes.
    "    movdqu xmm0, [rsi]",
    "    movdqu xmm1, [rsi + 16]",
    "    movdqu xmm2, [rsi + rdx - 32]",
    "    movdqu xmm3, [rsi + rdx - 16]",
    "    movdqu [rdi], xmm0",
    "    movdqu [rdi + 16], xmm1",
    "    movdqu [rdi + rdx - 32], xmm2",
    "    movdqu [rdi + rdx - 16], xmm3",
    "    ret",
    "4:",
    "    movzx ecx, byte ptr [rip + {mode}]",
    "    test ecx, ecx",
    "    jz 5f",
    "    cmp rdx, {rep_from}",
    "    jb 9f",
    "    test ecx, {rep}",
    "    jnz 8f",
    "9:",
    "    test ecx, {avx}",
    "    jnz 50f",
    "5:",
    // More than 64: the last 64 bytes are loaded first and stored last, so the loop only copies
    // whole 64-byte blocks while more than 64 bytes remain.
    "    movdqu xmm4, [rsi + rdx - 64]",
    "    movdqu xmm5, [rsi + rdx - 48]",
    "    movdqu xmm6, [rsi + rdx - 32]",
    "    movdqu xmm7, [rsi + rdx - 16]",
    "    lea r8, [rdi + rdx - 64]",
    "    mov rcx, rdx",
    "6:",
    "    movdqu xmm0, [rsi]",
    "    movdqu xmm1, [rsi + 16]",
    "    movdqu xmm2, [rsi + 32]",
    "    movdqu xmm3, [rsi + 48]",
    "    movdqu [rdi], xmm0",
    "    movdqu [rdi + 16], xmm1",
    "    movdqu [rdi + 32], xmm2",
    "    movdqu [rdi + 48], xmm3",
    "    add rsi, 64",
    "    add rdi, 64",
    "    sub rcx, 64",
    "    cmp rcx, 64",
    "    ja 6b",
    "    movdqu [r8], xmm4",
    "    movdqu [r8 + 16], xmm5",
    "    movdqu [r8 + 32], xmm6",
    "    movdqu [r8 + 48], xmm7",
    "    ret",
    "8:",
    // Large, ERMS: the CPU's own string copy (forward; correct for a dst below an overlapping src).
    "    mov rcx, rdx",
    "    rep movsb",
    "    ret",
    "50:",
    // AVX, more than 64 bytes: up to 128 the first and the last 64; above, as the SSE2 loop with
    // 128-byte blocks.
    "    cmp rdx, 128",
    "    ja 52f",
    "    vmovdqu ymm0, [rsi]",
    "    vmovdqu ymm1, [rsi + 32]",
    "    vmovdqu ymm2, [rsi + rdx - 64]",
    "    vmovdqu ymm3, [rsi + rdx - 32]",
    "    vmovdqu [rdi], ymm0",
    "    vmovdqu [rdi + 32], ymm1",
    "    vmovdqu [rdi + rdx - 64], ymm2",
    "    vmovdqu [rdi + rdx - 32], ymm3",
    "    vzeroupper",
    "    ret",
    "52:",
    "    vmovdqu ymm4, [rsi + rdx - 128]",
    "    vmovdqu ymm5, [rsi + rdx - 96]",
    "    vmovdqu ymm6, [rsi + rdx - 64]",
    "    vmovdqu ymm7, [rsi + rdx - 32]",
    "    lea r8, [rdi + rdx - 128]",
    "    mov rcx, rdx",
    "53:",
    "    vmovdqu ymm0, [rsi]",
    "    vmovdqu ymm1, [rsi + 32]",
    "    vmovdqu ymm2, [rsi + 64]",
    "    vmovdqu ymm3, [rsi + 96]",
    "    vmovdqu [rdi], ymm0",
    "    vmovdqu [rdi + 32], ymm1",
    "    vmovdqu [rdi + 64], ymm2",
    "    vmovdqu [rdi + 96], ymm3",
    "    sub rsi, -128",
    "    sub rdi, -128",
    "    add rcx, -128",
    "    cmp rcx, 128",
    "    ja 53b",
    "    vmovdqu [r8], ymm4",
    "    vmovdqu [r8 + 32], ymm5",
    "    vmovdqu [r8 + 64], ymm6",
    "    vmovdqu [r8 + 96], ymm7",
    "    vzeroupper",
    "    ret",
    "20:",
    // Under 16 bytes.
    "    cmp edx, 8",
    "    jb 21f",
    "    mov rcx, [rsi]",
    "    mov r8, [rsi + rdx - 8]",
    "    mov [rdi], rcx",
    "    mov [rdi + rdx - 8], r8",
    "    ret",
    "21:",
    "    cmp edx, 4",
    "    jb 22f",
    "    mov ecx, [rsi]",
    "    mov r8d, [rsi + rdx - 4]",
    "    mov [rdi], ecx",
    "    mov [rdi + rdx - 4], r8d",
    "    ret",
    "22:",
    "    test edx, edx",
    "    jz 23f",
    "    movzx ecx, byte ptr [rsi]",
    "    movzx r8d, byte ptr [rsi + rdx - 1]",
    "    cmp edx, 2",
    "    jb 24f",
    "    movzx r9d, word ptr [rsi]",
    "    mov [rdi], r9w",
    "24:",
    "    mov [rdi], cl",
    "    mov [rdi + rdx - 1], r8b",
    "23:",
    "    ret",
    ".size sluice_copy_forward, . - sluice_copy_forward",
    "",
    ".p2align 5",
    ".globl sluice_copy_move",
    ".type sluice_copy_move,@function",
    "sluice_copy_move:",
    $($mov,)*
    // Forward unless dst starts inside [src, src + n): then nothing ahead of the copy is
    // overwritten before it is read. Up to 64 bytes every path loads everything first anyway.
    "    mov rax, rdi",
    "    sub rax, rsi",
    "    cmp rax, rdx",
    "    jae sluice_copy_forward",
    "    cmp rdx, 64",
    "    jbe sluice_copy_forward",
    "    mov rax, rdi",
    // Backward: the first 64 bytes are loaded first and stored last; the loop copies whole
    // 64-byte blocks from the end while more than 64 bytes remain.
    "    movdqu xmm4, [rsi]",
    "    movdqu xmm5, [rsi + 16]",
    "    movdqu xmm6, [rsi + 32]",
    "    movdqu xmm7, [rsi + 48]",
    "    mov r8, rdi",
    "    lea rsi, [rsi + rdx]",
    "    lea rdi, [rdi + rdx]",
    "    mov rcx, rdx",
    "40:",
    "    movdqu xmm0, [rsi - 64]",
    "    movdqu xmm1, [rsi - 48]",
    "    movdqu xmm2, [rsi - 32]",
    "    movdqu xmm3, [rsi - 16]",
    "    movdqu [rdi - 64], xmm0",
    "    movdqu [rdi - 48], xmm1",
    "    movdqu [rdi - 32], xmm2",
    "    movdqu [rdi - 16], xmm3",
    "    sub rsi, 64",
    "    sub rdi, 64",
    "    sub rcx, 64",
    "    cmp rcx, 64",
    "    ja 40b",
    "    movdqu [r8], xmm4",
    "    movdqu [r8 + 16], xmm5",
    "    movdqu [r8 + 32], xmm6",
    "    movdqu [r8 + 48], xmm7",
    "    ret",
    ".size sluice_copy_move, . - sluice_copy_move",
    ".popsection",
    mode = sym COPY_MODE,
    rep_from = const REP_FROM,
    rep = const REP,
    avx = const AVX,
);
    };
}

#[cfg(all(target_arch = "x86_64", feature = "static-memcpy", target_env = "musl"))]
copy_asm!(
    [".globl memcpy", ".type memcpy,@function", "memcpy:"],
    [".globl memmove", ".type memmove,@function", "memmove:"]
);
#[cfg(all(
    target_arch = "x86_64",
    not(all(feature = "static-memcpy", target_env = "musl"))
))]
copy_asm!([], []);

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// A source with no repeating short pattern, so a byte copied from the wrong offset shows.
    fn pattern(len: usize) -> Vec<u8> {
        (0..len as u32).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    fn check_forward(src: &[u8], n: usize) {
        for so in 0..17 {
            for d in 0..17 {
                let mut dst = vec![0xAA_u8; n + 64];
                // SAFETY: both ranges are inside their buffers and do not overlap.
                let r =
                    unsafe { sluice_copy_forward(dst.as_mut_ptr().add(d), src[so..].as_ptr(), n) };
                assert_eq!(r, dst[d..].as_mut_ptr(), "returns dst");
                assert!(
                    dst[..d].iter().all(|&b| b == 0xAA),
                    "n={n}: wrote before dst"
                );
                assert_eq!(&dst[d..d + n], &src[so..so + n], "n={n} src+{so} dst+{d}");
                assert!(
                    dst[d + n..].iter().all(|&b| b == 0xAA),
                    "n={n}: wrote past the end"
                );
            }
        }
    }

    fn check_move(src: &[u8], n: usize) {
        for dist in [
            0, 1, 3, 8, 15, 16, 17, 31, 32, 63, 64, 65, 100, 200, 1000, 3000,
        ] {
            for dst_above in [false, true] {
                let len = n + dist + 32;
                let (s, d) = if dst_above {
                    (8, 8 + dist)
                } else {
                    (8 + dist, 8)
                };
                let mut buf = src[..len].to_vec();
                let mut want = buf.clone();
                want.copy_within(s..s + n, d);
                let p = buf.as_mut_ptr();
                // SAFETY: both ranges are inside `buf`; memmove allows the overlap.
                let r = unsafe { sluice_copy_move(p.add(d), p.add(s), n) };
                assert_eq!(r, p.wrapping_add(d), "returns dst");
                assert_eq!(buf, want, "move n={n} dist={dist} dst_above={dst_above}");
            }
        }
    }

    /// Every size up to 300 and the edges of each path, every alignment of source and
    /// destination up to 16, overlaps both ways, in each mode the CPU can run.
    #[test]
    fn copies_every_size_alignment_and_overlap() {
        let src = pattern(70_000);
        let mut sizes: Vec<usize> = (0..=300).collect();
        sizes.extend([
            511, 512, 513, 1023, 1024, 1025, 2047, 2048, 2049, 4097, 16_384, 65_539,
        ]);
        let mut modes = vec![Mode::Vector, Mode::RepMovsb];
        if has_avx() {
            modes.push(Mode::Avx);
        }
        for mode in modes {
            set_mode(mode);
            for &n in &sizes {
                check_forward(&src, n);
                check_move(&src, n);
            }
        }
        init();
    }
}
