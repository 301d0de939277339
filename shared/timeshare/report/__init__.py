"""Pictures and tables of simulation runs: ``report.html`` per simulation (html.py), parameter
sweeps (sweep.py, sweep_html.py) and their commands (cli.py).

Modules: runlog (events.jsonl -> arrays), series (binned GPU time, owed, usage ratio),
gantt (the per-GPU cluster picture), figures (the other charts), tables (metrics as HTML),
style (colours, units, PNG encoding).
"""
