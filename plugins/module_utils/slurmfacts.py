# Copyright (c) gpufleet.reliability contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slurm node facts, the one place they are written: node states and flags, our reason prefix and reason format,
and whose node it is (the ownership rule every repair body, the agent, the startup runner, the adapter and the
policy apply). A leaf: stdlib only, it imports nothing of this collection, so every caller can use it (the Slurm
adapter without the repair policy, the node agent without the adapter).

A node that is out of service (DOWN, or with the DRAIN or FAIL flag) belongs to whoever set its current reason.
Ours start with the reason prefix (``gpufleet:``). A node whose current reason is not ours is never drained over,
rebooted, reset, replaced or resumed by us, whatever our history says: the policy holds it and closes our open
incident on it with a note; the bodies check again right before every step that leaves the controller.

A node in an active maintenance reservation (``Flags=MAINT``: Slurm gives the node the MAINTENANCE flag, sinfo
shows ``maint``) is the operator's too, in service or not: a maintenance window is a hold nobody wrote as a
reason.

Slurm keeps our reason through its own reboot path (it appends `` : reboot issued`` and `` : reboot complete``,
and a node that stops responding keeps the reason it had), so our prefix survives our own reboot. A node in
service is nobody's: Slurm 24.11 keeps the last reason after a RESUME, so a reason on a node in service means
nothing.
"""

from __future__ import annotations

import re
from typing import AbstractSet, Iterable, Optional, Tuple

#: The prefix of every Slurm reason we set (the repair policy's ``reason_prefix`` defaults to it).
REASON_PREFIX = "gpufleet:"
#: The reason of an idle hot spare held out of service for the repair policy.
SPARE_REASON = REASON_PREFIX + " spare"
#: The reason prefix of a node the startup runner drained (``gpufleet: startup <script>``).
STARTUP_REASON = REASON_PREFIX + " startup"
#: Flags that mean Slurm is rebooting the node (or will).
REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"})
OUT_FLAGS = frozenset({"DRAIN", "FAIL"})
#: Base states (upper case) of a node out of service.
OUT_STATES = frozenset({"DOWN", "DRAINED", "DRAINING", "DRAIN", "FAIL", "FAILING"})
_OUT_ANY_FLAG = OUT_FLAGS | {"DOWN"}
_OUT_STATES_LOWER = frozenset(s.lower() for s in OUT_STATES)  # NodeState keeps its base state in lower case
#: Flags (upper case) of a node in an active maintenance reservation: scontrol/JSON spell it MAINTENANCE, sinfo maint.
MAINT_FLAGS = frozenset({"MAINTENANCE", "MAINT"})


def out_of_service(state: Optional[str], flags: Iterable[str] = ()) -> bool:
    """DOWN, drained, draining or failed (``state`` as scontrol or sinfo spells it, any case, ``*`` ignored)."""
    words = [w for w in str(state or "").upper().replace("*", "").split("+") if w]
    base = words[0] if words else ""
    fl = {str(f).upper() for f in flags} | set(words[1:])
    return out_of_service_split(base, fl)


def out_of_service_split(base: str, flags: AbstractSet[str]) -> bool:
    """out_of_service() of a state already split: ``base`` one word (any case), ``flags`` upper case."""
    return base in _OUT_STATES_LOWER or base.upper() in OUT_STATES or not _OUT_ANY_FLAG.isdisjoint(flags)


#: Why a node in a maintenance reservation is not ours.
IN_MAINTENANCE = "in an active maintenance reservation (Slurm's MAINT flag): the operator's, never touched"


def in_maintenance(state: Optional[str], flags: Iterable[str] = ()) -> bool:
    """In an active maintenance reservation (``state`` as scontrol or sinfo spells it, ``flags`` any case)."""
    words = str(state or "").upper().replace("*", "").split("+")
    return not MAINT_FLAGS.isdisjoint(words[1:]) or not MAINT_FLAGS.isdisjoint(str(f).upper() for f in flags)


def in_maintenance_split(flags: AbstractSet[str]) -> bool:
    """in_maintenance() of a state already split: ``flags`` upper case (the state's ``+`` words among them)."""
    return not MAINT_FLAGS.isdisjoint(flags)


def foreign_reason(
    state: Optional[str], flags: Iterable[str], reason: Optional[str], prefix: str, *, out: Optional[bool] = None,
    maint: Optional[bool] = None,
) -> Optional[str]:
    """None when we may act on the node; else why not (the node is out of service with a reason that is not ours).

    ``prefix`` must be a non-empty string: with an empty prefix every reason would be ours. ``out`` and ``maint``:
    whether the node is out of service and in maintenance, when the caller knows already (else they are worked out
    from ``state`` and ``flags``).
    """
    if not isinstance(prefix, str) or not prefix or prefix.isspace():
        raise ValueError(f"reason_prefix: expected a non-empty string, got {prefix!r}")
    if in_maintenance(state, flags) if maint is None else maint:
        return IN_MAINTENANCE
    if not (out_of_service(state, flags) if out is None else out):
        return None
    reason = str(reason or "")
    if reason.startswith(prefix):
        return None
    shown = reason[:120] or "none"
    return f"out of service by someone else (reason {shown!r} does not start with {prefix!r})"


def drained_by(state: Optional[str], flags: Iterable[str], reason: Optional[str], prefix: str) -> bool:
    """Out of service with a reason that starts with ``prefix``: we took the node out, we may bring it back."""
    out = out_of_service(state, flags)
    return out and foreign_reason(state, flags, reason, prefix, out=out) is None


#: Base states (scontrol and sinfo spellings, lower case) of a node with jobs on it.
BUSY_STATES = frozenset({"allocated", "alloc", "mixed", "mix", "completing", "comp"})


def busy(state: Optional[str], flags: Iterable[str] = ()) -> bool:
    """Jobs still on the node, running or completing (``state`` any case, ``*`` ignored)."""
    return busy_split(str(state or "").lower().replace("*", "").split("+", 1)[0], flags)


def busy_split(base: str, flags: Iterable[str]) -> bool:
    """busy() of a state already split: ``base`` one word in lower case, ``flags`` upper case."""
    return base in BUSY_STATES or "COMPLETING" in flags


def drain_reason(code: str, gpu: Optional[object] = None, pci: Optional[str] = None,
                 prefix: str = REASON_PREFIX) -> str:
    """The Slurm reason of a drain for a finding: ``gpufleet: <code>``, then `` gpu<N>`` when one GPU is meant
    (else `` <pci>`` when only its PCI address is known)."""
    return f"{prefix} {code}" + (f" gpu{gpu}" if gpu is not None else (f" {pci}" if pci else ""))


def drain_flagged(state: Optional[str], flags: Iterable[str] = ()) -> bool:
    """The node carries a drain (the DRAIN or FAIL flag, or a drained/draining/failing base state): it stays out of
    service when its slurmd registers. A node that is only DOWN does not: Slurm returns it to service when it
    registers (``ReturnToService``)."""
    words = str(state or "").upper().replace("*", "").split("+")
    marks = set(words[1:]) | {str(f).upper() for f in flags}
    return not OUT_FLAGS.isdisjoint(marks) or words[0] in OUT_STATES - {"DOWN"}


def startup_action(state: Optional[str], flags: Iterable[str], reason: Optional[str],
                   failed: Optional[str]) -> Tuple[str, Optional[str]]:
    """What the startup runner does with its own node at boot: (``drain`` | ``resume`` | ``kept`` | ``none``, the
    reason). ``failed``: the reason to drain with when a startup script failed (``STARTUP_REASON`` + the script).

    The runner works before slurmd starts, when the node is normally DOWN (not responding), so it asks whether the
    node carries a drain (:func:`drain_flagged`), not whether it is out of service: a failed startup drains a node
    that is only DOWN, so that it takes no jobs when slurmd registers it; a drain that is someone else's (a reason
    not ours) is kept as it is; a success takes back only the runner's own drain (``STARTUP_REASON``)."""
    reason = str(reason or "")
    drained = drain_flagged(state, flags)
    ours = reason.startswith(STARTUP_REASON)
    if failed is not None:
        if drained and (not ours or reason == failed):
            return "kept", reason  # someone else's drain stays theirs; ours with this reason is already there
        return "drain", failed
    if drained:
        return ("resume" if ours else "kept"), reason
    return "none", None


def reason_code(reason: Optional[str], prefix: str = REASON_PREFIX) -> Optional[str]:
    """The finding code a reason written by :func:`drain_reason` names (``gpufleet: xid79 gpu3`` -> ``xid79``);
    None for a reason that is not ours."""
    reason = str(reason or "")
    if not reason.startswith(prefix):
        return None
    words = reason[len(prefix):].split()
    return words[0] if words else ""


# ---- jobs ---------------------------------------------------------------------------------------------------------
#: A Slurm job id as we name one: 123, or an array element 123_4 (what squeue's JobID field and scancel take).
JOB_ID = re.compile(r"^[0-9]{1,12}(?:_[0-9]{1,9})?$", re.ASCII)
#: Job states of a job that still holds its nodes.
JOB_ACTIVE_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "CONFIGURING", "SIGNALING",
                               "STAGE_OUT", "RESIZING"})
#: Job states of a job waiting in the queue (requeued, or requeued by itself).
JOB_QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
#: The comment marker of a job that must never be evicted (the repair policy's ``jobs.opt_out_comment`` default).
NO_EVICT_MARK = REASON_PREFIX + "no-evict"


def is_job_id(text: object) -> bool:
    """True for a Slurm job id we act on (``JOB_ID``); anything else from outside is refused."""
    return isinstance(text, str) and JOB_ID.match(text) is not None
