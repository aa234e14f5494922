"""The store: one SQLite file holding sessions, history, metadata, settings and the usage ledger."""

from .search import SearchHit, SearchQuery
from .store import SUMMARY_NAMESPACE, Activity, ClearKind, ReplyState, Store, StoreError, Tx, UsageRow

__all__ = [
    "SUMMARY_NAMESPACE",
    "Activity",
    "ClearKind",
    "ReplyState",
    "SearchHit",
    "SearchQuery",
    "Store",
    "StoreError",
    "Tx",
    "UsageRow",
]
