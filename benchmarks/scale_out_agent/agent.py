"""The agent ``benchmarks/scale_out.py`` runs on its workers: each turn is a model
step calling ``record`` (a local tool writing one row through ``ctx.store``, in the
step's transaction), a tool step, and a final model step streaming its answer. A
zero-latency scripted model, so the figures are turnkit's and PostgreSQL's."""

from __future__ import annotations

from collections.abc import Sequence

from turnkit import Message, ToolMessage, UserMessage
from turnkit.testing import ScriptedModel, ScriptedReply, tool_call

agent = {"name": "bench"}


def _reply(transcript: Sequence[Message]) -> ScriptedReply:
    last = transcript[-1]
    if isinstance(last, UserMessage):
        return ScriptedReply(tool_calls=[tool_call("record", {"label": last.text})])
    if isinstance(last, ToolMessage):
        return ScriptedReply(text=f"recorded {last.result}", chunks=3)
    return ScriptedReply(text="?")


model = ScriptedModel(respond=_reply, record_calls=False)
