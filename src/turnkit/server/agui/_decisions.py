"""Decisions on a proposed call, spoken in AG-UI's terms.

A decision request becomes a ``tool_call`` interrupt whose ``responseSchema`` is
AG-UI's approve-with-edits pattern (``approved``, with ``editedArgs`` only when an
edit is allowed, and turnkit's ``reason`` and ``message`` when a rejection or a
response is); the resume payload in that shape becomes the ``Decision`` turnkit
checks. A payload in turnkit's own form (``{"decision": ...}``) is taken as is.
"""

from __future__ import annotations

from typing import Any

from ..._values.decisions import DecisionOptions
from ..._values.messages import JsonObject


def response_schema(options: DecisionOptions) -> JsonObject:
    """The interrupt's ``responseSchema``: what the allowed decisions can be told with."""
    properties: JsonObject = {"approved": {"type": "boolean"}}
    if "edit" in options.allowed:
        properties["editedArgs"] = {
            "type": "object",
            "description": "Full replacement of the tool's arguments (checked against its "
            "input schema, in metadata.turnkit.argumentsSchema). Not merged.",
        }
    if "reject" in options.allowed:
        properties["reason"] = {"type": "string", "description": "Why not (the model reads it)."}
    if "respond" in options.allowed:
        properties["message"] = {
            "type": "string",
            "description": "Instead of running the tool, what the model reads as its result.",
        }
    return {"type": "object", "properties": properties, "required": ["approved"]}


def metadata(options: DecisionOptions) -> JsonObject:
    """What a client needs to offer the decisions: the allowed kinds and the proposal."""
    return {
        "turnkit": {
            "kind": "decision",
            "allowed": list(options.allowed),
            "arguments": options.arguments,
            "argumentsSchema": options.arguments_schema,
        }
    }


def decision_value(payload: Any) -> Any:
    """The decision an AG-UI payload tells (approved, with edits; or not, with a reason
    or a message instead). A payload not in that shape is returned unchanged, for
    turnkit's check to accept (its own form) or refuse, saying why."""
    if not isinstance(payload, dict) or "decision" in payload:
        return payload
    approved = payload.get("approved")
    if not isinstance(approved, bool) or set(payload) - {
        "approved",
        "editedArgs",
        "reason",
        "message",
    }:
        return payload
    if approved:
        if payload.get("editedArgs") is not None:
            return {"decision": "edit", "arguments": payload["editedArgs"]}
        return {"decision": "approve"}
    if payload.get("message") is not None:
        return {"decision": "respond", "message": payload["message"]}
    reason = payload.get("reason")
    return {"decision": "reject", **({"reason": reason} if reason is not None else {})}
