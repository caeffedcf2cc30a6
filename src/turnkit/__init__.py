"""turnkit: durable agent turns.

A turn is a loop the engine drives (ask the model, run the tools it asked for,
repeat) with every step checkpointed, so a crashed or interrupted turn replays
from its last finished step. The public names are re-exported here.
"""

from ._agent import Agent
from ._context import ToolContext
from ._errors import (
    ConfigurationError,
    FatalToolError,
    MessageDecodeError,
    ModelError,
    SessionBusyError,
    StoreError,
    ToolDefinitionError,
    TurnError,
    TurnFailedError,
    TurnkitError,
)
from ._events import (
    ActionCompletedEvent,
    ActionRequestedEvent,
    EventSink,
    LocalEventSink,
    MessageCompletedEvent,
    MessageDeltaEvent,
    ReasoningDeltaEvent,
    TurnCompletedEvent,
    TurnEvent,
    TurnFailedEvent,
    TurnStartedEvent,
    event_from_dict,
)
from ._inbound import InboundEvent, Proactive, User
from ._loader import load_agent
from ._messages import (
    AssistantMessage,
    Message,
    ModelReply,
    StopReason,
    ToolCall,
    ToolMessage,
    TriggerMessage,
    UserMessage,
    message_from_dict,
)
from ._model import Model, ModelDelta, ModelDone, ReasoningDelta, TextDelta, ToolSpec
from ._runtime import AgentSession, Runtime
from ._tools import ActionContext, Tool, define_action, tool
from ._turns import TurnResult

__all__ = [
    "ActionCompletedEvent",
    "ActionContext",
    "ActionRequestedEvent",
    "Agent",
    "AgentSession",
    "AssistantMessage",
    "ConfigurationError",
    "EventSink",
    "FatalToolError",
    "InboundEvent",
    "LocalEventSink",
    "Message",
    "MessageCompletedEvent",
    "MessageDecodeError",
    "MessageDeltaEvent",
    "Model",
    "ModelDelta",
    "ModelDone",
    "ModelError",
    "ModelReply",
    "Proactive",
    "ReasoningDelta",
    "ReasoningDeltaEvent",
    "Runtime",
    "SessionBusyError",
    "StopReason",
    "StoreError",
    "TextDelta",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolDefinitionError",
    "ToolMessage",
    "ToolSpec",
    "TriggerMessage",
    "TurnCompletedEvent",
    "TurnError",
    "TurnEvent",
    "TurnFailedError",
    "TurnFailedEvent",
    "TurnResult",
    "TurnStartedEvent",
    "TurnkitError",
    "User",
    "UserMessage",
    "define_action",
    "event_from_dict",
    "load_agent",
    "message_from_dict",
    "tool",
]
