"""Notifiers for pause, gate failure, promotion, rollback and resume events (no Spark)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = ["FileNotifier", "LogNotifier", "Notifier", "WebhookNotifier", "notifiers_from_env",
           "send_all"]

log = logging.getLogger("sparkguard.notify")


class Notifier(Protocol):
    """Anything that can deliver one event to the plan's downstream recipients."""

    def send(self, event: str, recipients: Sequence[str], payload: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class LogNotifier:
    """Writes each event to the ``sparkguard.notify`` logger."""

    def send(self, event: str, recipients: Sequence[str], payload: dict[str, Any]) -> None:
        log.warning("notify %s -> %s: %s", event, ", ".join(recipients) or "-",
                    json.dumps(payload, default=str, sort_keys=True))


@dataclass(frozen=True)
class FileNotifier:
    """Appends each event as one JSON line to a file."""

    path: str

    def send(self, event: str, recipients: Sequence[str], payload: dict[str, Any]) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        line = {"event": event, "recipients": list(recipients),
                "at": dt.datetime.now(dt.timezone.utc).isoformat(), **payload}
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, default=str, sort_keys=True) + "\n")


@dataclass(frozen=True)
class WebhookNotifier:
    """POSTs each event as JSON to a URL taken from the environment, never from the plan."""

    url: str
    timeout_s: float = 5.0

    def send(self, event: str, recipients: Sequence[str], payload: dict[str, Any]) -> None:
        body = json.dumps({"event": event, "recipients": list(recipients), **payload},
                          default=str, sort_keys=True).encode("utf-8")
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            resp.read()


def notifiers_from_env(default_file: str | None = None) -> list[Notifier]:
    """Log always; a file when ``SPARKGUARD_NOTIFY_FILE`` (or a default) is set; a webhook
    when ``SPARKGUARD_WEBHOOK_URL`` is set (http/https only)."""
    out: list[Notifier] = [LogNotifier()]
    path = os.environ.get("SPARKGUARD_NOTIFY_FILE") or default_file
    if path:
        out.append(FileNotifier(path))
    url = os.environ.get("SPARKGUARD_WEBHOOK_URL")
    if url and url.startswith(("http://", "https://")):
        out.append(WebhookNotifier(url))
    return out


def send_all(notifiers: Sequence[Notifier], event: str, recipients: Sequence[str],
             payload: dict[str, Any]) -> list[str]:
    """Deliver to every notifier; a failing one is logged and reported, never fatal."""
    errors = []
    for n in notifiers:
        try:
            n.send(event, recipients, payload)
        except Exception as exc:  # a broken webhook must not break a backfill
            errors.append(f"{type(n).__name__}: {exc}")
            log.warning("notifier %s failed for %s: %s", type(n).__name__, event, exc)
    return errors
