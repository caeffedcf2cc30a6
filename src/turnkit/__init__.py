"""turnkit: durable agent turns.

A turn is a loop the engine drives (ask the model, run the tools it asked for,
repeat) with every step checkpointed, so a crashed or interrupted turn replays
from its last finished step. The public names are re-exported here.
"""

from ._agent import Agent
from ._approvals import AnswerCheck, Grant, ResumeRequest, grant_answer
from ._channels import Channel, ChannelContext, DeliveringChannel, mount_agent, receive
from ._context import ToolContext
from ._errors import (
    ConfigurationError,
    DeliveryError,
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
    TurnCancelledError,
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
    SubagentEvent,
    TurnCancelledEvent,
    TurnCompletedEvent,
    TurnEvent,
    TurnFailedEvent,
    TurnStartedEvent,
    event_from_dict,
)
from ._inbound import InboundEvent, Proactive, User
from ._inputs import Answerer, Answerers, InputRequest
from ._loader import AgentConfig, load_agent
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
from ._observe import TurnStream
from ._policy import SurfacePolicy, TurnPolicy
from ._runtime import AgentSession, Runtime
from ._schedule import ScheduledTurn, SlotRule, schedule
from ._subagent import SubagentError, subagent
from ._terminal import TerminalChannel
from ._tools import ActionContext, Tool, define_action, tool
from ._turns import ResetResult, TurnResult

__all__ = [
    "ActionCompletedEvent",
    "ActionContext",
    "ActionRequestedEvent",
    "Agent",
    "AgentConfig",
    "AgentSession",
    "AnswerCheck",
    "Answerer",
    "Answerers",
    "AssistantMessage",
    "Channel",
    "ChannelContext",
    "ConfigurationError",
    "DeliveringChannel",
    "DeliveryError",
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
    "ResetResult",
    "ResumeAuthorizationError",
    "ResumeConflictError",
    "ResumeRequest",
    "Runtime",
    "ScheduledTurn",
    "SessionBusyError",
    "SessionSuspendedError",
    "SlotRule",
    "StopReason",
    "StoreError",
    "SubagentError",
    "SubagentEvent",
    "SurfacePolicy",
    "TerminalChannel",
    "TextDelta",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolDefinitionError",
    "ToolMessage",
    "ToolSpec",
    "TriggerMessage",
    "TurnCancelledError",
    "TurnCancelledEvent",
    "TurnCompletedEvent",
    "TurnError",
    "TurnEvent",
    "TurnFailedError",
    "TurnFailedEvent",
    "TurnPolicy",
    "TurnResult",
    "TurnStartedEvent",
    "TurnStream",
    "TurnSuspendedError",
    "TurnkitError",
    "User",
    "UserMessage",
    "define_action",
    "event_from_dict",
    "grant_answer",
    "load_agent",
    "message_from_dict",
    "mount_agent",
    "receive",
    "schedule",
    "subagent",
    "tool",
]
