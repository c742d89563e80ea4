"""A fake OpenAI-compatible server (stdlib http.server on a thread) whose replies a test scripts.

    with FakeOpenAI(reply=lambda body: "[[A]]", models=["judge"]) as server:
        source = open_source(server.url + "#judge")

`reply(body)` gets the JSON body of each chat completion request and returns the content, or an int HTTP
status to fail with. Every request is recorded (path, headers with lower-case names, body) in `server.requests`.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


class FakeOpenAI:
    def __init__(self, reply: Callable[[dict], str | int], models: list[str] = ("judge",)):
        self.reply, self.models = reply, list(models)
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _headers(self) -> dict:
                return {k.lower(): v for k, v in self.headers.items()}

            def _send(self, status: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                with server.lock:
                    server.requests.append({"path": self.path, "headers": self._headers(), "body": None})
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": m, "object": "model", "created": 0,
                                                                 "owned_by": "test"} for m in server.models]})
                else:
                    self._send(404, {"error": {"message": "no route"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with server.lock:
                    server.requests.append({"path": self.path, "headers": self._headers(), "body": body})
                content = server.reply(body)
                if isinstance(content, int):
                    self._send(content, {"error": {"message": f"scripted {content}", "type": "test"}})
                    return
                self._send(200, {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": content}}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakeOpenAI":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def chats(self) -> list[dict]:
        """The bodies of the chat completion requests, in arrival order."""
        with self.lock:
            return [r["body"] for r in self.requests if r["body"] is not None]


def judged_user_text(body: dict) -> str:
    """The judge prompt's user message (the question and both answers)."""
    return [m for m in body["messages"] if m["role"] == "user"][0]["content"]
