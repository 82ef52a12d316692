"""The commands: the parser and every command but one (commands.py), `kbench grade` from its
arguments to the rendered reports (grade_command.py), `kbench prune` (housekeeping.py), and the
lines and bar a run shows as it goes (progress.py)."""
