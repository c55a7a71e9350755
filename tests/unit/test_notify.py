"""Notifiers: log, file and HTTP webhook (against a real local HTTP server), URL from the
environment only, failures reported and never fatal."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from sparkguard.notify import (
    FileNotifier,
    LogNotifier,
    WebhookNotifier,
    notifiers_from_env,
    send_all,
)


class _Hook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []
    status = 204

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append({"path": self.path, "auth": self.headers.get("Authorization"),
                                    "type": self.headers.get("Content-Type"),
                                    "body": json.loads(body)})
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Hook]]]:
    handler = type("Hook", (_Hook,), {"received": [], "status": 204})
    httpd = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}/hooks/sparkguard", handler
    httpd.shutdown()
    httpd.server_close()


def test_webhook_posts_json_with_event_recipients_payload_and_token(server: Any,
                                                                    monkeypatch: Any) -> None:
    url, hook = server
    monkeypatch.setenv("SPARKGUARD_WEBHOOK_URL", url)
    monkeypatch.setenv("SPARKGUARD_WEBHOOK_TOKEN", "s3cret")
    monkeypatch.delenv("SPARKGUARD_NOTIFY_FILE", raising=False)
    notifiers = notifiers_from_env()
    assert [type(n) for n in notifiers] == [LogNotifier, WebhookNotifier]
    assert "s3cret" not in repr(notifiers[1])
    for event in ("publish_paused", "promoted"):
        assert send_all(notifiers, event, ["finance-bi"], {"run_id": "r1", "version": 4}) == []
    assert [r["body"]["event"] for r in hook.received] == ["publish_paused", "promoted"]
    first = hook.received[0]
    assert first["path"] == "/hooks/sparkguard" and first["type"] == "application/json"
    assert first["auth"] == "Bearer s3cret"
    assert first["body"]["recipients"] == ["finance-bi"] and first["body"]["run_id"] == "r1"
    assert hook.received[1]["body"]["version"] == 4


def test_failing_webhook_is_reported_not_raised_and_other_notifiers_still_run(
        server: Any, tmp_path: Path) -> None:
    url, hook = server
    hook.status = 500
    out = tmp_path / "events.jsonl"
    errors = send_all([WebhookNotifier(url), FileNotifier(str(out))], "gate_failed", [],
                      {"error": "row_count_parity"})
    assert len(errors) == 1 and "WebhookNotifier" in errors[0] and "500" in errors[0]
    assert json.loads(out.read_text())["event"] == "gate_failed"
    unreachable = WebhookNotifier("http://127.0.0.1:9/nothing", timeout_s=0.5)
    assert send_all([unreachable], "promoted", [], {}) != []


def test_file_notifier_appends_one_json_line_per_event(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "events.jsonl"
    n = FileNotifier(str(out))
    n.send("publish_paused", ["a"], {"run_id": "r"})
    n.send("publish_resumed", ["a"], {"run_id": "r"})
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["event"] for x in lines] == ["publish_paused", "publish_resumed"]
    assert lines[0]["recipients"] == ["a"] and "at" in lines[0]


def test_log_notifier_writes_to_the_sparkguard_logger(caplog: Any) -> None:
    with caplog.at_level(logging.WARNING, logger="sparkguard.notify"):
        LogNotifier().send("rolled_back", ["ops"], {"run_id": "r9"})
    assert any("rolled_back" in r.getMessage() and "r9" in r.getMessage()
               for r in caplog.records)


def test_webhook_url_only_from_environment_and_only_http(monkeypatch: Any,
                                                         tmp_path: Path) -> None:
    monkeypatch.delenv("SPARKGUARD_WEBHOOK_URL", raising=False)
    monkeypatch.setenv("SPARKGUARD_NOTIFY_FILE", str(tmp_path / "n.jsonl"))
    assert [type(n) for n in notifiers_from_env()] == [LogNotifier, FileNotifier]
    monkeypatch.setenv("SPARKGUARD_WEBHOOK_URL", "file:///etc/passwd")
    assert not any(isinstance(n, WebhookNotifier) for n in notifiers_from_env())


def test_the_plan_cannot_carry_a_webhook() -> None:
    from pydantic import ValidationError

    from sparkguard.plan.model import Safeguards

    with pytest.raises(ValidationError):
        Safeguards.model_validate({"webhook_url": "http://evil.example/"})
