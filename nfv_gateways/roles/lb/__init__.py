"""The load-balancer role: Maglev over a connection table, active-active across instances."""
