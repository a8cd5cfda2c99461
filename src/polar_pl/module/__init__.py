"""polar_pl.module."""
