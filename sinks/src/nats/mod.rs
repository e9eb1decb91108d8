//! The NATS sink (core and JetStream). Placeholder until issue 3 lands: building it fails with
//! a clear error.

mod config;

pub use config::NatsConfig;
