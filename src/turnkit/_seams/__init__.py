"""The seams the engine talks through: ``SessionStore``, ``Model`` and ``EventSink``.

Protocols only (plus the values that cross them); every backend is a plug-in beside the core.
"""
