"""The lb role's controller side: load balancers: listeners, pools, members, health reports from the hosts."""
