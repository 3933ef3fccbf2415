"""`python -m tests.e2e.healthz_probe URL`: GET URL/healthz back to back until stdin closes, then
print each round trip's milliseconds as one JSON list.

A process of its own, so that what it measures is the API's answer time, not a wait for the GIL
of a test process that is busy driving hundreds of requests of its own.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import httpx


def main(base_url: str) -> int:
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    latencies_ms: list[float] = []
    with httpx.Client(base_url=base_url, timeout=10.0) as client:
        print("polling", flush=True)
        while not stop.is_set():
            started = time.perf_counter()
            response = client.get("/healthz")
            latencies_ms.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                print(json.dumps({"error": response.status_code}), flush=True)
                return 1
            time.sleep(0.01)
    print(json.dumps(latencies_ms), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
