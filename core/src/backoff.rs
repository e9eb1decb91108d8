//! The one retry policy of kubesink: capped exponential backoff with jitter, built on the
//! `backon` crate. The pipeline's sink retries, API discovery, the sinks' readiness probe and
//! the NATS reconnect delay all use it, so "how long until the next try" is defined once.
//!
//! Jitter stays inside the cap: each delay is `initial · 2ⁿ`, jittered by backon (which adds
//! up to one more delay on top), then clamped to `max`. A configured cap is therefore a real
//! upper bound on every wait, which is what an operator reading `retry_max_backoff` expects.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// Capped exponential backoff: `initial`, doubling per failure, never above `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The first delay.
    pub initial: Duration,
    /// The cap of every delay, jitter included.
    pub max: Duration,
    /// Whether delays are jittered (spread randomly, still within the cap) so that many
    /// clients failing together do not retry in lockstep.
    pub jitter: bool,
}

impl Backoff {
    /// A jittered policy from `initial` to `max`.
    pub const fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            jitter: true,
        }
    }

    /// The same policy without jitter (deterministic delays, for reconnect callbacks that
    /// are called with an attempt number, and for tests).
    pub const fn without_jitter(self) -> Self {
        Backoff {
            jitter: false,
            ..self
        }
    }

    /// The delays of successive failures, forever: each in `[initial, max]` (`[0, max]`
    /// when `initial` is zero).
    pub fn delays(&self) -> impl Iterator<Item = Duration> + Send + Sync + 'static {
        let mut b = ExponentialBuilder::default()
            .with_min_delay(self.initial)
            .with_max_delay(self.max.max(self.initial))
            .without_max_times();
        if self.jitter {
            b = b.with_jitter();
        }
        let max = self.max;
        // backon computes in floating point (800 ms comes out as 800.000012 ms): keep whole
        // microseconds.
        b.build()
            .map(move |d| Duration::from_micros(d.as_micros() as u64).min(max))
    }

    /// The delay before attempt `attempt` (0-based): `min(initial · 2^attempt, max)`, with
    /// jitter when enabled.
    pub fn delay(&self, attempt: usize) -> Duration {
        self.delays().nth(attempt).unwrap_or(self.max)
    }
}

/// Retries `op` with `backoff` until it succeeds or `retry` says the error is final.
/// `on_retry(error, delay)` is called before each wait (log there).
///
/// # Errors
/// The first error for which `retry` returns `false`.
pub async fn retry<T, E, Fut>(
    backoff: Backoff,
    mut op: impl FnMut() -> Fut,
    retry: impl Fn(&E) -> bool,
    mut on_retry: impl FnMut(&E, Duration),
) -> Result<T, E>
where
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut delays = backoff.delays();
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if retry(&e) => {
                let delay = delays.next().unwrap_or(backoff.max);
                on_retry(&e, delay);
                tokio::time::sleep(delay).await;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_without_jitter() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5)).without_jitter();
        let d: Vec<u128> = b.delays().take(8).map(|d| d.as_millis()).collect();
        assert_eq!(d, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(b.delay(3), Duration::from_millis(800));
        assert_eq!(b.delay(1000), Duration::from_secs(5));
    }

    #[test]
    fn jitter_never_exceeds_the_cap() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        for d in b.delays().take(2000) {
            assert!(d <= Duration::from_secs(2), "{d:?}");
            assert!(d >= Duration::from_millis(100), "{d:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retry_stops_at_success_or_a_final_error() {
        let b = Backoff::new(Duration::from_millis(10), Duration::from_millis(40));
        let mut calls = 0;
        let mut waits = Vec::new();
        let r: Result<u32, &str> = retry(
            b,
            || {
                calls += 1;
                let n = calls;
                async move {
                    if n < 4 {
                        Err("again")
                    } else {
                        Ok(n)
                    }
                }
            },
            |e| *e == "again",
            |_, d| waits.push(d),
        )
        .await;
        assert_eq!(r, Ok(4));
        assert_eq!(waits.len(), 3);
        let r: Result<u32, &str> =
            retry(b, || async { Err("final") }, |e| *e == "again", |_, _| {}).await;
        assert_eq!(r, Err("final"));
    }
}
