"""polar_pl.sandbox."""
