"""A kubesink consumer of a JetStream stream (nats-py): keeps the current view of the
cluster, resumes from a checkpoint, knows when it has caught up.

    python jetstream_view.py --server nats://localhost:4222 --stream KUBESINK --checkpoint view.json

Without a checkpoint it reads the stream from its first message (a rebuild); with one, from
the sequence after the saved one (a resume). The consumer is ephemeral (nothing stays on the
server); the checkpoint holds the sequence together with the view. Caught up = the stream's
last sequence at start was folded, or nothing is pending. With --exit-when-caught-up it then
prints the view as JSON Lines and exits; otherwise it keeps folding and checkpoints every
second until SIGTERM / Ctrl-C. --subject narrows the stream (e.g. kubesink.prod.core.Pod.*.*)."""

import argparse
import asyncio
import signal
import sys
import time

import nats
from nats.js.api import ConsumerConfig, DeliverPolicy, AckPolicy
from nats.js.errors import NotFoundError

import topology_view


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--stream", required=True)
    p.add_argument("--subject", default=None)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--exit-when-caught-up", action="store_true")
    args = p.parse_args()

    view, seq = topology_view.load(args.checkpoint)
    seq = seq or 0  # the last stream sequence folded
    nc = await nats.connect(args.server, connect_timeout=5, max_reconnect_attempts=-1)
    js = nc.jetstream()
    try:
        last = (await js.stream_info(args.stream)).state.last_seq
    except NotFoundError:
        sys.exit(f"JetStream stream {args.stream} at {args.server}: no such stream")
    config = ConsumerConfig(ack_policy=AckPolicy.NONE, inactive_threshold=30.0,
                            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=seq + 1)
    sub = await js.pull_subscribe(args.subject or "", stream=args.stream, config=config)

    stop = asyncio.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(s, stop.set)
    caught_up = seq >= last
    saved = time.monotonic()
    while not stop.is_set() and not (caught_up and args.exit_when_caught_up):
        try:
            msgs = await sub.fetch(256, timeout=0.5)
        except nats.errors.TimeoutError:
            msgs = []
            caught_up = caught_up or seq >= last or (await sub.consumer_info()).num_pending == 0
        for m in msgs:
            view.apply(m.data)
            seq = m.metadata.sequence.stream
            caught_up = caught_up or seq >= last or m.metadata.num_pending == 0
        if time.monotonic() - saved > 1:
            topology_view.save(args.checkpoint, view, seq)
            saved = time.monotonic()
    topology_view.save(args.checkpoint, view, seq)
    await nc.close()
    if caught_up:
        for line in view.lines():
            print(line)


if __name__ == "__main__":
    asyncio.run(main())
