"""Token buckets keyed by peer, for /login: pure bookkeeping over a clock the caller passes.

`allow(key, now)` takes one token from the key's bucket and from the global one, or refuses. Buckets
refill continuously (`per_minute`), hold at most `burst`, and at most `max_keys` peers are tracked
(full buckets are dropped first, then the least recently used), so memory stays bounded whatever
addresses an attacker uses.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    at: float
    refused: int = 0  # refusals since this key was last allowed


class Bucket:
    def __init__(self, per_minute: float, burst: int) -> None:
        self.rate = per_minute / 60.0
        self.burst = burst

    def refill(self, bucket: _Bucket, now: float) -> None:
        bucket.tokens = min(float(self.burst), bucket.tokens + max(0.0, now - bucket.at) * self.rate)
        bucket.at = now


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    scope: str | None = None  # "peer" or "global" when refused
    retry_after_s: int = 0
    first_refusal: bool = False  # the first refusal of this key since it was last allowed (log this one)


class LoginLimiter:
    def __init__(self, *, peer_per_minute: float = 10, peer_burst: int = 10, global_per_minute: float = 120,
                 global_burst: int = 60, max_keys: int = 10_000) -> None:
        self.peer = Bucket(peer_per_minute, peer_burst)
        self.all = Bucket(global_per_minute, global_burst)
        self.max_keys = max_keys
        self._keys: OrderedDict[str, _Bucket] = OrderedDict()
        self._global: _Bucket | None = None
        self._lock = threading.Lock()

    def _key(self, key: str, now: float) -> _Bucket:
        bucket = self._keys.get(key)
        if bucket is None:
            if len(self._keys) >= self.max_keys:
                self._evict(now)
            bucket = self._keys[key] = _Bucket(float(self.peer.burst), now)
        self._keys.move_to_end(key)
        return bucket

    def _evict(self, now: float) -> None:
        for key in [k for k, b in self._keys.items()
                    if b.tokens + (now - b.at) * self.peer.rate >= self.peer.burst]:
            del self._keys[key]
        while len(self._keys) >= self.max_keys:
            self._keys.popitem(last=False)

    def allow(self, key: str, now: float) -> Verdict:
        with self._lock:
            mine = self._key(key, now)
            self.peer.refill(mine, now)
            if self._global is None:
                self._global = _Bucket(float(self.all.burst), now)
            self.all.refill(self._global, now)
            for scope, bucket, rule in (("peer", mine, self.peer), ("global", self._global, self.all)):
                if bucket.tokens < 1:
                    mine.refused += 1
                    wait = int((1 - bucket.tokens) / rule.rate) + 1 if rule.rate > 0 else 3600
                    return Verdict(False, scope, wait, mine.refused == 1)
            mine.tokens -= 1
            self._global.tokens -= 1
            mine.refused = 0
            return Verdict(True)

    @property
    def tracked(self) -> int:
        return len(self._keys)
