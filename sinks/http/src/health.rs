//! What a sink that learns its destination's state only from its requests' answers (HTTP,
//! OTLP) tells `/readyz` and the log: an outage of retryable failures (no answer, 408, 429,
//! 5xx) as the brokers' sinks tell it ([`Outage`]: one WARN at its start, a summary a minute,
//! one INFO at its end; "unreachable" without an answer, "answers with errors" with one), and an answer that needs an operator (401, 403, 404…) until the next
//! 2xx. Every change of readiness bumps [`Health::signal`] ([`kubesink_core::Sink::health_signal`]),
//! so the readiness probe looks again at once instead of at its next interval.

use std::sync::{Mutex, PoisonError};

use kubesink_core::{Outage, ReadySignal, SinkError};

use crate::Failure;

/// How long [`Health::listens_again`] waits for a TCP connection.
pub const LISTENS_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// The readiness of one sink, from its requests' answers.
pub struct Health {
    outage: Outage,
    /// The last answer that needs an operator, until a 2xx.
    fatal: Mutex<Option<String>>,
    signal: ReadySignal,
}

impl Health {
    /// The health of sink `name` sending to `what` (`"HTTP receiver"`, `"OTLP endpoint"`);
    /// `retrying` says how requests are retried, for the outage's first line.
    pub fn new(name: &str, what: &'static str, retrying: &'static str) -> Self {
        Health {
            outage: Outage::new(name, what, retrying),
            fatal: Mutex::new(None),
            signal: ReadySignal::new(),
        }
    }

    fn fatal(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.fatal.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records how one request ended. A refused or too large body says nothing about the
    /// destination's health.
    pub fn record(&self, result: &Result<(), Failure>) {
        match result {
            Ok(()) => {
                let was_fatal = self.fatal().take().is_some();
                if self.outage.recovered() || was_fatal {
                    self.signal.notify();
                }
            }
            Err(Failure::Retry {
                message, status, ..
            }) => {
                let was_down = self.outage.is_down();
                // An answer (5xx, 429…) is a receiver refusing, not one out of reach.
                match status {
                    Some(_) => self.outage.failed_answering(message),
                    None => self.outage.failed(message),
                }
                if !was_down {
                    self.signal.notify();
                }
            }
            Err(Failure::Fatal { message }) => {
                if self.fatal().replace(message.clone()).is_none() {
                    self.signal.notify();
                }
            }
            Err(Failure::Refused { .. } | Failure::TooLarge { .. }) => {}
        }
    }

    /// Readiness: an error while an answer that needs an operator stands, or while requests
    /// fail (`url` names the destination).
    ///
    /// # Errors
    /// Why the sink is not ready.
    pub fn check(&self, sink: &str, url: &reqwest::Url) -> Result<(), SinkError> {
        if let Some(message) = self.fatal().clone() {
            return Err(SinkError::fatal(sink, message));
        }
        if self.outage.is_down() {
            return Err(SinkError::transient(
                sink,
                format!(
                    "the last {} requests to {url} failed",
                    self.outage.failures()
                ),
            ));
        }
        Ok(())
    }

    /// While requests get no answer at all (an outage of a receiver out of reach, nothing
    /// that needs an operator): whether the destination of `url` accepts a TCP connection
    /// again (within [`LISTENS_WITHIN`]). Then the healthcheck passes and the readiness probe
    /// (1 s doubling up to `server.sink_check_interval` while not ready) ends the pipeline's
    /// retry backoff: delivery resumes within a probe of the receiver's return instead of
    /// after up to `pipeline.retry_max_backoff`, and its first request says whether it
    /// answers. A receiver that answers with errors listens all along: its `health_url`
    /// tells when it is well again. A connection opened and closed, nothing sent.
    pub async fn listens_again(&self, url: &reqwest::Url) -> bool {
        if !self.outage.is_unanswered() || self.fatal().is_some() {
            return false;
        }
        let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            return false;
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        matches!(
            tokio::time::timeout(LISTENS_WITHIN, tokio::net::TcpStream::connect((host, port)))
                .await,
            Ok(Ok(_))
        )
    }

    /// The signal bumped whenever readiness changes.
    pub fn signal(&self) -> ReadySignal {
        self.signal.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_follows_the_answers_and_each_change_bumps_the_signal() {
        let h = Health::new("hook", "HTTP receiver", "retrying");
        let url = reqwest::Url::parse("http://r/").unwrap();
        let signal = h.signal();
        let retry = || Failure::Retry {
            message: "refused".into(),
            retry_after: None,
            status: None,
        };
        h.record(&Ok(()));
        assert_eq!(signal.generation(), 0, "ready stays ready: no bump");
        h.record(&Err(retry()));
        assert_eq!(signal.generation(), 1);
        assert!(h.check("hook", &url).is_err());
        h.record(&Err(retry()));
        assert_eq!(signal.generation(), 1, "still down: no bump");
        h.record(&Err(Failure::Refused {
            message: "400".into(),
        }));
        h.record(&Ok(()));
        assert_eq!(signal.generation(), 2, "ready again at the first 2xx");
        h.check("hook", &url).unwrap();
        h.record(&Err(Failure::Fatal {
            message: "401".into(),
        }));
        assert!(h.check("hook", &url).unwrap_err().is_fatal());
        assert_eq!(signal.generation(), 3);
        h.record(&Ok(()));
        assert_eq!(signal.generation(), 4);
        h.check("hook", &url).unwrap();
    }
}
