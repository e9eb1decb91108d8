"""The fault campaign's order and uid oracles (scripts/chaos.sh), over every message a
destination holds: a JetStream stream (nats-py) or a Kafka topic (confluent-kafka).

  chaos_check.py --server URL nats URL STREAM
  chaos_check.py --server URL kafka BOOTSTRAP TOPIC

Checks, per (key, uid), in the order the destination holds the messages (a stream's
sequence; a Kafka partition's offsets, and every key lives in one partition):
  1. the resourceVersion never goes backwards;
  2. nothing of a uid follows its `deleted` but a repeat of that `deleted` (at-least-once);
  3. folded by (key, uid), as a consumer indexing by uid would (`added`/`updated` hold the
     pair, `deleted` removes that pair only), the pairs held equal the cluster's pods
     (namespace, name, uid), read from the API server at URL: no ghost of an old uid,
     nothing missing. (`kubesink fold --against-cluster` folds by key, as most consumers do.)
Sync markers and Kafka tombstones (null values) are skipped. Exit 0 when all hold, 1 when
one does not (the first 50 problems printed).
"""

import argparse
import asyncio
import json
import sys
import urllib.request


def check(messages, cluster):
    """`messages`: (position, message dict) in destination order; `cluster`: set of
    (namespace, name, uid). Returns (count, pairs, problems)."""
    seen, rv, deleted, held, problems = 0, {}, {}, set(), []
    for pos, msg in messages:
        seen += 1
        if msg.get("op") == "synced":
            continue
        key, uid, op = msg["key"], msg["uid"], msg["op"]
        pair = (msg.get("namespace") or "", msg["name"], uid)
        if op == "deleted":
            held.discard(pair)
        else:
            held.add(pair)
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
    for ns, name, uid in sorted(held - cluster):
        problems.append(f"uid fold: {ns}/{name} uid {uid} held, not in the cluster (a ghost)")
    for ns, name, uid in sorted(cluster - held):
        problems.append(f"uid fold: {ns}/{name} uid {uid} in the cluster, not held (missing)")
    return seen, len(rv), problems


def cluster_pods(server):
    with urllib.request.urlopen(f"{server}/api/v1/pods", timeout=30) as r:
        items = json.load(r)["items"]
    return {(p["metadata"].get("namespace", ""), p["metadata"]["name"], p["metadata"]["uid"]) for p in items}


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
            out.append((f"stream seq {seq}", json.loads(m.data)))
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
            out.append((f"partition {p} offset {off}", json.loads(m.value())))
        if off + 1 >= ends[p]:
            done.add(p)
    c.close()
    if len(done) < len(parts):
        print(f"kafka: read only {len(done)} of {len(parts)} partitions to their end", file=sys.stderr)
        sys.exit(1)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True, help="the API server (plain HTTP)")
    ap.add_argument("kind", choices=["nats", "kafka"])
    ap.add_argument("where")
    ap.add_argument("name")
    a = ap.parse_args()
    if a.kind == "nats":
        messages = asyncio.run(nats_messages(a.where, a.name))
    else:
        messages = kafka_messages(a.where, a.name)
    seen, pairs, problems = check(messages, cluster_pods(a.server))
    print(f"{a.kind} order and uid check: {seen} messages, {pairs} (key, uid) pairs, {len(problems)} problems")
    for p in problems[:50]:
        print("  " + p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
