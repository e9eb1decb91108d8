//! Which member holds which cluster: rendezvous (highest-random-weight) hashing with bounded
//! loads, a pure function of the cluster names and the member set, so every replica computes
//! the same assignment from the same Leases and nothing is stored.
//!
//! - Rendezvous hashing (Thaler and Ravishankar, "Using name-based mappings to increase hit
//!   rates", 1998): cluster `c` goes to the member `m` of highest `w(c, m)`. A member joining
//!   takes only the clusters it now weighs highest for (about `1/(n+1)` of them); a member
//!   leaving gives only its own clusters away, each to its next choice.
//! - Bounded loads (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded
//!   Loads", 2018): with few clusters per member, plain rendezvous hashing can give one member
//!   twice another's share. Clusters are placed in a fixed order (by their own hash), each on
//!   its highest-weight member that holds fewer than `ceil(1.25 × clusters / members)`.
//!   Still a pure function of the inputs; a change of the member set moves a few more
//!   clusters than plain rendezvous hashing would (the cap shifts), never all of them.
//!
//! The weight is xxh3-64 (`xxhash-rust`, a stable, specified hash: replicas of two kubesink
//! versions during a rolling update agree) of `cluster ‖ 0 ‖ member`.

use std::collections::BTreeMap;

use xxhash_rust::xxh3::xxh3_64;

/// How much above an even share a member may be loaded: `ceil(LOAD × clusters / members)`.
pub const LOAD: f64 = 1.25;

fn weight(cluster: &str, member: &str) -> u64 {
    let mut bytes = Vec::with_capacity(cluster.len() + member.len() + 1);
    bytes.extend_from_slice(cluster.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(member.as_bytes());
    xxh3_64(&bytes)
}

/// The most clusters one member holds with `clusters` clusters over `members` members.
pub fn cap(clusters: usize, members: usize) -> usize {
    if members == 0 {
        return 0;
    }
    let even = clusters as f64 / members as f64;
    ((LOAD * even).ceil() as usize).max(1)
}

/// Each cluster's member: cluster name → member identity. Empty when `members` is empty.
/// Duplicate names count once; the order of either input does not matter.
pub fn assign(clusters: &[String], members: &[String]) -> BTreeMap<String, String> {
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
    let cap = cap(clusters.len(), members.len());
    clusters.sort_by_key(|c| (xxh3_64(c.as_bytes()), *c));
    let mut load: BTreeMap<&str, usize> = members.iter().map(|m| (*m, 0)).collect();
    for c in clusters {
        let mut ranked: Vec<(u64, &str)> = members.iter().map(|m| (weight(c, m), *m)).collect();
        ranked.sort_unstable_by(|a, b| b.cmp(a));
        // The cap times the members is at least the clusters, so one always has room.
        let chosen = ranked
            .iter()
            .map(|(_, m)| *m)
            .find(|m| load.get(m).copied().unwrap_or(0) < cap)
            .unwrap_or(ranked[0].1);
        *load.entry(chosen).or_insert(0) += 1;
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

    #[test]
    fn every_cluster_goes_to_one_member_and_no_member_exceeds_the_cap() {
        for (c, m) in [(30, 3), (30, 4), (7, 3), (1, 5), (100, 7), (3, 3)] {
            let clusters = names("cluster", c);
            let members = names("kubesink", m);
            let a = assign(&clusters, &members);
            assert_eq!(a.len(), c, "{c} clusters over {m}");
            let cap = cap(c, m);
            for (member, n) in loads(&a) {
                assert!(n <= cap, "{member} holds {n} > cap {cap} ({c} over {m})");
            }
        }
        assert!(assign(&names("c", 3), &[]).is_empty());
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
        assert_eq!(assign(&clusters, &members), assign(&c2, &m2));
    }

    #[test]
    fn a_member_joining_or_leaving_moves_few_clusters() {
        let clusters = names("cluster", 30);
        let three = names("kubesink", 3);
        let four = names("kubesink", 4);
        let before = assign(&clusters, &three);
        let after = assign(&clusters, &four);
        let moved = clusters.iter().filter(|c| before[*c] != after[*c]).count();
        // An even share for the new member is 7.5; bounded loads move a few more.
        assert!(
            (5..=14).contains(&moved),
            "{moved} of 30 moved when a 4th member joined"
        );
        let two = vec![three[0].clone(), three[2].clone()];
        let left = assign(&clusters, &two);
        let moved: Vec<&String> = clusters.iter().filter(|c| before[*c] != left[*c]).collect();
        let of_leaver = clusters.iter().filter(|c| before[*c] == three[1]).count();
        assert!(
            moved.len() <= of_leaver + 6,
            "{} moved when a member holding {of_leaver} left",
            moved.len()
        );
        assert!(
            clusters
                .iter()
                .filter(|c| before[*c] == three[1])
                .all(|c| moved.contains(&c)),
            "every cluster of the leaver moved"
        );
    }
}
