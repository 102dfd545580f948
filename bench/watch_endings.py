"""Stress: does a ResourceSlice watch ever end uncleanly ("Response ended prematurely")?

Issue 30, item 8: once, on a loaded 2-core machine, the exporter's DRA test read
``dra_slices_up`` 0, and a slice watch was said to have "ended prematurely". This runs the
exporter's slice follower (exporter/enrich/slicewatcher.py, the shared list+watch loop) many
times over against the API server stand-in, under CPU load, with short ``timeoutSeconds`` so
that thousands of watches open and end, while the slices change every ``--churn`` seconds:

- ``--clients`` processes, each following the slices with ``--watchers`` followers of its own
  (one API connection pool each, as one gpu-exporter has);
- ``--load`` busy-looping processes beside them (the machine's cores oversubscribed);
- the stand-in records every watch it ended without its last chunk, and why
  (``ApiServer.unclean_watch_ends``); each follower logs every watch that ended in an error.

    .venv/bin/python -m bench.watch_endings --seconds 120 --clients 3 --watchers 4 --load 4

Prints the watches served, the stand-in's unclean ends by reason and the followers' error
lines by message; exits 1 if any watch ended uncleanly.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def client(kubeconfig: str, seconds: float, watchers: int, timeout: int) -> None:
    """One process of followers; each error a follower logs goes to stderr."""
    from gpuquota.exporter.enrich.slices import KINDS, SliceIndex
    from gpuquota.exporter.enrich.slicewatcher import SliceWatcher
    from gpuquota.kube.client import Kube, Timeouts
    from gpuquota.kube.rest import load

    logging.basicConfig(level=logging.WARNING, format="CLIENT %(message)s")
    followers = []
    for _ in range(watchers):
        kube = Kube(load(kubeconfig), field_selectors=dict.fromkeys(KINDS, "spec.nodeName=node-a"))
        kube.timeouts = Timeouts(read=10.0, watch=timeout)
        follower = SliceWatcher(kube, SliceIndex(), "node-a")
        follower.start()
        followers.append(follower)
    time.sleep(seconds)
    down = sum(1 for f in followers if not f.up)
    print(f"CLIENT followers down at the end: {down}", file=sys.stderr, flush=True)
    os._exit(0)  # the followers are daemon threads in 5 s watches: do not wait for them


def burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--watchers", type=int, default=4)
    parser.add_argument("--load", type=int, default=4, help="busy-looping processes")
    parser.add_argument("--timeout", type=int, default=1, help="timeoutSeconds of each watch")
    parser.add_argument("--churn", type=float, default=0.05, help="seconds between slice writes")
    parser.add_argument(
        "--client", nargs=4, metavar=("KUBECONFIG", "S", "W", "T"), help=argparse.SUPPRESS
    )
    parser.add_argument("--burn", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        client(args.client[0], float(args.client[1]), int(args.client[2]), int(args.client[3]))
        return 0
    if args.burn:
        burn(args.burn)
        return 0

    from gpuquota.sim.apiserver import ApiServer
    from gpuquota.sim.nvml import spec
    from gpuquota.sim.nvml.resourceslices import resource_slices

    me = [sys.executable, "-m", "bench.watch_endings"]
    with ApiServer() as api, tempfile.TemporaryDirectory(prefix="gq-watch-") as folder:
        slices = resource_slices(spec.load("mixed"), "node-a")
        for obj in slices:
            api.apply("ADDED", obj)
        kubeconfig = str(api.write_kubeconfig(Path(folder) / "kubeconfig"))
        burners = [
            subprocess.Popen([*me, "--burn", str(args.seconds + 10)]) for _ in range(args.load)
        ]
        clients = [
            subprocess.Popen(
                [
                    *me,
                    "--client",
                    kubeconfig,
                    *map(str, (args.seconds, args.watchers, args.timeout)),
                ],
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(args.clients)
        ]
        end, writes = time.monotonic() + args.seconds, 0
        while time.monotonic() < end:
            obj = dict(slices[writes % len(slices)])
            obj["metadata"] = {**obj["metadata"], "labels": {"round": str(writes)}}
            api.apply("MODIFIED", obj)
            writes += 1
            time.sleep(args.churn)
        said = "".join(c.communicate()[1] for c in clients)
        # the stand-in's view first, before stopping it cuts what is still open
        unclean = list(api.unclean_watch_ends)
        served = api.requests.get("GET resourceslices", 0)
        for burner in burners:
            burner.kill()
            burner.wait()
    lines = [line for line in said.splitlines() if line.strip()]  # tracebacks included
    # every warning a follower logged (a watch error, a stalled watch, a failed list), by text
    errors = collections.Counter(
        line.removeprefix("CLIENT ").split(": ", 1)[-1]
        for line in lines
        if "down at the end" not in line
    )
    print(
        f"cpus {os.cpu_count()}, load processes {args.load}, clients {args.clients} x "
        f"{args.watchers} followers, timeoutSeconds {args.timeout}, {args.seconds:.0f} s, "
        f"{writes} slice writes"
    )
    print(f"slice requests served (lists and watches): {served}")
    print(f"watches the stand-in ended without their last chunk: {len(unclean)}")
    for why, count in collections.Counter(why for _, why in unclean).most_common():
        print(f"  {count:6d}  {why}")
    print(f"warnings the followers logged: {sum(errors.values())}")
    for message, count in errors.most_common():
        print(f"  {count:6d}  {message}")
    for line in lines:
        if "down at the end" in line:
            print(line.removeprefix("CLIENT "))
    return 1 if unclean or errors else 0


if __name__ == "__main__":
    sys.exit(main())
