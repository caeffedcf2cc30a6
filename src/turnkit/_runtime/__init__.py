"""The runtime: sessions, their queues, approvals and observing, around the engine.

It owns the event loop side of turnkit and hands the engine one delivery at a time.
"""
