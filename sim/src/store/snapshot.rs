//! Reading the state of one resource *as of* a past resourceVersion, reconstructed from the
//! current objects and the event log (each event keeps the previous object). This is how list
//! pages are served consistently at the first page's resourceVersion and how
//! `resourceVersionMatch=Exact` works
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions>).
//! Read-only: this module never changes the store.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use super::{ObjKey, Store, StoredObject};
use crate::resources::ResourceKey;
use crate::selector::Selectors;

/// One page of a snapshot.
#[derive(Debug, Default)]
pub struct Page {
    /// Matching objects in (namespace, name) order.
    pub items: Vec<Arc<StoredObject>>,
    /// Key of the last item when more matching items follow (the next page starts after it).
    pub next_start: Option<ObjKey>,
    /// How many matching items follow this page.
    pub remaining: usize,
}

/// What to read from a snapshot.
pub struct PageRequest<'a> {
    /// Resource to read.
    pub resource: &'a ResourceKey,
    /// Only this namespace (None = all).
    pub namespace: Option<&'a str>,
    /// The snapshot's resourceVersion (must be within the retained window).
    pub at_rv: u64,
    /// Start strictly after this key.
    pub after: Option<&'a ObjKey>,
    /// Page size; 0 = unlimited.
    pub limit: usize,
    /// Selectors applied to each object.
    pub selectors: &'a Selectors,
}

impl Store {
    /// The objects of `resource` changed after `at_rv`, mapped to their state at `at_rv`
    /// (`None` = absent then).
    fn overlay(
        &self,
        resource: &ResourceKey,
        at_rv: u64,
    ) -> BTreeMap<ObjKey, Option<Arc<StoredObject>>> {
        let mut overlay = BTreeMap::new();
        let first_newer = self.log.partition_point(|e| e.rv <= at_rv);
        // Walk newest to oldest so the oldest event after at_rv writes last: its `prev` is the
        // state at at_rv.
        for ev in self.log.range(first_newer..).rev() {
            if ev.resource == *resource {
                let key = (ev.object.namespace.clone(), ev.object.name.clone());
                overlay.insert(key, ev.prev.clone());
            }
        }
        overlay
    }

    /// Reads one page of `req.resource` as of `req.at_rv`. The caller checks the window.
    pub fn page(&self, req: &PageRequest<'_>) -> Page {
        let overlay = self.overlay(req.resource, req.at_rv);
        let empty = BTreeMap::new();
        let current = self.objects.get(req.resource).unwrap_or(&empty);
        let lower = match req.after {
            Some(k) => Bound::Excluded(k.clone()),
            None => Bound::Unbounded,
        };
        let range = (lower, Bound::Unbounded);
        let mut cur = current.range::<ObjKey, _>(range.clone()).peekable();
        let mut ovl = overlay.range::<ObjKey, _>(range).peekable();
        let mut page = Page::default();
        loop {
            // Merge two sorted streams; the overlay wins on equal keys.
            let next: Option<Option<&Arc<StoredObject>>> = match (cur.peek(), ovl.peek()) {
                (None, None) => break,
                (Some(_), None) => cur.next().map(|(_, o)| Some(o)),
                (None, Some(_)) => ovl.next().map(|(_, o)| o.as_ref()),
                (Some((ck, _)), Some((ok, _))) => {
                    if ck < ok {
                        cur.next().map(|(_, o)| Some(o))
                    } else {
                        if ck == ok {
                            cur.next();
                        }
                        ovl.next().map(|(_, o)| o.as_ref())
                    }
                }
            };
            let Some(Some(obj)) = next else { continue };
            if req.namespace.is_some_and(|ns| ns != obj.namespace)
                || !req
                    .selectors
                    .matches(&obj.namespace, &obj.name, &obj.labels, &obj.body)
            {
                continue;
            }
            if req.limit > 0 && page.items.len() >= req.limit {
                page.remaining += 1;
            } else {
                page.items.push(obj.clone());
            }
        }
        if page.remaining > 0 {
            page.next_start = page
                .items
                .last()
                .map(|o| (o.namespace.clone(), o.name.clone()));
        }
        page
    }
}
