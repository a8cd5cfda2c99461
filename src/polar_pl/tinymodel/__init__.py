"""polar_pl.tinymodel."""
