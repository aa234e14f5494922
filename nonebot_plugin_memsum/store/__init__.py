"""The store: one SQLite file holding sessions, history, metadata, settings and the usage ledger."""

from .store import SUMMARY_NAMESPACE, ClearKind, Store, StoreError, Tx

__all__ = ["SUMMARY_NAMESPACE", "ClearKind", "Store", "StoreError", "Tx"]
