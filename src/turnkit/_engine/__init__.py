"""The engine: drives one delivery of a turn through the seams, step by step.

It imports only value types and seams; it knows nothing of runtimes, channels or backends.
"""
