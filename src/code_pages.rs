//! Code pages the process no longer runs: given back to the kernel after the initial sync.
//!
//! The binary's machine code and read-only data are file-backed pages, counted in the
//! process's resident set (`RssFile` in `/proc/self/status`) and in its cgroup's memory for
//! as long as they stay mapped. Measured with the simulator (`benches/memory-floor.sh`;
//! BENCHMARKS.md, "Memory: the floor and the code pages"): 17.6 MiB of code and data pages
//! are resident after start-up and the initial sync, most of them run once (configuration,
//! the clients' TLS and discovery set-up, the list path) or mapped only as neighbours of a
//! page that was (the kernel maps up to 64 KiB around each page fault:
//! `fault_around_bytes`). Given back, 7.9 MiB were resident again after 20 s of 200
//! changes/s: the watch, pipeline and sink path. At 100,000 Pods that is a third of
//! kubesink's resident memory (35.1 → 23.2 MiB steady).
//!
//! [`release`] asks the kernel to reclaim the read-only segments of the executable and its
//! shared libraries (`madvise(MADV_PAGEOUT)`, Linux 5.4 and later; `madvise(2)`): clean
//! pages, dropped without any write, and read again from the page cache (or the file) at
//! their next use, as after any reclaim under memory pressure. [`release_after_sync`] does
//! it twice: once the bridge is running (the start-up's code goes; the lists fault back
//! only what they run, which lowers the sync's peak: 37.6 → 28.8 MiB at 100,000 Pods), and
//! when every watch of the process has synced (or 5 minutes after start, whichever comes
//! first: a follower's watches do not sync until it leads); a scale-out member, for each
//! cluster it takes up. Writable pages (the heap, relocated data) are never touched. Where
//! the kernel refuses (`EINVAL` before 5.4, a sandbox without the call), nothing changes and
//! the refusal is logged at DEBUG.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::informer::InformerStats;

/// How long [`release_after_sync`] waits for every watch to sync before it releases anyway.
pub const RELEASE_DEADLINE: Duration = Duration::from_secs(300);

/// How often [`release_after_sync`] looks at the watches.
const POLL: Duration = Duration::from_secs(1);

/// What [`release`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Bytes of read-only segments the kernel was asked to reclaim and accepted.
    pub bytes: u64,
    /// Segments whose `madvise` failed (left as they were).
    pub refused: u32,
    /// The first `errno` of a refusal, if any.
    pub errno: Option<i32>,
}

/// Asks the kernel to reclaim the pages of every read-only loaded segment of the
/// executable and its shared libraries (not the vDSO). Never fails: a segment the kernel
/// refuses is counted in [`Released::refused`].
#[cfg(target_os = "linux")]
pub fn release() -> Released {
    /// Called by `dl_iterate_phdr` once per loaded object, the executable first.
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `dl_iterate_phdr` passes a valid `dl_phdr_info` for the call's duration,
        // and `data` is the `Released` `release` passed, borrowed by nothing else.
        let (info, out) = unsafe { (&*info, &mut *data.cast::<Released>()) };
        if !info.dlpi_name.is_null() {
            // SAFETY: a non-null `dlpi_name` is a NUL-terminated string of the loader's.
            let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) };
            if name.to_bytes().windows(4).any(|w| w == b"vdso") {
                return 0;
            }
        }
        let page = page_size();
        for i in 0..usize::from(info.dlpi_phnum) {
            // SAFETY: `dlpi_phdr` points at `dlpi_phnum` program headers.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type != libc::PT_LOAD || ph.p_flags & libc::PF_W != 0 || ph.p_memsz == 0 {
                continue;
            }
            let start = info.dlpi_addr.wrapping_add(ph.p_vaddr);
            // Whole pages only: a segment's first and last page may hold a writable
            // neighbour's bytes, which the kernel would skip anyway (dirty, anonymous).
            let begin = start.div_ceil(page) * page;
            let end = (start + ph.p_memsz) / page * page;
            if end <= begin {
                continue;
            }
            let len = end - begin;
            // SAFETY: the range is whole pages of a segment the loader mapped, which stays
            // mapped for the process's life; MADV_PAGEOUT only drops clean pages, which the
            // kernel reads back at their next access; it changes no content.
            let rc = unsafe {
                libc::madvise(
                    begin as usize as *mut libc::c_void,
                    len as usize,
                    libc::MADV_PAGEOUT,
                )
            };
            if rc == 0 {
                out.bytes += len;
            } else {
                out.refused += 1;
                out.errno
                    .get_or_insert(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
        }
        0
    }
    let mut out = Released::default();
    // SAFETY: `each` matches the callback's signature and only reads what it is given;
    // `out` outlives the call.
    unsafe {
        libc::dl_iterate_phdr(Some(each), (&raw mut out).cast());
    }
    out
}

/// Elsewhere nothing is released.
#[cfg(not(target_os = "linux"))]
pub fn release() -> Released {
    Released::default()
}

#[cfg(target_os = "linux")]
fn page_size() -> u64 {
    // SAFETY: `sysconf` reads a constant of the system.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|s| *s > 0).unwrap_or(4096)
}

/// [`release`]s at once (the start-up's code), then again once every watch in `watches`
/// has synced (or at [`RELEASE_DEADLINE`]: the initial sync's code); logs what it did at
/// DEBUG.
pub async fn release_after_sync(watches: Vec<Arc<InformerStats>>) {
    // The start-up's own code (configuration, clients, discovery) first: the lists to come
    // fault back only the pages they run, which lowers the peak of the initial sync.
    release_logged("start-up").await;
    let started = tokio::time::Instant::now();
    let mut poll = tokio::time::interval(POLL);
    loop {
        poll.tick().await;
        let synced = watches.iter().all(|w| w.synced.load(Ordering::Relaxed));
        if synced || started.elapsed() >= RELEASE_DEADLINE {
            break;
        }
    }
    release_logged("the initial sync").await;
}

/// [`release`] on a blocking thread, logged at DEBUG as the code pages of `what`.
async fn release_logged(what: &str) {
    let released = tokio::task::spawn_blocking(release)
        .await
        .unwrap_or_default();
    tracing::debug!(
        bytes = released.bytes,
        refused = released.refused,
        errno = ?released.errno,
        "gave the code pages of {what} back to the kernel (MADV_PAGEOUT)"
    );
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Resident file-backed pages of this process, in kB.
    fn rss_file_kb() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("RssFile:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn released_code_pages_leave_the_resident_set_and_the_code_still_runs() {
        let before = rss_file_kb();
        let released = release();
        assert!(released.bytes > 0, "{released:?}");
        let after = rss_file_kb();
        eprintln!("RssFile {before} kB → {after} kB after {released:?}");
        assert!(after < before, "RssFile {before} kB → {after} kB");
        // The code runs on: its pages come back on use.
        assert_eq!(format!("{}", 6 * 7), "42");
        assert!(rss_file_kb() > 0);
    }
}
