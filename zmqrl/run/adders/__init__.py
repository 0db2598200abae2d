"""Adders: what turns an acting loop's vector-env steps into the items it sends (numpy only).

:class:`NStepBuilder` makes n-step transitions. A push that brings the policy's values adds two
fields to each transition, :data:`FIRST_VALUES` and :data:`ENV_ID`, which the acting loop takes
off again once it has built the transition's initial priority. :class:`SequenceAdder` makes the
fixed-length, overlapping sequences of recurrent agents, with the state each env held at their start.
"""

from zmqrl.run.adders.nstep import ENV_ID, FIRST_VALUES, NStepBuilder
from zmqrl.run.adders.sequence import SequenceAdder

__all__ = ["ENV_ID", "FIRST_VALUES", "NStepBuilder", "SequenceAdder"]
