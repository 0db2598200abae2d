"""``python -m zmqrl.cli ...``: the ``zmqrl`` command, as launchers start roles."""

import sys

from zmqrl.cli import role_process
from zmqrl.run.lifecycle import catch_stop_signals_early

if role_process(None):
    catch_stop_signals_early()  # before the imports below (0.2 s), in which a stop signal would kill a role

from zmqrl.cli.app import main  # noqa: E402

sys.exit(main())
