//! The lightweight store: what the informer remembers per object, and nothing more.
//!
//! Per object: namespace (interned), name, uid (16 bytes when it is a UUID, as Kubernetes
//! issues them), resourceVersion (as an integer when decimal, as etcd-backed servers issue
//! them), a 64-bit fingerprint of the payload that would be emitted, and the list epoch in
//! which the object was last seen, and whether it is *unconfirmed* (restored from saved state
//! that holds its `added` as sent but not confirmed: the next list re-sends it). Never the
//! object itself: that is the whole point (the
//! Lyft Clutch "lightweight informer" idea, which cut informer memory by about 65%).
//!
//! Per object also the 16-bit fingerprints of its change paths ([`Parts`], 16 bytes: what
//! lets an `updated` name what changed; the default paths when none are configured), in the
//! name's allocation rather than the slot: there they cost 16 bytes, in the slot 16 × 1.31
//! (the table's slots per object at its load), and an object without them none.
//!
//! Layout, measured by `cargo bench --bench state_size`: one `hashbrown::HashTable` slot of
//! 48 bytes plus the name's heap allocation (the name behind a thin pointer, its length a
//! one-byte prefix there, the parts after it when known: `name.rs`). The table is keyed by
//! (namespace id, name).
//! Beside it, only while acknowledgements are tracked, the *former* uids of keys whose
//! `deleted` not every sink has confirmed ([`Former`]): empty in a steady state.

use std::hash::{BuildHasher, Hash, Hasher};

use hashbrown::{DefaultHashBuilder, HashTable};
use uuid::Uuid;

use super::facts::{decimal_rv, uuid_bytes, Facts, Parts, Rv, Uid};
use super::name::Name;

/// Flag in [`Entry::epoch_flags`]: the uid is not a canonical UUID; its text is in the
/// overflow map.
const UID_TEXT: u32 = 1 << 31;
/// Flag in [`Entry::epoch_flags`]: the resourceVersion is not decimal; its text is in the
/// overflow map.
const RV_TEXT: u32 = 1 << 30;
/// Flag in [`Entry::epoch_flags`]: the object is unconfirmed (see [`Facts::unconfirmed`]):
/// restored from saved state that holds its `added` as sent but not confirmed by every sink.
const UNCONFIRMED: u32 = 1 << 29;
/// The flags whose texts live in the overflow map.
const TEXT_FLAGS: u32 = UID_TEXT | RV_TEXT;
/// The list epoch occupies the low 29 bits and wraps.
const EPOCH_MASK: u32 = UNCONFIRMED - 1;

/// What the store keeps per object: 48 bytes plus the name's heap allocation.
#[derive(Debug)]
pub struct Entry {
    /// Object name (a thin pointer: `name.rs`), and after it the change paths' fingerprints
    /// of the last emitted payload when they are known (see [`Entry::parts`]).
    pub name: Name,
    /// uid as UUID bytes (all zero when the uid is kept as text in the overflow map).
    uid: [u8; 16],
    /// resourceVersion as a number (0 when kept as text in the overflow map).
    rv: u64,
    /// Fingerprint of the last emitted-or-suppressed payload (XXH3-64, without
    /// `metadata.resourceVersion`).
    pub fingerprint: u64,
    /// Interned namespace id (0 = cluster scope).
    pub ns: u32,
    /// List epoch in which the object was last seen (low 29 bits), the text flags and
    /// [`UNCONFIRMED`].
    epoch_flags: u32,
}

impl Entry {
    /// A slot for `name` carrying `parts` when they are known.
    fn new(
        (ns, name): (u32, &str),
        uid: [u8; 16],
        rv: u64,
        (fingerprint, parts): (u64, Parts),
        epoch_flags: u32,
    ) -> Entry {
        Entry {
            name: Name::with_tail(name, parts.is_known().then(|| parts.to_bytes())),
            uid,
            rv,
            fingerprint,
            ns,
            epoch_flags,
        }
    }

    /// The change paths' fingerprints of the last emitted payload (see [`Parts`]; an update
    /// whose changes are all ignored keeps the ones before it, so the next `changed` is
    /// relative to what was last sent); [`Parts::UNKNOWN`] when none are kept.
    pub fn parts(&self) -> Parts {
        self.name.tail().map_or(Parts::UNKNOWN, Parts::from_bytes)
    }

    /// Keeps `parts`: in place when the name has room for them, else in a new allocation of
    /// the name with room; unknown parts on a name without room cost nothing.
    fn set_parts(&mut self, parts: Parts) {
        if !self.name.set_tail(parts.to_bytes()) && parts.is_known() {
            self.name = Name::with_tail(&self.name, Some(parts.to_bytes()));
        }
    }
}

/// uid and resourceVersion texts that do not fit the compact form (rare: only non-UUID uids
/// and non-decimal resourceVersions, which real API servers do not issue).
#[derive(Debug, Default)]
struct Overflow {
    uid: Option<Box<str>>,
    rv: Option<Box<str>>,
}

/// The result of [`LightStore::observe`].
#[derive(Debug, PartialEq, Eq)]
pub enum Observed {
    /// A key never seen before.
    New,
    /// A known key, same uid, *unconfirmed* (see [`Facts::unconfirmed`]): an earlier run sent
    /// its `added` and no sink confirmed it, so a destination may or may not hold it. It is
    /// confirmed now; its `added` goes out again, and must never be cancelled (see
    /// [`kubesink_core::message::Change::may_be_held`]).
    Resend,
    /// Known key, same uid, different fingerprint.
    Changed,
    /// Known key, same uid, same fingerprint: nothing to emit.
    Unchanged,
    /// Known key with a different uid: the old object was deleted and re-created unseen.
    Replaced {
        /// The old uid.
        old_uid: String,
        /// The old object's last resourceVersion.
        old_rv: String,
        /// The fingerprint of the old object's last emitted payload.
        old_fingerprint: u64,
    },
}

/// A vanished object found by [`LightStore::end_list`]: emitted as a `deleted` with
/// `finalStateUnknown: true`.
#[derive(Debug, PartialEq, Eq)]
pub struct Vanished {
    /// Namespace, `None` at cluster scope.
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// Last known uid.
    pub uid: String,
    /// Last known resourceVersion.
    pub rv: String,
    /// Fingerprint of the last emitted payload.
    pub fingerprint: u64,
    /// It was unconfirmed (see [`Facts::unconfirmed`]).
    pub unconfirmed: bool,
}

/// A uid a key had before its current one that a destination may still hold: the key was
/// re-created (a uid never returns, so the object of that uid is gone) and its `deleted`
/// has not been confirmed by every sink. Kept only while acknowledgements are tracked
/// (`tracked.rs`), so that the saved state can name it and a restart still sends that
/// `deleted` (with one uid per key, a crash between a re-creation and its delivery would
/// lose the old uid's `deleted`; `pipeline/model_tests/found.rs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Former {
    /// The old uid.
    pub uid: Uid<'static>,
    /// The resourceVersion its `deleted` carries (or, restored, the last one known).
    pub rv: Rv<'static>,
    /// Its `deleted` is emitted (and waits for the sinks); `false` when restored from saved
    /// state: owed, emitted by the decider's next list start ([`LightStore::take_owed`]).
    pub sent: bool,
}

/// An owed `deleted` of a former uid ([`LightStore::take_owed`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Owed {
    /// The key, the former uid and the resourceVersion last known for it.
    pub vanished: Vanished,
    /// The resourceVersion of the key's current object, if any (newer than the former's):
    /// the point at which the former uid was known gone.
    pub seen_gone: Option<String>,
}

/// Keys, uids, resourceVersions and fingerprints of one watch's objects. `Default` is
/// [`LightStore::new`], never a derived one: that would lack the cluster scope's namespace
/// id 0, so a store made with `unwrap_or_default()` would give the first namespace seen id 0
/// and write that namespace's objects as cluster-scoped.
pub struct LightStore {
    table: HashTable<Entry>,
    hasher: DefaultHashBuilder,
    namespaces: Vec<Box<str>>,
    ns_ids: hashbrown::HashMap<Box<str>, u32>,
    /// References to each namespace id: table entries, plus pins (the acknowledgement
    /// overlay's keys, see `tracked.rs`). At zero the namespace is forgotten and its id
    /// reused, so the table (and the saved state) holds the namespaces in use, not every
    /// namespace ever seen (CI and preview namespaces come and go).
    ns_refs: Vec<u32>,
    /// Ids of forgotten namespaces (their slot in `namespaces` is `""`), reused first.
    free_ns: Vec<u32>,
    overflow: hashbrown::HashMap<(u32, Box<str>), Overflow>,
    /// Former uids a destination may hold, by key ([`Former`]); empty but for keys
    /// re-created while their changes wait. Each key holds a reference to its namespace.
    former: hashbrown::HashMap<(u32, Box<str>), Vec<Former>>,
    /// The `change_values` of each object of a resource that has them (`changes.rs`): its
    /// paths' values in the payload last sent ([`Kept`]). Empty for every other resource.
    /// Not saved with the state.
    values: hashbrown::HashMap<(u32, Box<str>), Values>,
    epoch: u32,
}

/// One object's kept `change_values`, by path.
pub type Values = Box<[Kept]>;

/// One `change_values` path's value in the payload last sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kept {
    /// Its JSON text, within the byte bounds.
    Text(Box<str>),
    /// Beyond a byte bound: the XXH3-64 of its JSON text, so a change is still seen.
    Beyond(u64),
}

impl Kept {
    /// The XXH3-64 of the value's JSON text.
    pub fn hash(&self) -> u64 {
        match self {
            Kept::Text(t) => xxhash_rust::xxh3::xxh3_64(t.as_bytes()),
            Kept::Beyond(h) => *h,
        }
    }

    /// The text, when kept.
    pub fn text(&self) -> Option<&str> {
        match self {
            Kept::Text(t) => Some(t),
            Kept::Beyond(_) => None,
        }
    }
}

impl Default for LightStore {
    fn default() -> Self {
        LightStore::new()
    }
}

impl LightStore {
    /// An empty store.
    pub fn new() -> Self {
        LightStore {
            table: HashTable::default(),
            hasher: DefaultHashBuilder::default(),
            namespaces: vec!["".into()], // id 0: cluster scope
            ns_ids: hashbrown::HashMap::default(),
            ns_refs: vec![0],
            free_ns: Vec::new(),
            overflow: hashbrown::HashMap::default(),
            former: hashbrown::HashMap::default(),
            values: hashbrown::HashMap::default(),
            epoch: 0,
        }
    }

    /// Number of objects known.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no object is known.
    #[cfg(any(test, feature = "test-util"))]
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    fn ns_id(&mut self, ns: Option<&str>) -> u32 {
        let Some(ns) = ns.filter(|n| !n.is_empty()) else {
            return 0;
        };
        if let Some(id) = self.ns_ids.get(ns) {
            return *id;
        }
        let id = match self.free_ns.pop() {
            Some(id) => {
                self.namespaces[id as usize] = ns.into();
                id
            }
            None => {
                self.namespaces.push(ns.into());
                self.ns_refs.push(0);
                u32::try_from(self.namespaces.len() - 1).unwrap_or(u32::MAX)
            }
        };
        self.ns_ids.insert(ns.into(), id);
        id
    }

    /// One more reference to namespace `id` (an entry, or a pin).
    fn ns_ref(&mut self, id: u32) {
        if let Some(n) = self.ns_refs.get_mut(id as usize).filter(|_| id != 0) {
            *n += 1;
        }
    }

    /// One reference less to namespace `id`; at zero the namespace is forgotten.
    fn ns_unref(&mut self, id: u32) {
        let Some(n) = self.ns_refs.get_mut(id as usize).filter(|_| id != 0) else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.forget_ns(id);
        }
    }

    fn forget_ns(&mut self, id: u32) {
        let Some(slot) = self.namespaces.get_mut(id as usize) else {
            return;
        };
        if slot.is_empty() {
            return;
        }
        let name = std::mem::take(slot);
        self.ns_ids.remove(&name);
        self.free_ns.push(id);
    }

    /// Keeps namespace `ns` (interning it) while something outside the table refers to it
    /// by id: the acknowledgement overlay's keys. Returns its id. Undo with
    /// [`LightStore::unpin_namespace`].
    pub fn pin_namespace(&mut self, ns: Option<&str>) -> u32 {
        let id = self.ns_id(ns);
        self.ns_ref(id);
        id
    }

    /// Releases a [`LightStore::pin_namespace`].
    pub fn unpin_namespace(&mut self, id: u32) {
        self.ns_unref(id);
    }

    /// Namespaces known now (interned and not forgotten), cluster scope excluded.
    pub fn namespace_count(&self) -> usize {
        self.ns_ids.len()
    }

    /// The name of namespace `id` (`None` for cluster scope).
    fn ns_name(&self, id: u32) -> Option<String> {
        match id {
            0 => None,
            id => self.namespaces.get(id as usize).map(|s| s.to_string()),
        }
    }

    fn hash(hasher: &DefaultHashBuilder, ns: u32, name: &str) -> u64 {
        let mut h = hasher.build_hasher();
        ns.hash(&mut h);
        name.hash(&mut h);
        h.finish()
    }

    /// Starts a list (initial or relist): objects not observed before [`LightStore::end_list`]
    /// are reported as vanished.
    pub fn begin_list(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
    }

    /// Records an object seen in a list or a watch event and classifies it (its change
    /// paths unknown: [`LightStore::observe_parts`] with [`Parts::UNKNOWN`]).
    pub fn observe(
        &mut self,
        ns: Option<&str>,
        name: &str,
        uid: &str,
        rv: &str,
        fingerprint: u64,
    ) -> Observed {
        self.observe_parts(ns, name, uid, rv, fingerprint, Parts::UNKNOWN)
            .0
    }

    /// Records an object seen in a list or a watch event, with its change paths'
    /// fingerprints `parts`, and classifies it. Also returns the parts held before (for
    /// [`Observed::Changed`] and [`Observed::Unchanged`]; [`Parts::UNKNOWN`] otherwise). On
    /// [`Observed::Unchanged`] the held parts stay: they describe the payload last sent.
    pub fn observe_parts(
        &mut self,
        ns: Option<&str>,
        name: &str,
        uid: &str,
        rv: &str,
        fingerprint: u64,
        parts: Parts,
    ) -> (Observed, Parts) {
        let ns = self.ns_id(ns);
        let epoch = self.epoch & EPOCH_MASK;
        let hash = Self::hash(&self.hasher, ns, name);
        let hasher = &self.hasher;
        let (uid_bytes, rv_num) = (uuid_bytes(uid), decimal_rv(rv));
        let mut flags = 0;
        if uid_bytes.is_none() {
            flags |= UID_TEXT;
        }
        if rv_num.is_none() {
            flags |= RV_TEXT;
        }
        let slot = self.table.entry(
            hash,
            |e| e.ns == ns && &*e.name == name,
            |e| Self::hash(hasher, e.ns, &e.name),
        );
        let mut before = Parts::UNKNOWN;
        let (result, old_flags) = match slot {
            hashbrown::hash_table::Entry::Occupied(mut o) => {
                let e = o.get_mut();
                let old_flags = e.epoch_flags & TEXT_FLAGS;
                let unconfirmed = e.epoch_flags & UNCONFIRMED != 0;
                let same_uid = match uid_bytes {
                    Some(b) => old_flags & UID_TEXT == 0 && e.uid == b,
                    None => {
                        old_flags & UID_TEXT != 0
                            && self
                                .overflow
                                .get(&(ns, Box::<str>::from(name)))
                                .and_then(|o| o.uid.as_deref())
                                == Some(uid)
                    }
                };
                let result = if !same_uid {
                    Observed::Replaced {
                        old_uid: render_uid(e, &self.overflow),
                        old_rv: render_rv(e, &self.overflow),
                        old_fingerprint: e.fingerprint,
                    }
                } else if unconfirmed {
                    // Sent as `added` by an earlier run, never confirmed: send it again.
                    Observed::Resend
                } else if e.fingerprint == fingerprint {
                    before = e.parts();
                    Observed::Unchanged
                } else {
                    before = e.parts();
                    Observed::Changed
                };
                if result != Observed::Unchanged {
                    e.set_parts(parts);
                }
                e.uid = uid_bytes.unwrap_or_default();
                e.rv = rv_num.unwrap_or_default();
                e.fingerprint = fingerprint;
                e.epoch_flags = epoch | flags;
                (result, old_flags)
            }
            hashbrown::hash_table::Entry::Vacant(v) => {
                v.insert(Entry::new(
                    (ns, name),
                    uid_bytes.unwrap_or_default(),
                    rv_num.unwrap_or_default(),
                    (fingerprint, parts),
                    epoch | flags,
                ));
                self.ns_ref(ns);
                (Observed::New, 0)
            }
        };
        if flags != 0 {
            let o = self.overflow.entry((ns, name.into())).or_default();
            o.uid = uid_bytes.is_none().then(|| uid.into());
            o.rv = rv_num.is_none().then(|| rv.into());
        } else if old_flags != 0 {
            self.overflow.remove(&(ns, Box::<str>::from(name)));
        }
        (result, before)
    }

    /// Marks a known object as seen in the current list without changing it (a list item
    /// that could not be read: it must not be swept as vanished). Returns whether it was
    /// known.
    pub fn touch(&mut self, ns: Option<&str>, name: &str) -> bool {
        let Some(ns_id) = self.known_ns(ns) else {
            return false;
        };
        let epoch = self.epoch & EPOCH_MASK;
        let hash = Self::hash(&self.hasher, ns_id, name);
        match self
            .table
            .find_mut(hash, |e| e.ns == ns_id && &*e.name == name)
        {
            Some(e) => {
                e.epoch_flags = (e.epoch_flags & !EPOCH_MASK) | epoch;
                true
            }
            None => false,
        }
    }

    /// The id of an already interned namespace (0 for cluster scope); `None` if unknown.
    fn known_ns(&self, ns: Option<&str>) -> Option<u32> {
        match ns.filter(|n| !n.is_empty()) {
            None => Some(0),
            Some(n) => self.ns_ids.get(n).copied(),
        }
    }

    /// Forgets an object after a watch DELETED; returns whether it was known.
    pub fn remove(&mut self, ns: Option<&str>, name: &str) -> bool {
        let Some(ns_id) = self.known_ns(ns) else {
            return false;
        };
        let hash = Self::hash(&self.hasher, ns_id, name);
        match self
            .table
            .find_entry(hash, |e| e.ns == ns_id && &*e.name == name)
        {
            Ok(o) => {
                let (e, _) = o.remove();
                if e.epoch_flags & TEXT_FLAGS != 0 {
                    self.overflow.remove(&(ns_id, Box::from(&*e.name)));
                }
                if !self.values.is_empty() {
                    self.values.remove(&(ns_id, Box::from(&*e.name)));
                }
                self.ns_unref(ns_id);
                true
            }
            Err(_) => false,
        }
    }

    /// Ends a list: removes and returns every object not observed since
    /// [`LightStore::begin_list`] (deleted while the watch was down: the deletes a Clutch-style
    /// informer loses).
    pub fn end_list(&mut self) -> Vec<Vanished> {
        let epoch = self.epoch & EPOCH_MASK;
        let mut gone = Vec::new();
        let mut unref = Vec::new();
        let namespaces = &self.namespaces;
        let overflow = &mut self.overflow;
        let values = &mut self.values;
        self.table.retain(|e| {
            if e.epoch_flags & EPOCH_MASK == epoch {
                return true;
            }
            unref.push(e.ns);
            gone.push(Vanished {
                namespace: match e.ns {
                    0 => None,
                    id => namespaces.get(id as usize).map(|s| s.to_string()),
                },
                name: e.name.to_string(),
                uid: render_uid(e, overflow),
                rv: render_rv(e, overflow),
                fingerprint: e.fingerprint,
                unconfirmed: e.epoch_flags & UNCONFIRMED != 0,
            });
            if e.epoch_flags & TEXT_FLAGS != 0 {
                overflow.remove(&(e.ns, Box::from(&*e.name)));
            }
            if !values.is_empty() {
                values.remove(&(e.ns, Box::from(&*e.name)));
            }
            false
        });
        for id in unref {
            self.ns_unref(id);
        }
        // Namespaces interned without ever being referenced (a restored table's empty ones).
        for id in 1..self.ns_refs.len() {
            if self.ns_refs[id] == 0 {
                self.forget_ns(u32::try_from(id).unwrap_or(u32::MAX));
            }
        }
        gone.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        gone
    }

    /// The id of namespace `ns` (0 for cluster scope or `None`), interning it if new.
    pub fn intern(&mut self, ns: Option<&str>) -> u32 {
        self.ns_id(ns)
    }

    /// The id of namespace `ns` if it was ever interned (0 for cluster scope or `None`).
    pub fn ns_id_of(&self, ns: Option<&str>) -> Option<u32> {
        match ns.filter(|n| !n.is_empty()) {
            None => Some(0),
            Some(n) => self.ns_ids.get(n).copied(),
        }
    }

    /// The interned namespaces, indexed by id (id 0, the cluster scope, is `""`).
    pub fn namespace_table(&self) -> &[Box<str>] {
        &self.namespaces
    }

    /// The facts known for `(ns, name)`, if the key is known.
    pub fn get(&self, ns: Option<&str>, name: &str) -> Option<Facts<'_>> {
        let ns = self.ns_id_of(ns)?;
        let hash = Self::hash(&self.hasher, ns, name);
        let e = self.table.find(hash, |e| e.ns == ns && &*e.name == name)?;
        Some(self.facts(e))
    }

    /// The kept `change_values` of `(ns, name)` (`None`: none kept).
    pub fn values(&self, ns: Option<&str>, name: &str) -> Option<&Values> {
        let ns = self.ns_id_of(ns)?;
        self.values.get(&(ns, Box::<str>::from(name)))
    }

    /// Keeps `values` as the `change_values` of the known object `(ns, name)`; nothing for
    /// an unknown key (its namespace id could be reused: values live only beside an entry).
    pub fn set_values(&mut self, ns: Option<&str>, name: &str, values: Values) {
        let Some(ns) = self.ns_id_of(ns) else {
            return;
        };
        let hash = Self::hash(&self.hasher, ns, name);
        if self
            .table
            .find(hash, |e| e.ns == ns && &*e.name == name)
            .is_some()
        {
            self.values.insert((ns, name.into()), values);
        }
    }

    fn facts(&self, e: &Entry) -> Facts<'_> {
        let texts = || self.overflow.get(&(e.ns, Box::from(&*e.name)));
        Facts {
            uid: if e.epoch_flags & UID_TEXT == 0 {
                Uid::Uuid(e.uid)
            } else {
                Uid::Text(
                    texts()
                        .and_then(|o| o.uid.as_deref())
                        .unwrap_or_default()
                        .into(),
                )
            },
            rv: if e.epoch_flags & RV_TEXT == 0 {
                Rv::Number(e.rv)
            } else {
                Rv::Text(
                    texts()
                        .and_then(|o| o.rv.as_deref())
                        .unwrap_or_default()
                        .into(),
                )
            },
            fingerprint: e.fingerprint,
            parts: e.parts(),
            unconfirmed: e.epoch_flags & UNCONFIRMED != 0,
        }
    }

    /// Calls `f(namespace id, name, facts)` for every known object, in table order (the
    /// store's packed form, for the state snapshot; ids index [`LightStore::namespace_table`]).
    pub fn for_each(&self, mut f: impl FnMut(u32, &str, Facts<'_>)) {
        for e in self.table.iter() {
            f(e.ns, &e.name, self.facts(e));
        }
    }

    /// Inserts (or replaces) an object from saved facts, as seen in the current list epoch:
    /// how a store is rebuilt from a state snapshot before the first list. `ns` is an id from
    /// [`LightStore::intern`].
    pub fn restore(&mut self, ns: u32, name: &str, facts: &Facts<'_>) {
        let epoch = self.epoch & EPOCH_MASK;
        let (uid, mut text_flags, uid_text) = match &facts.uid {
            Uid::Uuid(b) => (*b, 0, None),
            Uid::Text(t) => ([0; 16], UID_TEXT, Some(Box::<str>::from(&**t))),
        };
        let (rv, rv_text) = match &facts.rv {
            Rv::Number(n) => (*n, None),
            Rv::Text(t) => {
                text_flags |= RV_TEXT;
                (0, Some(Box::<str>::from(&**t)))
            }
        };
        let flags = text_flags | if facts.unconfirmed { UNCONFIRMED } else { 0 };
        // Saved state lists a key's former uids before its current one (see
        // `Acknowledged::for_each`), and journal records come after the snapshot: an entry
        // of another uid than the one held makes the held one former.
        let hash = Self::hash(&self.hasher, ns, name);
        let held = self
            .table
            .find(hash, |e| e.ns == ns && &*e.name == name)
            .map(|e| self.facts(e).into_owned());
        if let Some(held) = held.filter(|h| h.uid != facts.uid) {
            self.add_former(ns, name, held.uid, held.rv, false);
        }
        self.drop_former(ns, name, &facts.uid);
        let hasher = &self.hasher;
        let entry = Entry::new(
            (ns, name),
            uid,
            rv,
            (facts.fingerprint, facts.parts),
            epoch | flags,
        );
        match self.table.entry(
            hash,
            |e| e.ns == ns && &*e.name == name,
            |e| Self::hash(hasher, e.ns, &e.name),
        ) {
            hashbrown::hash_table::Entry::Occupied(mut o) => *o.get_mut() = entry,
            hashbrown::hash_table::Entry::Vacant(v) => {
                v.insert(entry);
                self.ns_ref(ns);
            }
        }
        if text_flags != 0 {
            self.overflow.insert(
                (ns, name.into()),
                Overflow {
                    uid: uid_text,
                    rv: rv_text,
                },
            );
        } else {
            self.overflow.remove(&(ns, Box::<str>::from(name)));
        }
    }

    /// Records that key `(ns, name)` (namespace id from [`LightStore::intern`]) had `uid`
    /// before its current one and a destination may still hold it ([`Former`]). A uid
    /// already recorded for the key is kept as it is.
    pub fn add_former(
        &mut self,
        ns: u32,
        name: &str,
        uid: Uid<'static>,
        rv: Rv<'static>,
        sent: bool,
    ) {
        let key = (ns, Box::<str>::from(name));
        let list = match self.former.get_mut(&key) {
            Some(list) => list,
            None => {
                self.ns_ref(ns);
                self.former.entry(key).or_default()
            }
        };
        if list.iter().all(|f| f.uid != uid) {
            list.push(Former { uid, rv, sent });
        }
    }

    /// Forgets former `uid` of `(ns, name)`: its `deleted` is confirmed by every sink, or
    /// the key is back with that uid (saved state replayed). Returns whether it was there.
    pub fn settle_former(&mut self, ns: Option<&str>, name: &str, uid: &str) -> bool {
        match self.ns_id_of(ns) {
            Some(id) => self.drop_former(id, name, &Uid::parse(uid)),
            None => false,
        }
    }

    fn drop_former(&mut self, ns: u32, name: &str, uid: &Uid<'_>) -> bool {
        if self.former.is_empty() {
            return false;
        }
        let key = (ns, Box::<str>::from(name));
        let Some(list) = self.former.get_mut(&key) else {
            return false;
        };
        let before = list.len();
        list.retain(|f| f.uid != *uid);
        let dropped = list.len() != before;
        if list.is_empty() {
            self.former.remove(&key);
            self.ns_unref(ns);
        }
        dropped
    }

    /// The owed `deleted`s: every former uid not yet sent (restored from saved state), now
    /// marked sent. They stay (and in the saved state) until [`LightStore::settle_former`].
    pub fn take_owed(&mut self) -> Vec<Owed> {
        let mut owed = Vec::new();
        let keys: Vec<(u32, Box<str>)> = self
            .former
            .iter()
            .filter(|(_, list)| list.iter().any(|f| !f.sent))
            .map(|(k, _)| k.clone())
            .collect();
        for (ns, name) in keys {
            let namespace = self.ns_name(ns);
            let seen_gone = self.get(namespace.as_deref(), &name).map(|f| f.rv.render());
            let Some(list) = self.former.get_mut(&(ns, name.clone())) else {
                continue;
            };
            for f in list.iter_mut().filter(|f| !f.sent) {
                f.sent = true;
                owed.push(Owed {
                    vanished: Vanished {
                        namespace: namespace.clone(),
                        name: name.to_string(),
                        uid: f.uid.render(),
                        rv: f.rv.render(),
                        fingerprint: 0,
                        unconfirmed: true,
                    },
                    seen_gone: seen_gone.clone(),
                });
            }
        }
        owed.sort_by(|a, b| {
            let (a, b) = (&a.vanished, &b.vanished);
            (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name))
        });
        owed
    }

    /// Calls `f(namespace id, name, former)` for every former uid ([`Former`]).
    pub fn for_each_former(&self, mut f: impl FnMut(u32, &str, &Former)) {
        for ((ns, name), list) in &self.former {
            for former in list {
                f(*ns, name, former);
            }
        }
    }

    /// Every known key as `(namespace, name)`, for tests and diagnostics.
    #[cfg(any(test, feature = "test-util"))]
    pub fn keys(&self) -> Vec<(Option<String>, String)> {
        let mut v: Vec<_> = self
            .table
            .iter()
            .map(|e| (self.ns_name(e.ns), e.name.to_string()))
            .collect();
        v.sort();
        v
    }

    /// Approximate heap bytes held: table slots, names, interned namespaces, overflow texts.
    #[cfg(any(test, feature = "test-util"))]
    pub fn heap_bytes(&self) -> usize {
        let slots = self.table.capacity() * (std::mem::size_of::<Entry>() + 1);
        // Each name's allocation: its bytes and a one-byte length prefix (`name.rs`).
        let names: usize = self.table.iter().map(|e| e.name.len() + 1).sum();
        let ns: usize = self.namespaces.iter().map(|n| n.len() * 2 + 40).sum();
        let overflow: usize = self
            .overflow
            .iter()
            .map(|((_, n), o)| {
                n.len()
                    + o.uid.as_ref().map_or(0, |u| u.len())
                    + o.rv.as_ref().map_or(0, |r| r.len())
                    + 64
            })
            .sum();
        let former: usize = self
            .former
            .iter()
            .map(|((_, n), list)| n.len() + list.len() * std::mem::size_of::<Former>() + 64)
            .sum();
        slots + names + ns + overflow + former
    }
}

fn render_uid(e: &Entry, overflow: &hashbrown::HashMap<(u32, Box<str>), Overflow>) -> String {
    if e.epoch_flags & UID_TEXT == 0 {
        return Uuid::from_bytes(e.uid).hyphenated().to_string();
    }
    overflow
        .get(&(e.ns, Box::<str>::from(&*e.name)))
        .and_then(|o| o.uid.as_deref())
        .unwrap_or_default()
        .to_owned()
}

fn render_rv(e: &Entry, overflow: &hashbrown::HashMap<(u32, Box<str>), Overflow>) -> String {
    if e.epoch_flags & RV_TEXT == 0 {
        return e.rv.to_string();
    }
    overflow
        .get(&(e.ns, Box::<str>::from(&*e.name)))
        .and_then(|o| o.rv.as_deref())
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const U1: &str = "ef5a35d5-973f-4ec9-9925-a67e7648ea58";
    const U2: &str = "1d0f26d0-5b32-4c1a-ba4f-4c897e871cf9";

    #[test]
    fn classifies_new_changed_unchanged_and_replaced() {
        let mut s = LightStore::new();
        s.begin_list();
        assert_eq!(
            s.observe(Some("default"), "web", U1, "10", 7),
            Observed::New
        );
        assert_eq!(
            s.observe(Some("default"), "web", U1, "11", 7),
            Observed::Unchanged
        );
        assert_eq!(
            s.observe(Some("default"), "web", U1, "12", 8),
            Observed::Changed
        );
        assert_eq!(
            s.observe(Some("default"), "web", U2, "13", 8),
            Observed::Replaced {
                old_uid: U1.into(),
                old_rv: "12".into(),
                old_fingerprint: 8,
            }
        );
        assert_eq!(s.observe(Some("other"), "web", U1, "14", 8), Observed::New);
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn relist_reports_objects_not_seen_again() {
        let mut s = LightStore::new();
        s.begin_list();
        for i in 0..10 {
            s.observe(Some("ns"), &format!("o{i}"), U1, &i.to_string(), i);
        }
        s.observe(None, "node-1", U2, "99", 1);
        assert!(s.end_list().is_empty());
        s.begin_list();
        for i in 0..10 {
            if i % 2 == 0 {
                s.observe(Some("ns"), &format!("o{i}"), U1, &i.to_string(), i);
            }
        }
        let gone = s.end_list();
        let names: Vec<_> = gone.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["node-1", "o1", "o3", "o5", "o7", "o9"]);
        assert_eq!(gone[0].namespace, None);
        assert_eq!(gone[1].rv, "1");
        assert_eq!(gone[1].uid, U1);
        assert_eq!(s.len(), 5);
    }

    #[test]
    fn odd_uids_and_resource_versions_round_trip() {
        let mut s = LightStore::new();
        s.begin_list();
        s.observe(None, "a", "not-a-uuid", "abc", 1);
        s.observe(None, "b", &U1.to_uppercase(), "007", 1);
        s.begin_list();
        let gone = s.end_list();
        assert_eq!(
            (gone[0].uid.as_str(), gone[0].rv.as_str()),
            ("not-a-uuid", "abc")
        );
        assert_eq!(
            (gone[1].uid.as_str(), gone[1].rv.as_str()),
            (U1.to_uppercase().as_str(), "007")
        );
    }

    #[test]
    fn text_uids_and_versions_are_compared_and_reported_exactly() {
        let mut s = LightStore::new();
        assert_eq!(s.observe(None, "a", "x1", "r1", 1), Observed::New);
        assert_eq!(s.observe(None, "a", "x1", "r2", 1), Observed::Unchanged);
        assert_eq!(
            s.observe(None, "a", "x2", "r3", 1),
            Observed::Replaced {
                old_uid: "x1".into(),
                old_rv: "r2".into(),
                old_fingerprint: 1,
            }
        );
        assert_eq!(
            s.observe(None, "a", U1, "4", 1),
            Observed::Replaced {
                old_uid: "x2".into(),
                old_rv: "r3".into(),
                old_fingerprint: 1,
            }
        );
        assert!(
            s.overflow.is_empty(),
            "compact again once the texts are gone"
        );
        s.observe(None, "b", "x3", "r5", 1);
        assert!(s.remove(None, "b"));
        assert!(s.overflow.is_empty());
    }

    #[test]
    fn facts_read_back_and_restore_rebuilds_an_equal_store() {
        let mut s = LightStore::new();
        s.begin_list();
        s.observe(Some("a"), "x", U1, "10", 1);
        s.observe(None, "node", "odd-uid", "r7", 2);
        let mut copy = LightStore::new();
        let table = s.namespace_table().to_vec();
        s.for_each(|ns, name, facts| {
            let id = copy.intern(Some(&table[ns as usize]));
            copy.restore(id, name, &facts);
        });
        assert_eq!(copy.keys(), s.keys());
        assert_eq!(copy.get(Some("a"), "x"), s.get(Some("a"), "x"));
        let odd = copy.get(None, "node").unwrap();
        assert_eq!(
            (odd.uid.render(), odd.rv.render()),
            ("odd-uid".into(), "r7".into())
        );
        assert_eq!(copy.get(Some("zzz"), "x"), None);
        // Restored objects belong to the list epoch before the next list: unseen, swept.
        copy.begin_list();
        copy.observe(Some("a"), "x", U1, "10", 1);
        let gone = copy.end_list();
        assert_eq!(gone.len(), 1);
        assert_eq!((gone[0].name.as_str(), gone[0].fingerprint), ("node", 2));
    }

    #[test]
    fn namespaces_without_objects_are_forgotten_and_their_ids_reused() {
        let mut s = LightStore::new();
        // CI namespaces come and go: 1,000 of them, one pod each, created then deleted.
        for i in 0..1000 {
            let ns = format!("ci-{i}");
            assert_eq!(s.observe(Some(&ns), "pod", U1, "1", 1), Observed::New);
            assert!(s.remove(Some(&ns), "pod"));
        }
        assert_eq!(s.namespace_count(), 0);
        assert!(
            s.namespace_table().len() <= 2,
            "{} slots",
            s.namespace_table().len()
        );
        // Swept by a list, the same.
        s.observe(Some("kept"), "a", U1, "1", 1);
        s.observe(Some("swept"), "b", U1, "1", 1);
        s.begin_list();
        s.observe(Some("kept"), "a", U1, "1", 1);
        let gone = s.end_list();
        assert_eq!(gone[0].namespace.as_deref(), Some("swept"));
        assert_eq!(s.namespace_count(), 1);
        assert_eq!(s.get(Some("kept"), "a").map(|f| f.fingerprint), Some(1));
        // A pin keeps a namespace with no object (the overlay's deleted keys).
        let id = s.pin_namespace(Some("pinned"));
        s.observe(Some("pinned"), "c", U1, "1", 1);
        s.remove(Some("pinned"), "c");
        assert_eq!(s.ns_id_of(Some("pinned")), Some(id));
        s.unpin_namespace(id);
        assert_eq!(s.ns_id_of(Some("pinned")), None);
        // A namespace interned and never used is forgotten at the next list end.
        s.intern(Some("restored-but-empty"));
        s.begin_list();
        s.observe(Some("kept"), "a", U1, "1", 1);
        s.end_list();
        assert_eq!(s.namespace_count(), 1);
    }

    #[test]
    fn an_unconfirmed_object_is_new_again_when_seen_and_vanishes_like_any_other() {
        let mut s = LightStore::new();
        let ns = s.intern(Some("a"));
        let unconfirmed = Facts::unconfirmed(Uid::parse(U1), Rv::parse("5"));
        for name in ["seen", "gone", "recreated"] {
            s.restore(ns, name, &unconfirmed);
        }
        assert!(s.get(Some("a"), "seen").unwrap().unconfirmed);
        s.begin_list();
        // Same uid: downstream may not have it, so it is new (its `added` is sent again).
        assert_eq!(s.observe(Some("a"), "seen", U1, "5", 7), Observed::Resend);
        assert!(
            !s.get(Some("a"), "seen").unwrap().unconfirmed,
            "confirmed once re-sent"
        );
        assert_eq!(
            s.observe(Some("a"), "seen", U1, "6", 7),
            Observed::Unchanged
        );
        assert!(matches!(
            s.observe(Some("a"), "recreated", U2, "9", 7),
            Observed::Replaced { ref old_uid, .. } if old_uid == U1
        ));
        let gone = s.end_list();
        assert_eq!(gone.len(), 1);
        assert_eq!(
            (
                gone[0].name.as_str(),
                gone[0].rv.as_str(),
                gone[0].unconfirmed
            ),
            ("gone", "5", true)
        );
    }

    #[test]
    fn remove_forgets_only_that_key() {
        let mut s = LightStore::new();
        s.observe(Some("a"), "x", U1, "1", 1);
        s.observe(Some("b"), "x", U1, "1", 1);
        assert!(s.remove(Some("a"), "x"));
        assert!(!s.remove(Some("a"), "x"));
        assert!(!s.remove(Some("zzz"), "x"));
        assert_eq!(s.keys(), vec![(Some("b".to_owned()), "x".to_owned())]);
    }

    #[test]
    fn restoring_another_uid_of_a_key_makes_the_held_one_former_and_owed_once() {
        let mut s = LightStore::new();
        let ns = s.intern(Some("a"));
        let confirmed = Facts::from_text(U1, "5", 7);
        s.restore(ns, "x", &confirmed);
        s.restore(ns, "x", &Facts::unconfirmed(Uid::parse(U2), Rv::parse("8")));
        assert_eq!(s.len(), 1, "one key");
        assert_eq!(s.get(Some("a"), "x").map(|f| f.uid), Some(Uid::parse(U2)));
        let owed = s.take_owed();
        assert_eq!(owed.len(), 1);
        assert_eq!(
            (owed[0].vanished.uid.as_str(), owed[0].vanished.rv.as_str()),
            (U1, "5")
        );
        assert_eq!(owed[0].seen_gone.as_deref(), Some("8"), "the current uid's");
        assert_eq!(s.take_owed(), [], "owed once: now sent");
        let mut named = Vec::new();
        s.for_each_former(|_, name, f| named.push((name.to_owned(), f.uid.render(), f.sent)));
        assert_eq!(
            named,
            [("x".to_owned(), U1.to_owned(), true)],
            "kept until settled"
        );
        // The namespace stays while only the former refers to it.
        s.remove(Some("a"), "x");
        assert_eq!(s.namespace_count(), 1);
        assert!(s.settle_former(Some("a"), "x", U1));
        assert!(!s.settle_former(Some("a"), "x", U1));
        assert_eq!(s.namespace_count(), 0, "forgotten with its last reference");
    }

    #[test]
    fn restoring_a_key_with_its_former_uid_forgets_that_former() {
        let mut s = LightStore::new();
        let ns = s.intern(None);
        s.restore(ns, "x", &Facts::from_text(U1, "5", 7));
        s.restore(ns, "x", &Facts::from_text(U1, "6", 7));
        assert_eq!(s.take_owed(), [], "same uid: no former");
        s.add_former(
            ns,
            "x",
            Uid::parse(U2).into_owned(),
            Rv::parse("4").into_owned(),
            true,
        );
        s.restore(ns, "x", &Facts::from_text(U2, "9", 7));
        let mut formers = Vec::new();
        s.for_each_former(|_, _, f| formers.push((f.uid.render(), f.sent)));
        assert_eq!(
            formers,
            [(U1.to_owned(), false)],
            "U2 is current again, U1 former"
        );
    }
}
