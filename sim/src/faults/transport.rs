//! Transport faults below the API: slow response bodies (dribble) and an unreachable server
//! (every connection cut, new ones accepted and closed at once, as behind a network
//! partition). The server's accept loop and response writer consult these switches; this
//! module never touches a socket.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Faults;

impl Faults {
    /// Writes every response body (lists, gets, watch events, errors) in chunks of at most
    /// `bytes_per_chunk` bytes with a pause of `interval` between two chunks, like a slow or
    /// congested server. Applies to bodies written from now on, including open watches'
    /// later events. `bytes_per_chunk = 0` disables.
    pub fn dribble(&self, bytes_per_chunk: usize, interval: Duration) {
        self.with(|s| s.dribble = (bytes_per_chunk > 0).then_some((bytes_per_chunk, interval)));
    }

    /// While `on`, the server is unreachable: every open connection (including watches) is
    /// closed at once without a final chunk, and new TCP connections are accepted and closed
    /// immediately without a response. `false` resumes service on the same port.
    pub fn set_unreachable(&self, on: bool) {
        self.unreachable.store(on, Ordering::SeqCst);
        if on {
            self.count_effect("cutWatches", self.open_watch_count());
            let mut cut = self.cut.lock().unwrap_or_else(|p| p.into_inner());
            cut.cancel();
            *cut = CancellationToken::new();
        }
    }

    /// Resets every open connection (watches mid-stream included) at once, without a final
    /// chunk, as a load balancer, a proxy restart or a NAT timeout does; new connections are
    /// served as usual. A client sees its watch body end in a transport error, not a clean
    /// end, and must resume from the last resourceVersion it processed.
    pub fn reset_connections(&self) {
        self.count_effect("resetWatches", self.open_watch_count());
        let mut cut = self.cut.lock().unwrap_or_else(|p| p.into_inner());
        cut.cancel();
        *cut = CancellationToken::new();
    }

    /// Whether the server is unreachable now.
    pub fn is_unreachable(&self) -> bool {
        self.unreachable.load(Ordering::SeqCst)
    }

    /// The dribble setting: (bytes per chunk, pause), if on.
    pub(crate) fn dribble_setting(&self) -> Option<(usize, Duration)> {
        self.with(|s| s.dribble)
    }

    /// A token that fires when the server next becomes unreachable; each connection holds
    /// the one current when it was accepted.
    pub(crate) fn cut_token(&self) -> CancellationToken {
        self.cut.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
