"""A stand-in for vLLM's OpenAI server on a GPU, which this machine does not have: started exactly as
specviz starts vLLM (`PYTHON -m vllm.entrypoints.openai.api_server --port P ...`, through a wrapper
that runs this file), it answers /health and streams /v1/chat/completions (one word per chunk, a
few milliseconds apart, `max_tokens` words with `ignore_eos`, a short answer without), with vLLM's
per-request acceptance figures when it was given a speculative config. It appends what it saw to
the JSON Lines file $STANDIN_RECORD: its start (command line), each request's body, and its stop.

Used by tests/test_engine_vllm.py to check the sweep's server commands, their order and its
requests for device="cuda"; the real server's behaviour is checked there on vLLM's CPU build."""

import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECONDS_PER_TOKEN = 0.002
EOS_AFTER = 3          # tokens an answer has when it may end at EOS


def record(**event) -> None:
    with open(os.environ["STANDIN_RECORD"], "a") as out:
        out.write(json.dumps(dict(event, pid=os.getpid(), t=time.time())) + "\n")


def main() -> None:
    argv = sys.argv[1:]
    port = int(argv[argv.index("--port") + 1])
    speculative = "--speculative-config" in argv
    record(event="start", argv=argv, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            body = b"{}" if self.path == "/health" else json.dumps({"data": [{"id": "specviz-target"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            record(event="request", port=port, body=request)
            tokens = request["max_tokens"] if request.get("ignore_eos") else min(EOS_AFTER, request["max_tokens"])
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def send(payload):
                data = f"data: {payload}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            for i in range(tokens):
                time.sleep(SECONDS_PER_TOKEN)
                send(json.dumps({"choices": [{"delta": {"content": f"w{i} "},
                                              "finish_reason": "length" if i == tokens - 1 else None}]}))
            final = {"choices": [], "usage": {"completion_tokens": tokens}}
            if speculative:
                steps = max(1, tokens // 2)
                final["metrics"] = {"speculative_decoding": {
                    "num_spec_steps": steps, "num_draft_tokens": 4 * steps, "num_accepted_draft_tokens": steps,
                    "acceptance_histogram": [0, steps, 0, 0, 0], "mean_acceptance_length": 2.0,
                    "draft_acceptance_rate": 0.25}}
            send(json.dumps(final))
            send("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)

    def stop(*_):
        record(event="stop")
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    server.serve_forever()


if __name__ == "__main__":
    main()
