"""The floor of the floor: every closed list of settings, defined once (choices.py), and atomic file writes
(atomic.py). Imports nothing of the project, so every other folder may import it."""
