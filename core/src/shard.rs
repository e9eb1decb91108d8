//! [`Shard`]: one part of a cluster's objects, by the hash of their namespace, as Kubernetes'
//! sharded list and watch defines it (KEP-5866, feature gate `ShardedListAndWatch`, alpha in
//! v1.36, off by default; `docs/scale-out.md`, "One huge cluster").
//!
//! Outside facts, read in the source of the control plane the tests build (v0.37.2):
//! - `ListOptions.shardSelector` (query parameter `shardSelector`) is a CEL text of
//!   `shardRange(object.metadata.namespace, '0x…', '0x…')` calls joined by `||`
//!   (`k8s.io/apiserver/pkg/sharding/parser.go`); a range is `[start, end)`, both
//!   `0x`-prefixed lowercase hex of 16 digits, the end at most `0x10000000000000000` (2^64)
//!   (`k8s.io/apimachinery/pkg/sharding`: `HexLess` compares by length, then as text).
//! - The hash is 64-bit FNV-1a of the field's bytes (`sharding.HashField`: `fnv.New64a()`);
//!   a cluster-scoped object's namespace is the empty string.
//! - A server without the gate ignores the parameter and answers every object
//!   (`registry/generic/registry/store.go` parses it only when the gate is on).
//!
//! The informer therefore sends the selector *and* keeps only the objects of its range
//! itself ([`Shard::holds`]): with the gate on the check never fails; with it off, it is the
//! client-side fallback (counted in `InformerStats::shard_foreign`).
//!
//! Why the namespace and not the uid (the other field the server hashes): a key's uid
//! changes when its object is deleted and created again, and the two objects would then come
//! from two shards, with no order between the old one's `deleted` and the new one's `added`;
//! a key never leaves its namespace, so it stays in one shard for good.

use std::hash::Hasher;

/// The largest `shards` a cluster may be split into (`check` refuses more).
pub const MAX_SHARDS: u32 = 256;

/// Shard `index` of `count` (`0 <= index < count <= MAX_SHARDS`): the objects whose
/// namespace's FNV-1a-64 hash is in `[index·2^64/count, (index+1)·2^64/count)`. The ranges of
/// one `count` cover `[0, 2^64)` without overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shard {
    /// Which shard, from 0.
    pub index: u32,
    /// How many shards the cluster is split into.
    pub count: u32,
}

impl Shard {
    /// Whether a cluster may be split `count` ways: 1 (not split) to [`MAX_SHARDS`].
    pub fn valid_count(count: u32) -> bool {
        (1..=MAX_SHARDS).contains(&count)
    }

    /// The shards of a cluster split `count` ways (none when `count` is 0 or 1: the whole
    /// cluster is one unit).
    pub fn all(count: u32) -> Vec<Shard> {
        if count < 2 {
            return Vec::new();
        }
        (0..count).map(|index| Shard { index, count }).collect()
    }

    /// The hash range `[start, end)`, as numbers up to 2^64.
    pub fn range(&self) -> (u128, u128) {
        let span = 1u128 << 64;
        let count = u128::from(self.count.max(1));
        let at = |i: u32| u128::from(i) * span / count;
        (at(self.index), at(self.index + 1))
    }

    /// The `shardSelector` of this shard's list and watch requests.
    pub fn selector(&self) -> String {
        let (start, end) = self.range();
        format!(
            "shardRange(object.metadata.namespace, '{}', '{}')",
            hex(start),
            hex(end)
        )
    }

    /// `shardSelector=…`, URL-encoded: the query pair of this shard's requests.
    pub fn query_pair(&self) -> String {
        form_urlencoded::Serializer::new(String::new())
            .append_pair("shardSelector", &self.selector())
            .finish()
    }

    /// `uri` with this shard's `shardSelector` added to its query (kube's `ListParams` and
    /// `WatchParams` have no such field in kube 5).
    ///
    /// # Errors
    /// The joined URI does not parse (it cannot: the pair is URL-encoded), in words.
    pub fn on(&self, uri: &http::Uri) -> Result<http::Uri, String> {
        let pair = self.query_pair();
        let joined = match uri.query() {
            Some(q) if !q.is_empty() => format!("{}?{q}&{pair}", uri.path()),
            _ => format!("{}?{pair}", uri.path()),
        };
        let mut parts = uri.clone().into_parts();
        parts.path_and_query = Some(
            joined
                .parse()
                .map_err(|e: http::uri::InvalidUri| e.to_string())?,
        );
        http::Uri::from_parts(parts).map_err(|e| e.to_string())
    }

    /// Whether an object in `namespace` (`None` or empty: cluster-scoped) belongs to this
    /// shard.
    pub fn holds(&self, namespace: Option<&str>) -> bool {
        let h = u128::from(fnv1a64(namespace.unwrap_or("")));
        let (start, end) = self.range();
        start <= h && h < end
    }

    /// The name of this shard of cluster `cluster` as a unit of scale-out (its Lease, its
    /// saved state, its metrics): `{cluster}#shard-{index}-of-{count}`. `#` is not allowed in
    /// a cluster name, so no cluster can be named like a shard.
    pub fn unit(&self, cluster: &str) -> String {
        format!("{cluster}#shard-{}-of-{}", self.index, self.count)
    }
}

/// `{index}/{count}` (`1/4`): how logs name a shard beside its cluster.
impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// `0x` and 16 lowercase hex digits, or `0x10000000000000000` for 2^64: the server's form.
fn hex(v: u128) -> String {
    format!("0x{v:016x}")
}

/// 64-bit FNV-1a of `s`'s bytes (the `fnv` crate's hasher is FNV-1a 64 and writes the bytes
/// as given).
fn fnv1a64(s: &str) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(s.as_bytes());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_fnv1a_64_as_the_api_server_computes_it() {
        // The FNV-1a 64 offset basis (empty input) and the published test vector for "a"
        // (http://www.isthe.com/chongo/tech/comp/fnv/), as Go's hash/fnv gives them.
        assert_eq!(fnv1a64(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64("foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn the_ranges_cover_the_hash_space_once_and_print_as_the_server_parses_them() {
        for count in [2u32, 3, 4, 7, 16, MAX_SHARDS] {
            let shards = Shard::all(count);
            assert_eq!(shards.len(), count as usize);
            assert_eq!(shards[0].range().0, 0);
            assert_eq!(shards[shards.len() - 1].range().1, 1u128 << 64);
            for w in shards.windows(2) {
                assert_eq!(w[0].range().1, w[1].range().0, "{count}: gap or overlap");
                assert!(w[0].range().0 < w[0].range().1);
            }
        }
        assert_eq!(
            Shard { index: 1, count: 4 }.selector(),
            "shardRange(object.metadata.namespace, '0x4000000000000000', '0x8000000000000000')"
        );
        assert_eq!(
            Shard { index: 3, count: 4 }.selector(),
            "shardRange(object.metadata.namespace, '0xc000000000000000', '0x10000000000000000')"
        );
        assert!(Shard::all(1).is_empty());
    }

    #[test]
    fn a_request_gains_the_encoded_selector_and_keeps_its_query() {
        let s = Shard { index: 1, count: 2 };
        let uri: http::Uri = "/api/v1/configmaps?limit=500&watch=true".parse().unwrap();
        let with = s.on(&uri).unwrap();
        assert_eq!(with.path(), "/api/v1/configmaps");
        let pairs: Vec<(String, String)> = form_urlencoded::parse(with.query().unwrap().as_bytes())
            .into_owned()
            .collect();
        assert_eq!(
            pairs,
            [
                ("limit".to_owned(), "500".to_owned()),
                ("watch".to_owned(), "true".to_owned()),
                ("shardSelector".to_owned(), s.selector()),
            ]
        );
        let bare = s.on(&"/api/v1/nodes".parse().unwrap()).unwrap();
        assert_eq!(bare.query(), Some(s.query_pair().as_str()));
    }

    #[test]
    fn every_namespace_is_held_by_exactly_one_shard_and_cluster_scope_by_the_empty_ones() {
        for count in [2u32, 4, 5] {
            for ns in ["", "default", "kube-system", "team-a", "a"] {
                let holders = Shard::all(count)
                    .into_iter()
                    .filter(|s| s.holds(Some(ns)))
                    .count();
                assert_eq!(holders, 1, "{ns:?} of {count}");
            }
            let of_none: Vec<bool> = Shard::all(count).iter().map(|s| s.holds(None)).collect();
            let of_empty: Vec<bool> = Shard::all(count)
                .iter()
                .map(|s| s.holds(Some("")))
                .collect();
            assert_eq!(of_none, of_empty);
        }
        assert_eq!(
            Shard { index: 2, count: 4 }.unit("prod"),
            "prod#shard-2-of-4"
        );
    }
}
