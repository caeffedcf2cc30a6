"""Access: who is calling and which sessions they may use.

``Principal`` and the ``authenticate`` hook's shape (``principal``), the
``authorize`` hook and its actions (``authorize``), and whether a principal is a
parked question's named answerer (``answerer``). A layer of its own below the
HTTP app and the channels (``server``, ``slack``, ``mcp``, ``a2a``), which all
decide access the same way; it needs Starlette for the request an
``authenticate`` hook reads.
"""
