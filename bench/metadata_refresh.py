#!/usr/bin/env python3
"""What keeping an agent's copy of metadata current costs, as the state grows.

Starts one `silt metadata` node (the binary given) on loopback with its own data directory,
builds a state of one topic whose partition holds a chain of SEGMENTS sealed segments (the
commands an agent's writer sends: ClaimWriter, then OpenSegment and SealSegment per segment),
then sends one agent heartbeat at a time, as a cluster does every few seconds, and after each
reads what changed the two ways an agent can: the whole state
(`GET /metadata/state?after=N`) and the commands applied since (`...&changes=true`). Prints
the answers' mean size and the mean time to fetch and parse each, side by side:

    bench/metadata_refresh.py target/release/silt 100
    bench/metadata_refresh.py target/release/silt 5000
"""
import json
import sys
import time

from loopback import Process


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    silt, segments = sys.argv[1], int(sys.argv[2])
    node = Process(
        lambda data, addr: [silt, "metadata", "--id", "1", "--listen", addr, "--data-dir", data, "--peers", f"1={addr}", "--init"],
        "metadata-refresh",
        18000,
    )
    call = node.call

    def write(command: dict) -> dict:
        answer = json.loads(call("POST", "/metadata/write", command))
        if answer.get("type") == "error":
            sys.exit(f"{command['type']} refused: {answer}")
        return answer

    try:
        deadline = time.time() + 30
        while True:
            try:
                if json.loads(call("GET", "/metadata/status")).get("state") == "leader":
                    break
            except OSError:
                pass
            if time.time() > deadline:
                sys.exit("silt metadata did not lead within 30 s")
            time.sleep(0.1)
        now = int(time.time() * 1000)
        registered = write(
            {"type": "register_agent", "agent": "a1", "addr": "127.0.0.1:1", "lease_ms": 600000, "now_ms": now}
        )
        incarnation = registered["incarnation"]
        write({"type": "create_topic", "name": "chain", "partitions": 1, "config": {}, "now_ms": now})
        epoch = write(
            {"type": "claim_writer", "topic": "chain", "partition": 0, "agent": "a1", "expected_epoch": None}
        )["epoch"]
        started = time.time()
        for i in range(segments):
            base_offset = i * 10
            common = {"topic": "chain", "partition": 0, "epoch": epoch, "base_offset": base_offset}
            write({"type": "open_segment", **common, "ensemble": ["a1"], "now_ms": now})
            write(
                {
                    "type": "seal_segment",
                    **common,
                    "record_count": 10,
                    "size_bytes": 4096,
                    "min_timestamp_ms": now,
                    "max_timestamp_ms": now,
                    "now_ms": now,
                }
            )
        built = time.time() - started
        rounds = 50
        sizes = {"whole state": 0, "changes": 0}
        took = {"whole state": 0.0, "changes": 0.0}
        for _ in range(rounds):
            index = json.loads(call("GET", "/metadata/status"))["last_applied"]
            write({"type": "agent_heartbeat", "agent": "a1", "incarnation": incarnation, "now_ms": now})
            for kind, query in [("whole state", ""), ("changes", "&changes=true")]:
                t0 = time.perf_counter()
                body = call("GET", f"/metadata/state?after={index}{query}")
                json.loads(body)
                took[kind] += time.perf_counter() - t0
                sizes[kind] += len(body)
        print(f"{segments} segments in the chain (built in {built:.1f} s); one heartbeat, then each read, {rounds} times:")
        for kind in sizes:
            print(
                f"  {kind:12} mean answer {sizes[kind] / rounds / 1024:10.1f} KiB, "
                f"fetched and parsed in {1000 * took[kind] / rounds:8.3f} ms"
            )
    finally:
        node.stop()


if __name__ == "__main__":
    main()
