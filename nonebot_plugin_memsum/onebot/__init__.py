"""OneBot v11 in and out.

| module | what it holds |
|---|---|
| `sessions` | session ids and records from groups and private peers |
| `render` | messages as text, pure: labels, forgery neutralisation, segments, quotes |
| `segments` | non-text segments as short placeholders, pure |
| `notices` | notices as one line naming people, pure; which are noise |
| `state` | what the layer remembers, owned by the runtime, bounded: names, arrival tickets, locks |
| `names` | names as a place sees them: cache, else the implementation's API |
| `record` | a message or a notice recorded in arrival order (also the path for fetched history) |
| `send` | answers: quote, merged-forward |
| `said` | what the bot account said not through this plugin (other plugins, the owner), stored as its own |
| `matchers` | the NoneBot matchers, their handlers and the arrival ticket |
| `fastpath` | those handlers run without NoneBot's per-event tasks when only this plugin handles the event |
"""

from .matchers import register_matchers, release_arrival
from .record import record_message, record_notice, record_of
from .send import send_reply
from .sessions import PLATFORM, entry_of, group_record, group_session_id, private_record, private_session_id
from .state import OneBotState

__all__ = [
    "PLATFORM",
    "OneBotState",
    "entry_of",
    "group_record",
    "group_session_id",
    "private_record",
    "private_session_id",
    "record_message",
    "record_notice",
    "record_of",
    "register_matchers",
    "release_arrival",
    "send_reply",
]
