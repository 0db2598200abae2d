"""Environments: the factory and wrappers, Atari, Catch, env state capture, the greedy evaluator."""
