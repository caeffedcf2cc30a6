"""turnkit: durable agent turns.

A turn is a loop the engine drives (ask the model, run the tools it asked for,
repeat) with every step checkpointed, so a crashed or interrupted turn replays
from its last finished step. The public names are re-exported here.
"""

from ._assembly.loader import AgentConfig, load_agent
from ._channels.channel import Channel, ChannelContext, DeliveringChannel, mount_agent, receive
from ._channels.schedule import ScheduledTurn, SlotRule, schedule
from ._channels.subagent import SubagentError, subagent
from ._channels.terminal import TerminalChannel
from ._engine.agent import Agent
from ._engine.approval import Approval
from ._engine.context import ToolContext
from ._engine.history import (
    HistoryPolicy,
    HistoryView,
    HistoryWindow,
    LastTurns,
    SummarizeOlder,
    Summarizer,
    TokenBudget,
)
from ._engine.limits import Limits
from ._engine.retries import Retry
from ._engine.tool_sources import ToolSource
from ._engine.tools import ActionContext, Tool, define_action, tool
from ._engine.wait_tool import wait_tool
from ._errors import (
    ConfigurationError,
    ContextWindowError,
    DeliveryError,
    FatalToolError,
    FencedError,
    GenerationArchivedError,
    InvalidAnswerError,
    MessageDecodeError,
    ModelError,
    ModelOverloadedError,
    ResumeAuthorizationError,
    ResumeConflictError,
    RetryableError,
    SessionBusyError,
    SessionFileError,
    SessionOwnerError,
    SessionSuspendedError,
    StoreError,
    ToolDefinitionError,
    TurnCancelledError,
    TurnError,
    TurnFailedError,
    TurnHeldError,
    TurnkitError,
    TurnMoveError,
    TurnSuspendedError,
    WriteConflictError,
)
from ._runtime.approvals import Grant, ResumeRequest
from ._runtime.client import RuntimeClient
from ._runtime.exported import ImportResult, export_session, import_session
from ._runtime.forking import ForkResult, fork_session
from ._runtime.granting import grant_answer
from ._runtime.inbox import InboxPage, PendingInput
from ._runtime.observe import TurnStream
from ._runtime.retention import PruneReport, Retention
from ._runtime.runtime import Runtime
from ._runtime.session import AgentSession
from ._runtime.session_client import SessionClient
from ._runtime.worker import Worker
from ._seams.blobs import BlobStore
from ._seams.codec import Codec, PayloadKind
from ._seams.model import (
    Model,
    ModelDelta,
    ModelDone,
    OutputModel,
    OutputSpec,
    ReasoningDelta,
    TextDelta,
    ToolSpec,
)
from ._seams.sink import EventSink, LocalEventSink
from ._seams.tracer import StepOutcome, StepSpan, StepTrace, Tracer, TurnSpan, TurnTrace
from ._values.answers import AnswerRecord
from ._values.budgets import Budget, Limit, Price, Spend
from ._values.decisions import Decision, DecisionOptions
from ._values.events import (
    ActionCompletedEvent,
    ActionRequestedEvent,
    DeliveryFailedEvent,
    InputAnsweredEvent,
    InputExpiredEvent,
    InputReminderEvent,
    InputRequestedEvent,
    MessageCompletedEvent,
    MessageDeltaEvent,
    ReasoningDeltaEvent,
    StepRetryEvent,
    SubagentEvent,
    TurnCancelledEvent,
    TurnCompletedEvent,
    TurnEvent,
    TurnFailedEvent,
    TurnHeldEvent,
    TurnStartedEvent,
    TurnVersionChangedEvent,
    UnknownEvent,
    event_from_dict,
)
from ._values.inbound import InboundEvent, Proactive, User
from ._values.inputs import AnswerCheck, Answerer, Answerers, Expiry, InputRequest
from ._values.listed_tools import ListedTool
from ._values.messages import (
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
from ._values.policy import SurfacePolicy, TurnPolicy
from ._values.rate_limits import RateLimit
from ._values.tenancy import Concurrency
from ._values.turn_options import TurnKeywords, TurnOptions
from ._values.turns import ResetResult, TurnResult
from ._values.usage import Usage
from ._values.versions import Rewrite, VersionChange, VersionDecision

__all__ = [
    "ActionCompletedEvent",
    "ActionContext",
    "ActionRequestedEvent",
    "Agent",
    "AgentConfig",
    "AgentSession",
    "AnswerCheck",
    "AnswerRecord",
    "Answerer",
    "Answerers",
    "Approval",
    "AssistantMessage",
    "BlobStore",
    "Budget",
    "Channel",
    "ChannelContext",
    "Codec",
    "Concurrency",
    "ConfigurationError",
    "ContextWindowError",
    "Decision",
    "DecisionOptions",
    "DeliveringChannel",
    "DeliveryError",
    "DeliveryFailedEvent",
    "EventSink",
    "Expiry",
    "FatalToolError",
    "FencedError",
    "ForkResult",
    "GenerationArchivedError",
    "Grant",
    "HistoryPolicy",
    "HistoryView",
    "HistoryWindow",
    "ImportResult",
    "InboundEvent",
    "InboxPage",
    "InputAnsweredEvent",
    "InputExpiredEvent",
    "InputReminderEvent",
    "InputRequest",
    "InputRequestedEvent",
    "InvalidAnswerError",
    "LastTurns",
    "Limit",
    "Limits",
    "ListedTool",
    "LocalEventSink",
    "Message",
    "MessageCompletedEvent",
    "MessageDecodeError",
    "MessageDeltaEvent",
    "Model",
    "ModelDelta",
    "ModelDone",
    "ModelError",
    "ModelOverloadedError",
    "ModelReply",
    "OutputModel",
    "OutputSpec",
    "PayloadKind",
    "PendingInput",
    "Price",
    "Proactive",
    "PruneReport",
    "RateLimit",
    "ReasoningDelta",
    "ReasoningDeltaEvent",
    "ResetResult",
    "ResumeAuthorizationError",
    "ResumeConflictError",
    "ResumeRequest",
    "Retention",
    "Retry",
    "RetryableError",
    "Rewrite",
    "Runtime",
    "RuntimeClient",
    "ScheduledTurn",
    "SessionBusyError",
    "SessionClient",
    "SessionFileError",
    "SessionOwnerError",
    "SessionSuspendedError",
    "SlotRule",
    "Spend",
    "StepOutcome",
    "StepRetryEvent",
    "StepSpan",
    "StepTrace",
    "StopReason",
    "StoreError",
    "SubagentError",
    "SubagentEvent",
    "SummarizeOlder",
    "Summarizer",
    "SurfacePolicy",
    "TerminalChannel",
    "TextDelta",
    "TokenBudget",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolDefinitionError",
    "ToolMessage",
    "ToolSource",
    "ToolSpec",
    "Tracer",
    "TriggerMessage",
    "TurnCancelledError",
    "TurnCancelledEvent",
    "TurnCompletedEvent",
    "TurnError",
    "TurnEvent",
    "TurnFailedError",
    "TurnFailedEvent",
    "TurnHeldError",
    "TurnHeldEvent",
    "TurnKeywords",
    "TurnMoveError",
    "TurnOptions",
    "TurnPolicy",
    "TurnResult",
    "TurnSpan",
    "TurnStartedEvent",
    "TurnStream",
    "TurnSuspendedError",
    "TurnTrace",
    "TurnVersionChangedEvent",
    "TurnkitError",
    "UnknownEvent",
    "Usage",
    "User",
    "UserMessage",
    "VersionChange",
    "VersionDecision",
    "Worker",
    "WriteConflictError",
    "define_action",
    "event_from_dict",
    "export_session",
    "fork_session",
    "grant_answer",
    "import_session",
    "load_agent",
    "message_from_dict",
    "mount_agent",
    "receive",
    "schedule",
    "subagent",
    "tool",
    "wait_tool",
]


def _report_public_module() -> None:
    """Public classes and functions say ``turnkit`` is their module, as documented."""
    for name in __all__:
        obj = globals()[name]
        if isinstance(obj, type) or (callable(obj) and hasattr(obj, "__code__")):
            obj.__module__ = __name__


_report_public_module()
