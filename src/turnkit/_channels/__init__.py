"""Channels: where turns come from and where their events go.

The channel contract with ``mount_agent``/``receive``, schedules, the terminal
channel and subagents.
"""
