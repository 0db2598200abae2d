"""Adders: what turns an acting loop's vector-env steps into the items replay stores."""

from zmqrl.run.adders.sequence import SequenceAdder

__all__ = ["SequenceAdder"]
