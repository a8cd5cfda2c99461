"""Held-out evaluation of a model folder or a checkpoint through any harness: pass@1 and pass@k
over n attempts per task with 95% intervals, resumable, and the paired comparison of two models
(run.py, stats.py, report.py); `HeldOutEval` runs it before and after a training run (callback.py)."""
