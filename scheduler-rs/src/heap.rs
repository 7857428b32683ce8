//! The router's heap under glibc: huge inputs (a 100k-token prompt is megabytes of JSON,
//! text and tokenizer state) must not leave their memory parked in the allocator for good.
//!
//! NOTE: glibc serves an allocation from `mmap` (given back on free) only above a threshold
//! that, by default, rises to the size of every mmapped chunk freed (up to 32 MiB): after one
//! huge prompt, the next huge prompt's buffers land in the heap arenas, which glibc does not
//! shrink while anything above them is live. Each tokio worker thread has its own arena, so
//! RSS crept up with every round of huge prompts. A fixed threshold keeps big buffers on
//! `mmap`, and a trim after a big input hands the arenas' free tops and pages back.

/// Allocations at least this large always come from `mmap` (given back when freed).
pub const MMAP_THRESHOLD: usize = 1 << 20;

/// A request body at least this large trims the heap once it has been answered.
pub const TRIM_AFTER_BYTES: usize = 256 * 1024;

/// Fix glibc's mmap threshold at [`MMAP_THRESHOLD`] (which also stops it adapting). Call once
/// at start, before the runtime's threads exist. A no-op off glibc.
pub fn init() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let threshold = libc::c_int::try_from(MMAP_THRESHOLD).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only sets an allocator parameter; any value is valid to pass.
        let ok = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, threshold) };
        if ok != 1 {
            tracing::debug!("mallopt(M_MMAP_THRESHOLD) refused");
        }
    }
}

/// Give the free memory of every glibc arena back to the system. A no-op off glibc.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes the arenas' locks itself; it may run on any thread.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

/// Trim after an input of `bytes` when it is big enough to have grown the heap.
pub fn trim_after(bytes: usize) {
    if bytes >= TRIM_AFTER_BYTES {
        trim();
    }
}
