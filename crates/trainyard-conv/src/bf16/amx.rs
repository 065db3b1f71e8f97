//! AMX: `tdpbf16ps` on tile registers, 16 × 16 f32 sums of 32-long bf16 dot products per instruction
//! (16 times the multiply-adds of an AVX-512 FMA). Written with `asm!`, as Rust's AMX intrinsics are not
//! stable: the tile registers are never named to the compiler, which does not use them, so they hold
//! their values from one `asm!` to the next within a thread.
//!
//! Linux hands out AMX's 8 KiB of tile state only to a process that asks for it
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); without it the first tile instruction is a
//! SIGILL. A refusal (an older kernel, a seccomp filter) leaves AMX unused.

use super::pack::{Tile, Windows, TILE_K, TILE_ROWS};
use std::arch::asm;

/// Whether this CPU has AMX-BF16 and the kernel lets this process use it (asked once).
pub fn available() -> bool {
    static PERMITTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PERMITTED.get_or_init(|| cpu_has_amx_bf16() && request_tile_state())
}

fn cpu_has_amx_bf16() -> bool {
    let max_leaf = std::arch::x86_64::__cpuid(0).eax;
    if max_leaf < 7 {
        return false;
    }
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    let (amx_bf16, amx_tile) = (edx & (1 << 22) != 0, edx & (1 << 24) != 0);
    amx_bf16 && amx_tile
}

#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes this process's permitted xstate features.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// The tile configuration (palette 1): tiles 0-7 all 16 rows of 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

fn config() -> Config {
    let mut c = [0u8; 64];
    c[0] = 1;
    for t in 0..8 {
        c[16 + 2 * t..18 + 2 * t].copy_from_slice(&((TILE_K * 2) as u16).to_le_bytes());
        c[48 + t] = TILE_ROWS as u8;
    }
    Config(c)
}

/// Tile state configured for this thread while alive, released on drop.
pub struct Session(());

impl Session {
    /// # Safety
    /// `available()` returned true.
    pub unsafe fn start() -> Session {
        let cfg = config();
        // SAFETY: AMX is permitted (the caller's promise); `cfg` is a valid palette-1 configuration.
        unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
        Session(())
    }

    /// `out` (up to 32 × 32 f32, row stride 32) = the product of `mt` A row tiles (`a`, then `a +
    /// a_next`) and `nt` B column tiles (`b`, then `b + b_next`), each `kt` tiles deep (consecutive).
    ///
    /// # Safety
    /// `a`, `b` point at `kt` consecutive tiles, and so do `a + a_next` when `mt == 2` and `b + b_next`
    /// when `nt == 2`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn block(
        &self,
        (a, a_next, mt): (*const Tile, usize, usize),
        (b, b_next, nt): (*const Tile, usize, usize),
        kt: usize,
        out: &mut [f32; 32 * 32],
    ) {
        const STRIDE: usize = TILE_K * 2;
        // SAFETY: the tiles read are inside the packed operands (the caller's promise); tile registers
        // are configured (`start`); `store` writes inside `out`.
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
            for t in 0..kt {
                let (a0, b0) = (a.add(t), b.add(t));
                asm!("tileloadd tmm4, [{p} + {s}*1]", p = in(reg) a0, s = in(reg) STRIDE, options(nostack, readonly));
                asm!("tileloadd tmm6, [{p} + {s}*1]", p = in(reg) b0, s = in(reg) STRIDE, options(nostack, readonly));
                asm!("tdpbf16ps tmm0, tmm4, tmm6", options(nostack, nomem));
                if nt == 2 {
                    let b1 = b0.add(b_next);
                    asm!("tileloadd tmm7, [{p} + {s}*1]", p = in(reg) b1, s = in(reg) STRIDE, options(nostack, readonly));
                    asm!("tdpbf16ps tmm1, tmm4, tmm7", options(nostack, nomem));
                }
                if mt == 2 {
                    let a1 = a0.add(a_next);
                    asm!("tileloadd tmm5, [{p} + {s}*1]", p = in(reg) a1, s = in(reg) STRIDE, options(nostack, readonly));
                    asm!("tdpbf16ps tmm2, tmm5, tmm6", options(nostack, nomem));
                    if nt == 2 {
                        asm!("tdpbf16ps tmm3, tmm5, tmm7", options(nostack, nomem));
                    }
                }
            }
            self.store(out, mt, nt);
        }
    }

    /// `out` (32 × 32 f32, row stride 32) = (or, with `accumulate`, +=) two A tiles times `nt` B tiles,
    /// summed over reduction steps. Each operand is a set of windows (`Windows`): tiles read in place
    /// from wherever they lie, at any row stride (a convolution's input, its output gradient).
    ///
    /// # Safety
    /// Every tile the windows name lies in one allocation (16 rows of 64 bytes at their stride), for
    /// both A tiles and the `nt` B tiles of each step; tile state is configured (`start`).
    pub unsafe fn windows_block(
        &self,
        a: &Windows,
        (b, nt): (&Windows, usize),
        accumulate: bool,
        out: &mut [f32; 32 * 32],
    ) {
        const OUT_STRIDE: usize = 32 * 4;
        debug_assert_eq!(a.steps.len(), b.steps.len());
        // SAFETY: the tiles read are where the caller promises; `out` holds 32 rows of 128 bytes.
        unsafe {
            if accumulate {
                let o = out.as_ptr() as *const u8;
                asm!("tileloadd tmm0, [{p} + {s}*1]", p = in(reg) o, s = in(reg) OUT_STRIDE, options(nostack, readonly));
                asm!("tileloadd tmm1, [{p} + {s}*1]", p = in(reg) o.add(64), s = in(reg) OUT_STRIDE, options(nostack, readonly));
                asm!("tileloadd tmm2, [{p} + {s}*1]", p = in(reg) o.add(16 * OUT_STRIDE), s = in(reg) OUT_STRIDE, options(nostack, readonly));
                asm!("tileloadd tmm3, [{p} + {s}*1]", p = in(reg) o.add(16 * OUT_STRIDE + 64), s = in(reg) OUT_STRIDE, options(nostack, readonly));
            } else {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem)
                );
            }
            for (&a_at, &b_at) in a.steps.iter().zip(b.steps) {
                let (a0, b0) = (a.base.add(a_at), b.base.add(b_at));
                asm!("tileloadd tmm4, [{p} + {s}*1]", p = in(reg) a0, s = in(reg) a.row, options(nostack, readonly));
                asm!("tileloadd tmm6, [{p} + {s}*1]", p = in(reg) b0, s = in(reg) b.row, options(nostack, readonly));
                asm!("tdpbf16ps tmm0, tmm4, tmm6", options(nostack, nomem));
                if nt == 2 {
                    asm!("tileloadd tmm7, [{p} + {s}*1]", p = in(reg) b0.add(b.next), s = in(reg) b.row, options(nostack, readonly));
                    asm!("tdpbf16ps tmm1, tmm4, tmm7", options(nostack, nomem));
                }
                asm!("tileloadd tmm5, [{p} + {s}*1]", p = in(reg) a0.add(a.next), s = in(reg) a.row, options(nostack, readonly));
                asm!("tdpbf16ps tmm2, tmm5, tmm6", options(nostack, nomem));
                if nt == 2 {
                    asm!("tdpbf16ps tmm3, tmm5, tmm7", options(nostack, nomem));
                }
            }
            self.store(out, 2, nt);
        }
    }

    /// The four accumulators (those `mt` × `nt` uses) into `out` (row stride 32 f32).
    ///
    /// # Safety
    /// Tile state is configured (`start`).
    unsafe fn store(&self, out: &mut [f32; 32 * 32], mt: usize, nt: usize) {
        const OUT_STRIDE: usize = 32 * 4;
        let o = out.as_mut_ptr() as *mut u8;
        // SAFETY: the stores write inside `out` (32 rows of 128 bytes).
        unsafe {
            asm!("tilestored [{p} + {s}*1], tmm0", p = in(reg) o, s = in(reg) OUT_STRIDE, options(nostack));
            if nt == 2 {
                asm!("tilestored [{p} + {s}*1], tmm1", p = in(reg) o.add(64), s = in(reg) OUT_STRIDE, options(nostack));
            }
            if mt == 2 {
                asm!("tilestored [{p} + {s}*1], tmm2", p = in(reg) o.add(16 * OUT_STRIDE), s = in(reg) OUT_STRIDE, options(nostack));
                if nt == 2 {
                    asm!("tilestored [{p} + {s}*1], tmm3", p = in(reg) o.add(16 * OUT_STRIDE + 64), s = in(reg) OUT_STRIDE, options(nostack));
                }
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: tiles were configured by `start`; releasing returns them to their initial state.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}
