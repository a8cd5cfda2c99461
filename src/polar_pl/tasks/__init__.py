"""Tasks, evaluators and rewards.

- `task.py`: the frozen `Task` record, parsed from SWE-bench / SWE-Gym rows with field-level errors.
- `sources.py`: `TaskSource` (Hydra group `task/`): SWE-bench files through `datasets`, the built-in
  suite (`builtin/`, 24 bug-fix tasks, under unittest or pytest), and `learnable.py`, the
  answer-scored CPU family.
- `workspace.py`: the prepare step (snapshot into a sandbox, setup, baseline commit).
- `evaluator.py`: `Evaluator` protocol and `SandboxEvaluator` (fresh, pre-warmed sandbox; patch, the
  task's own test files from `trusted.py`, FAIL_TO_PASS / PASS_TO_PASS), with `patching.py`;
  `testrun.py` runs the tests through the in-sandbox kit in `inside/` (a supervisor holding a key,
  one guarded test process per file, results the code under test cannot forge; `pytest_bundle.py`
  where the image has no pytest); `grading.py` scores with SWE-bench's own grading. What the guard
  catches is status "tampering" (reward 0, metric `rollout/tampering`). `answer.py` scores answer
  text. `suite_check.py` and `cli.py` (`polar-pl tasks list|check|export`) check the suite.
"""
