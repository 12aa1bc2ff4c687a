# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The repair lab: the Slurm lab + the real node agent as its health hook (on replayed GPUs, faults injected as
replayed kernel lines) + repair.yml run through ansible-runner the way AWX runs a job template."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import ansible_runner

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FAKEGPU = HERE / "fakegpu.py"
SPARE_REASON = "gpufleet: spare"
#: A healthy node with nothing that could change its report is checked again after this many seconds (install_hook).
HEALTHY_REPEAT_S = 120


class RepairLab:
    def __init__(self, lab, tmp: Path):
        self.lab = lab
        self.dir = lab.dir
        self.tmp = tmp
        self.state = tmp / "state"
        self.bin = tmp / "bin"
        self.hook_log = tmp / "hook.log"
        self.runs = 0
        self.last: dict = {}  # the set_stats artifacts of the last run()

    # ---- set-up -------------------------------------------------------------------------------------------
    def install(self):
        for sub in ("faults", "reports"):
            d = self.dir / sub
            if d.exists():
                shutil.rmtree(d)
            d.mkdir(parents=True)
        for log in ("fake-nvidia-smi.log", "reboot-calls.log"):
            (self.dir / "log" / log).write_text("")
        self.bin.mkdir(parents=True, exist_ok=True)
        for node in self.lab.nodes:
            script = self.bin / f"nvidia-smi-{node}"
            script.write_text(
                f'#!/usr/bin/env bash\nexec {sys.executable} {FAKEGPU} nvidia-smi {self.dir} {node} "$@"\n'
            )
            script.chmod(0o755)
        self.hook_cmd = self.bin / "hook"
        self.hook_cmd.write_text(f"#!/usr/bin/env bash\ncat >>{self.hook_log}; echo >>{self.hook_log}; "
                                 "echo '{\"ticket\": \"RMA-1\"}'\n")
        self.hook_cmd.chmod(0o755)
        # clear every node's history (the lab's reset does not)
        self.lab.run("scontrol", "update", f"NodeName={','.join(self.lab.nodes)}", "Extra=")
        self.install_hook()

    def install_hook(self):
        """The real agent as the lab's health check (it drains its own node when unhealthy).

        Slurm runs it on every node every few seconds, and each run is a Python start: most of the CPU a repair lab
        test costs. A node with nothing that could change its report - no injected fault, no shared state file, a
        healthy report written after its slurmd started and less than HEALTHY_REPEAT_S old - is not checked again
        until that report is that old: the check would only say "healthy" once more. Anything that changes the
        answer (an injected fault, a reboot, a reset that clears a fault after a sick report) runs it at once."""
        hook = self.lab.hook
        d = shlex.quote(str(self.dir))
        # no exec: the shell keeps the hook's path in its command line while the agent runs (lab.stop_hooks)
        hook.write_text(f"""#!/usr/bin/env bash
node=$SLURMD_NODENAME d={d} r={d}/reports/$SLURMD_NODENAME.json
if [[ ! -e $d/faults/$node.json && ! -e $d/faults/state-files && -f $r && $r -nt $d/run/slurmd-$node.pid ]] &&
   (( $(date +%s) - $(stat -c %Y "$r") < {HEALTHY_REPEAT_S} )) && grep -q '"verdict": "healthy"' "$r"; then
  exit 0
fi
{sys.executable} {FAKEGPU} agent {d} "$node"
""")
        hook.chmod(0o755)

    def uninstall(self):
        self.lab.stop_hooks()

    # ---- faults and state -----------------------------------------------------------------------------------
    def inject(self, node, fault="xid48", cleared_by="reboot"):
        subprocess.run([sys.executable, str(FAKEGPU), "inject", str(self.dir), node, fault, cleared_by], check=True)

    def sicken(self, nodes, fault="xid48", cleared_by="reset_gpu"):
        """Inject ``fault`` on every node of ``nodes``, then wait until each one's agent has drained it."""
        for node in nodes:
            self.inject(node, fault, cleared_by)
        for node in nodes:
            self.drained_by_agent(node)

    def drained_by_agent(self, node, timeout=60):
        return self.lab.wait_for(node, lambda sr: sr[0] in ("drained", "draining") and sr[1].startswith("gpufleet:"),
                                 timeout=timeout)

    def spare(self, node):
        self.lab.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={SPARE_REASON}")

    def extra(self, node) -> str:
        out = self.lab.run("scontrol", "show", "node", node).stdout
        for line in out.splitlines():
            line = line.strip()
            if line.startswith("Extra="):
                return line[len("Extra="):].strip()
        return ""

    def set_extra(self, node, text):
        self.lab.run("scontrol", "update", f"NodeName={node}", f"Extra={text}")

    def drain(self, node, reason):
        self.lab.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def history(self, node) -> dict:
        text = self.extra(node)
        return json.loads(text) if text and text != "(null)" else {}

    def resets(self, node=None):
        """The GPU resets the fake nvidia-smi was asked for (of ``node``), as its log lines (none before any)."""
        log = self.dir / "log" / "fake-nvidia-smi.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [ln for ln in lines if " -r" in ln and (node is None or f" {node} " in ln)]

    def reboots(self):
        return [ln for ln in (self.dir / "log" / "reboot-calls.log").read_text().splitlines() if "node=" in ln]

    def hook_calls(self):
        if not self.hook_log.exists():
            return []
        return [json.loads(ln) for ln in self.hook_log.read_text().splitlines() if ln.strip()]

    def breaker(self):
        p = self.state / "breaker.json"
        return json.loads(p.read_text()) if p.exists() else {}

    # ---- the playbook, as AWX runs it ---------------------------------------------------------------------
    def extravars(self, config=None, **over):
        cfg = {"ttl": 0, "cooldown": 0,
               "blast_radius": {"max_unavailable": len(self.lab.nodes), "min_healthy": 0},
               "breaker": {"min_nodes": len(self.lab.nodes)}}
        cfg.update(config or {})
        ev = {
            "node_repair_config": cfg,
            "node_repair_reports_dir": str(self.dir / "reports"),
            # the lab's agents write their report where the plan reads it; a test of the fetch moves the plan's
            "node_repair_agent_report": str(self.dir / "reports" / "{node}.json"),
            "node_repair_state_dir": str(self.state),
            "node_repair_verify_command": [sys.executable, str(FAKEGPU), "check", str(self.dir), "{node}"],
            "node_repair_dcgm_level": 0,
            "node_repair_nvidia_smi": str(self.bin / "nvidia-smi-{node}"),
            "node_repair_reboot_timeout": 90,
            "node_repair_hook_command": [str(self.hook_cmd)],
            "node_repair_publish_dir": str(self.tmp),
            "node_repair_textfile_dir": str(self.tmp),
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
        }
        ev.update(over)
        return ev

    def _private(self):
        self.runs += 1
        pdd = self.tmp / f"runner-{self.runs}"
        (pdd / "inventory").mkdir(parents=True)
        (pdd / "inventory" / "hosts").write_text("localhost ansible_connection=local\n")
        return pdd

    def _envvars(self):
        return {
            "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "SLURM_CONF": str(self.lab.conf),
            "PATH": str(Path(sys.executable).parent) + ":" + os.environ.get("PATH", "") + ":/usr/sbin:/sbin",
            "ANSIBLE_HOST_KEY_CHECKING": "False",
        }

    def run(self, ok=True, cmdline=None, **kw):
        """Run repair.yml once through ansible-runner; returns (runner, artifacts from set_stats).

        ``ok``: True - the run must succeed (rc 0, AWX status successful); False - it must fail (the run could not do
        what the policy decided: breaker, failed step or verification, escalation, unusable input); None - either.
        The runner's ``output`` attribute holds the run's stdout."""
        ev = self.extravars(**kw)
        r = ansible_runner.run(private_data_dir=str(self._private()), project_dir=str(REPO),
                               playbook="playbooks/repair.yml", extravars=ev, envvars=self._envvars(), quiet=True,
                               timeout=600, cmdline=cmdline)
        artifacts = {}
        for event in r.events:
            if event.get("event") == "playbook_on_stats":
                artifacts = event.get("event_data", {}).get("artifact_data") or {}
        r.output = r.stdout.read() if hasattr(r.stdout, "read") else ""
        self.last = artifacts
        if ok is not None and (r.rc == 0) != ok:
            raise AssertionError(f"repair.yml rc={r.rc} status={r.status}, expected {'success' if ok else 'failure'}"
                                 f"\n{r.output[-6000:]}")
        if ok is False:
            assert r.status == "failed", r.status  # what AWX shows as the job status
        return r, artifacts

    @property
    def remote_tmp(self) -> Path:
        """Where the modules of a run started by start_async() run from (their command lines name it)."""
        return self.tmp / "remote-tmp"

    def start_async(self, **kw):
        """Start repair.yml as a separate process (ansible-playbook, same extravars); returns the Popen."""
        ev = self.extravars(**kw)
        varfile = self.tmp / f"vars-{self.runs}.json"
        varfile.write_text(json.dumps(ev))
        env = dict(os.environ, **self._envvars())
        # a run started this way may be killed, and a killed module leaves its payload directory: in the test's own
        # temporary directory (pytest's to clean), not the machine's /tmp
        env["TMPDIR"] = str(self.tmp / "tmp")
        (self.tmp / "tmp").mkdir(exist_ok=True)
        # its modules run from a directory of the test's own, so a test that kills the run's leftovers kills only
        # this run's (another lane runs the same modules at the same time)
        env["ANSIBLE_REMOTE_TEMP"] = str(self.remote_tmp)
        env["ANSIBLE_LOCAL_TEMP"] = str(self.tmp / "local-tmp")
        return subprocess.Popen([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
                                 str(REPO / "playbooks" / "repair.yml"), "-e", f"@{varfile}"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def run_with_full_state_dir(self, size="4k", **kw):
        """Run repair.yml (ansible-playbook) with the controller's state directory on a tmpfs of ``size`` that holds
        the run lock and nothing more (a disk that filled up), mounted in a mount namespace of the run's own, so
        the mount ends with the run. Returns (exit status, output)."""
        ev = self.extravars(**kw)
        varfile = self.tmp / f"vars-full-{self.runs}.json"
        varfile.write_text(json.dumps(ev))
        self.state.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, **self._envvars())
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
             'mount -t tmpfs -o "size=$1,mode=0750" tmpfs "$2" && shift 2 && exec "$@"', "sh", size,
             str(self.state), str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
             str(REPO / "playbooks" / "repair.yml"), "-e", f"@{varfile}"],
            env=env, capture_output=True, text=True, timeout=600, check=False, stdin=subprocess.DEVNULL)
        return proc.returncode, proc.stdout + proc.stderr

    @staticmethod
    def kill(proc):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def until(self, pred, runs=5, **kw):
        """Run the playbook until ``pred()`` holds (at most ``runs`` times); returns the artifacts of each run.
        A run may fail (a failed verification on the way is a failed run)."""
        seen = []
        for _unused in range(runs):
            _r, art = self.run(ok=None, **kw)
            seen.append(art)
            if pred():
                return seen
        raise AssertionError(f"not converged after {runs} runs: {self.lab.node_states()}\n"
                             f"{json.dumps(seen, indent=1)[-4000:]}")


def wait_until(pred, timeout=60, interval=0.2, what="condition", show=None):
    """Wait for pred(); past the timeout fail, saying what was waited for and what ``show()`` says of it then."""
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout}s" + (f": {show()}" if show else ""))
        time.sleep(interval)
