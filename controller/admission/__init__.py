"""Health-gated admission: the `taugrid.dev/gpu-health` AdmissionCheck answered on Workloads.

Owns the AdmissionCheck's `Active` condition and our entry in each Workload's
`status.admissionChecks[]`. Reads Nodes and pods as the cluster shows them; imports no other
domain.
"""
