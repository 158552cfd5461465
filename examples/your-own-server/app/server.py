"""A small inference server: POST /next-token {"inputs": [[token ids], ...]} -> {"next": [id, ...]}.

At start it compiles the model at every batch size it serves (serving.BATCH_SIZES) and only then says it
is ready (GET /ready). With compilecache the compiled code comes from the preloaded cache, so that start
is warm. Prometheus metrics (torch's cache hits and misses, and why a graph compiled afresh) on :9400.
"""

import json
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from cachelib import runtime

runtime.warm_start()  # before the first torch.compile: waits for a sidecar preload, records each graph's lookup

import serving  # noqa: E402
import torch  # noqa: E402

MODEL = torch.compile(serving.build_model(), dynamic=False)
READY = False


def next_tokens(rows: list[list[int]]) -> list[int]:
    with torch.no_grad():
        logits = MODEL(serving.input_ids(rows)).logits
    return logits[:, -1].argmax(-1).tolist()


def warm_up() -> None:
    for batch in serving.BATCH_SIZES:
        started = time.perf_counter()
        next_tokens([[0]] * batch)
        print(f"batch {batch}: first call {time.perf_counter() - started:.2f} s", flush=True)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.reply(200 if READY else 503, {"ready": READY})

    def do_POST(self) -> None:
        try:
            rows = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))["inputs"]
            self.reply(200, {"next": next_tokens(rows)})
        except (ValueError, KeyError, TypeError) as exc:
            self.reply(400, {"error": str(exc)})

    def reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    runtime.start_http_server(9400)
    warm_up()
    READY = True
    print(f"ready: {runtime.why().reason}", flush=True)
    HTTPServer(("", 8000), Handler).serve_forever()
