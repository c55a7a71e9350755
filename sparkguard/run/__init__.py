"""The backfill run: stage units (:mod:`.stages`), one evaluator (:mod:`.evaluator`), a frozen
context and a mutable state (:mod:`.context`), and a typed report (:mod:`.report`)."""

from __future__ import annotations

from sparkguard.run.stages import RunOptions, build_stages, explain

__all__ = ["RunOptions", "build_stages", "explain"]
