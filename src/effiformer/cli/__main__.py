"""``python -m effiformer.cli``: the ``effiformer`` command."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
