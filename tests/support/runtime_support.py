"""Shared helpers for the runtime tests (fake clock, store wrapper, update builders).

The other runtime test modules import from here (``tests/support`` is on ``sys.path``, see
``pythonpath`` in setup.cfg); tests/unit/test_runtime_support.py checks the helpers themselves,
so a broken helper cannot make the real tests pass vacuously.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ptb_fence import MemoryUpdateStore, StoreFeatures
from ptb_fence.contract import BATCH_STORE_METHODS, DURABLE_METHODS, FEATURE_METHODS

EXTRA_METHODS = tuple(m for m in BATCH_STORE_METHODS if m not in DURABLE_METHODS) + ("close",)
"""The methods every batch store has beyond the durable level (``commit`` among them)."""

ALL_METHODS = DURABLE_METHODS + EXTRA_METHODS

T0 = 1_700_000_000.0
"""Start time of :class:`FakeClock` (seconds since the epoch)."""


class FakeClock:
    """A settable ``clock()`` for the runtime (seconds since the epoch)."""

    def __init__(self, start: float = T0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def ms(self) -> int:
        return int(self() * 1000)


class StoreWrapper:
    """Exposes only ``methods`` of a :class:`MemoryUpdateStore`, counting every call.

    ``fail[name] = exc`` makes that method raise ``exc`` (every call while set);
    ``hooks[name] = fn`` replaces it by ``fn(original, *args, **kwargs)``.
    """

    def __init__(
        self,
        inner: Optional[MemoryUpdateStore] = None,
        methods: Iterable[str] = ALL_METHODS,
    ) -> None:
        self.inner = inner if inner is not None else MemoryUpdateStore()
        self.calls: Counter = Counter()
        self.fail: Dict[str, BaseException] = {}
        self.hooks: Dict[str, Callable[..., Any]] = {}
        self._lock = threading.Lock()
        names = tuple(methods)
        for name in names:
            setattr(self, name, self._delegate(name))
        if "commit" in names:  # a batch store: it declares the parts whose methods it shows
            self.features = StoreFeatures(**{
                part: all(m in names for m in needed)
                for part, needed in FEATURE_METHODS.items()
                if part != "state" or all(m in names for m in FEATURE_METHODS["outbox"])
            })

    def _delegate(self, name: str) -> Callable[..., Any]:
        original = getattr(self.inner, name)

        def method(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
                error = self.fail.get(name)
                hook = self.hooks.get(name)
            if error is not None:
                raise error
            if hook is not None:
                return hook(original, *args, **kwargs)
            return original(*args, **kwargs)

        method.__name__ = name
        return method

    def count(self, name: str) -> int:
        with self._lock:
            return self.calls[name]


class StoreDown(RuntimeError):
    """The error injected as a store failure."""


def body(update_id: int, chat: Optional[int] = None, text: str = "hi") -> str:
    """A message update's JSON text in ``chat`` (default: its own chat)."""
    chat_id = update_id + 10_000 if chat is None else chat
    return json.dumps(
        {
            "update_id": update_id,
            "message": {
                "message_id": update_id,
                "date": 1_700_000_000,
                "chat": {"id": chat_id, "type": "private"},
                "from": {"id": chat_id, "is_bot": False, "first_name": "U"},
                "text": text,
            },
        }
    )


def row(store: Any, update_id: int) -> Any:
    """The memory store's row (internal; read only)."""
    inner = getattr(store, "inner", store)
    with inner._lock:
        found = inner._rows.get(update_id)
        if found is None:
            return None
        return type(found)(**found.__dict__)  # a snapshot


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, step: float = 0.005) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds passed; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(step)


class Recorder:
    """Thread-safe list of observer calls."""

    def __init__(self) -> None:
        self.items: List[Any] = []
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> None:
        with self._lock:
            self.items.append(args)

    def snapshot(self) -> List[Any]:
        with self._lock:
            return list(self.items)


def post_json(url: str, params: Dict[str, Any], timeout: float = 30.0) -> Tuple[int, Any]:
    """POST ``params`` as JSON to ``url``. Returns the HTTP status and the decoded body.

    An error status is returned too, with its body, as a Bot API client reads it."""
    request = urllib.request.Request(
        url, data=json.dumps(params).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)
