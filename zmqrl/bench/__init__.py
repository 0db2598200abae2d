"""``zmqrl bench``: each performance goal measured next to its baseline, in one run.

One module per group (``--only NAME``), all built on :mod:`zmqrl.bench.harness` (rows and their
verdicts, settings, process control, helper processes), which imports none of them;
:mod:`zmqrl.bench.registry` maps names to modules, imported only when their group runs.
Every row compares a figure with a baseline measured in the same run on the same machine (or
with the goal itself where the goal is absolute); its ratio and verdict come from those two
figures alone:

=================  =================================================================  ============
group (--only)     measured vs baseline                                               goal (ratio)
=================  =================================================================  ============
replay             bytes per stored transition vs the transition's raw payload        <= 1.1
                   (and, for stacked frames, vs storing obs and next_obs)             <= 0.35
actor              env steps/s of the real actor sending to a sink vs its bare        >= 0.9
                   acting loop, per config (CartPole DQN, Pendulum SAC)
transport          batches/s through the proxy vs a relay inside libzmq               >= 0.9
                   (and vs direct PUSH->PULL: reported, not judged)                   (none)
learner            opt steps/s while ingesting 4 actors' batches (feeders obey the    >= 0.9
                   rate limiter's pause) vs idle
                   (and CartPole's written-out DQN update vs its autograd update)     (none)
broadcast          model publish -> loaded in a subscriber process (median ms)        goal/ms >= 1
startup            ``zmqrl local`` launch -> first transition in replay (s)           goal/s >= 1
scaling            env steps/s of ``zmqrl local`` with N actors vs 1 actor            (none)
                   and on HalfCheetah (SAC) vs a bare loop of the same env            (none)
solve              time to the config's stop return: ``zmqrl local`` vs ``train``     (none)
                   (and vs Stable-Baselines3's peer with ``--sb3``), per config       <= 0.5
                   (CartPole DQN, Pendulum SAC; CartPole APPO vs SB3's PPO)           <= 0.7
onpolicy           env steps/s of an APPO ``zmqrl local`` job vs a bare acting loop   >= 0.8
                   (shipped, and with one pass a batch); segments dropped for lag     (none)
scale              1,024 simulated actors on 64 relays: bytes per version, intake,    (several)
                   reach of a version and of a pause, joiners, memory, fairness
rewards            time to solve with rewards x0.01 and x100 vs as shipped, per       <= 1.5
                   config (CartPole DQN, IQN, APPO; POMDP R2D2; Pendulum SAC)
cheetah            HalfCheetah APPO's greedy return after 10 minutes vs SB3's PPO     >= 1.5
                   (``--sb3`` only)
=================  =================================================================  ============

    zmqrl bench                       # everything
    zmqrl bench --quick --json b.json # shorter windows, one seed
    zmqrl bench --only actor,transport
    zmqrl bench --only solve --sb3 --sb3-python /tmp/sb3venv/bin/python

``zmqrl soak`` (:mod:`zmqrl.bench.soak`) runs a job for a while and reports every role's memory.
"""

from zmqrl.bench.harness import Row, Settings, make_row, skipped_row
from zmqrl.bench.registry import GROUPS
from zmqrl.bench.suite import cmd_bench, format_table, main, run_suite

__all__ = ["GROUPS", "Row", "Settings", "cmd_bench", "format_table", "main", "make_row", "run_suite", "skipped_row"]
