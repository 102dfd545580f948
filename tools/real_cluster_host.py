"""The host's state around tools/real-cluster (and tools/real-kubelet): a snapshot before ``up``,
the cleanup after ``down`` and the comparison of the two (issue 38).

    python tools/real_cluster_host.py snapshot --work W    # writes W/host-snapshot.json
    python tools/real_cluster_host.py cleanup --work W     # undoes what a cluster left behind
    python tools/real_cluster_host.py compare --work W     # one line per difference; exit 1 if any

A kubelet, containerd and the CNI bridge plugin leave behind (../shared/real-cluster.md):
container processes (orphaned under PID 1 when the shims die first), mounts (rootfs, shm, the
root-dir bind), ``/run/netns/cni-*``, the bridge and its veths, iptables chains (CNI-*,
KUBE-FIREWALL, KUBE-KUBELET-CANARY), ``ip_forward=1``, kubepods cgroups in every hierarchy and
folders (/var/lib/kubelet, /var/log/pods, ...). The snapshot records each of those; cleanup
removes whatever the snapshot did not have, and nothing it had; compare says what still
differs. The machine is shared: processes count as the cluster's only when they run in a
kubepods cgroup or name the work folder or one of the cluster's programs, and iptables rules only
when they name the pod subnet, the bridge or a chain the kubelet or CNI makes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# folders a kubelet, containerd or CNI create on the host outside the work folder
FOLDERS = (
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni",
    "/run/containerd",
    "/run/netns",
    "/etc/cni",
    "/opt/cni",
    "/var/lib/containerd",
)
SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/ipv4/conf/all/forwarding",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "net/ipv6/conf/all/forwarding",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
KUBE_CHAIN = re.compile(r"\bKUBE-[\w-]+\b")
CNI_CHAIN = re.compile(r"\bCNI-[\w-]+\b")
OTHER_NETWORK = re.compile(r'name: \\"(?!gq\\")')  # a CNI rule of another network (podman's)


def sh(*args: str, check: bool = False) -> str:
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def mounts() -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        out.append(fields[4].replace("\\040", " "))
    return out


def netns() -> list[str]:
    path = Path("/run/netns")
    return sorted(p.name for p in path.iterdir()) if path.is_dir() else []


def links() -> list[str]:
    return sorted(
        line.split(":")[1].strip().split("@")[0]
        for line in sh("ip", "-o", "link", "show").splitlines()
        if ":" in line
    )


def iptables(family: str = "iptables") -> list[str]:
    """Rules and chains without counters, one table at a time."""
    rules = []
    for table in ("filter", "nat", "mangle"):
        for line in sh(f"{family}-save", "-t", table).splitlines():
            if line.startswith(("#", "COMMIT")):
                continue
            line = re.sub(r"\[\d+:\d+\]", "", line).strip()
            rules.append(f"{table} {line}")
    return rules


def sysctls() -> dict[str, str]:
    values = {}
    for name in SYSCTLS:
        path = Path("/proc/sys") / name
        if path.exists():
            values[name] = path.read_text().strip()
    for conf in Path("/proc/sys/net/ipv4/conf").iterdir():
        values[f"net/ipv4/conf/{conf.name}/route_localnet"] = (conf / "route_localnet").read_text().strip()  # fmt: skip
    return values


def cgroups() -> list[str]:
    """Folders at the top of each hierarchy and under kubepods (what the kubelet makes)."""
    out = []
    root = Path("/sys/fs/cgroup")
    for hierarchy in [root, *[p for p in root.iterdir() if p.is_dir()]]:
        try:
            children = [p for p in hierarchy.iterdir() if p.is_dir()]
        except OSError:
            continue
        for child in children:
            if (child / "cgroup.procs").exists():
                out.append(str(child))
    return sorted(set(out))


def folders() -> list[str]:
    return sorted(p for p in FOLDERS if os.path.lexists(p))


def ancestors() -> set[int]:
    """This process and the ones that started it (the tool itself names the work folder)."""
    out, pid = set(), os.getpid()
    while pid > 1:
        out.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return out


ANCESTORS = ancestors()


def is_ours(pid: int, work: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")  # fmt: skip
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
    if pid in ANCESTORS:
        return False
    if "kubepods" in cgroup:
        return True
    # only what names the work folder: other sessions' programs on this machine are not ours
    return work in cmdline


def processes(work: str) -> list[str]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and is_ours(int(entry.name), work):
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if cmd.strip():
                out.append(f"{entry.name} {cmd.strip()[:160]}")
    return sorted(out)


def modules() -> list[str]:
    path = Path("/proc/modules")  # absent in some VMs and containers
    return (
        sorted(line.split()[0] for line in path.read_text().splitlines()) if path.exists() else []
    )


def snapshot(work: str) -> dict[str, Any]:
    return {
        "time": time.time(),
        "processes": processes(work),
        "mounts": mounts(),
        "netns": netns(),
        "links": links(),
        "iptables": iptables(),
        "ip6tables": iptables("ip6tables"),
        "sysctls": sysctls(),
        "cgroups": cgroups(),
        "folders": folders(),
        "modules": modules(),
    }


def is_cluster_rule(rule: str, subnet: str, bridge: str) -> bool:
    """Rules and chains of this cluster: the kubelet's KUBE-* (no other kubelet runs here), the
    guard, and what CNI made for the network "gq" (a chain of podman's is left alone)."""
    if KUBE_CHAIN.search(rule) or "gq-guard" in rule or bridge in rule or subnet in rule:
        return True
    if 'name: \\"gq\\"' in rule:
        return True
    # an empty CNI chain: its rules named the network; count it unless another network's
    return (
        bool(CNI_CHAIN.search(rule))
        and " :" in f" {rule.split(' ', 1)[1]}"
        and not OTHER_NETWORK.search(rule)
    )


def compare(before: dict[str, Any], after: dict[str, Any], work: str, subnet: str, bridge: str) -> list[str]:  # fmt: skip
    diffs: list[str] = []

    def sets(name: str, keep: Any = lambda x: True) -> None:
        old, new = set(before[name]), set(after[name])
        for item in sorted(new - old):
            if keep(item):
                diffs.append(f"{name}: left behind: {item}")
        for item in sorted(old - new):
            if keep(item):
                diffs.append(f"{name}: gone: {item}")

    sets("processes")
    sets("mounts", lambda m: any(k in m for k in (work, "kubelet", "containerd", "netns", "kubepods", "/var/lib/kubelet")))  # fmt: skip
    sets("netns")
    sets("links", lambda link: link == bridge or link.startswith("veth"))
    sets("iptables", lambda r: is_cluster_rule(r, subnet, bridge))
    sets("ip6tables", lambda r: is_cluster_rule(r, subnet, bridge))
    sets("cgroups")
    sets("folders")
    for name, value in after["sysctls"].items():
        old = before["sysctls"].get(name)
        if old is not None and old != value:
            diffs.append(f"sysctl {name}: {old} before, {value} now")
    for name in before["sysctls"]:
        if name not in after["sysctls"] and f"/conf/{bridge}/" not in name:
            diffs.append(f"sysctl {name}: gone")
    for module in sorted(set(after["modules"]) - set(before["modules"])):
        diffs.append(f"kernel module loaded since the snapshot (left loaded, harmless): {module}")
    return diffs


# -- cleanup --------------------------------------------------------------------------------


def kill_ours(work: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [int(p.split()[0]) for p in processes(work)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        end = time.monotonic() + 10
        while pids and time.monotonic() < end:
            pids = [p for p in pids if Path(f"/proc/{p}").exists() and is_ours(p, work)]
            time.sleep(0.2)


def unmount_new(before: dict[str, Any]) -> None:
    old = set(before["mounts"])
    for _ in range(3):
        # deepest first, so that a bind under a bind goes before its parent
        new = sorted((m for m in mounts() if m not in old), key=len, reverse=True)
        if not new:
            return
        for m in new:
            subprocess.run(["umount", m], capture_output=True, check=False)
        for m in sorted((m for m in mounts() if m not in old), key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True, check=False)


def drop_rules(before: dict[str, Any], family: str, key: str, subnet: str, bridge: str) -> None:
    old = set(before[key])
    for table in ("filter", "nat", "mangle"):
        lines = [line for line in iptables(family) if line.startswith(table + " ")]
        ours = [
            line[len(table) + 1 :]
            for line in lines
            if line not in old
            and " -A " in f" {line}"
            and is_cluster_rule(line, subnet, bridge)
            and not OTHER_NETWORK.search(line)
        ]
        # the chains our rules jump to or live in, and the kubelet's
        chains = {c for rule in ours for c in CNI_CHAIN.findall(rule) + KUBE_CHAIN.findall(rule)}
        for rule in ours:  # rules first (they name the chains), then the chains
            chain, _, spec = rule[3:].partition(" ")
            subprocess.run([family, "-t", table, "-D", chain, *split_rule(spec)],
                           capture_output=True, check=False)  # fmt: skip
        new_chains = [line.split()[1][1:] for line in lines if line not in old and line.split()[1].startswith(":")]  # fmt: skip
        for chain in new_chains:
            if chain in chains or KUBE_CHAIN.fullmatch(chain):
                subprocess.run([family, "-t", table, "-F", chain], capture_output=True, check=False)
        for chain in new_chains:
            if chain in chains or KUBE_CHAIN.fullmatch(chain):
                subprocess.run([family, "-t", table, "-X", chain], capture_output=True, check=False)


def split_rule(spec: str) -> list[str]:
    import shlex

    return shlex.split(spec)


def remove_cgroups(before: dict[str, Any]) -> None:
    old = set(before["cgroups"])
    for top in cgroups():
        if top in old:
            continue
        # depth first: a cgroup folder goes only when it has no children
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                Path(dirpath).rmdir()


def cleanup(before: dict[str, Any], work: str, subnet: str, bridge: str) -> None:
    kill_ours(work)
    unmount_new(before)
    for name in netns():
        if name not in before["netns"]:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
            Path("/run/netns", name).unlink(missing_ok=True)
    for link in links():
        if link not in before["links"] and (link == bridge or link.startswith("veth")):
            subprocess.run(["ip", "link", "delete", link], capture_output=True, check=False)
    drop_rules(before, "iptables", "iptables", subnet, bridge)
    drop_rules(before, "ip6tables", "ip6tables", subnet, bridge)
    remove_cgroups(before)
    for path in FOLDERS:
        if path not in before["folders"] and os.path.lexists(path):
            shutil.rmtree(path, ignore_errors=True)
    for name, value in before["sysctls"].items():
        path = Path("/proc/sys") / name
        if path.exists() and path.read_text().strip() != value:
            try:
                path.write_text(value + "\n")
            except OSError as error:
                print(f"cannot restore {name}={value}: {error}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("snapshot", "cleanup", "compare"))
    parser.add_argument("--work", required=True)
    parser.add_argument("--subnet", default="10.244.0.0/24")
    parser.add_argument("--bridge", default="gq0")
    args = parser.parse_args(argv)
    path = Path(args.work) / "host-snapshot.json"
    if args.action == "snapshot":
        Path(args.work).mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(snapshot(args.work), indent=1))
        print(f"host snapshot in {path}")
        return 0
    if not path.is_file():
        print(f"no snapshot at {path}: nothing to compare with", file=sys.stderr)
        return 2
    before = json.loads(path.read_text())
    if args.action == "cleanup":
        cleanup(before, args.work, args.subnet, args.bridge)
        return 0
    diffs = compare(before, snapshot(args.work), args.work, args.subnet, args.bridge)
    real = [d for d in diffs if "harmless" not in d]
    for line in diffs:
        print(line)
    print(f"{'PASS' if not real else 'FAIL'} host matches the snapshot taken before up"
          f"{'' if not real else f': {len(real)} difference(s)'}")  # fmt: skip
    return 1 if real else 0


if __name__ == "__main__":
    sys.exit(main())
