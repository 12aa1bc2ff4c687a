"""People: business hours, approvals and the technicians who carry out a step by hand."""

from __future__ import annotations

from .records import H, NodeRec


class People:
    """The people of one simulated cluster (a part of ``engine.Sim``): when a person is there, how long an
    approval takes, and the limited crew (``repair.technicians``) that steps by hand wait for."""

    # --- people ----------------------------------------------------------------------------------------------------
    def business_open(self, t: float) -> float:
        """The first time >= t when someone is at work (the run starts Monday 00:00)."""
        bh = self.rep["business_hours"]
        if bh is None:
            return t
        for _unused in range(15):
            day = int(t // 24)
            hour = t - day * 24
            if day % 7 < bh["weekdays"]:
                if hour < bh["start"]:
                    return day * 24 + bh["start"]
                if hour < bh["end"]:
                    return t
            t = (day + 1) * 24
        return t

    def human_ready(self, t: float) -> float:
        t = self.business_open(t)
        return self.business_open(t + self.rep["human_response_min"]["sample"](self.rng) * H)

    def approval_delay(self, t: float) -> float:
        spec = self.policy.get("approval_delay_min")
        if spec is not None:
            from .dists import parse_duration

            sampler = parse_duration("policy.approval_delay_min", spec)[0]
        else:
            sampler = self.rep["approval_delay_min"]["sample"]
        self.stats["approvals"] += 1
        return t + sampler(self.rng) * H

    def _by_hand(self, rec: NodeRec, action: str, wait_for_hours: bool = False):
        """A step a person carries out (a held or escalated node, every step in manual mode, a replacement): with a
        limited crew (repair.technicians) it first waits for a free technician, in order of arrival."""
        req = self.techs.request() if self.techs is not None else None
        if req is not None:
            t0 = self.env.now
            yield req
            self.stats["technician_wait_h"] += self.env.now - t0
        try:
            if wait_for_hours:
                yield self.env.timeout(self.human_ready(self.env.now) - self.env.now)
            ok = yield from self._do(rec, action)
        finally:
            if req is not None:
                self.techs.release(req)
        return ok
