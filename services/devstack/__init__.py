"""timeshare devstack service."""
