"""Shell control of a simulated node, for the demo and for people:

python -m gpuquota.sim.nvml STATE create PRESET|SPEC.yaml
python -m gpuquota.sim.nvml STATE show
python -m gpuquota.sim.nvml STATE set GPU field=value [field=value ...]
python -m gpuquota.sim.nvml STATE xid GPU XID [--gi N --ci N]
python -m gpuquota.sim.nvml STATE lose GPU | restore GPU | reset-required GPU [--clear]
python -m gpuquota.sim.nvml STATE process GPU PID BYTES [--kind graphics] | clear-processes GPU
python -m gpuquota.sim.nvml STATE process-util GPU PID --sm R --memory R [--encoder R --decoder R]
python -m gpuquota.sim.nvml STATE gpm GPU [--mig N] metric=value [metric=value ...]
python -m gpuquota.sim.nvml STATE nvlink GPU LINK [--replay N --recovery N --crc-flit N --crc-data N]
python -m gpuquota.sim.nvml STATE fail GPU|system FUNCTION CODE|clear
python -m gpuquota.sim.nvml STATE costs modelled|instant [--queueing gpu|library]
python -m gpuquota.sim.nvml STATE cost GPU|all FUNCTION MS [--overlap]   # e.g. a hung call
python -m gpuquota.sim.nvml STATE env        # shell exports to run an NVML client against STATE
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from gpuquota.cli_common import exitcodes
from gpuquota.cli_common.commandline import OneLineParser, add_version
from gpuquota.sim.nvml.control import SimError, SimNode

PROG = "python -m gpuquota.sim.nvml"
EXAMPLES = """\
examples:
  python -m gpuquota.sim.nvml.build                         # the stand-in library, once
  python -m gpuquota.sim.nvml /tmp/node.state create h100x8
  eval "$(python -m gpuquota.sim.nvml /tmp/node.state env)"; nvidia-smi-like-tool
  python -m gpuquota.sim.nvml /tmp/node.state set 0 power_watts=300 gpu_utilization_ratio=0.5
  python -m gpuquota.sim.nvml /tmp/node.state xid 3 79
  python -m gpuquota.sim.nvml /tmp/node.state gpm 0 sm_activity=0.96 tensor_activity=0.93
  python -m gpuquota.sim.nvml /tmp/node.state process 0 411 8000000000
  python -m gpuquota.sim.nvml /tmp/node.state process-util 0 411 --sm 0.92 --memory 0.28

""" + exitcodes.help_text()


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Drive the simulated GPU node behind the NVML stand-in.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version(p)
    p.add_argument("state", type=Path, help="state file (GPUQUOTA_SIM_STATE)")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create", help="write a fresh node from a preset or spec file")
    c.add_argument("spec", help="preset (h100x8, a100-mig, l4x2, mixed) or YAML/JSON file")
    sub.add_parser("show", help="list the GPUs")
    sub.add_parser("env", help="print shell exports for NVML clients")
    s = sub.add_parser("set", help="set fields: power_watts=300 gpu_utilization_ratio=0.5")
    s.add_argument("gpu", type=int)
    s.add_argument("values", nargs="+", metavar="FIELD=VALUE")
    x = sub.add_parser("xid", help="inject an XID critical error event")
    x.add_argument("gpu", type=int)
    x.add_argument("xid", type=int)
    x.add_argument("--gi", type=int, default=None, help="GPU instance id (MIG)")
    x.add_argument("--ci", type=int, default=None, help="compute instance id (MIG)")
    for name, text in (("lose", "the GPU falls off the bus"), ("restore", "undo lose")):
        sub.add_parser(name, help=text).add_argument("gpu", type=int)
    r = sub.add_parser("reset-required", help="the GPU needs a reset")
    r.add_argument("gpu", type=int)
    r.add_argument("--clear", action="store_true")
    pr = sub.add_parser("process", help="add a process using the GPU")
    pr.add_argument("gpu", type=int)
    pr.add_argument("pid", type=int)
    pr.add_argument("bytes", type=int)
    pr.add_argument("--kind", choices=("compute", "graphics"), default="compute")
    pr.add_argument("--gi", type=int, default=None)
    pr.add_argument("--ci", type=int, default=None)
    sub.add_parser("clear-processes").add_argument("gpu", type=int)
    pu = sub.add_parser("process-util", help="per-process utilisation (ratios 0-1)")
    pu.add_argument("gpu", type=int)
    pu.add_argument("pid", type=int)
    for engine in ("sm", "memory", "encoder", "decoder"):
        pu.add_argument(f"--{engine}", type=float, default=0.0)
    gp = sub.add_parser("gpm", help="GPM rates: sm_activity=0.9 dram_activity=0.3 ...")
    gp.add_argument("gpu", type=int)
    gp.add_argument("--mig", type=int, default=None, help="MIG instance position on the GPU")
    gp.add_argument("values", nargs="+", metavar="METRIC=VALUE")
    nv = sub.add_parser("nvlink", help="set one link's error counters")
    nv.add_argument("gpu", type=int)
    nv.add_argument("link", type=int)
    for counter in ("replay", "recovery", "crc-flit", "crc-data"):
        nv.add_argument(f"--{counter}", type=int, default=0)
    f = sub.add_parser("fail", help="force an NVML function's return code")
    f.add_argument("gpu", help="GPU index, or 'system'")
    f.add_argument("function", help="e.g. nvmlDeviceGetPowerUsage")
    f.add_argument("code", help="NVML return code (e.g. 999), or 'clear'")
    k = sub.add_parser("costs", help="NVML calls cost an H100's time (modelled) or nothing")
    k.add_argument("mode", choices=("modelled", "instant"))
    k.add_argument("--queueing", choices=("gpu", "library"), default=None)
    one = sub.add_parser("cost", help="set one NVML function's wall time in milliseconds")
    one.add_argument("gpu", help="GPU index, or 'all'")
    one.add_argument("function", help="e.g. nvmlDeviceGetPowerUsage")
    one.add_argument("ms", type=float)
    one.add_argument("--overlap", action="store_true", help="concurrent callers do not queue")
    for action in sub.choices.values():  # every action's --help shows the examples too
        action.epilog = EXAMPLES
        action.formatter_class = argparse.RawDescriptionHelpFormatter
    return p


def _number(text: str) -> float:
    if text.lower() in {"true", "yes", "on"}:
        return 1.0
    if text.lower() in {"false", "no", "off"}:
        return 0.0
    return float(int(text, 0)) if text.lower().startswith("0x") else float(text)


def run(args: argparse.Namespace) -> int:
    if args.command == "create":
        node = SimNode.create(args.state, args.spec)
        print(f"created {node.path}: {node.gpu_count} GPUs")
        return 0
    node = SimNode.attach(args.state)
    try:
        return _act(node, args)
    finally:
        node.close()


def _act(node: SimNode, args: argparse.Namespace) -> int:
    cmd = args.command
    if cmd == "show":
        for i in range(node.gpu_count):
            flags = [f for f in ("lost", "reset_required") if node.get(i, f)]
            migs = node.mig_uuids(i)
            extra = f" MIG x{len(migs)}" if migs else ""
            print(f"{i} {node.uuid(i)} {node.get(i, 'power_watts'):.0f} W{extra} {' '.join(flags)}")
    elif cmd == "env":
        for key, value in node.env().items():
            print(f"export {key}={shlex.quote(value)}")
    elif cmd == "set":
        values: dict[str, object] = {}
        for item in args.values:
            key, sep, raw = item.partition("=")
            if not sep:
                raise ValueError(f"expected FIELD=VALUE, got {item!r}")
            try:
                values[key] = _number(raw)
            except ValueError:
                values[key] = raw  # string fields (name, serial...)
        node.set(args.gpu, **values)
    elif cmd == "xid":
        node.inject_xid(args.gpu, args.xid, args.gi, args.ci)
    elif cmd in {"lose", "restore"}:
        node.set_lost(args.gpu, cmd == "lose")
    elif cmd == "reset-required":
        node.set_reset_required(args.gpu, not args.clear)
    elif cmd == "process":
        node.add_process(args.gpu, args.pid, args.bytes, args.kind, args.gi, args.ci)
    elif cmd == "clear-processes":
        node.clear_processes(args.gpu)
    elif cmd == "process-util":
        node.set_process_utilization(
            args.gpu, args.pid, args.sm, args.memory, args.encoder, args.decoder
        )
    elif cmd == "gpm":
        rates: dict[str, float] = {}
        for item in args.values:
            key, sep, raw = item.partition("=")
            if not sep:
                raise ValueError(f"expected METRIC=VALUE, got {item!r}")
            rates[key] = _number(raw)
        node.set_gpm(args.gpu, args.mig, **rates)
    elif cmd == "nvlink":
        node.set_nvlink_errors(
            args.gpu, args.link, args.replay, args.recovery, args.crc_flit, args.crc_data
        )
    elif cmd == "fail":
        gpu = None if args.gpu == "system" else int(args.gpu)
        code = None if args.code == "clear" else int(args.code, 0)
        node.fail_call(gpu, args.function, code)
    elif cmd == "costs":
        node.set_costs(args.mode, args.queueing)
    elif cmd == "cost":
        gpu = None if args.gpu == "all" else int(args.gpu)
        node.set_call_cost(gpu, args.function, args.ms, overlap=args.overlap)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return run(args)
    except (ValueError, SimError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
