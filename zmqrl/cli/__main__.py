"""``python -m zmqrl.cli``: the ``zmqrl`` command."""

import sys

from zmqrl.cli import main

sys.exit(main())
