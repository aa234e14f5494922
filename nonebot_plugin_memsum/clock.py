"""The one clock of the plugin, so tests can replace it."""

import time

now = time.time
