"""``sparkguard plan init``: draft a plan from the live tables.

:mod:`~sparkguard.draft.decide` and :mod:`~sparkguard.draft.render` are pure;
:mod:`~sparkguard.draft.infer` reads the tables (aggregates and bounded samples only).
"""
