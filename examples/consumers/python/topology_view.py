"""The fold every kubesink consumer does (docs/consumers.md), shared by kafka_view.py and
jetstream_view.py: a view keyed by the message key, deduplication by the key's last id,
upsert/delete by op, and the sync-marker sweep (docs/restarts.md, "Consumers: the recipe").
The view and the broker position are saved together in one checkpoint file, atomically."""

import json
import os


def message_key(m):
    """The message key: the payload's `key`, else derived as docs/message-contract.md says."""
    if "key" in m:
        return m["key"]
    return "/".join([m["cluster"], group_of(m), m["kind"], m.get("namespace", ""), m["name"]])


def group_of(m):
    """The group as keys write it: the `group` field, else from `apiVersion`; `core` if empty."""
    group = m.get("group")
    if group is None:
        api = m["apiVersion"]
        group = api.split("/", 1)[0] if "/" in api else ""
    return group or "core"


def scope_of(m, partition):
    """A sync marker's scope: the watch (cluster, group, kind, namespace) and the partition."""
    ns = m.get("namespace", "") if m.get("scope") == "namespace" else None
    return json.dumps([m["cluster"], group_of(m), m["kind"], ns, partition])


class View:
    def __init__(self):
        self.entries = {}  # key -> {"id", "op", "uid", "resourceVersion", "observedAt", "partition", "initial_seq"}
        self.scopes = {}   # scope -> {"last_marker_seq", "last_id"}
        self.seq = 0       # records folded, numbers the `initial` sightings

    def apply(self, value, record_key=None, partition=None):
        """Folds one record: `value` is the payload bytes, or None for a Kafka tombstone."""
        self.seq += 1
        if value is None:  # tombstone: delete by the record key
            self.entries.pop(record_key, None)
            return
        m = json.loads(value)
        if "specversion" in m and isinstance(m.get("data"), dict):
            m = m["data"]  # a structured-mode CloudEvent
        op = m.get("op")
        if op == "synced":
            return self.marker(m, partition)
        if op not in ("added", "updated", "deleted"):
            return  # an op this consumer does not know: skip it
        key = message_key(m)
        old = self.entries.get(key)
        if old is not None and old["id"] == m["id"]:
            if m.get("initial"):
                old["initial_seq"] = self.seq  # a new list re-sent it unchanged: seen
            return  # a redelivery: the key's last message again
        if op == "deleted":
            self.entries.pop(key, None)
            return
        self.entries[key] = {
            "id": m["id"], "op": op, "uid": m["uid"], "resourceVersion": m["resourceVersion"],
            "observedAt": m["observedAt"], "partition": partition,
            "changed": m.get("changed"),  # the paths the last update changed, if it said
            "initial_seq": self.seq if m.get("initial") else (old or {}).get("initial_seq", 0),
            "scope": [m["cluster"], group_of(m), m["kind"], m.get("namespace", "")],
        }

    def marker(self, m, partition):
        scope = scope_of(m, partition)
        state = self.scopes.setdefault(scope, {"last_marker_seq": 0, "last_id": None})
        since = state["last_marker_seq"]
        sweep = m.get("initial") is True and state["last_id"] != m["id"]
        state.update(last_marker_seq=self.seq, last_id=m["id"])
        if not sweep:
            return
        cluster, group, kind, ns, part = json.loads(scope)

        def in_scope(e):
            c, g, k, n = e["scope"]
            return (c, g, k) == (cluster, group, kind) and ns in (None, n) and part in (None, e["partition"])

        seen = sum(1 for e in self.entries.values() if in_scope(e) and e["initial_seq"] > since)
        if part is None and seen < m.get("count", 0):
            return  # some of the list never arrived (JetStream dropped re-sends as duplicates)
        for key, e in list(self.entries.items()):
            if in_scope(e) and e["initial_seq"] <= since:
                del self.entries[key]  # not in the list this marker closes: gone

    def lines(self):
        """The view as JSON Lines, ordered by key: key, op, uid, resourceVersion, observedAt,
        and changed when the key's last message had it."""
        for key in sorted(self.entries):
            e = self.entries[key]
            line = {"key": key, "op": e["op"], "uid": e["uid"],
                    "resourceVersion": e["resourceVersion"], "observedAt": e["observedAt"]}
            if e.get("changed") is not None:
                line["changed"] = e["changed"]
            yield json.dumps(line)


def load(path):
    """(view, position) from the checkpoint, or an empty view and None."""
    view = View()
    try:
        with open(path) as f:
            c = json.load(f)
    except FileNotFoundError:
        return view, None
    view.entries, view.scopes, view.seq = c["entries"], c["scopes"], c["seq"]
    return view, c["position"]


def save(path, view, position):
    """Writes view and position together: a crash leaves the old checkpoint or the new one."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"position": position, "entries": view.entries, "scopes": view.scopes,
                   "seq": view.seq}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
