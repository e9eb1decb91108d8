//! Wall-clock time as Unix milliseconds, the form kubesink's atomic timestamps take
//! (`failing_since_ms`, `last_event_ms`, `last_save_ms`, ...; 0 means "none").

use std::time::{SystemTime, UNIX_EPOCH};

/// `t` as milliseconds since the Unix epoch; 0 before the epoch, `u64::MAX` past its range.
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Now, as milliseconds since the Unix epoch ([`unix_ms`]).
pub fn now_ms() -> u64 {
    unix_ms(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn unix_ms_counts_from_the_epoch_and_saturates() {
        assert_eq!(unix_ms(UNIX_EPOCH), 0);
        assert_eq!(unix_ms(UNIX_EPOCH + Duration::from_millis(1_234)), 1_234);
        assert!(now_ms() > 1_700_000_000_000);
    }
}
