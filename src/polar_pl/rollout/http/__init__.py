"""`polar-pl rollout serve`: the rollout controller over HTTP (app.py routes, schema.py models,
server.py assembly from the training config, cli.py the command)."""
