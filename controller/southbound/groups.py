"""Security groups as hosts take them: each rule with its remote side resolved to addresses, IPv4's rules in
`rules` and IPv6's in `rules6` (compiled for dual-stack VPCs only: an IPv4-only VPC carries no IPv6, and its
hosts hold no IPv6 flows)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection

from tianji.southbound import SecurityGroupInfo, SecurityGroupRuleInfo

ANYWHERE = ("0.0.0.0/0", "::/0")  # by family: [is IPv6]


def groups_fragments(rule_rows: list, member_rows: list, vpcs: list[str],
                     dual: Collection[str] = ()) -> dict[str, dict[str, SecurityGroupInfo]]:
    """Every security group of each VPC, remote groups resolved to member addresses (/32s, and /128s in a
    dual-stack VPC, `dual`). Groups, rules and memberships only change with a write that stamps their VPC (remote
    groups are in the same VPC)."""
    members: tuple[dict[str, list[str]], dict[str, list[str]]] = (defaultdict(list), defaultdict(list))
    for gid, ip, ip6 in member_rows:
        members[0][gid].append(f"{ip}/32")
        if ip6:
            members[1][gid].append(f"{ip6}/128")
    built: dict[str, dict[str, tuple[list[SecurityGroupRuleInfo], list[SecurityGroupRuleInfo]]]] = {
        vid: {} for vid in vpcs}
    for r in rule_rows:  # every group, with its rules if it has any
        by_family = built[r.vpc_id].setdefault(r.group_id, ([], []))
        v6 = r.ethertype == "IPv6"
        if r.id is None or (v6 and r.vpc_id not in dual):
            continue
        remote = members[v6].get(r.remote_group_id, []) if r.remote_group_id else [r.remote_cidr or ANYWHERE[v6]]
        by_family[v6].append(SecurityGroupRuleInfo(
            id=r.id, direction=r.direction, protocol=r.protocol, port_range_min=r.port_range_min,
            port_range_max=r.port_range_max, remote_cidrs=remote))
    return {vid: {gid: SecurityGroupInfo(id=gid, vpc_id=vid, rules=r4, rules6=r6)
                  for gid, (r4, r6) in groups.items()} for vid, groups in built.items()}
