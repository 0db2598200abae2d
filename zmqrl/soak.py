"""``zmqrl soak`` lives in :mod:`zmqrl.bench.soak`, beside the bench whose harness it shares; this
name stays for ``python -m zmqrl.soak`` and existing imports."""

import sys

from zmqrl.bench.soak import cmd_soak, main, register

__all__ = ["cmd_soak", "main", "register"]

if __name__ == "__main__":
    sys.exit(main())
