"""The gateway's `kvgate` sub-commands: `serve`, `settings`, `replica-keys` (`gateway/cli.py`
wires them)."""
