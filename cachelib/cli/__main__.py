"""``python -m cachelib.cli``: the ``compilecache`` command line."""

import sys

from cachelib.cli import main

sys.exit(main())
