"""The store: one SQLite file or one PostgreSQL database holding sessions, history, metadata,
settings and the usage ledger. `open_store(location)` is how every caller gets one."""

from .engine import Location, describe
from .search import SearchHit, SearchQuery
from .store import (
    SUMMARY_NAMESPACE,
    Activity,
    ClearKind,
    RecallMask,
    ReplyState,
    Store,
    StoreError,
    Tx,
    UsageRow,
)


async def open_store(location: Location) -> Store:
    """The store at `location` (a SQLite file's path, or a `postgresql://` URL), opened and
    migrated; StoreError (naming the place, never a password) when it cannot be."""
    store = Store(location)
    await store.open()
    return store


__all__ = [
    "SUMMARY_NAMESPACE",
    "Activity",
    "ClearKind",
    "Location",
    "RecallMask",
    "ReplyState",
    "SearchHit",
    "SearchQuery",
    "Store",
    "StoreError",
    "Tx",
    "UsageRow",
    "describe",
    "open_store",
]
