"""Learning algorithms behind one seam (:mod:`zmqrl.agents.base`), reached by name through
:mod:`zmqrl.config.algorithms`; one folder per algorithm (``dqn/``, ``iqn/``, ``sac/``)."""
