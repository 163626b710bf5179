"""Canary audit of a run's privacy (docs/audit.md): :mod:`fl_app.audit.canaries` runs the canaries inside a
training run; ``python -m fl_app.audit <run dir>`` recomputes the audit from the saved statistics and plots it.
The statistics themselves are pure functions in :mod:`fl_app.privacy.audit`."""
