"""Fleet health: heartbeats, the fleet state, the quarantine policy and loop, node actions.

Owns the `GPUHealthy` condition, the `taugrid.dev/gpu-unhealthy` taint, our cordon and the
quarantine annotations on Nodes, the breaker and the dry-run switch (kept on the Lease), and
the on-call API (`/v1/heartbeats`, `/v1/nodes*`, `/v1/fleet*`). Imports no other domain.
"""
