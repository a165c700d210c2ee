"""A durable job's callback, kept as a reference that another process can resolve.

A job outlives the process that scheduled it. So its callback is kept as text: the import
path of a module-level function (``package.module:function``), or a name registered with
:func:`register_job_callback`. A bot run as a script (``python bot.py``) keeps the functions
of ``__main__``: the same script resolves them after a restart.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
from typing import Any, Callable, Dict, Optional

from ptb_fence._errors import UsageError

__all__ = ["callback_reference", "register_job_callback", "resolve_callback"]

_REGISTERED: Dict[str, Callable[..., Any]] = {}
_LOCK = threading.Lock()
_NAMED = "name:"


def register_job_callback(name: str, callback: Callable[..., Any]) -> Callable[..., Any]:
    """Register ``callback`` under ``name`` for durable jobs, and return it.

    A job scheduled with a registered callback keeps the name, not the import path. So the
    function may move to another module in a deploy. Register it at import time in every
    process that runs jobs.

    Raises:
        ValueError: ``name`` is taken by another callback.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("a job callback's name must be a non-empty str")
    with _LOCK:
        known = _REGISTERED.get(name)
        if known is not None and known is not callback:
            raise ValueError(f"the job callback name {name!r} is taken by {known!r}")
        _REGISTERED[name] = callback
    return callback


def _registered_name(callback: Callable[..., Any]) -> Optional[str]:
    with _LOCK:
        for name, known in _REGISTERED.items():
            if known is callback:
                return name
    return None


def callback_reference(callback: Callable[..., Any]) -> str:
    """The text a job keeps for ``callback``.

    Raises:
        UsageError: ``callback`` cannot be found again by another process (a lambda, a
            closure, a bound method, a callable object). The message names the fix.
    """
    named = _registered_name(callback)
    if named is not None:
        return _NAMED + named
    module = getattr(callback, "__module__", None)
    qualname = getattr(callback, "__qualname__", None)
    fix = (
        "a durable job keeps its callback by name, so that another process or a restart "
        "finds it: pass a function defined at module level, or register it with "
        "ptb_fence.ptb.register_job_callback(name, callback)"
    )
    if inspect.ismethod(callback):
        raise UsageError(f"{callback!r} is a bound method: {fix}")
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise UsageError(f"{callback!r} has no module-level name: {fix}")
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise UsageError(f"{module}.{qualname} is a lambda or a nested function: {fix}")
    reference = f"{module}:{qualname}"
    try:
        found = resolve_callback(reference)
    except LookupError:
        found = None
    if found is not callback and getattr(found, "__wrapped__", None) is not callback:
        raise UsageError(f"{reference} does not name {callback!r}: {fix}")
    return reference


def resolve_callback(reference: str) -> Callable[..., Any]:
    """The callback a job kept as ``reference``.

    Raises:
        LookupError: It does not exist (any more): a deploy renamed or removed it. The
            message names the reference.
    """
    if reference.startswith(_NAMED):
        with _LOCK:
            found = _REGISTERED.get(reference[len(_NAMED):])
        if found is None:
            raise LookupError(
                f"no job callback is registered as {reference[len(_NAMED):]!r} in this "
                "process: register it with register_job_callback at import time"
            )
        return found
    module_name, _, qualname = reference.partition(":")
    try:
        module: Any = sys.modules.get(module_name) or importlib.import_module(module_name)
    except ImportError as exc:
        raise LookupError(f"the job callback {reference} cannot be imported: {exc}") from None
    found_obj: Any = module
    for part in qualname.split("."):
        found_obj = getattr(found_obj, part, None)
        if found_obj is None:
            raise LookupError(
                f"the job callback {reference} does not exist in this process (renamed or "
                "removed by a deploy?)"
            )
    if not callable(found_obj):
        raise LookupError(f"the job callback {reference} is not callable")
    return found_obj  # type: ignore[no-any-return]
