//! Free TCP ports on 127.0.0.1 for the brokers the tests start (and for the proxy in front of
//! tansu), chosen so that nothing else takes them between the choice and the bind, and so that
//! a port a test takes down and brings back is still free when it comes back.
//!
//! A port from `bind(127.0.0.1:0)` is in the kernel's ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`, 32768–60999 on Linux by default), so once the
//! probe socket is closed the kernel may hand it out again: as another test's `bind(0)`, or as
//! the source port of any outgoing connection. It can even be the source port of a client
//! retrying a connection to that very port while its server is down, which then connects to
//! itself (TCP simultaneous open) and holds it. Tests running in parallel in one binary hit the
//! first case (`AddrInUse` on the proxy's bind in `tests/kafka.rs`). So ports are drawn at random
//! from outside the ephemeral range, checked free by binding, never 4222 (the machine's NATS),
//! and never handed out twice by this process. A server in the test's own process takes the
//! bound listener itself ([`free_listener`]), so there is no window at all.
//!
//! One copy per test binary, so one set of ports handed out: this module lives in the
//! test-support crate, which cargo links once into each binary (the brokers' modules and the
//! proxy of this crate all draw from it). The benchmark suite (`benches/suite`), which
//! includes this file by path beside `kube_server.rs`, declares it once at its root.

use std::collections::BTreeSet;
use std::hash::{BuildHasher, RandomState};
use std::net::TcpListener;
use std::sync::Mutex;

/// The ports this process has handed out.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// A TCP port on 127.0.0.1 that is free now, outside the ephemeral range where the machine
/// leaves room for one (else from `bind(0)`), not 4222, and not returned before by this process:
/// for a server the test starts as another process.
///
/// Panics when no port can be found (a test set-up failure).
pub fn free_port() -> u16 {
    free_listener()
        .local_addr()
        .expect("a bound listener's address")
        .port()
}

/// A listener on 127.0.0.1 bound to a port chosen as [`free_port`] chooses it, for a server
/// in the test's own process: it holds the port from the moment it is chosen.
///
/// Panics when no port can be found (a test set-up failure).
pub fn free_listener() -> TcpListener {
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    let usable = |p: u16| p != 4222 && !handed.contains(&p);
    let bound = match outside_ephemeral() {
        Some((lo, hi)) => (0..100_000).find_map(|_| {
            let span = u64::from(hi - lo) + 1;
            let p = lo + (RandomState::new().hash_one(0u8) % span) as u16;
            usable(p)
                .then(|| TcpListener::bind(("127.0.0.1", p)).ok())
                .flatten()
        }),
        None => (0..1_000).find_map(|_| {
            let l = TcpListener::bind("127.0.0.1:0").ok()?;
            usable(l.local_addr().ok()?.port()).then_some(l)
        }),
    };
    let l = bound.expect("no free TCP port on 127.0.0.1");
    handed.insert(l.local_addr().expect("a bound listener's address").port());
    l
}

/// A range of at least 5,000 unprivileged ports that the kernel does not use for `bind(0)`
/// or outgoing connections: below the ephemeral range (from 10,000 up) or above it.
fn outside_ephemeral() -> Option<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = text.split_whitespace().map(str::parse::<u16>);
    let (lo, hi) = (it.next()?.ok()?, it.next()?.ok()?);
    if lo >= 15_000 {
        Some((10_000, lo - 1))
    } else if hi <= 60_535 {
        Some((hi + 1, 65_535))
    } else {
        None
    }
}
