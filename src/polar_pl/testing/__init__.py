"""Test and bench kits, imported by tests/ and bench/ only, never by a product module
(tests/test_imports.py checks it).

  scripted   ScriptedBackend / ScriptedServer / serve_scripted: the real engine server answering
             with scripted assistant turns (a double for what is AROUND the engine)
  smoke      the scripted two-turn shell-tool task every harness can run (`SHELL_TOOL`)
  clitrace   a real harness CLI doing a three-turn tool task through a fresh gateway: merge stats
  learning   the CLI learning check's measure: the no-push control's overrides, start and lead
  sandbox    pytest fixtures for a private Docker engine and the sandbox leftover check
  hosts      a second (TLS, TCP) engine as a remote host, a local registry, wheel-built per-task
             images, a TCP proxy that can cut a host off (and their session fixtures)

This is the only package allowed to import pytest (a `test` extra, not a runtime dependency).
"""
