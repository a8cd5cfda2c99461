"""polar_pl.engine."""
