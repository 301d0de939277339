"""timeshare executor service."""
