"""polar_pl.rollout: where sessions run, behind one interface the DataModule talks to.

`runtime.py`   `RolloutRuntime`, a run's rollouts without Lightning: the engine, the rollout client,
               the push target, health, interrupt (the DataModule owns one in training; the HTTP
               service, SFT generation and the held-out evaluation drive one directly);
`build.py`     a runtime from a composed config (`build_runtime`);
`protocol.py`  the `RolloutClient` the DataModule (or any trainer) drives, the `RolloutBackend`
               that connects one (Hydra group `rollout=`), and `RolloutSetup`, what a run needs;
`local.py`     `rollout=local`: one gateway and the stage pools in this process (the CPU default);
`ray_*.py`     `rollout=ray`: rollout workers as Ray actors on every node offering `sandbox`, a
               controller actor keeping today's group bookkeeping, lost sessions retried or masked;
`http/`        `polar-pl rollout serve` (the controller over HTTP, OpenAPI);
`remote.py`    `rollout=remote`: a trainer driving such a service (weights through a shared directory).

Group semantics (G attempts, deadlines, work-ahead bound, resume cursor) live once, in
`polar_pl.rollout.service.RolloutService`; the backends only change what runs the jobs.
"""
