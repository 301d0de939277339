"""timeshare budget service."""
