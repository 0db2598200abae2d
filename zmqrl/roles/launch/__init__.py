"""Launchers: ``zmqrl local`` (every role on one machine), ``zmqrl head`` and ``zmqrl host`` (a cluster's
machines), the supervisor that keeps their roles running, and the role processes they start."""
