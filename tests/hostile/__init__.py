"""Test equipment, not part of zmqrl: a hostile peer of a running job (:mod:`hostile.client`, its
messages in :mod:`hostile.messages`) and a soak under its attack (:mod:`hostile.soak`).

From a checkout (CartPole-v1 configs)::

    python tests/hostile soak configs/cartpole_dqn.yaml --minutes 10 --actors 2     # the hostile soak
    python tests/hostile client configs/cartpole_dqn.yaml --run-dir runs/x --seconds 120  # the client alone

Its own tests are ``tests/hostile/test_hostile.py``.
"""
