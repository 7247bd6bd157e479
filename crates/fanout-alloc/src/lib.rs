//! fanout's global allocator: mimalloc, as the `mimalloc` crate wires it, except that an
//! allocation whose alignment mimalloc gives every block anyway goes through `mi_malloc` instead
//! of `mi_malloc_aligned`.
//!
//! Why: the `mimalloc` crate passes every Rust allocation to the aligned entry points. In mimalloc
//! v3 their fast path covers only blocks of at most 1 KiB; a larger block whose size class is not
//! a power of two is *over-allocated* (size + alignment − 1, then the pointer adjusted) even when
//! the alignment asked for is 8 or 16, which every mimalloc block has. A request's futures are
//! such blocks (1–4 KiB each), so the gateway took that slow path ~6 times per request. The same
//! fix is proposed upstream (purpleprotocol/mimalloc_rust pull request 170, "skip `*_aligned`
//! calls when alignment fits default"); this crate holds it until a release has it.
//!
//! The rule is the standard library's own for `System` on Unix: the plain call when the
//! alignment is at most the allocator's minimum (`MI_MAX_ALIGN_SIZE`, 16 bytes) and at most the
//! size (a block of 8 bytes is only 8-aligned). Everything else keeps the aligned calls.
//!
//! ```text
//! #[global_allocator]
//! static GLOBAL: fanout_alloc::MiMalloc = fanout_alloc::MiMalloc;
//! ```

use libmimalloc_sys as sys;
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// The alignment every mimalloc block of at least this size has (`MI_MAX_ALIGN_SIZE`).
const MIN_ALIGN: usize = 16;

/// mimalloc as the global allocator (see the crate's documentation).
#[derive(Debug, Default, Clone, Copy)]
pub struct MiMalloc;

/// Whether a block from the plain (unaligned) calls satisfies `align` for `size` bytes.
#[inline]
fn plain(size: usize, align: usize) -> bool {
    align <= MIN_ALIGN && align <= size
}

// SAFETY: every call forwards to mimalloc, which returns null or a block of at least the size
// asked for, aligned as asked (the plain calls only where `plain` holds, which mimalloc
// guarantees); `dealloc` and `realloc` are only given pointers that came from this allocator.
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain FFI calls with a size and a power-of-two alignment.
        unsafe {
            if plain(layout.size(), layout.align()) {
                sys::mi_malloc(layout.size()) as *mut u8
            } else {
                sys::mi_malloc_aligned(layout.size(), layout.align()) as *mut u8
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        unsafe {
            if plain(layout.size(), layout.align()) {
                sys::mi_zalloc(layout.size()) as *mut u8
            } else {
                sys::mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (GlobalAlloc's contract); mi_free takes blocks
        // from the plain and the aligned calls alike.
        unsafe { sys::mi_free(ptr as *mut c_void) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`; the new block keeps the
        // alignment: plain only when it is satisfied for the new size too.
        unsafe {
            if plain(new_size, layout.align()) {
                sys::mi_realloc(ptr as *mut c_void, new_size) as *mut u8
            } else {
                sys::mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size class from 1 byte to 64 KiB (and the sizes around each power of two), with
    /// every alignment from 1 to 4 KiB: the block is aligned, writable over its whole size, and
    /// keeps its bytes through growing and shrinking reallocations.
    #[test]
    fn blocks_are_aligned_and_keep_their_bytes_through_realloc() {
        let a = MiMalloc;
        let mut sizes: Vec<usize> = (1..=300).collect();
        for shift in 4..=16 {
            let p = 1usize << shift;
            sizes.extend([p - 1, p, p + 1, p + p / 2, p + 15]);
        }
        for &size in &sizes {
            for shift in 0..=12 {
                let align = 1usize << shift;
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size; every block is freed with its own layout.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null(), "{size} bytes aligned {align}");
                    assert_eq!(p as usize % align, 0, "{size} bytes aligned {align}");
                    for i in 0..size {
                        p.add(i).write(i as u8);
                    }
                    let grown = size * 3 + 17;
                    let q = a.realloc(p, layout, grown);
                    assert!(!q.is_null());
                    assert_eq!(q as usize % align, 0, "grown to {grown}, aligned {align}");
                    for i in 0..size {
                        assert_eq!(q.add(i).read(), i as u8, "byte {i} after growing");
                    }
                    let big = Layout::from_size_align(grown, align).unwrap();
                    let shrunk = size.div_ceil(2);
                    let r = a.realloc(q, big, shrunk);
                    assert!(!r.is_null());
                    assert_eq!(r as usize % align, 0, "shrunk to {shrunk}, aligned {align}");
                    for i in 0..shrunk {
                        assert_eq!(r.add(i).read(), i as u8, "byte {i} after shrinking");
                    }
                    a.dealloc(r, Layout::from_size_align(shrunk, align).unwrap());

                    let z = a.alloc_zeroed(layout);
                    assert!(!z.is_null());
                    assert_eq!(z as usize % align, 0);
                    assert!((0..size).all(|i| z.add(i).read() == 0), "zeroed {size}");
                    a.dealloc(z, layout);
                }
            }
        }
    }

    /// The rule itself: plain calls only where mimalloc's guarantee covers the alignment.
    #[test]
    fn plain_calls_only_within_the_default_alignment() {
        assert!(plain(16, 16));
        assert!(plain(3000, 8));
        assert!(plain(8, 8));
        assert!(!plain(8, 16), "an 8-byte block is only 8-aligned");
        assert!(!plain(4096, 32));
        assert!(!plain(256, 128));
    }
}
