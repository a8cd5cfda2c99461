"""polar_pl.tasks."""
