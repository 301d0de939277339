"""Pictures and tables of simulation runs: ``report.html`` per simulation (html.py), parameter
sweeps (sweep.py, sweep_html.py) and their commands (cli.py).

Modules: runlog (events -> arrays), series (binned GPU time, owed, usage ratio),
gantt (the per-GPU cluster picture), figures (the other charts), svg (charts as inline SVG),
tables (metrics as HTML), palette (colours, units), style (the sweep page's matplotlib figures).
"""
