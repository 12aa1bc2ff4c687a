# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The parsers under fuzz: one Target each, seeded from genuine inputs, with the properties each must keep.

Each ``run(data)`` gets raw bytes (as they come off a pipe, a file or a socket) and may raise only the
parser's documented error type; everything else, or an ``assert`` below that breaks, is a finding.
"""
from __future__ import annotations

import atexit
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List

from support.fuzz_engine import FIXTURES, REPO, Target, fixtures, read

# --------------------------------------------------------------------------------------------- helpers
_TMP = Path(tempfile.mkdtemp(prefix="gpufleet-fuzz-"))
atexit.register(shutil.rmtree, str(_TMP), True)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _lines_of(data: bytes, n: int) -> List[bytes]:
    """Line-aligned windows of about ``n`` bytes (big genuine files become several small seeds)."""
    out, cur = [], b""
    for line in data.splitlines(keepends=True):
        cur += line
        if len(cur) >= n:
            out.append(cur)
            cur = b""
    if cur:
        out.append(cur)
    return out


WEIRD_VALUES: List[Any] = [None, True, False, 0, -1, 1, 2 ** 31, 2 ** 64, -(2 ** 63), 10 ** 30, 1e308, -1e308,
                           float("inf"), float("-inf"), float("nan"), 0.5, "", " ", "x" * 300, "0", "-1", "1e999",
                           "(null)", "N/A", [], [None], [[[]]], {}, {"": None}, {"number": 1e400},
                           {"set": True, "infinite": False, "number": float("inf")}, "\u2028", "\x00", "\udcff"]


def _mutate_obj(rng: random.Random, obj: Any, depth: int = 0) -> Any:
    """Replace one random node of a JSON/YAML tree with a hostile value (structure-aware mutation)."""
    if isinstance(obj, dict) and obj and depth < 12:
        key = rng.choice(list(obj))
        obj = dict(obj)
        r = rng.random()
        if r < 0.1:
            del obj[key]
        elif r < 0.2:
            obj[rng.choice(["", "x", key + "_", str(rng.random())])] = rng.choice(WEIRD_VALUES)
        elif r < 0.6:
            obj[key] = _mutate_obj(rng, obj[key], depth + 1)
        else:
            obj[key] = rng.choice(WEIRD_VALUES)
        return obj
    if isinstance(obj, list) and obj and depth < 12:
        obj = list(obj)
        i = rng.randrange(len(obj))
        r = rng.random()
        if r < 0.15:
            del obj[i]
        elif r < 0.3:
            obj.append(obj[i])
        elif r < 0.7:
            obj[i] = _mutate_obj(rng, obj[i], depth + 1)
        else:
            obj[i] = rng.choice(WEIRD_VALUES)
        return obj
    return rng.choice(WEIRD_VALUES)


def _json_structured(rng: random.Random, seed: bytes) -> bytes:
    try:
        obj = json.loads(seed)
    except ValueError:
        return seed
    for _unused in range(rng.choice((1, 1, 2, 3))):
        obj = _mutate_obj(rng, obj)
    return json.dumps(obj, allow_nan=True).encode("utf-8", "surrogatepass")


# --------------------------------------------------------------------------------------------- kmsg
def kmsg_target() -> Target:
    from ansible_collections.gpufleet.reliability.plugins.module_utils.health import kmsg_parse as kp

    seeds: List[bytes] = []
    for p in fixtures("gpu/*.log"):
        seeds.extend(_lines_of(read(p), 1024))

    def run(data: bytes) -> None:
        events = kp.parse_kmsg(_text(data))
        if len(data) % 4 == 0:  # a quarter of the inputs: the same text as bytes lines gives the same records
            events_b = kp.parse_kmsg(data.split(b"\n"))
            assert len(events) == len(events_b), "str and bytes-lines input give different event counts"
        for ev in events:
            kp.recovery_action_of(ev)
            kp.gpc_tpc_of(ev)
            kp.reset_flags_of(ev)
            t = kp.event_time(ev)
            assert t is None or isinstance(t, (int, float)), "event_time is not a number"
        kp.group_bursts(events)

    tokens = [b"NVRM: Xid (PCI:0000:19:00): ", b"NVRM: Xid (PCI:0000:19:00.0): 79, pid=1, name=x, ", b"SXid (PCI:",
              b"nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, ", b"fallen off the bus",
              b"NVRM: The NVIDIA GPU 0000:19:00.0", b"NVRM: GPU at PCI:0000:19:00: GPU-", b"6,1234,5678,-;",
              b"[Sun Feb 31 25:61:61 2025] ", b"kern  :warn  : ", b"2025-02-29T23:59:60,999999+14:00 ",
              b"[99999999999999999999.123456] ", b"recovery action changed from 0x0 to 0x", b"GPC 1, TPC 2",
              b"RST: Yes, D-RST: Yes", b"callbacks suppressed", b"(PCI:", b"): ", b", pid=", b"'<unknown>'"]
    return Target("kmsg", run, seeds, (), tokens, max_len=16 * 1024)


# --------------------------------------------------------------------------------------------- nvidia-smi
def _xml_one_gpu(data: bytes) -> bytes:
    end = data.find(b"</gpu>")
    if end < 0:
        return data
    return data[: end + len(b"</gpu>")] + b"\n</nvidia_smi_log>\n"


def smi_xml_target() -> Target:
    from ansible_collections.gpufleet.reliability.plugins.module_utils.health import smi

    seeds = [_xml_one_gpu(read(p)) for p in fixtures("gpu/*.xml")]

    def run(data: bytes) -> None:
        snap = smi.read_nvidia_smi_xml(data)
        snap.to_dict()
        if len(data) % 8 == 0:  # an eighth of the inputs: bytes and text give the same GPUs
            snap2 = smi.read_nvidia_smi_xml(data.decode("utf-8", "replace"))
            assert len(snap.gpus) == len(snap2.gpus), "bytes and str input give different GPU counts"

    tokens = [b"<gpu id=\"00000000:53:00.0\">", b"</gpu>", b"GPU is lost", b"Unknown Error", b"[N/A]",
              b"<!DOCTYPE nvidia_smi_log SYSTEM \"nvsmi_device_v12.dtd\">",
              b"<!DOCTYPE a [<!ENTITY a \"aaaaaaaaaa\"><!ENTITY b \"&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;\">"
              b"<!ENTITY c \"&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;\"><!ENTITY d \"&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;\">]>",
              b"&d;", b"<!ENTITY x SYSTEM \"file:///etc/passwd\">", b"&x;", b"<![CDATA[", b"]]>", b"&#0;",
              b"&#x110000;",
              b"<remapped_rows>", b"<retired_pages>", b"<recovery_action>", b"<pci_bus_id>", b"<attached_gpus>",
              b"<nvlink>", b"<ecc_errors>", b"<volatile>", b"<aggregate>", b"<temperature>", b"<gpu_temp>"]
    return Target("nvidia-smi -q -x", run, seeds, (), tokens, max_len=48 * 1024)


def _smi_text_first_gpu(data: bytes) -> bytes:
    marker = b"\nGPU 0000"
    first = data.find(marker)
    if first < 0:
        return data
    second = data.find(marker, first + 1)
    return data if second < 0 else data[:second + 1]


def smi_text_target() -> Target:
    from ansible_collections.gpufleet.reliability.plugins.module_utils.health import smi

    seeds = [_smi_text_first_gpu(read(p)) for p in fixtures("gpu/*.nvidia-smi-q.txt")]
    seeds += _lines_of(read(FIXTURES / "gpu" / "nvidia-smi-and-nvml-error-strings.txt"), 400)

    def run(data: bytes) -> None:
        snap = smi.read_nvidia_smi_text(data)
        snap.to_dict()

    tokens = [b"GPU 00000000:19:00.0\n", b"    Retired Pages\n", b"        Pending Page Blacklist    : Yes\n",
              b"    Remapped Rows\n", b"        Pending                   : Yes\n", b"Attached GPUs : 8\n",
              b" : ", b"N/A", b"[N/A]", b"Unable to determine the device handle for GPU0000:19:00.0: Unknown Error",
              b"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver", b"GPU is lost"]
    return Target("nvidia-smi -q (text)", run, seeds, (), tokens, max_len=32 * 1024)


# --------------------------------------------------------------------------------------------- nvml replay
def _strip_hangs(cfg: Any) -> Any:
    """A replay config's ``hang`` asks the fake NVML to sleep on purpose (a documented test feature)."""
    if isinstance(cfg, dict):
        cfg.pop("hang", None)
        devices = cfg.get("devices")
        for d in devices if isinstance(devices, list) else ():
            if isinstance(d, dict):
                d.pop("hang", None)
        dd = cfg.get("device_defaults")
        if isinstance(dd, dict):
            dd.pop("hang", None)
    return cfg


def nvml_target() -> Target:
    from ansible_collections.gpufleet.reliability.plugins.module_utils import nvml, nvml_fake
    from ansible_collections.gpufleet.reliability.plugins.module_utils.health import smi

    seeds: List[bytes] = []
    for p in fixtures("gpu/*.xml"):
        snap = smi.read_nvidia_smi_xml(read(p))
        cfg = nvml_fake.fake_config_from_snapshot(snap)
        cfg["devices"] = cfg["devices"][:2]
        cfg["count"] = min(cfg["count"], 2)
        seeds.append(json.dumps(cfg, indent=1).encode())
    devices = [{"index": 1, "fail": {"mode": "lost", "after_calls": 3}},
               {"index": 0, "not_supported": ["nvmlDeviceGetRemappedRows"], "nvlink_errors": {"0": {"replay": 3}}}]
    seeds.append(json.dumps({"count": 2, "devices": devices}).encode())
    seeds.append(b"count: 1\ninit_error: LibRmVersionMismatch\n")
    seeds.append(b"count: 2\ndevice_defaults:\n  remapped_rows: [0, 4, 1, 0]\n  recovery_action: 2\n")
    json_path = _TMP / "replay.json"
    yaml_path = _TMP / "replay.yaml"

    def run(data: bytes) -> None:
        path = yaml_path if data[:1] not in (b"{", b"[") and data.find(b"\"count\"") < 0 else json_path
        path.write_bytes(data)
        try:
            cfg = nvml_fake.load_config(str(path))
        except UnicodeDecodeError:
            return  # the replay file must be UTF-8 text: a decode error is the documented ValueError
        cfg = _strip_hangs(cfg)
        fake = nvml_fake.FakeNvml(cfg)
        snap = nvml.probe(fake)
        snap.to_dict()

    import yaml
    tokens = [b"\"count\": ", b"\"devices\": [", b"\"index\": ", b"\"fail\": {\"mode\": \"", b"reset_required",
              b"\"nvlink_errors\": {", b"\"remapped_rows\": [", b"\"mig\": [", b"\"fabric\": {\"state\": ",
              b"\"ecc_mode\": [", b"\"clocks_event_reasons\": [", b"\"retired_pages\": ", b"\"after_calls\": ",
              b"count: ", b"devices:\n  - index: ", b"init_error: ", b"&a [*a, *a]", b"!!python/object:os.system"]
    return Target("nvml replay", run, seeds, (ValueError, yaml.YAMLError), tokens, max_len=16 * 1024,
                  structured=_json_structured)


def snapshot_target() -> Target:
    """``gpufleet-health check --snapshot-json FILE`` (a recorded snapshot): the agent's reader, then the rules."""
    from ansible_collections.gpufleet.reliability.plugins.module_utils.cli import health_agent as agent
    from ansible_collections.gpufleet.reliability.plugins.module_utils.health import Snapshot, judge, smi

    seeds: List[bytes] = []
    for p in fixtures("gpu/*.xml"):
        snap = smi.read_nvidia_smi_xml(_xml_one_gpu(read(p)))
        seeds.append(json.dumps(snap.to_dict(), indent=1).encode())
    path = _TMP / "snapshot.json"

    def run(data: bytes) -> None:
        path.write_bytes(data)
        raw = agent._load_mapping(str(path), "--snapshot-json")
        snap = Snapshot.from_dict(raw.get("snapshot", raw))
        report = judge(snap, None, now=1_760_000_000.0)
        assert report.to_dict()["verdict"] in ("healthy", "degraded", "unhealthy", "unknown")

    tokens = [b"\"gpus\": [", b"\"index\": ", b"\"lost\": true", b"\"probe_errors\": {", b"\"nvlinks\": [",
              b"\"clocks_event_reasons\": [", b"\"remapped_rows_pending\": ", b"\"recovery_action\": ",
              b"\"probe_status\": \"", b"\"snapshot\": {"]
    return Target("snapshot JSON (--snapshot-json)", run, seeds, (agent.UsageError, ValueError, UnicodeDecodeError),
                  tokens, max_len=16 * 1024, structured=_json_structured)


# --------------------------------------------------------------------------------------------- Slurm
def slurm_json_target() -> Target:
    from ansible_collections.gpufleet.reliability.plugins.module_utils import slurm

    seeds = [read(p) for p in fixtures("slurm/*.json")]

    def run(data: bytes) -> None:
        nodes = slurm.parse_nodes_json(_text(data))
        assert isinstance(nodes, dict)
        for name, node in nodes.items():
            assert isinstance(name, str) and isinstance(node.name, str), "node name is not a string"
            assert node.reason_time is None or isinstance(node.reason_time, int), "reason_time not int"
            node.to_dict()
            assert isinstance(node.sinfo_state, str)

    tokens = [b"\"nodes\": [", b"\"sinfo\": [", b"\"state\": [\"IDLE\", \"DRAIN\"]", b"\"name\": ", b"\"errors\": [",
              b"{\"set\": true, \"infinite\": false, \"number\": ", b"\"reason_changed_at\": ", b"\"partitions\": ",
              b"\"next_state_after_reboot\": [", b"\"reason\": {\"description\": ", b"\"features\": {\"active\": ",
              b"\"boot_time\": ", b"\"cpus\": ", b"\"alloc_cpus\": "]
    return Target("Slurm JSON (scontrol/sinfo)", run, seeds, (slurm.SlurmError,), tokens, max_len=24 * 1024,
                  structured=_json_structured)


def slurm_text_target() -> Target:
    from ansible_collections.gpufleet.reliability.plugins.module_utils import slurm

    raw = read(FIXTURES / "slurm" / "text-outputs-22.05.txt")
    seeds = _lines_of(raw, 600)
    seeds.append(b"101\x1fRUNNING\x1falice\x1fgpu[01-02]\x1f1:02:03\x1f2025-03-01T12:00:00\x1fNone\x1ftrain\x1fx\n")

    def run(data: bytes) -> None:
        text = _text(data)
        try:
            nodes = slurm.parse_nodes_text(text)
            for node in nodes.values():
                node.to_dict()
        except slurm.SlurmError:
            pass
        try:
            slurm.parse_jobs_text(text)
        except slurm.SlurmError:
            pass
        slurm.parse_version(text)

    tokens = [b"NodeName=", b" State=", b"IDLE+DRAIN", b" Reason=", b" [root@2025-02-30T25:00:00]", b" BootTime=",
              b"9999-12-31T23:59:59", b" CPUTot=", b" Partitions=", b" ActiveFeatures=", b"\x1f", b"slurm 24.11.5"]
    return Target("Slurm text (scontrol -o / squeue)", run, seeds, (slurm.SlurmError,), tokens, max_len=16 * 1024)


def slurmconf_target() -> Target:
    from ansible_collections.gpufleet.reliability.plugins.module_utils import slurmconf as sc

    seeds: List[bytes] = []
    for p in fixtures("slurmconf/*"):
        seeds.extend(_lines_of(read(p), 1500))
    kinds = {}
    for p in fixtures("slurmconf/*"):
        kinds[p.name] = sc.guess_kind(p.name) or "slurm"

    def run(data: bytes) -> None:
        text = _text(data)
        kind = "cgroup" if b"Constrain" in data[:4000] or b"CgroupPlugin" in data[:4000] else "slurm"
        try:
            cf = sc.ConfFile(text, kind)
        except sc.SlurmConfError:
            cf = sc.ConfFile(text, kind, validate=False)  # syntax ok, a value bad: still renders byte for byte
        assert cf.render() == text, "an unchanged file does not render back byte for byte"
        assert not cf.changed
        cf.settings()
        cf.includes()
        for rec in cf.records():
            rec.head()
        if kind == "slurm" and cf.validate:
            cf.restart_reasons("24.11.5")
            cf.set("SlurmctldTimeout", 137)
            again = sc.ConfFile(cf.render(), kind, validate=False)
            assert again.get("SlurmctldTimeout") == "137", "a set value does not read back"

    tokens = [b"NodeName=gpu[01-04] Gres=gpu:8 State=UNKNOWN\n", b"PartitionName=batch Nodes=ALL Default=YES\n",
              b"Include /etc/slurm/x.conf\n", b"SlurmctldTimeout=", b"\\\n", b"\"", b"#", b"=", b"  ",
              b"SlurmctldPort=6817-6820\n", b"RebootProgram=\"/sbin/reboot\"\n", b"HealthCheckInterval=",
              b"NodeName=DEFAULT ", b"DownNodes=", b"ConstrainDevices=yes\n", b"RequeueExit=1-9,18\n"]
    return Target("slurm.conf", run, seeds, (sc.SlurmConfError,), tokens, max_len=12 * 1024)


# --------------------------------------------------------------------------------------------- scenario
def scenario_target() -> Target:
    import yaml

    from gpufleet_sim import scenario
    from gpufleet_sim.dists import SpecError

    seeds = [p.read_bytes() for p in sorted((REPO / "simulator" / "scenarios").glob("*.yaml"))]
    path = _TMP / "scenario.yaml"

    parsed: Dict[bytes, Any] = {}

    def structured(rng: random.Random, seed: bytes) -> bytes:
        if seed not in parsed:
            parsed[seed] = yaml.load(seed, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        obj = parsed[seed]
        for _unused in range(rng.choice((1, 1, 2, 3))):
            obj = _mutate_obj(rng, obj)
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # the harness's own speed; the loader is the product's
        return yaml.dump(obj, Dumper=dumper, allow_unicode=True, width=1000).encode("utf-8", "surrogatepass")

    def run(data: bytes) -> None:
        path.write_bytes(data)
        try:
            scenario.load(path)
        except SpecError as exc:
            msg = str(exc)
            assert msg and "\n" not in msg.split(": not valid YAML:", maxsplit=1)[0], "SpecError is not one clear line"

    tokens = [b"rate_per_1000_node_days: ", b"job_mtbf_h: ", b"horizon_days: ", b"nodes: ", b"- name: ",
              b"duration_min: {dist: lognormal, median: 5, p90: 1}", b".inf", b"-.inf", b".nan", b"!!binary",
              b"&a [*a, *a, *a]", b"<<: *a", b"share: ", b"lead_h: ", b"kmsg: [", b"policies: [", b"0x10", b"1e9999",
              b"!!python/name:os.system", b"? ", b"---\n", b"...\n"]
    return Target("scenario YAML", run, seeds, (SpecError,), tokens, max_len=8 * 1024, structured=structured)


# --------------------------------------------------------------------------------------------- repair history
def history_target() -> Target:
    from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import history as hi

    now = 1_760_000_000
    seeds: List[bytes] = [b"", b"{\"gf\":1,\"n\":0}", b"Slurm admin note: gpu3 replaced 2025-01-02"]
    h = hi.History()
    h.open("gpu_memory", "xid48", 3, now - 3600)
    h.start("reset_gpu", now - 3000)
    h.finish("failed")
    h.start("reboot", now - 600)
    seeds.append(hi.dumps(h).encode())
    h.finish("ok")
    h.close(now, 1800)
    seeds.append(hi.dumps(h).encode())
    h.open("nvlink", "xid74", None, now + 10)
    h.incident.spare = "gpu-spare-rack12-07"
    h.start("replace", now + 20)
    seeds.append(hi.dumps(h).encode())

    def run(data: bytes) -> None:
        text = _text(data)
        hi.is_ours(text)
        try:
            ours = hi.loads_ours(text)
        except hi.HistoryError:
            ours = None
        h1 = hi.loads(text)
        out = hi.dumps(h1)
        assert hi.dumps(hi.loads(out)) == out, "dumps(loads(x)) is not stable"
        assert ours is None or hi.dumps(ours) == out

    tokens = [b"\"gf\":1", b"\"i\":{", b"\"s\":[[\"", b"\",", b",null]", b"\"r\":\"", b"\"p\":\"", b"\"cd\":",
              b"\"hk\":\"", b"\"sp\":", b"\"k\":", b"\"c\":\"", b"\"id\":", b"\"t\":", b"\"e\":", b"\"g\":", b"1e400",
              b"-1", b"\"\\ud800\""]
    return Target("repair history (node field)", run, seeds, (hi.HistoryError,), tokens, max_len=4096,
                  structured=_json_structured)


# --------------------------------------------------------------------------------------------- OIDC
def _oidc_forge():
    from support import oidc_forge  # imported when an OIDC harness first runs

    return oidc_forge


_OIDC: Dict[str, Any] = {}


def _oidc_setup() -> Dict[str, Any]:
    if _OIDC:
        return _OIDC
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.config import parse_config
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.jwks import JWKSCache
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.validator import TokenValidator

    forge = _oidc_forge()
    priv = forge.make_private_jwks(1)
    cache_dir = _TMP / "oidc-cache"
    cache_dir.mkdir(mode=0o700, exist_ok=True)
    cfg = parse_config({"issuer": forge.ISSUER, "audience": forge.AUD, "username_claim": "preferred_username",
                        "groups_claim": "groups", "allowed_groups": ["hpc-users"], "http_timeout": 1,
                        "min_refresh_interval": 10 ** 9, "jwks_cache_dir": str(cache_dir),
                        "algorithms": ["RS256", "ES256", "PS256"]})
    cache = JWKSCache.from_config(cfg)
    cache.seed(forge.public_jwks(priv))
    _OIDC.update(forge=forge, priv=priv, cfg=cfg, cache=cache, validator=TokenValidator(cfg, cache))
    return _OIDC


def _b64dec(part: bytes) -> bytes:
    import base64
    import binascii
    try:
        return base64.urlsafe_b64decode(part + b"=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        return b"?" + part


def token_target() -> Target:
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import OIDCError

    o = _oidc_setup()
    forge, priv = o["forge"], o["priv"]
    good = forge.claims_for(forge.ISSUER, forge.AUD)
    seeds = [forge.sign(priv, good).encode(), forge.sign(priv, dict(good, azp="x", nbf=good["iat"])).encode(),
             forge.unsigned(good).encode(), forge.hs256_with_public_pem(priv, good).encode()]
    for kid, alg in (("es-1", "ES256"), ("rs-1", "PS256")):
        try:
            seeds.append(forge.sign(priv, good, kid=kid, alg=alg).encode())
        except Exception:  # noqa: BLE001 - the forge may not hold that key type
            pass
    validator = o["validator"]
    genuine = set()
    for s in seeds:
        try:
            validator.validate(s)
            genuine.add(s)
        except OIDCError:
            pass
    assert len(genuine) >= 2, "the genuine tokens must validate (controls)"

    def run(data: bytes) -> None:
        try:
            claims = validator.validate(data)
        except OIDCError as exc:
            assert not str(getattr(exc, "reason", exc)).startswith("internal error"), str(exc)[:120]
            raise
        if data.strip() in genuine:
            return
        parts = data.strip().split(b".")
        orig = {tuple(_b64dec(p) for p in g.split(b".")) for g in genuine}
        assert tuple(_b64dec(p) for p in parts) in orig, f"accepted a changed token (sub={claims.get('sub')!r})"

    structured_parts = [b"eyJhbGciOiJub25lIn0", b"eyJhbGciOiJSUzI1NiIsImtpZCI6WzFdfQ", b"e30", b"W10", b"bnVsbA",
                        b"eyJhbGciOiJSUzI1NiIsImNyaXQiOlsiYiJdfQ", b"eyJhbGciOiJFUzI1NiIsImtpZCI6ImVzLTEifQ"]

    def structured(rng: random.Random, seed: bytes) -> bytes:
        parts = seed.split(b".")
        i = rng.randrange(len(parts))
        r = rng.random()
        if r < 0.4:
            import base64
            raw = _b64dec(parts[i])
            try:
                obj = json.loads(raw)
                raw = json.dumps(_mutate_obj(rng, obj), allow_nan=True).encode("utf-8", "surrogatepass")
            except ValueError:
                raw = raw[::-1]
            parts[i] = base64.urlsafe_b64encode(raw).rstrip(b"=")
        elif r < 0.7:
            parts[i] = rng.choice(structured_parts)
        else:
            parts.insert(i, rng.choice(structured_parts + [b""]))
        return b".".join(parts)

    return Target("OIDC token", run, seeds, (OIDCError,), [b".", b"..", b"=", b"+", b"/", b"eyJ"],
                  max_len=20000, structured=structured)


def jwks_target() -> Target:
    from joserfc.errors import JoseError

    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc import jwks as jw
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc import transport
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import IdPUnavailable
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.validator import _import_key

    o = _oidc_setup()
    forge = o["forge"]
    seeds = [json.dumps(forge.public_jwks(o["priv"]), indent=1).encode(),
             json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0"}, {"kty": "RSA", "use": "enc", "n": "AQAB",
                                                                    "e": "AQAB"}]}).encode()]
    cache = jw.JWKSCache("https://idp.example/realms/x", str(_TMP / "jwks-cache"))
    os.makedirs(cache.cache_dir, mode=0o700, exist_ok=True)

    def run(data: bytes) -> None:
        # the IdP's answer as the transport reads it (the socket is the only thing left out)
        try:
            doc = transport.Response(200, data, "https://idp.example/jwks").json()
        except ValueError:
            doc = None
        if doc is not None:
            keys = jw.public_keys_only(doc)  # IdPUnavailable for a document without a key list
            for k in keys:
                assert not set(k) & {"d", "p", "q", "dp", "dq", "qi", "oth", "k"}, "private part kept"
            for alg in ("RS256", "ES256", "PS256", "EdDSA"):
                kty, crv = jw.ALG_KTY[alg]
                for kid in (None, "rs-1", "es-1"):
                    key = jw.JWKSCache._select(keys, kid, kty, crv, alg)
                    if key is not None:
                        try:
                            _import_key(key)
                        except (JoseError, ValueError, TypeError):
                            pass  # the validator turns these into TokenRejected ("signing key unusable")
        # the same bytes as the on-disk cache file: unreadable or foreign content is ignored, never raised
        fd = os.open(cache.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        got = cache._load()
        assert got is None or isinstance(got, dict)
        if doc is None:
            raise IdPUnavailable("not JSON")

    tokens = [b"\"keys\": [", b"\"kty\": \"RSA\"", b"\"kty\": \"EC\"", b"\"kty\": \"OKP\"", b"\"crv\": \"P-256\"",
              b"\"crv\": \"Ed25519\"", b"\"n\": \"", b"\"e\": \"AQAB\"", b"\"x\": \"", b"\"y\": \"", b"\"kid\": ",
              b"\"alg\": ", b"\"use\": \"sig\"", b"\"d\": \"", b"\"issuer\": \"https://idp.example/realms/x\""]
    return Target("OIDC JWKS", run, seeds, (IdPUnavailable,), tokens, max_len=16 * 1024,
                  structured=_json_structured)


def discovery_target() -> Target:
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc import jwks as jw
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc import transport
    from ansible_collections.gpufleet.reliability.plugins.module_utils.oidc.errors import IdPUnavailable

    o = _oidc_setup()
    issuer = "https://idp.example/realms/x"
    good_jwks = json.dumps(o["forge"].public_jwks(o["priv"])).encode()
    seeds = [json.dumps({"issuer": issuer, "jwks_uri": issuer + "/protocol/openid-connect/certs",
                         "authorization_endpoint": issuer + "/auth", "token_endpoint": issuer + "/token",
                         "device_authorization_endpoint": issuer + "/device",
                         "id_token_signing_alg_values_supported": ["RS256", "ES256"],
                         "response_types_supported": ["code"], "subject_types_supported": ["public"]},
                        indent=1).encode()]

    class _Net:
        """Stands in for the socket only: the body goes through transport.Response and get_json's checks."""

        def __init__(self):
            self.body = b""

        def get_json(self, url: str, timeout: float = 5.0) -> Any:
            body = self.body if url.endswith("/.well-known/openid-configuration") else good_jwks
            try:
                return transport.Response(200, body, url).json()
            except ValueError:
                raise IdPUnavailable(f"response from {url} is not JSON")

        def __getattr__(self, name: str) -> Any:
            return getattr(transport, name)  # require_secure_url and friends: the real checks

    net = _Net()
    cache = jw.JWKSCache(issuer, str(_TMP / "disc-cache"))
    os.makedirs(cache.cache_dir, mode=0o700, exist_ok=True)

    def run(data: bytes) -> None:
        net.body = data
        real = jw.http
        jw.http = net
        try:
            meta = cache.fetch_metadata()
            assert meta.get("issuer") == issuer
            state = cache._fetch_all(None)
            uri = meta.get("jwks_uri")
            assert isinstance(uri, str) and transport.is_secure_url(uri), f"insecure jwks_uri accepted: {uri!r}"
            assert state["keys"], "no keys"
        finally:
            jw.http = real

    tokens = [b"\"issuer\": \"https://idp.example/realms/x\"", b"\"jwks_uri\": \"", b"http://", b"https://",
              b"file:///etc/passwd", b"https://idp.example@evil/", b"\"jwks_uri\": null", b"\\u0000"]
    return Target("OIDC discovery", run, seeds, (IdPUnavailable,), tokens, max_len=8 * 1024,
                  structured=_json_structured)


# cheapest first, so that a campaign cut short has most parsers done
ALL = [history_target, token_target, discovery_target, slurm_text_target, slurm_json_target, smi_text_target,
       kmsg_target, jwks_target, smi_xml_target, nvml_target, slurmconf_target, scenario_target, snapshot_target]
