"""The store: one SQLite file holding sessions, history, metadata, settings and the usage ledger."""

from .store import SUMMARY_NAMESPACE, Activity, ClearKind, Store, StoreError, Tx, UsageRow

__all__ = ["SUMMARY_NAMESPACE", "Activity", "ClearKind", "Store", "StoreError", "Tx", "UsageRow"]
