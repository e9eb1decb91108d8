//! Which member holds which cluster: an even spread that moves as few clusters as it can, a
//! function of the cluster names, the member set and who holds each cluster now (the
//! cluster Leases every replica lists), so every replica computes the same assignment from
//! the same Leases and nothing else is stored.
//!
//! - **Even**: with `c` clusters over `m` members every member holds `c / m` or `c / m + 1`
//!   (exactly `c % m` of them the latter): 3 clusters over 3 replicas is one each.
//! - **Fewest moves**: a member keeps what it holds up to its share (its highest-weight
//!   clusters first); only the clusters over a share, those of members gone, and those no one
//!   holds are placed, each on the highest-weight member with room. A member leaving gives
//!   only its own clusters away; one joining or rejoining takes only its share, from the
//!   members over theirs. Any even spread must move at least those, so none moves fewer.
//! - **Rendezvous weights** (highest-random-weight hashing: Thaler and Ravishankar, "Using
//!   name-based mappings to increase hit rates", 1998) pick where a placed cluster goes and
//!   which clusters a member over its share keeps: `xxh3_64(cluster ‖ 0 ‖ member)`, a stable,
//!   specified hash (`xxhash-rust`), so replicas of two kubesink versions agree during a
//!   rolling update. With no holder at all (a group starting) it is rendezvous hashing
//!   capped at the even share.
//!
//! The assignment is a fixed point: when the clusters are held as assigned, it assigns them
//! the same way, so a settled group moves nothing. Bounded-load rendezvous hashing without
//! the holders (Mirrokni, Thorup and Zadimoghaddam 2018, this module's former rule, capped at
//! `ceil(1.25 × c / m)`) gave 3 clusters over 3 replicas as 2 / 1 / 0 and moved two clusters
//! back to a rejoining replica where one restores the balance.

use std::collections::BTreeMap;

use xxhash_rust::xxh3::xxh3_64;

fn weight(cluster: &str, member: &str) -> u64 {
    let mut bytes = Vec::with_capacity(cluster.len() + member.len() + 1);
    bytes.extend_from_slice(cluster.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(member.as_bytes());
    xxh3_64(&bytes)
}

/// The most clusters one member holds with `clusters` clusters over `members` members:
/// `ceil(clusters / members)` (0 without members).
pub fn cap(clusters: usize, members: usize) -> usize {
    match members {
        0 => 0,
        m => clusters.div_ceil(m),
    }
}

/// Each cluster's member: cluster name → member identity. Empty when `members` is empty.
/// `holders` is who holds each cluster now (cluster → its Lease's valid holder; absent or
/// `None`: no one); a holder that is not among `members` counts as no one. Duplicate names
/// count once; the order of either list does not matter.
pub fn assign(
    clusters: &[String],
    members: &[String],
    holders: &BTreeMap<String, Option<String>>,
) -> BTreeMap<String, String> {
    let mut members: Vec<&str> = members.iter().map(String::as_str).collect();
    members.sort_unstable();
    members.dedup();
    let mut clusters: Vec<&str> = clusters.iter().map(String::as_str).collect();
    clusters.sort_unstable();
    clusters.dedup();
    let mut out = BTreeMap::new();
    if members.is_empty() {
        return out;
    }
    let (base, extra) = (
        clusters.len() / members.len(),
        clusters.len() % members.len(),
    );
    // What each member holds and keeps: its highest-weight clusters, up to `base + 1`.
    let mut kept: BTreeMap<&str, Vec<&str>> = members.iter().map(|m| (*m, Vec::new())).collect();
    for c in &clusters {
        if let Some(list) = holders
            .get(*c)
            .and_then(|h| h.as_deref())
            .and_then(|h| kept.get_mut(h))
        {
            list.push(c);
        }
    }
    for (m, list) in kept.iter_mut() {
        list.sort_unstable_by_key(|c| (std::cmp::Reverse(weight(c, m)), *c));
        list.truncate(base + 1);
    }
    // Only `extra` members may hold `base + 1`: the others over `base` give their last one up
    // (which ones does not change how many move), in the order of their own hash.
    let mut full: Vec<&str> = kept
        .iter()
        .filter(|(_, l)| l.len() == base + 1)
        .map(|(m, _)| *m)
        .collect();
    full.sort_unstable_by_key(|m| (xxh3_64(m.as_bytes()), *m));
    for m in full.iter().skip(extra) {
        if let Some(list) = kept.get_mut(m) {
            list.truncate(base);
        }
    }
    let mut load: BTreeMap<&str, usize> = BTreeMap::new();
    for (m, list) in &kept {
        load.insert(m, list.len());
        for c in list {
            out.insert((*c).to_owned(), (*m).to_owned());
        }
    }
    let mut at_top = load.values().filter(|n| **n == base + 1).count();
    // The rest, in the order of their own hash, each on its highest-weight member with room.
    let mut rest: Vec<&str> = clusters
        .iter()
        .copied()
        .filter(|c| !out.contains_key(*c))
        .collect();
    rest.sort_unstable_by_key(|c| (xxh3_64(c.as_bytes()), *c));
    for c in rest {
        let mut ranked: Vec<(u64, &str)> = members.iter().map(|m| (weight(c, m), *m)).collect();
        ranked.sort_unstable_by(|a, b| b.cmp(a));
        // While a cluster is unplaced the loads sum to less than `clusters`
        // (= members × base + extra), so some member is under `base`, or at it with a
        // `base + 1` place left.
        let room = |m: &str| {
            let n = load.get(m).copied().unwrap_or(0);
            n < base || (n == base && at_top < extra)
        };
        let chosen = ranked
            .iter()
            .map(|(_, m)| *m)
            .find(|m| room(m))
            .unwrap_or(ranked[0].1);
        let n = load.entry(chosen).or_insert(0);
        if *n == base {
            at_top += 1;
        }
        *n += 1;
        out.insert(c.to_owned(), chosen.to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}-{i}")).collect()
    }

    fn loads(a: &BTreeMap<String, String>) -> BTreeMap<String, usize> {
        let mut l = BTreeMap::new();
        for m in a.values() {
            *l.entry(m.clone()).or_insert(0) += 1;
        }
        l
    }

    fn held(a: &BTreeMap<String, String>) -> BTreeMap<String, Option<String>> {
        a.iter()
            .map(|(c, m)| (c.clone(), Some(m.clone())))
            .collect()
    }

    fn moved(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> usize {
        a.iter().filter(|(c, m)| b.get(*c) != Some(*m)).count()
    }

    /// Every cluster on one member, every member at `c / m` or `c / m + 1`.
    fn assert_even(a: &BTreeMap<String, String>, c: usize, members: &[String]) {
        assert_eq!(a.len(), c, "{c} clusters over {}", members.len());
        let l = loads(a);
        let base = c / members.len();
        for m in members {
            let n = l.get(m).copied().unwrap_or(0);
            assert!(
                n == base || n == base + 1,
                "{m} holds {n} ({c} over {}): {l:?}",
                members.len()
            );
        }
        let top = members
            .iter()
            .filter(|m| l.get(*m).copied().unwrap_or(0) == base + 1)
            .count();
        assert_eq!(top, c % members.len(), "{l:?}");
    }

    #[test]
    fn three_clusters_over_three_replicas_is_one_each_and_any_spread_is_even() {
        // The roll-out's names: bounded loads (cap 2) gave 2 / 1 / 0.
        let clusters = vec![
            "prod-eu".to_owned(),
            "prod-us".to_owned(),
            "staging".to_owned(),
        ];
        let members = names("kubesink", 3);
        let a = assign(&clusters, &members, &BTreeMap::new());
        assert_eq!(loads(&a).values().copied().collect::<Vec<_>>(), [1, 1, 1]);
        for c in 0..=40 {
            for m in 1..=7 {
                let members = names("kubesink", m);
                assert_even(
                    &assign(&names("cluster", c), &members, &BTreeMap::new()),
                    c,
                    &members,
                );
            }
        }
        assert!(assign(&names("c", 3), &[], &BTreeMap::new()).is_empty());
        assert_eq!(cap(3, 3), 1);
        assert_eq!(cap(30, 4), 8);
    }

    #[test]
    fn the_order_of_the_inputs_does_not_matter() {
        let clusters = names("cluster", 30);
        let members = names("kubesink", 3);
        let mut c2 = clusters.clone();
        c2.reverse();
        let mut m2 = members.clone();
        m2.reverse();
        m2.push(members[0].clone());
        let none = BTreeMap::new();
        assert_eq!(assign(&clusters, &members, &none), assign(&c2, &m2, &none));
    }

    #[test]
    fn a_settled_group_moves_nothing_and_a_stranger_holding_counts_as_no_one() {
        for (c, m) in [(30, 3), (7, 3), (3, 3), (2, 5), (100, 7)] {
            let (clusters, members) = (names("cluster", c), names("kubesink", m));
            let a = assign(&clusters, &members, &BTreeMap::new());
            assert_eq!(assign(&clusters, &members, &held(&a)), a, "{c} over {m}");
            let mut strange = held(&a);
            for h in strange.values_mut() {
                *h = Some("gone".into());
            }
            assert_eq!(assign(&clusters, &members, &strange), a);
        }
    }

    /// For every spread and every member: leaving moves exactly its clusters; rejoining
    /// moves exactly the clusters it is given back (the fewest any even spread moves), and
    /// it is given its share.
    #[test]
    fn a_member_leaving_or_rejoining_moves_the_fewest_clusters() {
        for c in 1..=24 {
            for m in 2..=6 {
                let (clusters, all) = (names("cluster", c), names("kubesink", m));
                let before = assign(&clusters, &all, &BTreeMap::new());
                for k in &all {
                    let rest: Vec<String> = all.iter().filter(|x| *x != k).cloned().collect();
                    let mut without = held(&before);
                    for h in without.values_mut() {
                        if h.as_ref() == Some(k) {
                            *h = None;
                        }
                    }
                    let left = assign(&clusters, &rest, &without);
                    assert_even(&left, c, &rest);
                    let of_k = before.values().filter(|x| *x == k).count();
                    assert_eq!(moved(&before, &left), of_k, "{c} over {m}, {k} left");
                    let back = assign(&clusters, &all, &held(&left));
                    assert_even(&back, c, &all);
                    let to_k = back.values().filter(|x| *x == k).count();
                    assert_eq!(moved(&left, &back), to_k, "{c} over {m}, {k} rejoined");
                }
            }
        }
    }

    #[test]
    fn a_member_joining_takes_its_share_from_the_others() {
        let clusters = names("cluster", 30);
        let three = names("kubesink", 3);
        let four = names("kubesink", 4);
        let before = assign(&clusters, &three, &BTreeMap::new());
        let after = assign(&clusters, &four, &held(&before));
        assert_even(&after, 30, &four);
        let new = after.values().filter(|m| **m == four[3]).count();
        assert_eq!(moved(&before, &after), new);
        assert!((7..=8).contains(&new), "{new}");
    }
}
