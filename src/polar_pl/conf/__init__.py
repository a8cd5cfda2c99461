"""The Hydra config groups, shipped inside the package so that every entry point composes them the
same way, from a checkout or an installed wheel: `config_path="pkg://polar_pl.conf"` (train.py,
`python -m polar_pl.sft`), `importlib.resources` (`polar-pl traces export`). The checkout's
top-level `conf` is a link to this folder."""
