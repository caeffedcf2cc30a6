"""Which agent a command runs and what ``turnkit run`` was told to say.

``turnkit run`` and ``turnkit dev`` take an agent folder, or run the example agent
shipped inside the package (so it is there after a wheel install too). ``run``
takes ``[AGENT_DIR] TEXT``: one word is the text for the bundled example.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigurationError
from ._store import CliError

#: The example agent shipped inside the package, run when no folder is named.
BUNDLED_EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ops"


def bundled_example() -> Path:
    """The example agent run when no folder is named."""
    if not BUNDLED_EXAMPLE.is_dir():
        raise ConfigurationError(
            "this installation has no bundled example agent; name an agent folder "
            "(turnkit run AGENT_DIR TEXT, turnkit dev AGENT_DIR)"
        )
    return BUNDLED_EXAMPLE


@dataclass(frozen=True, kw_only=True)
class RunTarget:
    """What ``turnkit run`` runs: the agent folder and the text of the turn."""

    folder: Path
    text: str


def run_target(words: Sequence[str]) -> RunTarget:
    """``[AGENT_DIR] TEXT`` → the folder (the bundled example when absent) and the text.

    Empty text is refused as the HTTP API refuses it. A lone word naming a folder is
    taken for a forgotten text, not said to the example agent.
    """
    if len(words) not in (1, 2):
        raise CliError(
            f"turnkit run takes [AGENT_DIR] TEXT, got {len(words)} words; "
            'quote the text: turnkit run AGENT_DIR "order 2 blue widgets"'
        )
    text = words[-1]
    if not text.strip():
        raise CliError("the text must not be empty; say something to the agent")
    if len(words) == 2:
        return RunTarget(folder=Path(words[0]), text=text)
    if Path(text).is_dir():
        raise CliError(
            f"{text!r} is a folder; say what to tell its agent: "
            f'turnkit run {shlex.quote(text)} "your message"'
        )
    return RunTarget(folder=bundled_example(), text=text)


@dataclass(frozen=True)
class AnswerTarget:
    folder: Path
    answer: str | None


def answer_target(words: Sequence[str]) -> AnswerTarget:
    """``[AGENT_DIR] [ANSWER]`` → the folder (the bundled example when absent) and the
    answer (``None``: ask at the prompt). A first word naming a folder is the folder."""
    if len(words) > 2:
        raise CliError(
            f"turnkit answer takes [AGENT_DIR] [ANSWER], got {len(words)} words; "
            'quote the answer: turnkit answer AGENT_DIR "yes"'
        )
    if words and Path(words[0]).is_dir():
        return AnswerTarget(folder=Path(words[0]), answer=words[1] if len(words) == 2 else None)
    if len(words) == 2:
        raise CliError(f"{words[0]!r} is not a folder; turnkit answer takes [AGENT_DIR] [ANSWER]")
    return AnswerTarget(folder=bundled_example(), answer=words[0] if words else None)


def default_session(agent: str) -> str:
    """The session ``turnkit run`` uses without ``--session``: one per agent, since a
    session belongs to the agent that opened it."""
    return f"cli:{agent}"
