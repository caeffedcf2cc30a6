"""Local stand-ins for the model providers: real HTTP on 127.0.0.1, real wire formats.

The official SDKs talk to these servers exactly as they talk to the real APIs, so the
adapters' tests exercise the SDKs' own request building, SSE parsing and retries.
"""
