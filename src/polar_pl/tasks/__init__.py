"""Tasks, evaluators and rewards.

- `task.py`: the frozen `Task` record, parsed from SWE-bench / SWE-Gym rows with field-level errors.
- `sources.py`: `TaskSource` (Hydra group `task/`): SWE-bench files through `datasets`, the built-in
  suite (`builtin/`, 24 bug-fix tasks), and `learnable.py`, the answer-scored CPU family.
- `workspace.py`: the prepare step (snapshot into a sandbox, setup, baseline commit).
- `evaluator.py`: `Evaluator` protocol and `SandboxEvaluator` (fresh, pre-warmed sandbox; patch,
  test patch, FAIL_TO_PASS / PASS_TO_PASS), with `patching.py` and `testrun.py`; `answer.py` scores
  answer text. `suite_check.py` and `cli.py` (`polar-pl tasks list|check|export`) check the suite.
"""
