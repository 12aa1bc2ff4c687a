"""gpu_reset and node_replace run as real modules through Ansible (ansible localhost -m ...): gpu_reset against a
fake nvidia-smi (the only stand-in: GPU hardware), node_replace against a real command and a real HTTP server on
loopback."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from support.ansible_cli import run_module


@pytest.fixture
def fake_smi(tmp_path):
    """A fake nvidia-smi: logs its arguments, lists processes from procs.csv, answers a reset like the real one."""
    log = tmp_path / "smi.log"
    procs = tmp_path / "procs.csv"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {log}
case "$*" in
  *--query-compute-apps*) [ -f {procs} ] && cat {procs}; exit 0 ;;
  *-r*) [ -f {tmp_path}/reset-fails ] && {{ echo "Unable to reset this GPU because it's being used"; exit 255; }}
        echo "GPU 00000000:86:00.0 was successfully reset."; echo "All done."; exit 0 ;;
  *-pm*) echo "Persistence mode set."; exit 0 ;;
esac
exit 2
""")
    smi.chmod(0o755)
    return smi, log, procs


GPU_RESET_ROWS = [
    # (name, args, procs, check mode, ok, changed, smi calls that must appear, must not appear)
    ("resets one GPU", {"gpu": 3}, None, False, True, True, ["-r -i 3"], []),
    ("resets every GPU", {}, None, False, True, True, ["-r"], ["-i"]),
    ("refuses while processes hold the GPU", {"gpu": 3}, "4242, python3\n777, nccl-tests\n", False, False, False,
     [], ["-r"]),
    ("check mode resets nothing", {"gpu": 3}, None, True, True, True, [], ["-r"]),
    ("persistence toggled around the reset", {"gpu": 1, "toggle_persistence": True}, None, False, True, True,
     ["-pm 0 -i 1", "-r -i 1", "-pm 1 -i 1"], []),
    ("bad index", {"gpu": -1}, None, False, False, False, [], ["-r"]),
]


@pytest.mark.parametrize("name,args,procs,check,ok,changed,want,never", GPU_RESET_ROWS,
                         ids=[r[0] for r in GPU_RESET_ROWS])
def test_gpu_reset(fake_smi, name, args, procs, check, ok, changed, want, never):
    smi, log, procs_file = fake_smi
    if procs:
        procs_file.write_text(procs)
    good, res = run_module("gpu_reset", dict(args, nvidia_smi=str(smi)), check=check)
    assert good is ok, res
    assert bool(res.get("changed")) is changed
    calls = log.read_text().splitlines() if log.exists() else []
    for w in want:
        assert any(c.endswith(w) or c == w for c in calls), calls
    for n in never:
        assert not any(f" {n}" in f" {c}" for c in calls if "query" not in c), calls
    if procs:
        assert [p["pid"] for p in res["processes"]] == [4242, 777] and "held by 2 process" in res["msg"]


def test_gpu_reset_reports_a_failed_reset(fake_smi, tmp_path):
    smi, _log, _p = fake_smi
    (tmp_path / "reset-fails").write_text("")
    good, res = run_module("gpu_reset", {"gpu": 0, "nvidia_smi": str(smi)})
    assert not good and "resetting GPU 0 failed" in res["msg"] and "being used" in res["msg"]


# ---------------------------------------------------------------------------------------------------------------
# node_replace
# ---------------------------------------------------------------------------------------------------------------
class _Hook(http.server.BaseHTTPRequestHandler):
    fail_first = 0
    calls: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append({"body": body, "key": self.headers.get("Idempotency-Key"),
                                 "auth": self.headers.get("Authorization")})
        if len(type(self).calls) <= type(self).fail_first:
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b"busy")
            return
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"ticket": "RMA-7", "node": body["node"]}).encode())

    def log_message(self, *a):
        pass


@pytest.fixture
def webhook():
    _Hook.calls = []
    _Hook.fail_first = 0
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/replace", _Hook
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=10)


def test_node_replace_webhook_retries_and_is_idempotent(webhook, tmp_path):
    url, hook = webhook
    hook.fail_first = 2
    args = {"node": "node3", "incident": "4", "idempotency_key": "gpufleet-abc123", "reason": "xid79 after reboot",
            "url": url, "headers": {"Authorization": "Bearer t0k"}, "retries": 3, "delay": 0.05,
            "state_dir": str(tmp_path / "hooks")}
    good, res = run_module("node_replace", args)
    assert good and res["changed"] and res["attempts"] == 3, res
    assert res["response"] == {"ticket": "RMA-7", "node": "node3"}
    assert [c["key"] for c in hook.calls] == ["gpufleet-abc123"] * 3 and hook.calls[0]["auth"] == "Bearer t0k"
    assert hook.calls[-1]["body"] == {"action": "replace", "node": "node3", "incident": "4",
                                      "idempotency_key": "gpufleet-abc123", "reason": "xid79 after reboot"}
    # the same key again: nothing is sent, the recorded answer comes back
    good, res = run_module("node_replace", args)
    assert good and not res["changed"] and res["attempts"] == 0 and res["response"]["ticket"] == "RMA-7"
    assert len(hook.calls) == 3


def test_node_replace_webhook_gives_up(webhook, tmp_path):
    url, hook = webhook
    hook.fail_first = 10
    good, res = run_module("node_replace", {"node": "n1", "idempotency_key": "k1", "url": url, "retries": 1,
                                            "delay": 0.01, "state_dir": str(tmp_path / "hooks")})
    assert not good and res["attempts"] == 2 and "503" in res["errors"][0]
    assert not (tmp_path / "hooks" / "k1.json").exists()


def test_node_replace_headers_are_no_log(webhook, tmp_path):
    url, hook = webhook
    hook.fail_first = 1  # one failed attempt: the errors list is returned too
    args = {"node": "node5", "idempotency_key": "gpufleet-nolog", "url": url, "retries": 1, "delay": 0.01,
            "headers": {"Authorization": "Bearer s3cr3t-rma-T0ken"}, "state_dir": str(tmp_path / "hooks")}
    good, res = run_module("node_replace", args, verbose=True)
    assert good and res["changed"] and hook.calls[-1]["auth"] == "Bearer s3cr3t-rma-T0ken", res  # still sent
    assert res["invocation"]["module_args"]["headers"] == {"Authorization": "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"}
    assert "s3cr3t-rma-T0ken" not in json.dumps(res)


def test_node_replace_command(tmp_path):
    out = tmp_path / "got.json"
    script = tmp_path / "hook.sh"
    script.write_text(f"#!/usr/bin/env bash\ncat > {out}\necho \"$GPUFLEET_NODE/$GPUFLEET_ACTION\" >> {out}.env\n"
                      "echo '{\"queued\": true}'\n")
    script.chmod(0o755)
    args = {"node": "node7", "action": "reimage", "idempotency_key": "gpufleet-k2", "command": [str(script)],
            "state_dir": str(tmp_path / "hooks")}
    good, res = run_module("node_replace", args, check=True)
    assert good and res["changed"] and not out.exists()  # check mode calls nothing
    good, res = run_module("node_replace", args)
    assert good and res["changed"] and res["response"] == {"queued": True}
    assert json.loads(out.read_text())["action"] == "reimage"
    assert (tmp_path / "got.json.env").read_text().strip() == "node7/reimage"
    good, res = run_module("node_replace", args)
    assert good and not res["changed"]


def test_node_replace_rejects_bad_key(tmp_path):
    good, res = run_module("node_replace", {"node": "n", "idempotency_key": "a b/c", "command": ["true"],
                                            "state_dir": str(tmp_path)})
    assert not good and "idempotency_key" in res["msg"]
