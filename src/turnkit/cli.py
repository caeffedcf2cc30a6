"""The ``turnkit`` command line: run an agent's turn in the terminal.

Errors print as one line (``turnkit: error: …``) with a non-zero exit, never a
traceback; ``--help`` on each command says what it takes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ._channels import mount_agent
from ._errors import TurnkitError
from ._loader import AgentFolder
from ._model import Model
from ._runtime import Runtime
from ._terminal import TerminalChannel
from .models import demo_model
from .models._env import configured
from .stores import SqliteStore

DEFAULT_STORE = os.path.join(".turnkit", "sessions.db")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turnkit", description="Durable agent turns.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run one turn of an agent, streamed to the terminal")
    run.add_argument("agent_dir", help="the agent folder (agent.py, instructions.md, tools/)")
    run.add_argument("text", help="what to say to the agent")
    run.add_argument("--session", default="cli", help="session id (default: cli)")
    run.add_argument(
        "--store",
        default=DEFAULT_STORE,
        help=f"SQLite file for sessions (default: {DEFAULT_STORE})",
    )
    return parser


async def _run(args: argparse.Namespace) -> int:
    folder = AgentFolder.read(args.agent_dir)
    agent = folder.agent(_model_for(folder))
    store_path = Path(args.store)
    store_path.parent.mkdir(parents=True, exist_ok=True)
    terminal = TerminalChannel()
    async with Runtime([agent], store=SqliteStore(store_path)) as runtime:
        await runtime.recover()
        ctx = mount_agent(agent, runtime, channels=[terminal])
        result = await terminal.converse(ctx, args.text, session=args.session)
    if result.status == "suspended":
        print(
            f"turnkit: the turn is still waiting for an answer; run again with "
            f"--session {args.session} to answer it",
            file=sys.stderr,
        )
        return 3
    if result.status != "completed":
        print(f"turnkit: turn {result.status}: {result.error or result.reason}", file=sys.stderr)
        return 1
    return 0


def _model_for(folder: AgentFolder) -> Model | None:
    """The model to run when the folder names none: the environment's (``from_env``'s
    rule), else the folder's ``demo_model()``, else the generic offline demo."""
    if folder.model is not None:
        return None
    found = configured()
    if found is not None:
        model, choice = found
        print(f"turnkit: using {choice.label} ({choice.because})", file=sys.stderr)
        return model
    print("turnkit: no model configured; using the offline demo model", file=sys.stderr)
    return None if folder.demo_model is not None else demo_model()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except TurnkitError as exc:
        print(f"turnkit: error: {exc}", file=sys.stderr)
        return 2
    except EOFError:
        print("turnkit: no answer given; the turn waits for one on the next run", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("turnkit: interrupted; the turn resumes on the next run", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
