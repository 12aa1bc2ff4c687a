"""Builders for the repair policy's inputs (fleet counts, attention nodes, health reports, histories)."""

from __future__ import annotations

from ansible_collections.gpufleet.reliability.plugins.module_utils.repair import History, dumps
from ansible_collections.gpufleet.reliability.plugins.module_utils.repair.history import Incident, Step

NOW = 1_764_700_000  # a fixed "now" (2025-12-02 18:26:40 UTC); every test is relative to it
H = 3600
D = 86400


def report(verdict="unhealthy", action="reset_gpu", code="xid48", gpu=3, findings=None):
    if findings is None:
        findings = [
            {"check": code, "severity": "fail" if verdict == "unhealthy" else "info", "gpu": gpu, "detail": code,
             "evidence": [], "action": action, "code": code}
        ]
    return {"verdict": verdict, "action": action, "code": code, "gpu": gpu, "findings": findings,
            "summary": f"{verdict}: {code}"}


HEALTHY = {"verdict": "healthy", "action": "none", "code": "ok", "gpu": None, "findings": [], "summary": "ok"}


def node(name="node2", rep="default", state="IDLE", flags=("DRAIN",), reason="gpufleet: xid48 gpu3",
         reason_time=NOW - H, history=None, partition="gpu", rack="r1", switch="s1", report_time=None, user="root"):
    return {
        "name": name, "partition": partition, "domains": {"rack": rack, "switch": switch},
        "report": report() if rep == "default" else rep, "report_time": report_time,
        "state": state, "flags": list(flags), "reason": reason if flags or state == "DOWN" else "",
        "reason_user": user, "reason_time": reason_time, "history": history,
    }


def in_service(name="node2", rep="default", **kw):
    kw.setdefault("reason_time", None)
    return node(name, rep, state="IDLE", flags=(), reason="", **kw)


def fleet(total=8, unavailable=1, spares=("spare1",), racks=None, partition="gpu"):
    f = {"total": total, "partitions": {partition: {"total": total, "available": total - unavailable,
                                                    "unavailable": unavailable, "spares_idle": list(spares)}}}
    if racks:
        f["domains"] = {"rack": {r: {"total": t, "available": t - u, "unavailable": u} for r, (t, u) in racks.items()}}
    return f


def hist(cls="gpu_memory", code="xid48", t0=NOW - H, steps=(), repairs=None, past=(), cooldown=None, escalated=None,
         spare=None, seq=None, gpu=3, open_incident=True):
    """A stored history. ``steps``: (action, started, outcome or None[, ran: when it was proven to have run])."""
    h = History()
    if open_incident:
        h.seq = seq or (len(past) + 1)
        h.incident = Incident(id=h.seq, failure_class=cls, code=code, gpu=gpu, first_seen=int(t0),
                              steps=tuple(Step(st[0], int(st[1]), st[2], st[3] if len(st) > 3 else None)
                                          for st in steps), escalated=escalated, spare=spare)
    else:
        h.seq = seq or len(past)
    h.repairs = tuple((int(st[1]), st[0]) for st in steps) if repairs is None else tuple((int(t), a)
                                                                                         for t, a in repairs)
    h.past = tuple((int(t), c) for t, c in past)
    h.cooldown_until = cooldown
    return dumps(h)
