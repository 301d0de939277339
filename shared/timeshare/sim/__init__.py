"""The simulator: scenarios, traces, the discrete-event loop and its metrics (the shell around
the pure core that reads files; decisions are all made by the core)."""
