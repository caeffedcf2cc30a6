"""Test doubles that ship with turnkit, so apps test their agents the way turnkit does.

``ScriptedModel`` plays back replies, ``RecordingSink`` keeps every event, and
``CrashingStore`` kills the process at a chosen commit to prove crash safety.
"""

from ..models._scripted import ScriptedCall, ScriptedModel, ScriptedReply, tool_call
from ._crashing import CrashingStore
from ._sinks import RecordingSink

__all__ = [
    "CrashingStore",
    "RecordingSink",
    "ScriptedCall",
    "ScriptedModel",
    "ScriptedReply",
    "tool_call",
]
