#!/usr/bin/env python3
"""A small automation shipped for demos and tests.

Reads the job's parameters (JSON) on standard input, as every automation command does,
and also finds them in HUBDOMMED_JOB_PARAMS. Parameters:

- ``name``: who to greet (default "world");
- ``sleep``: seconds to work before answering (default 0);
- ``fail``: when true, exit with ``exit_code`` (default 1) after saying why.
"""

import json
import os
import sys
import time


def main() -> int:
    params = json.loads(sys.stdin.read() or "{}")
    if params != json.loads(os.environ.get("HUBDOMMED_JOB_PARAMS", "{}")):
        print("the parameters on stdin and in the environment differ", file=sys.stderr)
        return 2
    job = os.environ.get("HUBDOMMED_JOB_ID", "?")
    print(f"job {job}: hello, {params.get('name', 'world')}!", flush=True)
    seconds = float(params.get("sleep", 0))
    if seconds:
        print(f"job {job}: working for {seconds:g} s", flush=True)
        time.sleep(seconds)
    if params.get("fail"):
        print(f"job {job}: failing as asked", file=sys.stderr, flush=True)
        return int(params.get("exit_code", 1))
    print(f"job {job}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
