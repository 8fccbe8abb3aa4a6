#!/usr/bin/env python3
"""How a topic's history weighs on its produce requests.

Starts `silt dev` (the binary given) on loopback with its own data directory, creates a topic of
one partition with the smallest segments (segment.bytes=4096, retention.ms=-1), writes SEGMENTS
messages of 4 KiB (one segment each, so metadata holds a chain of that many segments), then
sends 1,000 produce requests of one small message and prints the agent's own mean produce
latency over them (silt_agent_produce_latency_seconds) and the client's. Run it with a short
chain and a long one, side by side:

    bench/segment_chain.py target/release/silt 100
    bench/segment_chain.py target/release/silt 3000
"""
import json
import re
import sys
import time

from loopback import Process


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    silt, segments = sys.argv[1], int(sys.argv[2])
    server = Process(lambda data, addr: [silt, "dev", "--data-dir", data, "--listen", addr], "chain", 17000)
    call = server.call

    def produce_latency() -> tuple[float, float]:
        metrics = call("GET", "/metrics").decode()
        total = re.search(r"^silt_agent_produce_latency_seconds_sum (\S+)", metrics, re.M)
        count = re.search(r"^silt_agent_produce_latency_seconds_count (\S+)", metrics, re.M)
        return float(total.group(1)), float(count.group(1))

    try:
        deadline = time.time() + 30
        while True:
            try:
                call("GET", "/health")
                break
            except OSError:
                if time.time() > deadline:
                    sys.exit("silt dev did not answer within 30 s")
                time.sleep(0.1)
        config = {"segment.bytes": "4096", "retention.ms": "-1"}
        call("POST", "/v1/topics", {"name": "chain", "partitions": 1, "config": config})
        started = time.time()
        for _ in range(segments):
            call("POST", "/v1/topics/chain/messages", {"messages": [{"value": "x" * 4200}]})
        built = time.time() - started
        topic = json.loads(call("GET", "/v1/topics/chain"))
        chain = sum(len(p["segments"]) for p in topic["partitions"])
        total0, count0 = produce_latency()
        started = time.time()
        requests = 1000
        for _ in range(requests):
            call("POST", "/v1/topics/chain/messages", {"messages": [{"value": "small"}]})
        wall = time.time() - started
        total1, count1 = produce_latency()
        agent_ms = 1000 * (total1 - total0) / (count1 - count0)
        print(
            f"{chain} segments in the chain (written in {built:.1f} s); {requests} produce requests: "
            f"agent mean {agent_ms:.3f} ms, client mean {1000 * wall / requests:.3f} ms"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
