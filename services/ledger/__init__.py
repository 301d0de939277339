"""timeshare ledger service."""
