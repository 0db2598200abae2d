"""Roles: thin processes joining agents, replay and the wire (actor, proxy, learner, evaluator, local)."""
