"""The automation worker: the program on an automation's machine.

It needs only the hub's URL, its worker credential and the broker (no database). It
learns of jobs from its automation's own queue and by polling the hub, claims them,
runs the automation's command, heartbeats while it runs and reports the outcome.
"""
