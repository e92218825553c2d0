"""``python -m cunorm bench ...`` (see cunorm._cli)."""
import sys

from ._cli import main

sys.exit(main())
