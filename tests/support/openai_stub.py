"""A real OpenAI-compatible HTTP server for tests: deterministic answers, a request log and
injectable faults. Clients talk to it over TCP exactly as they would to a provider.

Chat completions: the first user message holds the text to extract from (inside its
``<document>`` blocks, as services/core/llm/prompts.py writes it). Entities are maximal
runs of Capitalised words (type CONCEPT, description = their first sentence); consecutive
entities of a sentence are related (RELATED_TO, strength 5). Follow-up turns (gleaning) get
empty lists. ``chat_handler`` replaces all of this with a callable(body) -> content.

Embeddings: a hashed bag of words of ``dimensions`` (or ``embedding_dim``) entries,
L2-normalised, as floats or base64 float32 as the request asks.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import math
import re
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

FaultKind = Literal["429", "500", "400", "401", "timeout", "disconnect", "malformed"]
ChatHandler = Callable[[dict[str, Any]], str]

_CAPITALISED_RUN = re.compile(r"\b[A-Z][\w'’-]*(?:[ \t]+[A-Z][\w'’-]*)*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_TOKEN = re.compile(r"\w+|[^\w\s]")
_BLOCK = re.compile(r"<document(?: id=\"([^\"]*)\")?>\n(.*?)\n</document>", re.DOTALL)


@dataclass(frozen=True)
class StubRequest:
    """One request as the server received it."""

    path: str
    body: dict[str, Any]
    time: float


@dataclass
class OpenAIStub:
    """Start with ``start()`` (or the ``openai_stub`` fixture); ``base_url`` ends in /v1."""

    embedding_dim: int = 384
    hang_s: float = 3.0  # how long a "timeout" fault holds the request
    held: int = 0  # requests a "timeout" fault holds now (counted when taken, under _lock)
    chat_handler: ChatHandler | None = None
    requests: list[StubRequest] = field(default_factory=list)
    _faults: deque[FaultKind] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("stub not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> OpenAIStub:
        """Listen on a free port of 127.0.0.1 in a background thread."""
        stub = self

        class Handler(_Handler):
            pass

        Handler.stub = stub
        self._stopping.clear()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},  # quick shutdown between tests
            name="openai-stub",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; requests held by a "timeout" fault are released."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def fail_next(self, kind: FaultKind, times: int = 1) -> None:
        """The next ``times`` requests (any endpoint) fail this way, in queue order."""
        with self._lock:
            self._faults.extend([kind] * times)

    def requests_to(self, suffix: str) -> list[StubRequest]:
        """Logged requests whose path ends with ``suffix`` (e.g. "/chat/completions")."""
        with self._lock:
            return [r for r in self.requests if r.path.endswith(suffix)]

    def _log(self, path: str, body: dict[str, Any]) -> FaultKind | None:
        with self._lock:
            self.requests.append(StubRequest(path, body, time.time()))
            fault = self._faults.popleft() if self._faults else None
            if fault == "timeout":
                self.held += 1
            return fault

    def _hang(self) -> None:
        try:
            self._stopping.wait(self.hang_s)
        finally:
            with self._lock:
                self.held -= 1

    def chat_content(self, body: dict[str, Any]) -> str:
        """The assistant content the stub answers ``body`` with."""
        if self.chat_handler is not None:
            return self.chat_handler(body)
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        if len(users) != 1:
            return json.dumps({"entities": [], "relationships": []})
        return json.dumps(extract_graph(document_text(_text_of(users[0]))))


def document_blocks(message: str) -> list[tuple[str, str]]:
    """(id, text) of each ``<document>`` block of a prompt, in order ("" when it has no id)."""
    return [(m.group(1) or "", m.group(2)) for m in _BLOCK.finditer(message)]


def outside_blocks(message: str) -> str:
    """The prompt without its ``<document>`` blocks: what the model reads as instructions."""
    return _BLOCK.sub("", message)


def document_text(message: str) -> str:
    """The text of a prompt's document blocks (the whole message when it has none)."""
    blocks = document_blocks(message)
    return "\n".join(text for _, text in blocks) if blocks else message


_FROM_TO = re.compile(r"\bfrom (\d{4}) to (\d{4})\b")


def extract_graph(text: str) -> dict[str, list[dict[str, Any]]]:
    """The stub's deterministic extraction of ``text`` in the extractor's JSON shape."""
    entities: dict[str, dict[str, Any]] = {}
    relationships: list[dict[str, Any]] = []
    for sentence in _SENTENCE_END.split(text):
        names = [m.group(0) for m in _CAPITALISED_RUN.finditer(sentence)]
        for name in names:
            entities.setdefault(
                name, {"name": name, "type": "CONCEPT", "description": sentence.strip()}
            )
        # When it held, as a model gives it: the sides of "from Y1 to Y2", else none.
        held = _FROM_TO.search(sentence)
        for a, b in itertools.pairwise(names):
            if a != b:
                relationships.append(
                    {
                        "source": a,
                        "target": b,
                        "type": "RELATED_TO",
                        "description": sentence.strip(),
                        "strength": 5,
                        "valid_from": held.group(1) if held else "",
                        "valid_to": held.group(2) if held else "",
                    }
                )
    return {"entities": list(entities.values()), "relationships": relationships}


def hashed_embedding(text: str, dim: int) -> list[float]:
    """Signed hashed bag of lower-cased words, L2-normalised (a unit vector if empty)."""
    vector = [0.0] * dim
    for word in re.findall(r"\w+", text.lower()):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        value = int.from_bytes(digest, "little")
        vector[value % dim] += 1.0 if (value >> 63) & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0:
        vector[0] = 1.0
        return vector
    return [v / norm for v in vector]


def count_tokens(text: str) -> int:
    """A rough token count (words and punctuation), enough for realistic usage fields."""
    return len(_TOKEN.findall(text))


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content", "")
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


class _Handler(BaseHTTPRequestHandler):
    stub: OpenAIStub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep pytest output clean

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            self._error(400, "invalid_request_error", "body is not JSON")
            return
        path = self.path.split("?", 1)[0]
        fault = self.stub._log(path, body)
        if fault is not None and self._fault(fault):
            return
        if path.endswith("/chat/completions"):
            self._chat(body, malformed=fault == "malformed")
        elif path.endswith("/embeddings"):
            self._embeddings(body, malformed=fault == "malformed")
        else:
            self._error(404, "invalid_request_error", f"no route for {path}")

    def _fault(self, kind: FaultKind) -> bool:
        """Answer with the fault; False when the normal handler should shape the answer."""
        if kind == "429":
            self._error(429, "rate_limit_exceeded", "Rate limit reached", {"Retry-After": "0"})
        elif kind == "500":
            self._error(500, "server_error", "The server had an error")
        elif kind == "400":
            self._error(400, "invalid_request_error", "Invalid request")
        elif kind == "401":
            self._error(401, "invalid_api_key", "Incorrect API key provided")
        elif kind == "disconnect":
            self.close_connection = True  # no answer at all: the client sees a dropped connection
        elif kind == "timeout":
            self.stub._hang()
            self.close_connection = True
        else:
            return False
        return True

    def _chat(self, body: dict[str, Any], *, malformed: bool) -> None:
        content = (
            "Sure! Here are the entities: {not json" if malformed else self.stub.chat_content(body)
        )
        prompt = sum(
            count_tokens(_text_of(m)) + 4 for m in body.get("messages", []) if isinstance(m, dict)
        )
        completion = count_tokens(content)
        self._json(
            200,
            {
                "id": f"chatcmpl-stub-{len(self.stub.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "stub"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content, "refusal": None},
                        "finish_reason": "stop",
                        "logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            },
        )

    def _embeddings(self, body: dict[str, Any], *, malformed: bool) -> None:
        if malformed:
            self._raw(200, b"<html>not json</html>", "application/json")
            return
        inputs = body.get("input", [])
        texts = [inputs] if isinstance(inputs, str) else [str(t) for t in inputs]
        dim = int(body.get("dimensions") or self.stub.embedding_dim)
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for i, t in enumerate(texts):
            vector = hashed_embedding(t, dim)
            encoded: Any = (
                base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode("ascii")
                if as_base64
                else vector
            )
            data.append({"object": "embedding", "index": i, "embedding": encoded})
        tokens = sum(count_tokens(t) for t in texts)
        self._json(
            200,
            {
                "object": "list",
                "data": data,
                "model": body.get("model", "stub"),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    def _error(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        error = {"error": {"message": message, "type": code, "param": None, "code": code}}
        self._json(status, error, headers)

    def _json(self, status: int, obj: object, headers: dict[str, str] | None = None) -> None:
        self._raw(status, json.dumps(obj).encode(), "application/json", headers)

    def _raw(
        self, status: int, data: bytes, ctype: str, headers: dict[str, str] | None = None
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its timeout); nothing to answer
