"""The load-balancer members on this host, as the agent's passes need them: their translation zones' keys
(lb_flows.member_zone_seeds) and their health probes (health.Prober), redone only when the config or the interfaces
change, not at every pass (the program loop runs 20 times a second)."""

from __future__ import annotations

from typing import Any

from tianji.southbound import HostConfig
from vswitch_agent import health
from vswitch_agent.lb_flows import member_zone_seeds


class LocalMembers:
    def __init__(self, prober: health.Prober) -> None:
        self.prober = prober
        self.seen: tuple[Any, Any] = (None, None)  # the config and interfaces last looked at
        self.seeds: dict[str, int] = {}

    def zone_seeds(self, cfg: HostConfig, ofports: dict[str, int]) -> dict[str, int]:
        """Both are replaced, never changed in place: identity says whether anything changed."""
        if cfg is not self.seen[0] or ofports is not self.seen[1]:
            self.seeds = member_zone_seeds(cfg)
            self.prober.update(health.targets_of(cfg, ofports))
            self.seen = (cfg, ofports)
        return self.seeds
