"""Tools that read a run from outside: plot, enjoy, status, and the Python API."""
