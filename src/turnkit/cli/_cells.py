"""``turnkit cells``: where the tenants of a deployment over several databases live,
and moving one of them to another cell (docs/deploying.md, "Cells").

``cells list`` reads the directory; ``cells move`` runs ``move_tenant``, printing each
step, and finishes a move that an earlier run left half done.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from .._errors import TurnkitError
from ._open import is_cells_spec
from ._progress import Progress
from ._store import CliError, StoreOption, one_line, writable_store

if TYPE_CHECKING:
    from ..stores.postgres import Cells

_SPEC = "cells:NAME=postgresql://…,NAME=postgresql://… (the first is the home cell)"


def add_cells(commands: Any, store_option: StoreOption) -> None:
    cells = commands.add_parser(
        "cells",
        help="list where tenants live across cells, or move a tenant to another cell",
        description="A deployment over several PostgreSQL databases (cells), named by "
        f"--store {_SPEC}.",
    )
    actions = cells.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="each cell's sessions, tenants, moves under way")
    store_option(listing)
    listing.add_argument("--json", action="store_true", help="print one JSON object instead")
    listing.set_defaults(handler=cells_list)
    move = actions.add_parser(
        "move",
        help="move a tenant and all its sessions to another cell (drain, copy, switch)",
        description="Drain the tenant (its new turns are refused, its running ones finish), "
        "copy its sessions with everything they keep, verify, switch the directory, and "
        "clear the old cell. Run it again to finish a move that stopped.",
    )
    store_option(move)
    move.add_argument("tenant", help="the tenant to move")
    move.add_argument("--to", required=True, metavar="CELL", help="the cell to move it to")
    move.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the tenant's running turns (default: 60)",
    )
    move.set_defaults(handler=cells_move)


async def cells_list(args: argparse.Namespace, progress: Progress) -> int:
    store = await _cells(args.store)
    try:
        layout = await store.directory.layout()
        counts = await store.turn_counts()
    finally:
        await store.close()
    progress.done()
    if args.json:
        print(
            json.dumps(
                {
                    "home": store.home,
                    "cells": list(store.cells),
                    "sessions": layout.sessions,
                    "tenants": layout.tenants,
                    "moves": [vars(m) for m in layout.moves],
                    "turns": counts,
                },
                indent=2,
            )
        )
        return 0
    for name in store.cells:
        tenants = sorted(t for t, c in layout.tenants.items() if c == name)
        home = " (home)" if name == store.home else ""
        shown = ", ".join(repr(t) for t in tenants[:10]) + (", …" if len(tenants) > 10 else "")
        print(
            f"{name}{home}: {layout.sessions.get(name, 0)} sessions, "
            f"{len(tenants)} tenants{': ' + shown if tenants else ''}"
        )
    for m in layout.moves:
        print(f"moving {m.tenant!r}: {m.source} -> {m.target}, {m.stage}")
    return 0


async def cells_move(args: argparse.Namespace, progress: Progress) -> int:
    from ..stores.postgres import move_tenant

    store = await _cells(args.store)
    try:
        moved = await move_tenant(
            store, args.tenant, args.to, drain_timeout=args.drain_timeout, progress=print
        )
    except TurnkitError as exc:
        raise CliError(one_line(str(exc))) from None
    finally:
        await store.close()
    progress.done()
    print(f"moved tenant {moved.tenant!r} ({moved.sessions} sessions) to cell {moved.target!r}")
    return 0


async def _cells(spec: str) -> Cells:
    from ..stores.postgres import Cells

    if not is_cells_spec(spec):
        raise CliError(f"turnkit cells needs --store {_SPEC}")
    store = await writable_store(spec)
    assert isinstance(store, Cells)  # what a cells: spec opens
    return store
