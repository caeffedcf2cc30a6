"""``record`` writes one row per call through ``ctx.store``, in the step's
transaction: a tool step that ran twice would leave two rows."""

from __future__ import annotations

import os

from turnkit import ToolContext, tool


@tool
def record(ctx: ToolContext, label: str) -> dict[str, object]:
    """Record the label."""
    ctx.store.execute(
        "INSERT INTO bench_effects (session_id, turn_id, pid) VALUES (?, ?, ?)",
        (ctx.session_id, ctx.turn_id, os.getpid()),
    )
    return {"label": label, "pid": os.getpid()}
