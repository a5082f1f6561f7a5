"""A waiting line that is fair across keys: round robin among the keys with waiters.

Within one key waiters are served first come, first served (``pop_first`` may pass over
one that waits for what the others behind it do not); across keys each key with someone
waiting gets one turn per round, so one client's burst cannot starve the others.
Pure: no loop, no clock.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class FairQueue(Generic[T]):
    def __init__(self) -> None:
        # Keys in turn order: the first key is served next, then moves to the back.
        self._lines: OrderedDict[str, deque[T]] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[T]:
        """Every waiter, heads first (no particular fairness order beyond that)."""
        for line in self._lines.values():
            yield from line

    def push(self, key: str, item: T) -> None:
        self._lines.setdefault(key, deque()).append(item)
        self._size += 1

    def pop(self) -> T:
        """The head of the key whose turn it is."""
        if not self._lines:
            raise IndexError("pop from an empty FairQueue")
        key = next(iter(self._lines))
        return self._take_head(key)

    def pop_first(
        self,
        select: Callable[[T], R | None],
        passable: Callable[[T], bool] = lambda item: False,
    ) -> tuple[T, R] | None:
        """Walk the keys in turn order and take the first waiter for which ``select`` gives
        something; that key then goes to the back. Within a key's line only the head is
        tried, and those behind a waiter ``select`` passed over when it is ``passable``
        (one that waits for something the others do not). ``None`` if none is selected."""
        for key, line in self._lines.items():
            for item in line:
                selected = select(item)
                if selected is not None:
                    return self._take(key, item), selected
                if not passable(item):
                    break
        return None

    def newest(self, key: str) -> T | None:
        """The last of ``key``'s waiters to come, if it has any."""
        line = self._lines.get(key)
        return line[-1] if line else None

    def remove(self, key: str, item: T) -> bool:
        """Take ``item`` out wherever it waits (a waiter that gave up); ``False`` if absent."""
        line = self._lines.get(key)
        if line is None:
            return False
        try:
            line.remove(item)
        except ValueError:
            return False
        self._size -= 1
        if not line:
            del self._lines[key]
        return True

    def _take_head(self, key: str) -> T:
        return self._take(key, self._lines[key][0])

    def _take(self, key: str, item: T) -> T:
        """Take ``item`` out of ``key``'s line, and send the key to the back of the round."""
        line = self._lines.pop(key)
        if line[0] is item:
            line.popleft()
        else:
            line.remove(item)
        self._size -= 1
        if line:
            self._lines[key] = line
        return item
