"""The one bounded cache of the product's hand-kept memos: a dict that forgets its oldest
entry once it holds `most`, safe across threads. (functools.lru_cache serves where a call's
arguments are its key; this serves where the key is built, or where a value is kept only
once it is final.)"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Bounded(Generic[K, V]):
    def __init__(self, most: int) -> None:
        self.most = most
        self._d: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            return self._d.get(key)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            while len(self._d) > self.most:
                self._d.popitem(last=False)

    def add(self, key: K) -> bool:
        """Put `key` (with None) unless it is held: True when it was new (a set's add)."""
        with self._lock:
            if key in self._d:
                return False
            self._d[key] = None  # type: ignore[assignment]
            while len(self._d) > self.most:
                self._d.popitem(last=False)
            return True

    def __len__(self) -> int:
        return len(self._d)
