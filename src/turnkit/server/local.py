"""Serving on this machine alone: what ``turnkit dev`` and ``turnkit console`` run.

Both bind a loopback address, answer loopback clients only (addressed by a loopback
name), and stop on SIGINT or SIGTERM; see docs/server.md and docs/console.md.
"""

from ._console_serve import serve_console
from ._dev import DevOptions, ServedChannel, SlackOptions, serve_dev

__all__ = ["DevOptions", "ServedChannel", "SlackOptions", "serve_console", "serve_dev"]
