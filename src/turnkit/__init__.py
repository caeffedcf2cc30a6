"""turnkit: durable agent turns.

A turn is a loop the engine drives (ask the model, run the tools it asked for,
repeat) with every step checkpointed, so a crashed or interrupted turn replays
from its last finished step. The public names are re-exported here.
"""

from ._agent import Agent
from ._approvals import AnswerCheck, Grant, ResumeRequest, grant_answer
from ._context import ToolContext
from ._errors import (
    ConfigurationError,
    FatalToolError,
    InvalidAnswerError,
    MessageDecodeError,
    ModelError,
    ResumeAuthorizationError,
    ResumeConflictError,
    SessionBusyError,
    SessionSuspendedError,
    StoreError,
    ToolDefinitionError,
    TurnError,
    TurnFailedError,
    TurnkitError,
    TurnSuspendedError,
)
from ._events import (
    ActionCompletedEvent,
    ActionRequestedEvent,
    EventSink,
    InputRequestedEvent,
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
from ._inputs import Answerer, Answerers, InputRequest
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
    "AnswerCheck",
    "Answerer",
    "Answerers",
    "AssistantMessage",
    "ConfigurationError",
    "EventSink",
    "FatalToolError",
    "Grant",
    "InboundEvent",
    "InputRequest",
    "InputRequestedEvent",
    "InvalidAnswerError",
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
    "ResumeAuthorizationError",
    "ResumeConflictError",
    "ResumeRequest",
    "Runtime",
    "SessionBusyError",
    "SessionSuspendedError",
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
    "TurnSuspendedError",
    "TurnkitError",
    "User",
    "UserMessage",
    "define_action",
    "event_from_dict",
    "grant_answer",
    "load_agent",
    "message_from_dict",
    "tool",
]
