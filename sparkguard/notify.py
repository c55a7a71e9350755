"""Notifiers for pause, gate failure, promotion, rollback and resume events (no Spark)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

__all__ = ["EVENTS", "FileNotifier", "LogNotifier", "Notifier", "WebhookNotifier",
           "notifiers_from_env", "send_all"]

log = logging.getLogger("sparkguard.notify")

# Every event a run or a rollback sends, with what it means for downstream consumers.
EVENTS: dict[str, str] = {
    "publish_paused": "a backfill paused publish of its targets; hold downstream publishing",
    "gate_failed": "a gate or verification failed; targets unchanged or restored; still paused",
    "promoted": "one target's promotion commit landed (version and rollback point in the "
                "payload), not yet verified: a failure after it restores it (restored follows); "
                "re-read on publish_resumed",
    "restored": "a target promoted by this run was restored to its rollback point",
    "dry_run_passed": "a dry run passed every gate; nothing changed",
    "publish_resumed": "the backfill finished and released its publish hold",
    "rolled_back": "a finished backfill was rolled back; targets are at their rollback points",
    "rollback_abandoned": "a rollback that could not finish was closed; targets as listed in "
                          "the payload, publish still paused on those it names",
}


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
                "at": dt.datetime.now(dt.UTC).isoformat(), **payload}
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, default=str, sort_keys=True) + "\n")


@dataclass(frozen=True)
class WebhookNotifier:
    """POSTs each event as JSON to a URL taken from the environment, never from the plan.

    ``token`` (``SPARKGUARD_WEBHOOK_TOKEN``) is sent as a bearer token when set. A non-2xx
    answer raises, and :func:`send_all` reports it without stopping the run.
    """

    url: str
    timeout_s: float = 5.0
    token: str | None = field(default=None, repr=False)

    def send(self, event: str, recipients: Sequence[str], payload: dict[str, Any]) -> None:
        body = json.dumps({"event": event, "recipients": list(recipients),
                           "at": dt.datetime.now(dt.UTC).isoformat(), **payload},
                          default=str, sort_keys=True).encode("utf-8")
        headers = {"Content-Type": "application/json", "User-Agent": "sparkguard"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url, data=body, method="POST", headers=headers)
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
    if url:
        if not url.startswith(("http://", "https://")):
            log.warning("SPARKGUARD_WEBHOOK_URL ignored: only http:// and https:// URLs are used")
        else:
            out.append(WebhookNotifier(url, token=os.environ.get("SPARKGUARD_WEBHOOK_TOKEN")))
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
