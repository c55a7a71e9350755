"""Benchmarks and the reliability command; run from the repository root (``python -m bench.NAME``
for the ones that import ``bench`` or ``tests``)."""
