"""A closed-loop client for an OpenAI-compatible server (vLLM's, llama.cpp's), standard library only.

`closed_loop` keeps `concurrency` streams busy: each stream sends its next request as soon as its
last one ends (vLLM's own `vllm bench serve --max-concurrency B` does the same), so the server
always has B requests in flight until the list runs out. Each request is streamed, to time its
first token; the final chunk carries the usage and the engine's acceptance figures for that request
(vLLM's with `--per-request-spec-decode-metrics`, llama.cpp's `timings`).

The client's own cost per chunk is one JSON parse; on this CPU it stays within a few percent of
`vllm.benchmarks.serve` at the same concurrency (scripts/vllm_side_by_side.py measures both).
"""

from __future__ import annotations

import http.client
import json
import queue
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ..errors import SpecvizError

READ_TIMEOUT = 300.0    # seconds without a byte from the server before a request fails
WAKE_SECONDS = 0.5      # how often the closed loop's waiting thread wakes to notice a Ctrl-C


@dataclass(frozen=True)
class Request:
    index: int           # its place in the list (a row of the sweep)
    prompt: str
    chat: bool           # through the model's chat template (/v1/chat/completions) or raw (/v1/completions)
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0       # 0: off
    seed: int | None = None
    ignore_eos: bool = False     # vLLM's extension: always write max_tokens (benchmarks: equal work)
    # vLLM's prefix-cache namespace (its `cache_salt`): requests with another salt, or none, never reuse
    # this one's cached prompt blocks. A sweep gives each point its own, so that a point is timed as
    # on a server just started (its requests share blocks among themselves, as `vllm bench serve`'s do).
    cache_salt: str | None = None

    def body(self, model: str) -> dict:
        # Sampling fields only where they differ from the server's defaults: the body is then what
        # `vllm bench serve` sends for the same request.
        body = {"model": model, "max_tokens": self.max_tokens, "temperature": self.temperature,
                "stream": True, "stream_options": {"include_usage": True}}
        if self.top_p < 1.0:
            body["top_p"] = self.top_p
        if self.top_k > 0:
            body["top_k"] = self.top_k
        if self.seed is not None:
            body["seed"] = self.seed
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.cache_salt is not None:
            body["cache_salt"] = self.cache_salt
        if self.chat:
            body["messages"] = [{"role": "user", "content": self.prompt}]
        else:
            body["prompt"] = self.prompt
        return body


@dataclass
class Response:
    index: int
    text: str = ""
    tokens: int = 0                  # completion tokens, as the server counted them
    sent: float = 0.0                # time.perf_counter() when the request was sent
    first: float | None = None       # ... when its first token arrived
    finished: float = 0.0
    finish_reason: str | None = None
    spec: dict | None = None         # the engine's acceptance figures for this request (`spec_figures`)
    chunks: int = 0
    arrivals: list[float] = field(default_factory=list)    # when each chunk with text arrived
    extra: dict = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.finished - self.sent

    @property
    def time_to_first_token(self) -> float | None:
        """vLLM's TTFT: from sending to the first text (prefill and queueing)."""
        return None if self.first is None else self.first - self.sent

    @property
    def inter_token_latencies(self) -> list[float]:
        """vLLM's ITL: the gaps between chunks with text (a chunk can hold several tokens)."""
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:])]

    @property
    def decode_seconds_per_token(self) -> float | None:
        """Time per output token after the first (vLLM's TPOT); None for a one-token answer."""
        if self.first is None or self.tokens < 2:
            return None
        return (self.finished - self.first) / (self.tokens - 1)


class EngineRequestError(SpecvizError):
    """The server refused a request or the connection broke (its message, as the server said it)."""


def _path(chat: bool) -> str:
    return "/v1/chat/completions" if chat else "/v1/completions"


def _post(connection: http.client.HTTPConnection, path: str, body: str) -> http.client.HTTPResponse:
    # A server may close a kept-alive connection between requests (llama.cpp's does): http.client
    # reopens a closed connection by itself, so one retry of a request that got no answer at all.
    for attempt in (1, 2):
        try:
            connection.request("POST", path, body=body,
                               headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
            return connection.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            connection.close()
            if attempt == 2:
                raise


def send(connection: http.client.HTTPConnection, base_path: str, model: str, request: Request) -> Response:
    """One streamed request on a kept-alive connection."""
    response = Response(request.index, sent=time.perf_counter())
    pieces: list[str] = []
    try:
        answer = _post(connection, base_path + _path(request.chat), json.dumps(request.body(model)))
        if answer.status != 200:
            raise EngineRequestError(f"The server refused a request (HTTP {answer.status}): "
                                     f"{_error_text(answer.read())}")
        while True:
            line = answer.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            response.chunks += 1
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") if request.chat else choice.get("text")
                if piece:
                    response.arrivals.append(time.perf_counter())
                    if response.first is None:
                        response.first = response.arrivals[-1]
                    pieces.append(piece)
                if choice.get("finish_reason"):
                    response.finish_reason = choice["finish_reason"]
            if chunk.get("usage"):
                response.tokens = chunk["usage"].get("completion_tokens", 0)
                response.spec = spec_figures(chunk)
                if chunk.get("timings"):
                    response.extra["timings"] = chunk["timings"]
            if chunk.get("error"):
                raise EngineRequestError(f"The server failed a request: {chunk['error'].get('message', chunk)}")
        answer.read()
    except (OSError, http.client.HTTPException) as error:
        raise EngineRequestError(f"The connection to the server broke ({type(error).__name__}: {error}).") \
            from None
    response.finished = time.perf_counter()
    response.text = "".join(pieces)
    return response


def spec_figures(chunk: dict) -> dict | None:
    """A final chunk's acceptance figures for its request: vLLM's `metrics.speculative_decoding` as it
    is, or llama.cpp's `timings.draft_n` / `draft_n_accepted` in vLLM's names (llama.cpp counts no
    speculative steps per request: its per-point steps come from /metrics, see `engines.llamacpp`)."""
    vllm = (chunk.get("metrics") or {}).get("speculative_decoding")
    if vllm is not None:
        return vllm
    timings = chunk.get("timings") or {}
    if "draft_n" not in timings:        # llama.cpp leaves them out when nothing was drafted
        return None
    return {"num_draft_tokens": timings["draft_n"], "num_accepted_draft_tokens": timings.get("draft_n_accepted", 0)}


def _error_text(body: bytes) -> str:
    try:
        payload = json.loads(body)
        error = payload.get("error", payload)
        return str(error.get("message", error) if isinstance(error, dict) else error)[:2000]
    except (ValueError, AttributeError):
        return body.decode(errors="replace")[:2000]


def connect(url: str) -> tuple[http.client.HTTPConnection, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SpecvizError(f"Not a server address: {url!r} (give http://HOST:PORT).")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return kind(parts.hostname, parts.port, timeout=READ_TIMEOUT), parts.path.rstrip("/")


def served_model(url: str) -> str:
    """The model name a running server serves (its first, from /v1/models)."""
    connection, base = connect(url)
    try:
        connection.request("GET", base + "/v1/models")
        answer = connection.getresponse()
        payload = json.loads(answer.read())
        return payload["data"][0]["id"]
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError) as error:
        raise SpecvizError(f"No OpenAI-compatible server answers at {url} ({type(error).__name__}: {error}).") \
            from None
    finally:
        connection.close()


def server_version(url: str) -> str | None:
    """vLLM's version as a running server reports it (GET /version), None if it does not say."""
    connection, base = connect(url)
    try:
        connection.request("GET", base + "/version")
        answer = connection.getresponse()
        return json.loads(answer.read()).get("version") if answer.status == 200 else None
    except (OSError, http.client.HTTPException, ValueError, AttributeError):
        return None
    finally:
        connection.close()


def closed_loop(url: str, model: str, requests: Sequence[Request], concurrency: int,
                stop: threading.Event | None = None) -> Iterator[Response]:
    """Send `requests` through `concurrency` streams, each sending its next request when its last one
    ends; yields each response as it finishes (in finishing order). Closing the generator, or setting
    `stop`, sends nothing more; requests in flight finish (or end when the server is stopped). A
    failed request stops the loop and is raised here."""
    stop = stop or threading.Event()       # the caller's: stop everything
    ended = threading.Event()               # this loop's: its consumer has gone or a request failed
    todo: queue.SimpleQueue[Request] = queue.SimpleQueue()
    for request in requests:
        todo.put(request)
    done: queue.SimpleQueue[Response | BaseException | None] = queue.SimpleQueue()

    def stream() -> None:
        connection, base = connect(url)
        try:
            while not stop.is_set() and not ended.is_set():
                try:
                    request = todo.get_nowait()
                except queue.Empty:
                    break
                done.put(send(connection, base, model, request))
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, who raises it
            ended.set()
            done.put(error)
        finally:
            connection.close()
            done.put(None)

    threads = [threading.Thread(target=stream, daemon=True, name=f"specviz-client-{i}")
               for i in range(max(1, min(concurrency, len(requests))))]
    for thread in threads:
        thread.start()
    running = len(threads)
    try:
        while running:
            try:
                # A timeout, not a bare get(): a Ctrl-C that the kernel hands to one of the stream
                # threads reaches this (the main) thread only when it runs Python code again, which a
                # lock wait without one defers until the next answer comes, a minute away on a slow server.
                item = done.get(timeout=WAKE_SECONDS)
            except queue.Empty:
                continue
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        ended.set()
