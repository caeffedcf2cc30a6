"""The ``TenantView`` seam: which sessions have turns of a tenant.

A session has no tenant of its own: each turn is stored with one (docs/tenants.md).
The operator console filters its session list by tenant a page at a time: it reads
a page of sessions by key, as without a filter, and asks the store which of them
have a turn of the tenant, in one read. Every built-in store offers it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class TenantView(Protocol):
    """A store that can tell which sessions have turns of a tenant."""

    async def sessions_of_tenant(self, tenant: str, session_ids: Sequence[str]) -> set[str]:
        """Those of ``session_ids`` with at least one turn (of their live
        generation) stored for ``tenant``."""
        ...
