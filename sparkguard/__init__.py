"""sparkguard: safe, reconciled, reversible backfills on Spark and Delta Lake."""

__all__ = ["__version__"]

__version__ = "0.1.0"
