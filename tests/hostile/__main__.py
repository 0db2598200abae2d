"""``python tests/hostile soak ...`` (the hostile soak) or ``python tests/hostile client ...`` (the client alone)."""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as ``python tests/hostile``: import this package by its name, from tests/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from hostile import client, soak  # noqa: E402

PROGRAMS = {"soak": soak.main, "client": client.main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in PROGRAMS:
        print(f"usage: python tests/hostile {{{','.join(PROGRAMS)}}} ARGS... (--help after one for its own)",
              file=sys.stderr)
        sys.exit(2)
    sys.exit(PROGRAMS[sys.argv[1]](sys.argv[2:]))
