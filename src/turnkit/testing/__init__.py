"""Test doubles that ship with turnkit, so apps test their agents the way turnkit does.

``ScriptedModel`` plays back replies, ``RecordingSink`` keeps every event, and
``CrashingStore`` kills the process at a chosen commit to prove crash safety, and
``replay`` plays a recorded session against a changed agent and names where it
diverges.
"""

from ..models import ScriptedCall, ScriptedModel, ScriptedReply, tool_call
from ._crashing import CrashingStore
from ._replay import Divergence, ReplayDivergenceError, ReplayReport, replay
from ._sinks import RecordingSink

__all__ = [
    "CrashingStore",
    "Divergence",
    "RecordingSink",
    "ReplayDivergenceError",
    "ReplayReport",
    "ScriptedCall",
    "ScriptedModel",
    "ScriptedReply",
    "replay",
    "tool_call",
]
