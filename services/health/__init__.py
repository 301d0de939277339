"""timeshare health service."""
