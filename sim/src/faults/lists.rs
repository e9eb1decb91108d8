//! List pagination faults, per "Retrieving large results sets in chunks"
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/#retrieving-large-results-sets-in-chunks>):
//! `continue` tokens that expire early (410 `Expired` with an inconsistent-continue token in
//! the Status's `metadata.continue`) and a last page that carries `"continue": ""` instead
//! of omitting the field. The list handler consults these switches.

use super::Faults;

impl Faults {
    /// The next `n` list requests that carry a `continue` token answer 410 `Expired` with the
    /// message the real server gives ("The provided continue parameter is too old to display a
    /// consistent list result. …") and, in the Status's `metadata.continue`, a token that
    /// continues the list inconsistently at the latest resourceVersion, as when etcd
    /// compacted the first page's revision. Replaces a pending count.
    pub fn expire_next_continue(&self, n: usize) {
        self.with(|s| s.expire_continues = n);
    }

    /// While `on`, the last page of every list (and every unpaginated list) carries
    /// `metadata.continue: ""` explicitly instead of omitting it, as some servers and proxies
    /// do; clients must treat both as "no more pages".
    pub fn explicit_empty_continue(&self, on: bool) {
        self.with(|s| s.explicit_empty_continue = on);
    }

    /// Consumes one pending expired continue.
    pub(crate) fn take_expired_continue(&self) -> bool {
        let take = self.with(|s| {
            let take = s.expire_continues > 0;
            s.expire_continues = s.expire_continues.saturating_sub(1);
            take
        });
        self.count_effect("expiredContinues", u64::from(take));
        take
    }

    /// Whether last pages carry `"continue": ""`.
    pub(crate) fn empty_continue_on_last_page(&self) -> bool {
        self.with(|s| s.explicit_empty_continue)
    }
}
