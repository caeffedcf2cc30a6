"""The Vercel AI SDK's UI message stream for turnkit agents (``turnkit[server]``).

``create_app(runtime, ..., frontends=[ai_sdk()])`` serves, for every agent, the chat
endpoint ``DefaultChatTransport`` talks to, its reconnect endpoint (replayed from
the durable event log) and a durable stop; see docs/frontends.md.
"""

from ._chat import AiSdk, ai_sdk, approval_value

__all__ = ["AiSdk", "ai_sdk", "approval_value"]
