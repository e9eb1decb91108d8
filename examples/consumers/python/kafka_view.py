"""A kubesink consumer of a Kafka topic (confluent-kafka): keeps the current view of the
cluster, resumes from a checkpoint, knows when it has caught up.

    python kafka_view.py --bootstrap localhost:9092 --topic kubesink.prod --checkpoint view.json

Without a checkpoint it reads every partition from the beginning (a rebuild); with one, from
the saved offsets (a resume). Partitions are assigned, not subscribed: no consumer group, no
offset commits; the checkpoint holds the offsets together with the view, so they never
disagree. Caught up = every partition reached the high watermark read at start. With
--exit-when-caught-up it then prints the view as JSON Lines and exits; otherwise it keeps
folding and checkpoints every second until SIGTERM / Ctrl-C."""

import argparse
import signal
import sys
import time

from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING

import topology_view


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--exit-when-caught-up", action="store_true")
    args = p.parse_args()

    view, offsets = topology_view.load(args.checkpoint)
    offsets = offsets or {}  # partition (str) -> next offset to read
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": "unused-no-commits",
                         "enable.auto.commit": False, "enable.auto.offset.store": False})
    meta = consumer.list_topics(args.topic, timeout=10)
    topic = meta.topics.get(args.topic)
    if topic is None or topic.error is not None or not topic.partitions:
        sys.exit(f"Kafka topic {args.topic} at {args.bootstrap}: no such topic")
    partitions = sorted(topic.partitions)
    consumer.assign([TopicPartition(args.topic, p, offsets.get(str(p), OFFSET_BEGINNING))
                     for p in partitions])
    behind = {}  # partition -> high watermark at start, while not reached
    for p in partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(args.topic, p), timeout=10)
        if high > max(low, offsets.get(str(p), 0)):
            behind[p] = high

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    saved = time.monotonic()
    while not stop:
        if not behind and args.exit_when_caught_up:
            break
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            key = msg.key().decode() if msg.key() is not None else None
            view.apply(msg.value(), record_key=key, partition=msg.partition())
            offsets[str(msg.partition())] = msg.offset() + 1
            if behind.get(msg.partition(), 0) <= msg.offset() + 1:
                behind.pop(msg.partition(), None)
        if time.monotonic() - saved > 1:
            topology_view.save(args.checkpoint, view, offsets)
            saved = time.monotonic()
    topology_view.save(args.checkpoint, view, offsets)
    consumer.close()
    if not behind:
        for line in view.lines():
            print(line)


if __name__ == "__main__":
    main()
