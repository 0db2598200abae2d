"""One run's machinery: start-up, the acting loop and its adders, single-process training, bookkeeping, checkpoints,
records, lifecycle and the run directory."""
