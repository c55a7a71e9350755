"""Delta's optimistic-concurrency conflicts: recognised by exception type (``delta.exceptions``,
the JVM class, or Spark Connect's error condition), never by message text, and retried."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

import delta.exceptions.captured  # noqa: F401  (makes pyspark raise Delta's conflict types)
from delta.exceptions import base as delta_exception_types

__all__ = ["CONFLICT_TYPES", "PROTOCOL_REFUSAL_FIX", "VARIANT_READ_FIX", "conflict_summary",
           "error_condition", "is_conflict", "post_commit_failed", "protocol_refusal",
           "variant_read_failure", "with_conflict_retry"]

T = TypeVar("T")


def error_condition(exc: BaseException) -> str | None:
    """The error condition (error class) of a PySpark exception, if it has one."""
    get = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    try:
        return get() if get is not None else None
    except Exception:  # the JVM side may be gone
        return None


# Delta's optimistic-concurrency conflicts as pyspark raises them once ``delta.exceptions`` is
# imported (the captured classes subclass these base ones).
CONFLICT_TYPES: tuple[type[BaseException], ...] = (
    delta_exception_types.DeltaConcurrentModificationException,
    delta_exception_types.ConcurrentWriteException,
    delta_exception_types.MetadataChangedException,
    delta_exception_types.ProtocolChangedException,
    delta_exception_types.ConcurrentAppendException,
    delta_exception_types.ConcurrentDeleteReadException,
    delta_exception_types.ConcurrentDeleteDeleteException,
    delta_exception_types.ConcurrentTransactionException,
)
# The JVM root of every Delta conflict (io.delta.exceptions.* and Delta's internal ones extend it).
_JVM_CONFLICT_ROOTS = frozenset({"java.util.ConcurrentModificationException",
                                 "io.delta.exceptions.DeltaConcurrentModificationException"})


def _has_condition(exc: BaseException, conditions: tuple[str, ...]) -> bool:
    """Whether ``exc`` (its own error condition, as over Spark Connect) or the JVM throwable it
    wraps, or a cause of that, has one of ``conditions``."""
    if error_condition(exc) in conditions:
        return True
    java = getattr(exc, "java_exception", None)
    try:
        for _ in range(10):
            if java is None:
                return False
            with contextlib.suppress(Exception):  # not every throwable has an error class
                if java.getErrorClass() in conditions:
                    return True
            java = java.getCause()
    except Exception:  # the JVM side may be gone
        return False
    return False


def post_commit_failed(exc: BaseException) -> bool:
    """Whether ``exc`` reports a failed post-commit hook (auto compaction, checkpoint) of a
    commit that itself landed (error condition ``DELTA_POST_COMMIT_HOOK_FAILED``)."""
    return _has_condition(exc, (_POST_COMMIT_FAILED,))


def protocol_refusal(exc: BaseException) -> str | None:
    """Delta's one-line reason when ``exc`` is Delta refusing this client a table's protocol (a
    reader or writer version or table feature it does not support); None for anything else."""
    # the features Delta names come last, after the table's location: keep the whole line
    return conflict_summary(exc, 2000) if _has_condition(exc, _PROTOCOL_REFUSALS) else None


# what to do about a protocol refusal, wherever it is reported
PROTOCOL_REFUSAL_FIX = ("run sparkguard with a Delta version that supports the table features "
                        "Delta names, e.g. the runtime that wrote the table")
# Spark 4.0's failure to read a VARIANT column from a Parquet file with a deletion vector
# (SPARK-55552), and what reads it instead (measured on 4.0.1 and 4.0.5)
_VARIANT_READ = "Not implemented. VariantType"
VARIANT_READ_FIX = ("this Spark cannot read a VARIANT column from a Parquet file with a deletion "
                    "vector without whole-stage code generation (SPARK-55552; README, Versions): "
                    "run again with --conf spark.sql.parquet.enableVectorizedReader=false, or "
                    "with spark.sql.codegen.maxFields above the table's field count")


def variant_read_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is Spark failing to read a VARIANT column from a file with a deletion
    vector (SPARK-55552)."""
    return _VARIANT_READ in str(exc)


_POST_COMMIT_FAILED = "DELTA_POST_COMMIT_HOOK_FAILED"
_PROTOCOL_REFUSALS = ("DELTA_UNSUPPORTED_FEATURES_FOR_READ", "DELTA_UNSUPPORTED_FEATURES_FOR_WRITE",
                      "DELTA_INVALID_PROTOCOL_VERSION")


# Their error conditions, as Spark Connect reports them (it has no Delta exception types).
_CONFLICT_CONDITIONS = ("DELTA_CONCURRENT_", "DELTA_METADATA_CHANGED", "DELTA_PROTOCOL_CHANGED")


def is_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is one of Delta's optimistic-concurrency conflicts, by type: a
    ``delta.exceptions`` class, or a raw Py4J error whose JVM exception (or a cause of it) is a
    ``ConcurrentModificationException`` (Delta's conflicts all extend it), or, over Spark
    Connect, an error condition of Delta's conflicts. Never by message text.
    A failed post-commit hook is not a conflict of the commit (it landed), whatever its cause."""
    if post_commit_failed(exc):
        return False
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, CONFLICT_TYPES):
            return True
        java = getattr(cur, "java_exception", None)
        if java is not None and _jvm_is_conflict(java):
            return True
        if (error_condition(cur) or "").startswith(_CONFLICT_CONDITIONS):  # Spark Connect's errors
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _jvm_is_conflict(java: Any) -> bool:
    """Whether a JVM throwable or one of its causes is a concurrent-modification conflict."""
    try:
        for _ in range(10):  # bounded walk of the cause chain
            if java is None:
                return False
            cls = java.getClass()
            while cls is not None:
                if cls.getName() in _JVM_CONFLICT_ROOTS:
                    return True
                cls = cls.getSuperclass()
            java = java.getCause()
    except Exception:  # the JVM side may be gone: not a conflict we can prove
        return False
    return False


def conflict_summary(exc: BaseException, limit: int = 300) -> str:
    """One line naming the error (a conflict, say): the JVM exception's class and message when
    ``exc`` wraps one (a Py4JJavaError's own first line says nothing), else Python's."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            text = f"{java.getClass().getSimpleName()}: {java.getMessage()}"
        except Exception:  # the JVM side may be gone
            text = f"{type(exc).__name__}: {exc}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return (text.strip().splitlines() or [""])[0][:limit]


def with_conflict_retry(action: Callable[[], T], attempts: int = 3, delay_s: float = 2.0,
                        log: Callable[[str], None] = print,
                        before_retry: Callable[[], None] | None = None) -> T:
    """Run ``action``; on a Delta concurrency conflict retry a bounded number of times.

    Each conflict is logged with the attempt number; ``before_retry`` runs before each retry
    (e.g. to re-check that the write did not land after all). Other errors propagate at once.
    """
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as exc:
            if not is_conflict(exc) or attempt == attempts:
                raise
            first = conflict_summary(exc)
            log(f"delta conflict on attempt {attempt}/{attempts}: {first}; retrying in "
                f"{delay_s * attempt:.1f}s")
            time.sleep(delay_s * attempt)
            if before_retry is not None:
                before_retry()
    raise AssertionError("unreachable")
