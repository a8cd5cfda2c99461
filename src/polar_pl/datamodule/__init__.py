"""polar_pl.datamodule."""
