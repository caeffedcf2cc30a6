"""Which model an agent folder runs with when started from the command line.

The folder's own ``model`` wins; else the environment's (``from_env``'s rule); else
the folder's ``demo_model()``, else the generic offline demo. The note says which,
so a person never mistakes the offline demo for a real model.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._assembly.loader import AgentFolder
from .._seams.model import Model
from ..models import configured, demo_model


@dataclass(frozen=True, kw_only=True)
class FolderModel:
    """``model`` to pass to ``folder.agent()`` (``None``: the folder's own choice)."""

    model: Model | None
    note: str | None
    offline: bool


def choose_model(folder: AgentFolder) -> FolderModel:
    if folder.model is not None:
        return FolderModel(model=None, note=None, offline=False)
    found = configured()
    if found is not None:
        model, choice = found
        return FolderModel(
            model=model, note=f"using {choice.label} ({choice.because})", offline=False
        )
    return FolderModel(
        model=None if folder.demo_model is not None else demo_model(),
        note="no model configured; using the offline demo model",
        offline=True,
    )
