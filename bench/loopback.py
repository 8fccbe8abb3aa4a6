"""A Silt process on loopback for the bench scripts: started with its own data directory,
called over HTTP with JSON, stopped with SIGTERM and its directory removed."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import urllib.request


class Process:
    """`args(data_dir, addr)` gives the command line; the process listens on `addr`."""

    def __init__(self, args, name: str, base_port: int) -> None:
        self.data = tempfile.mkdtemp(prefix=f"silt-{name}-")
        self.addr = f"127.0.0.1:{base_port + os.getpid() % 1000}"
        self.base = f"http://{self.addr}"
        self.process = subprocess.Popen(
            args(self.data, self.addr), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def call(self, method: str, path: str, body=None) -> bytes:
        payload = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base + path, data=payload, method=method, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.read()

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait()
        shutil.rmtree(self.data, ignore_errors=True)
