//! kubesink's benchmark suite (`scripts/bench.sh`, `BENCHMARKS.md`): the driver
//! `bench-suite` and its two comparison programs, `baseline-reflector` (an ordinary informer)
//! and `parse-floor` (parse + write of the same stream, nothing else).
//!
//! The driver starts every process itself: `kubesink-sim` with realistic pods, `kubesink run`
//! with a generated configuration, the comparison programs, nats-server and tansu on free
//! ports. It measures from outside, as an operator would: RSS from `/proc/PID/status`, CPU
//! from `/proc/PID/stat`, progress from kubesink's `/metrics` or from output lines. Nothing
//! here asserts a figure: benchmarks are not tests.
//!
//! This library holds the driver's parts: [`procfs`] (RSS and CPU of a process),
//! [`http`] (a minimal HTTP/1.1 client for `/metrics` and the simulator's admin endpoints),
//! [`plot`] (the RSS-over-time PNG), [`procs`] (the processes it starts) and [`stats`]
//! (percentiles).

pub mod http;
pub mod plot;
pub mod procfs;
pub mod procs;
pub mod stats;
