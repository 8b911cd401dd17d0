"""The local, real Kubernetes control plane used by the tests and by `taugrid dev`."""
