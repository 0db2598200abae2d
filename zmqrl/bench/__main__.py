"""``python -m zmqrl.bench [options]``: the same as ``zmqrl bench``."""

import sys

from zmqrl.bench.suite import main

sys.exit(main())
