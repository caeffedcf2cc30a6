"""``python -m turnkit.cli``: the same as the ``turnkit`` command."""

from . import main

raise SystemExit(main())
