"""The controller's Kubernetes adapters: the only modules that import kubernetes_asyncio."""
