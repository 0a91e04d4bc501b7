//! The allocator's settings. skiff stays on glibc's malloc (mimalloc and jemalloc measured
//! slower on TPC-H, docs/performance.md) but changes two of its thresholds.
//!
//! By default glibc serves a buffer over 128 KiB with its own `mmap` and, freeing memory,
//! gives back to the kernel whatever lies above its trim threshold. A scan's column buffers are
//! a few hundred KiB to a few MiB, made and dropped once a batch, so each batch faulted its pages
//! in afresh: 38% of a selective TPC-H scan's time was page faults and `madvise`.

/// Sets the thresholds, unless the environment sets glibc's own (`GLIBC_TUNABLES`), which then
/// stand as given: that is the off switch. Called before any thread starts.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("GLIBC_TUNABLES").is_none() {
        // glibc's largest mmap threshold on 64-bit: buffers up to it come from the arenas.
        const MMAP_THRESHOLD: i32 = 32 << 20;
        // Free memory an arena keeps before handing it back.
        const TRIM_THRESHOLD: i32 = 128 << 20;
        // SAFETY: mallopt changes allocator parameters; no allocation is in flight on another
        // thread, as none has started yet.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    }
}
