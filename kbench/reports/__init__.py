"""What a stored run is rendered to: leaderboard.md (markdown.py), index.html (html_report.py)
with its charts (charts.py), results.csv (csv_report.py), all written by report_folder.py; the batch
summary (summary.py) and two runs compared (run_diff.py, `kbench compare`)."""
