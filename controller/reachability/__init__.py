"""The reachability analyzer: "why can't port A reach B:443?" answered in the tenant's own terms.

It runs the agents' own flow builders on the configs the controller compiles for each host (vswitch_agent's
flows, in its OpenFlow model), hop by hop across hosts and gateway instances, and explains each table's decision
by the object the deciding flow comes from. Not a second implementation of the rules: what the switch would do
is what it says.

  walk.py         the packet's way across hosts (and the reply's back)
  explain.py      a switch's steps in words
  gateway_hop.py  a gateway instance's part, from its compiled config
  query.py        a question from the API, resolved and answered from the database
"""
