"""The gateway instance every role runs on (`instance.Instance`): registration, the config watch, heartbeat,
the VPC sections and their forwarding view, neighbours, the punt/inject slow path or the socket path, status and
metrics, each an object the instance holds. A role (`nfv_gateways.roles.<role>`) is handed to it through the
`role.Role` protocol; it never subclasses the instance."""
