"""timeshare: the pure scheduling core.

Everything that decides lives here and nothing here does I/O, reads clocks or uses global
randomness: time arrives as an argument (`now_s`), randomness as a `random.Random`. The
services and the simulator both call this package, so a decision made in simulation is the
decision the live system makes.
"""
