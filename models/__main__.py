"""``python -m models``: see :mod:`models.cli`."""

from __future__ import annotations

import sys

from models.cli import main

if __name__ == "__main__":
    sys.exit(main())
