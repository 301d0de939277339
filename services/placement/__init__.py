"""timeshare placement service."""
