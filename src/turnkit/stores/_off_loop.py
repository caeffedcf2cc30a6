"""Running a local tool's step off the event loop, where the tool may block."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")


async def on_thread(executor: Executor | None, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on ``executor``'s threads (the loop's default if ``None``), in a
    copy of the caller's context variables, as ``asyncio.to_thread`` does."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(executor, call)
