"""``python -m fedmem.cli``: the ``fedmem`` command."""

import sys

from fedmem.cli import main

sys.exit(main())
