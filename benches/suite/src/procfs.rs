//! A process's memory and CPU from Linux's `/proc` (proc(5)), and a sampler that records
//! RSS over time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Clock ticks per second of `utime`/`stime` in `/proc/PID/stat` (`sysconf(_SC_CLK_TCK)`;
/// 100 on every Linux architecture the suite runs on).
pub const CLOCK_TICKS: f64 = 100.0;

/// Resident memory of a process, in bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Memory {
    /// `VmRSS`: resident now.
    pub rss: u64,
    /// `VmHWM`: the peak resident size so far.
    pub hwm: u64,
}

/// `VmRSS` and `VmHWM` of `pid`; `None` once the process is gone.
pub fn memory(pid: u32) -> Option<Memory> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    Some(Memory {
        rss: field("VmRSS:")?,
        hwm: field("VmHWM:")?,
    })
}

/// User + system CPU seconds `pid` has used (fields 14 and 15 of `/proc/PID/stat`).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces: split after it.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / CLOCK_TICKS)
}

/// Open file descriptors of `pid` (entries of `/proc/PID/fd`); `None` once it is gone.
pub fn open_fds(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// One RSS sample: seconds since the sampler started, bytes.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Seconds since [`Sampler::start`].
    pub t: f64,
    /// `VmRSS` in bytes.
    pub rss: u64,
}

/// The mean RSS in bytes of the samples taken at or after `from` seconds (the steady window
/// after a sync); `None` when there are none.
pub fn mean_rss_since(samples: &[Sample], from: f64) -> Option<f64> {
    let tail: Vec<f64> = samples
        .iter()
        .filter(|s| s.t >= from)
        .map(|s| s.rss as f64)
        .collect();
    crate::stats::mean(&tail)
}

/// Samples a process's RSS every `every` on a thread of its own until stopped or the process
/// is gone.
pub struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    started: Instant,
}

impl Sampler {
    /// Starts sampling `pid`.
    pub fn start(pid: u32, every: Duration) -> Sampler {
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let (s, st) = (samples.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let Some(m) = memory(pid) else { break };
                s.lock().unwrap_or_else(|p| p.into_inner()).push(Sample {
                    t: started.elapsed().as_secs_f64(),
                    rss: m.rss,
                });
                std::thread::sleep(every);
            }
        });
        Sampler {
            samples,
            stop,
            thread: Some(thread),
            started,
        }
    }

    /// Seconds since the sampler started.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The samples so far.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops sampling and returns every sample.
    pub fn stop(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.samples()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's CPU time (user + system, every thread) from the kernel's clock, not
    /// from `/proc`.
    fn process_cpu_clock() -> f64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the call's duration.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
        ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
    }

    #[test]
    fn reads_its_own_memory_and_cpu() {
        let me = std::process::id();
        let m = memory(me).expect("own /proc/self/status");
        assert!(m.rss > 0 && m.hwm >= m.rss);
        assert!(memory(u32::MAX).is_none());
        assert!(cpu_seconds(u32::MAX).is_none());

        // Burn half a CPU-second (by the kernel's process CPU clock), bracketing the two
        // reads of /proc: what `cpu_seconds` says was used meanwhile must match that clock
        // to within a few clock ticks (the kernel derives utime + stime from the same
        // runtime, in ticks). Wrong fields, a wrong tick rate or a value that does not move
        // all fail here; a bounded wall-clock deadline keeps a starved machine from hanging.
        let clock0 = process_cpu_clock();
        let proc0 = cpu_seconds(me).expect("own /proc/self/stat");
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut x = 0u64;
        while process_cpu_clock() - clock0 < 0.5 {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            assert!(
                Instant::now() < deadline,
                "burning 0.5 CPU-seconds took over 60 s"
            );
        }
        let proc1 = cpu_seconds(me).expect("own /proc/self/stat");
        let clock1 = process_cpu_clock();
        let (by_proc, by_clock) = (proc1 - proc0, clock1 - clock0);
        assert!(
            by_clock >= 0.5 && (by_proc - by_clock).abs() <= 0.1,
            "cpu_seconds moved by {by_proc:.3} s while the process CPU clock moved by {by_clock:.3} s"
        );
    }
}
