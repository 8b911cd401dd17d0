"""Runs: a researcher's tau.yaml turned into attempts (Jobs, RayJobs), tracked and resumed.

Owns TauRuns (spec and status), the attempt objects and the per-run objects it creates
(token Secret, checkpoint ConfigMap, headless Services), checkpoints, evidence and the
researcher API (`/v1/runs*`, `/v1/queues`, `/v1/schema/run`). Imports no other domain.
"""
