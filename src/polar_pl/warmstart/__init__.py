"""Calibration for the learning checks: the warm-started tiny models their runs train from (a CLI
harness's, trained inside that CLI's captured request; the CLI and multi-turn checks' case-task
starts; the generic chat and tool-call warm start they build on), the data and evaluations each
warm start uses, and `polar-pl warm-start`, which builds the one a training config names.

Built before a run, never by it: no product module imports this package (tests/test_imports.py),
and `python train.py` refuses a config whose warm-started model_dir is missing (preflight.py).
"""
