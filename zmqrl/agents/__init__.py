"""Learning algorithms behind one seam (:mod:`zmqrl.agents.base`), reached by name through
:mod:`zmqrl.agents.registry`; one folder per algorithm (``dqn/``, ``iqn/``, ``sac/``)."""
