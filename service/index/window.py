"""Time-window generations: retention is whole-key expiry, never a per-entry sweep.

Writes go to the current generation; reads merge the last ``generations`` of them. With a
generation of ``retention / (generations - 1)`` seconds a fingerprint stays matchable for at
least ``retention`` and at most ``retention * generations / (generations - 1)`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Window:
    retention_seconds: int
    generations: int

    @property
    def generation_seconds(self) -> int:
        return -(-self.retention_seconds // (self.generations - 1))

    @property
    def ttl_seconds(self) -> int:
        """How long a generation's keys live after their first write."""
        return self.generation_seconds * (self.generations + 1)

    def expires_at(self, generation: int) -> int:
        """When a generation's keys expire, the same second for all of them (Unix time).

        The generation is read until ``generations - 1`` newer ones have begun and ended; one
        more generation is slack for replicas whose clocks differ.
        """
        return (generation + self.generations + 1) * self.generation_seconds

    def current(self, now: float) -> int:
        return int(now // self.generation_seconds)

    def live(self, now: float) -> range:
        """Generations to read, oldest first."""
        cur = self.current(now)
        return range(cur - self.generations + 1, cur + 1)
