"""How many refused enrollments and authentications the node gateway writes as node events.

Every refused call used to write one row; anyone who can reach the gateway could fill the events table
without a credential. Now each (action, client address) writes at most PER_SOURCE rows per WINDOW_S
seconds and the whole gateway at most TOTAL rows per window; the refusals left out are counted and the
next row written for that source carries `{"suppressed": n}` (so the record says how many there were).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

WINDOW_S = 60.0
PER_SOURCE = 5
TOTAL = 60
MAX_SOURCES = 10_000


@dataclass
class _Window:
    started: float
    written: int = 0


@dataclass
class RefusalAudit:
    window_s: float = WINDOW_S
    per_source: int = PER_SOURCE
    total: int = TOTAL
    _sources: dict[tuple[str, str], _Window] = field(default_factory=dict)
    _suppressed: dict[tuple[str, str], int] = field(default_factory=dict)
    _all: _Window = field(default_factory=lambda: _Window(time.monotonic()))

    def admit(self, action: str, address: str | None, now: float | None = None) -> int | None:
        """None: leave this refusal out (counted); else write it, carrying the count left out before it."""
        now = time.monotonic() if now is None else now
        key = (action, address or "unknown")
        if now - self._all.started >= self.window_s:
            self._all = _Window(now)
            if len(self._sources) > MAX_SOURCES:  # keep memory bounded under many addresses
                self._sources = {k: w for k, w in self._sources.items() if now - w.started < self.window_s}
        window = self._sources.get(key)
        if window is None or now - window.started >= self.window_s:
            window = self._sources[key] = _Window(now)
        if window.written >= self.per_source or self._all.written >= self.total:
            if key in self._suppressed or len(self._suppressed) < MAX_SOURCES:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return None
        window.written += 1
        self._all.written += 1
        return self._suppressed.pop(key, 0)
