"""The usage ledger in SQL (SQLite and PostgreSQL): what each session and each tenant
spent on model calls, for budgets and metrics (docs/tenants.md).

One row per session (bucket ``s:<session id>``) and ``TENANT_SHARDS`` rows per tenant
(``t:0`` ...), a model step adding to its session's row and to one of its tenant's,
picked by the session: concurrent steps of one tenant's sessions mostly update
different rows, so they do not queue on one row lock; a tenant's total is the sum
of its shards.
"""

from __future__ import annotations

import zlib
from typing import Any

from .._values.budgets import Spend
from .._values.writes import CountUsage

#: How many rows a tenant's total is spread over.
TENANT_SHARDS = 8
_TENANT_BUCKETS = tuple(f"t:{n}" for n in range(TENANT_SHARDS))

#: Add to one bucket: tenant, bucket, input tokens, output tokens, cost.
COUNT = (
    "INSERT INTO turnkit_usage AS u (tenant, bucket, input_tokens, output_tokens, cost, calls) "
    "VALUES (?, ?, ?, ?, ?, 1) ON CONFLICT (tenant, bucket) DO UPDATE SET "
    "input_tokens = u.input_tokens + excluded.input_tokens, "
    "output_tokens = u.output_tokens + excluded.output_tokens, "
    "cost = u.cost + excluded.cost, calls = u.calls + 1"
)
_IN_TENANT = ", ".join(f"'{b}'" for b in _TENANT_BUCKETS)
#: A session's spend and its tenant's: tenant, the session's bucket. Rows: whether it
#: is the session's, then the sums.
SPEND = (
    "SELECT substr(bucket, 1, 2) = 's:', sum(input_tokens), sum(output_tokens), sum(cost), "
    f"sum(calls) FROM turnkit_usage WHERE tenant = ? AND (bucket = ? OR bucket IN ({_IN_TENANT})) "
    "GROUP BY substr(bucket, 1, 2) = 's:'"
)
#: Every tenant's spend.
BY_TENANT = (
    "SELECT tenant, sum(input_tokens), sum(output_tokens), sum(cost), sum(calls) "
    f"FROM turnkit_usage WHERE bucket IN ({_IN_TENANT}) GROUP BY tenant ORDER BY tenant"
)


def session_bucket(session_id: str) -> str:
    return f"s:{session_id}"


def tenant_bucket(session_id: str) -> str:
    return _TENANT_BUCKETS[zlib.crc32(session_id.encode()) % TENANT_SHARDS]


def count_statements(session_id: str, w: CountUsage) -> list[tuple[str, tuple[Any, ...]]]:
    """The upserts of one ``CountUsage``: the session's row and one of its tenant's."""
    amounts = (w.input_tokens, w.output_tokens, float(w.cost))
    return [
        (COUNT, (w.tenant, session_bucket(session_id), *amounts)),
        (COUNT, (w.tenant, tenant_bucket(session_id), *amounts)),
    ]


def spend_params(session_id: str, tenant: str) -> tuple[Any, ...]:
    return (tenant, session_bucket(session_id))


def spend_of(row: Any) -> Spend:
    return Spend(int(row[1] or 0), int(row[2] or 0), float(row[3] or 0.0), int(row[4] or 0))


def split_spend(rows: list[Any]) -> tuple[Spend, Spend]:
    """``SPEND``'s rows as (the session's, the tenant's)."""
    session = tenant = Spend()
    for row in rows:
        if row[0] in (True, 1, "t", b"t"):
            session = spend_of(row)
        else:
            tenant = spend_of(row)
    return session, tenant
