"""timeshare gateway service."""
