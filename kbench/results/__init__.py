"""What a run produced and where it is kept: verdicts (verdict.py), the run's record and
results.json's schema (run_record.py), the SQLite store (store.py), and the mark a kbench process
holds in a folder others may use too (presence.py)."""
