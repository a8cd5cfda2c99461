"""polar_pl.harness."""
