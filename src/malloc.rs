//! The allocator's settings. skiff stays on glibc's malloc (mimalloc and jemalloc measured
//! slower on TPC-H, docs/performance.md) but changes two of its thresholds, and gives freed
//! memory back when no query runs.
//!
//! By default glibc serves a buffer over 128 KiB with its own `mmap` and, freeing memory,
//! gives back to the kernel whatever lies above its trim threshold. A scan's column buffers are
//! a few hundred KiB to a few MiB, made and dropped once a batch, so each batch faulted its pages
//! in afresh: 38% of a selective TPC-H scan's time was page faults and `madvise`.

/// Whether skiff tunes the allocator: not when the environment sets glibc's own settings
/// (`GLIBC_TUNABLES`), which then stand as given. That is the off switch of both.
fn tuned() -> bool {
    cfg!(all(target_os = "linux", target_env = "gnu")) && std::env::var_os("GLIBC_TUNABLES").is_none()
}

/// Sets the thresholds. Called before any thread starts.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if tuned() {
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

/// What the engine runs when the last running query ends: glibc keeps the memory a query
/// freed in the middle of its heaps (the trim threshold only returns what lies at their top).
/// At TPC-H scale factor 10 a server that had run q09 and q10 held 1.3 GB when idle, and q18
/// then peaked 1.3 GB higher than on a fresh server. Past [`KEEP`] resident, `malloc_trim`
/// returns every free page.
pub fn when_idle() -> Option<fn()> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if tuned() {
        return Some(|| {
            if resident().is_some_and(|r| r > KEEP) {
                // SAFETY: malloc_trim only takes the allocator's own locks.
                unsafe { libc::malloc_trim(0) };
            }
        });
    }
    None
}

/// What a server may keep resident between queries. Below it the next query reuses the
/// pages warm: trimming after every query, the Worker's kinds at 10M events (300 MiB
/// resident) took 5–10% longer, faulting their pages in again.
const KEEP: usize = 512 << 20;

/// This process's resident memory (`/proc/self/statm`), in bytes.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn resident() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * usize::try_from(page).ok()?)
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// Memory freed between blocks still held stays resident until the hook runs.
    #[test]
    fn the_idle_hook_returns_freed_memory_past_what_is_kept() {
        let Some(hook) = when_idle() else {
            assert!(std::env::var_os("GLIBC_TUNABLES").is_some());
            return;
        };
        // 64 KiB blocks come from the heap (under glibc's default mmap threshold of 128 KiB).
        let mut blocks: Vec<Vec<u8>> = (0..16_000).map(|_| vec![1u8; 64 << 10]).collect();
        // Every fourth block stays, so what is freed lies between blocks in use, below the top.
        let mut i = 0;
        blocks.retain(|_| {
            i += 1;
            i % 4 == 0
        });
        let before = resident().unwrap();
        assert!(before > KEEP, "{before} bytes resident");
        hook();
        let after = resident().unwrap();
        assert!(after + (400 << 20) < before, "resident {before} before the hook, {after} after");
        assert_eq!(blocks.len(), 4_000);
    }
}
