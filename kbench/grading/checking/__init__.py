"""Checking: is a candidate's output right (compared with the reference, per case, rechecked),
is the problem fit to grade (screening), and why a failure failed."""
