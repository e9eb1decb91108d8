"""The fault campaign's order and uid oracles (scripts/chaos.sh), over every message a
destination holds: a JetStream stream (nats-py) or a Kafka topic (confluent-kafka).

  chaos_check.py --server URL nats URL STREAM
  chaos_check.py --server URL kafka BOOTSTRAP TOPIC

Honours leader epochs as `kubesink fold` does (docs/consumers.md): a message whose
`leaderEpoch` is below the highest already applied for its key is a deposed leader's late
write, skipped and counted; one that lands after its leader's successor was itself replaced
(the stream's, or the partition's, highest epoch is above epoch + 1) is a zombie publish no
freeze explains, and a problem. Then, per (key, uid), in the order the destination holds the
messages (a stream's sequence; a Kafka partition's offsets, and every key lives in one
partition):
  1. the resourceVersion never goes backwards;
  2. nothing of a uid follows its `deleted` but a repeat of that `deleted` (at-least-once);
  3. folded by (key, uid), as a consumer indexing by uid would (`added`/`updated` hold the
     pair, `deleted` removes that pair only), the pairs held equal the cluster's Pods,
     ConfigMaps and Secrets (kind, namespace, name, uid), read from the API server at URL: no
     ghost of an old uid, nothing missing;
  4. exact state: each pair held carries the cluster's resourceVersion, and its `spec`,
     `status` and `data` equal the live object's (payload "full");
  5. no Secret message carries `data` or `stringData`; some Secret was seen; with
     `--expect-recreated`, some key was seen with more than one uid.
Sync markers and Kafka tombstones (null values) are skipped (markers counted). With
`--drop-update` (the campaign's lost-update plant) the last `updated` of one live object is
left out of what is read. Exit 0 when all hold, 1 when one does not (the first 50 problems
printed).
"""

import argparse
import asyncio
import json
import sys
import urllib.request


KINDS = {"Pod": "pods", "ConfigMap": "configmaps", "Secret": "secrets"}
CONTENT = ("spec", "status", "data")  # compared with the cluster's where the payload has them


def check(messages, cluster, drop_update=False):
    """`messages`: (position, partition, message dict) in destination order; `cluster`: dict
    (kind, namespace, name, uid) -> live object. Returns (stats, problems)."""
    st = {"messages": 0, "markers": 0, "late": 0, "zombies": 0, "secrets": 0, "recreated": 0, "late_markers": 0}
    rv, deleted, held, problems = {}, {}, {}, []
    epochs, part_max, uids = {}, {}, {}
    if drop_update:  # the lost-update plant: forget the last `updated` of one live pair
        last = {}
        for i, (_, _, m) in enumerate(messages):
            if m.get("op") != "synced":
                last[(m.get("kind"), m.get("namespace") or "", m["name"], m["uid"])] = i
        for k, i in sorted(last.items(), key=lambda kv: kv[1]):
            if k in cluster and messages[i][2]["op"] == "updated":
                print(f"PLANT lost-update: dropped {messages[i][0]} ({k[1]}/{k[2]} rv {messages[i][2]['resourceVersion']}, updated)")
                messages = messages[:i] + messages[i + 1:]
                break
    for pos, part, msg in messages:
        st["messages"] += 1
        epoch = msg.get("leaderEpoch")
        if epoch is not None:
            part_max[part] = max(part_max.get(part, 0), epoch)
        if msg.get("op") == "synced":
            st["markers"] += 1
            # `kubesink fold` applies the epoch rule to markers by key and partition (on Kafka
            # one marker key is written to every partition): counted here to compare.
            if epoch is not None:
                mk = (msg["key"], part)
                if epoch < epochs.get(mk, epoch):
                    st["late_markers"] += 1
                else:
                    epochs[mk] = epoch
            continue
        key, uid, op = msg["key"], msg["uid"], msg["op"]
        # Leader epochs (docs/consumers.md), as `kubesink fold` honours them: a message below
        # the highest epoch already applied for its key is a deposed leader's late write,
        # skipped. A late write can only come from a leader's client library draining after
        # its successor took over, so it must land while that successor (epoch + 1) is still
        # the newest writer of its stream (partition); one that lands after a later hand-over
        # is a zombie publish nothing in the schedule explains.
        if epoch is not None:
            top = epochs.get(key)
            if top is not None and epoch < top:
                st["late"] += 1
                if part_max[part] > epoch + 1:
                    st["zombies"] += 1
                    problems.append(f"{key} uid {uid}: {op} of leader epoch {epoch} at rv {msg['resourceVersion']} ({pos}) "
                                    f"after epoch {part_max[part]} wrote: a zombie publish (late by more than one hand-over)")
                continue
            epochs[key] = epoch
        if msg.get("kind") == "Secret":
            st["secrets"] += 1
            obj = msg.get("object") or {}
            for f in ("data", "stringData"):
                if f in obj:
                    problems.append(f"{key}: Secret {op} ({pos}) carries {f}")
        uids.setdefault(key, set()).add(uid)
        pair = (msg.get("kind"), msg.get("namespace") or "", msg["name"], uid)
        if op == "deleted":
            held.pop(pair, None)
        else:
            held[pair] = msg
        try:
            n = int(msg["resourceVersion"])
        except ValueError:
            continue
        k = (key, uid)
        if k in deleted and op != "deleted":
            problems.append(f"{key} uid {uid}: {op} at rv {n} ({pos}) after its deleted at rv {deleted[k]}")
        if k in rv and n < rv[k]:
            problems.append(f"{key} uid {uid}: rv {n} ({pos}, {op}) after rv {rv[k]}")
        rv[k] = max(rv.get(k, 0), n)
        if op == "deleted":
            deleted[k] = n
    st["recreated"] = sum(1 for u in uids.values() if len(u) > 1)
    for k in sorted(set(held) - set(cluster)):
        problems.append(f"uid fold: {k[0]} {k[1]}/{k[2]} uid {k[3]} held, not in the cluster (a ghost)")
    for k in sorted(set(cluster) - set(held)):
        problems.append(f"uid fold: {k[0]} {k[1]}/{k[2]} uid {k[3]} in the cluster, not held (missing)")
    for k in sorted(set(cluster) & set(held)):
        live, msg = cluster[k], held[k]
        want, got = live["metadata"]["resourceVersion"], msg["resourceVersion"]
        if want != got:
            problems.append(f"exact state: {k[0]} {k[1]}/{k[2]} uid {k[3]}: rv {got} held, the cluster has rv {want} (a lost update)")
            continue
        obj = msg.get("object") or {}
        for f in CONTENT:
            if f in live and not (k[0] == "Secret" and f == "data") and obj.get(f) != live[f]:
                problems.append(f"exact state: {k[0]} {k[1]}/{k[2]} at rv {got}: {f} differs from the cluster's")
    st["pairs"] = len(rv)
    st["held"] = len(held)
    return st, problems


def cluster_objects(server):
    out = {}
    for kind, plural in KINDS.items():
        with urllib.request.urlopen(f"{server}/api/v1/{plural}", timeout=30) as r:
            for o in json.load(r)["items"]:
                m = o["metadata"]
                out[(kind, m.get("namespace", ""), m["name"], m["uid"])] = o
    return out


async def nats_messages(url, stream):
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    info = await js.stream_info(stream)
    last, out = info.state.last_seq, []
    if info.state.messages:
        sub = await js.subscribe(">", stream=stream, ordered_consumer=True)
        seq = 0
        while seq < last:
            try:
                m = await sub.next_msg(timeout=10)
            except Exception:
                break
            seq = m.metadata.sequence.stream
            out.append((f"stream seq {seq}", "stream", json.loads(m.data)))
    await nc.close()
    return out


def kafka_messages(bootstrap, topic):
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "chaos-check",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    meta = c.list_topics(topic, timeout=30).topics[topic]
    parts = sorted(meta.partitions)
    ends = {}
    for p in parts:
        _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        ends[p] = high
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    out, done, idle = [], {p for p in parts if ends[p] == 0}, 0
    while len(done) < len(parts) and idle < 20:
        m = c.poll(1.0)
        if m is None:
            idle += 1
            continue
        if m.error():
            print(f"kafka: {m.error()}", file=sys.stderr)
            idle += 1
            continue
        idle = 0
        p, off = m.partition(), m.offset()
        if m.value() is not None:  # a tombstone's value is null
            out.append((f"partition {p} offset {off}", p, json.loads(m.value())))
        if off + 1 >= ends[p]:
            done.add(p)
    c.close()
    if len(done) < len(parts):
        print(f"kafka: read only {len(done)} of {len(parts)} partitions to their end", file=sys.stderr)
        sys.exit(1)
    return out


def show(messages, keys):
    """Prints, in destination order, each message of `keys` and every sync marker of their
    kinds: op, uid, resourceVersion, initial, leaderEpoch, id (markers: count)."""
    kinds = {k.split("/")[2] for k in keys if k.count("/") >= 3}
    for pos, _, m in messages:
        if m.get("key") in keys or (m.get("op") == "synced" and m.get("kind") in kinds):
            what = f"{m.get('kind')} marker count={m.get('count')}" if m.get("op") == "synced" else m.get("key")
            print(f"  {pos}: {m.get('op')} {what} uid={m.get('uid')} rv={m.get('resourceVersion')} "
                  f"initial={m.get('initial')} epoch={m.get('leaderEpoch')} id={m.get('id')} observedAt={m.get('observedAt')}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True, help="the API server (plain HTTP)")
    ap.add_argument("kind", choices=["nats", "kafka"])
    ap.add_argument("where")
    ap.add_argument("name")
    ap.add_argument("--drop-update", action="store_true", help="plant: drop the last `updated` of one live object from what is read")
    ap.add_argument("--expect-recreated", action="store_true", help="fail unless some key was seen with more than one uid")
    ap.add_argument("--show", action="append", default=[], metavar="KEY",
                    help="print every message of KEY and the sync markers of its kind, in destination order, then exit (evidence for a drift)")
    a = ap.parse_args()
    if a.kind == "nats":
        messages = asyncio.run(nats_messages(a.where, a.name))
    else:
        messages = kafka_messages(a.where, a.name)
    if a.show:
        show(messages, a.show)
        return
    st, problems = check(messages, cluster_objects(a.server), a.drop_update)
    if a.expect_recreated and st["recreated"] == 0:
        problems.append("no key was seen with more than one uid: re-creation was not exercised")
    if st["secrets"] == 0:
        problems.append("no Secret message: Secrets were not exercised")
    print(f"{a.kind} order, uid and exact-state check: {st['messages']} messages ({st['markers']} sync markers, "
          f"{st['secrets']} of Secrets), {st['pairs']} (key, uid) pairs, {st['held']} held, keys re-created with a new uid: "
          f"{st['recreated']}, late writes of a deposed leader skipped: {st['late']} ({st['zombies']} zombies), sync markers below their key's epoch: {st['late_markers']}, {len(problems)} problems")
    for p in problems[:50]:
        print("  " + p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
