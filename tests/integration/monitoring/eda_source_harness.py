"""Runs the collection's real alert_webhook event source (in the ansible-rulebook venv) with a queue that prints
every event as one JSON line; the arguments come as JSON in argv[1]. For test_eda_source.py."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[3] / "extensions" / "eda" / "plugins" / "event_source" / "alert_webhook.py"


class PrintQueue:
    """The rulebook's queue, printing each event as one JSON line. With ``stall_after`` N, it takes N events and
    then has no room any more (a rulebook busy with a run): ``put`` waits for ever, as on a full asyncio.Queue."""

    def __init__(self, stall_after=None):
        self.stall_after = stall_after

    async def put(self, event):
        if self.stall_after is not None:
            if self.stall_after <= 0:
                await asyncio.Future()
            self.stall_after -= 1
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()


def main():
    spec = importlib.util.spec_from_file_location("alert_webhook", PLUGIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        args = json.loads(sys.argv[1])
        asyncio.run(mod.main(PrintQueue(args.pop("_stall_after", None)), args))
    except ValueError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
