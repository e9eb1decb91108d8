//! When the librdkafka producer must be replaced by a new one with the same properties: a
//! pure step from what the service saw of the current producer to its next state and
//! whether to rebuild, tested row by row. It does no I/O; `service.rs` feeds it and acts.
//!
//! Why a producer can be unusable while the brokers answer: the idempotent producer's
//! state (producer id, epoch, sequence numbers per partition) lives on the broker too, and a
//! broker can lose it: real Kafka expires an idle producer's id after
//! `producer.id.expiration.ms` (one day by default, KIP-854) and forgets it with a deleted or
//! re-created topic; a broker restarted without its state (tansu on its memory engine)
//! forgets every id. librdkafka then either raises a fatal error (`rd_kafka_fatal_error`),
//! reports the broker's error in delivery reports, or, for `UNKNOWN_PRODUCER_ID` on a record
//! that was never retried, bumps the epoch locally and retries (KIP-360's recovery for the
//! idempotent producer, `rdkafka_request.c`), which a broker that does not know the id at all
//! answers with `UNKNOWN_PRODUCER_ID` again: the producer loops until `message.timeout.ms`,
//! every record ends `Message timed out`, and retrying into the same producer loops again.
//! A new producer asks for a new id (InitProducerId) and delivers at once.
//!
//! Must never ask for a rebuild because the brokers are unreachable (librdkafka's reconnects
//! cure that, a new producer would not), nor for a failure that says nothing about the
//! producer (authorization, unknown topic, oversize).

/// Sends of the current producer in a row in which every failed record timed out while the
/// brokers answered a metadata request, before it is replaced. One: librdkafka has already
/// retried each of those records for a whole `message_timeout`; a second full timeout in the
/// same producer would only double the wait.
pub const TIMED_OUT_SENDS_BEFORE_REBUILD: u32 = 1;

/// Epoch bumps of the current producer since its last successful delivery (librdkafka's
/// statistics, `eos.producer_epoch`) that mean the brokers keep rejecting its producer id.
/// librdkafka bumps the epoch once per recovery (an `UNKNOWN_PRODUCER_ID`, skipped sequence
/// numbers, or records that timed out); against a broker that does not know the id it bumps
/// about thirty times a second (measured with tansu 0.6).
pub const EPOCH_BUMPS_BEFORE_REBUILD: i64 = 10;

/// What the service saw of the current producer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A send whose records were all delivered.
    Delivered,
    /// A delivery report or librdkafka fatal error saying the broker lost or fenced this
    /// producer's id, epoch or sequence state (`service.rs::needs_new_producer`): why.
    StateLost(String),
    /// A send in which every failed record timed out (`MSG_TIMED_OUT`); `brokers_answer`: a
    /// metadata request right after it succeeded.
    TimedOut {
        /// The brokers answered a metadata request after the send.
        brokers_answer: bool,
    },
    /// librdkafka's statistics: the producer's epoch was bumped `bumps` times since its last
    /// successful delivery (librdkafka also bumps it once after records time out, so a long
    /// outage adds bumps too: hence `brokers_answer`).
    EpochBumps {
        /// The producer id the broker keeps rejecting.
        producer_id: i64,
        /// Epoch bumps since the last successful delivery.
        bumps: i64,
        /// The brokers answered a metadata request right after.
        brokers_answer: bool,
    },
    /// Any other failed send (brokers down, authorization, unknown topic, oversize): says
    /// nothing about the producer's id.
    OtherFailure,
}

/// The current producer's state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ProducerHealth {
    /// Delivering, or failing for reasons a new producer would not cure.
    #[default]
    Delivering,
    /// Sends timed out while the brokers answered, fewer than
    /// [`TIMED_OUT_SENDS_BEFORE_REBUILD`] in a row.
    TimingOut {
        /// Such sends in a row.
        sends: u32,
    },
    /// Replaced by a new producer because of `reason`; not ready until the new producer
    /// delivers.
    Replaced {
        /// Why the previous producer was replaced.
        reason: String,
        /// Sends of the new producer that timed out while the brokers answered.
        timed_out_sends: u32,
    },
}

impl ProducerHealth {
    /// The next state after `seen`, and `Some(reason)` when the producer must be replaced
    /// now.
    pub fn step(&self, seen: Seen) -> (ProducerHealth, Option<String>) {
        use ProducerHealth as H;
        let rebuild = |reason: String| {
            (
                H::Replaced {
                    reason: reason.clone(),
                    timed_out_sends: 0,
                },
                Some(reason),
            )
        };
        match (self, seen) {
            (_, Seen::Delivered) => (H::Delivering, None),
            (_, Seen::StateLost(why)) => rebuild(why),
            (
                _,
                Seen::EpochBumps {
                    producer_id,
                    bumps,
                    brokers_answer: true,
                },
            ) if bumps >= EPOCH_BUMPS_BEFORE_REBUILD => {
                rebuild(format!(
                    "the brokers keep rejecting producer id {producer_id}: librdkafka bumped its epoch {bumps} times without a delivery (UNKNOWN_PRODUCER_ID: the broker lost the idempotent producer's state)"
                ))
            }
            (_, Seen::TimedOut { brokers_answer: true }) => {
                let sends = match self {
                    H::Delivering => 1,
                    H::TimingOut { sends } => sends + 1,
                    H::Replaced {
                        timed_out_sends, ..
                    } => timed_out_sends + 1,
                };
                if sends >= TIMED_OUT_SENDS_BEFORE_REBUILD {
                    rebuild(format!(
                        "{sends} send(s) in a row timed out (message_timeout) while the brokers answered metadata requests"
                    ))
                } else if let H::Replaced { reason, .. } = self {
                    (
                        H::Replaced {
                            reason: reason.clone(),
                            timed_out_sends: sends,
                        },
                        None,
                    )
                } else {
                    (H::TimingOut { sends }, None)
                }
            }
            (
                _,
                Seen::TimedOut {
                    brokers_answer: false,
                }
                | Seen::OtherFailure
                | Seen::EpochBumps { .. },
            ) => (self.clone(), None),
        }
    }

    /// Why the sink is not ready because of its producer, while it is not.
    pub fn problem(&self) -> Option<String> {
        match self {
            ProducerHealth::Replaced { reason, .. } => Some(format!(
                "the Kafka producer was replaced by a new one ({reason}); not ready until the new producer delivers"
            )),
            ProducerHealth::Delivering | ProducerHealth::TimingOut { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ProducerHealth as H;

    fn replaced(reason: &str) -> H {
        H::Replaced {
            reason: reason.into(),
            timed_out_sends: 0,
        }
    }

    const UP: Seen = Seen::TimedOut {
        brokers_answer: true,
    };
    const DOWN: Seen = Seen::TimedOut {
        brokers_answer: false,
    };

    #[test]
    fn a_delivery_makes_any_state_healthy_and_ready() {
        for s in [H::Delivering, H::TimingOut { sends: 3 }, replaced("x")] {
            assert_eq!(s.step(Seen::Delivered), (H::Delivering, None));
        }
        assert_eq!(H::Delivering.problem(), None);
    }

    #[test]
    fn lost_producer_state_rebuilds_at_once_and_is_not_ready_until_a_delivery() {
        let (next, rebuild) = H::Delivering.step(Seen::StateLost("UNKNOWN_PRODUCER_ID".into()));
        assert_eq!(rebuild.as_deref(), Some("UNKNOWN_PRODUCER_ID"));
        assert!(next.problem().unwrap().contains("UNKNOWN_PRODUCER_ID"));
        // The new producer loses it too: replaced again.
        let (_, again) = next.step(Seen::StateLost("PRODUCER_FENCED".into()));
        assert_eq!(again.as_deref(), Some("PRODUCER_FENCED"));
    }

    /// Steps `s` with timed-out sends while the brokers answer until it rebuilds; returns
    /// how many it took and the state after.
    fn timeouts_until_rebuild(mut s: H) -> (u32, H) {
        for sends in 1..=10 {
            let (next, rebuild) = s.step(UP);
            if let Some(why) = rebuild {
                assert!(why.contains("timed out"), "{why}");
                return (sends, next);
            }
            assert_eq!(next.problem().is_some(), matches!(s, H::Replaced { .. }));
            s = next;
        }
        panic!("no rebuild after 10 timed-out sends");
    }

    #[test]
    fn timeouts_while_the_brokers_answer_rebuild_after_the_configured_count() {
        let (sends, next) = timeouts_until_rebuild(H::Delivering);
        assert_eq!(sends, TIMED_OUT_SENDS_BEFORE_REBUILD);
        assert!(matches!(next, H::Replaced { .. }));
        // The new producer times out as well: replaced again after as many.
        let (again, _) = timeouts_until_rebuild(next);
        assert_eq!(again, TIMED_OUT_SENDS_BEFORE_REBUILD);
    }

    #[test]
    fn timeouts_while_the_brokers_are_down_never_rebuild() {
        for s in [H::Delivering, H::TimingOut { sends: 7 }, replaced("x")] {
            assert_eq!(s.step(DOWN), (s.clone(), None));
        }
    }

    #[test]
    fn other_failures_change_nothing() {
        for s in [H::Delivering, H::TimingOut { sends: 1 }, replaced("x")] {
            assert_eq!(s.step(Seen::OtherFailure), (s.clone(), None));
        }
    }

    #[test]
    fn a_few_epoch_bumps_are_librdkafkas_own_recovery_many_are_a_wedge() {
        let bumps = |bumps, brokers_answer| Seen::EpochBumps {
            producer_id: 1,
            bumps,
            brokers_answer,
        };
        let few = bumps(EPOCH_BUMPS_BEFORE_REBUILD - 1, true);
        assert_eq!(H::Delivering.step(few), (H::Delivering, None));
        // Many, but the brokers are away: the bumps are librdkafka's after timeouts.
        let outage = bumps(EPOCH_BUMPS_BEFORE_REBUILD * 3, false);
        assert_eq!(H::Delivering.step(outage), (H::Delivering, None));
        let many = bumps(EPOCH_BUMPS_BEFORE_REBUILD, true);
        let (next, rebuild) = H::Delivering.step(many);
        let why = rebuild.unwrap();
        assert!(why.contains("producer id 1") && why.contains("UNKNOWN_PRODUCER_ID"));
        assert!(next.problem().is_some());
    }
}
