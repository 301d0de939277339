"""The operator's tools: ``python -m services.admin setup`` creates what services only bind to."""
