"""``sparkguard plan init``: draft a plan from the live tables.

:mod:`~sparkguard.draft.decide` (with :mod:`~sparkguard.draft.inputs`,
:mod:`~sparkguard.draft.layout` and :mod:`~sparkguard.draft.keys`, which it re-exports) and
:mod:`~sparkguard.draft.render` are pure; :mod:`~sparkguard.draft.infer` reads the tables
(aggregates and bounded samples only).
"""
