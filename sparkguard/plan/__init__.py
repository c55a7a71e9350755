"""Plan models, loading, fingerprint and approvals. Imports no pyspark."""

from sparkguard.plan.fingerprint import fingerprint
from sparkguard.plan.loader import load_plan, load_plan_text
from sparkguard.plan.model import BackfillPlan, TargetSpec

__all__ = ["BackfillPlan", "TargetSpec", "fingerprint", "load_plan", "load_plan_text"]
