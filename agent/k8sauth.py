"""TokenReview + SubjectAccessReview through kubernetes_asyncio (the only adapter that uses it).

A caller may run diagnostics or release faults on this node when the API server accepts its
token and allows it `<verb>` on `nodes/<node>` (the same right quarantine needs, DESIGN.md
section 4). Answers are cached by token hash, and reviews rate-limited per source, in front of
this adapter (`auth.Gate`), so a busy endpoint or a flood of unknown tokens does not load the
API server.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

from kubernetes_asyncio import client, config

from agent import auth
from shared import kubetoken


class KubernetesAuthenticator:
    """`auth.Authenticator` backed by the Kubernetes API."""

    def __init__(
        self, api: client.ApiClient, *, audience: str = "", controller_audience: str = ""
    ) -> None:
        self._api = api
        self._audience = audience
        self._controller_audience = controller_audience

    @classmethod
    async def in_cluster(
        cls, *, audience: str = "", controller_audience: str = ""
    ) -> KubernetesAuthenticator:
        """Build one from the pod's ServiceAccount (or the local kubeconfig outside a pod)."""
        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
            await config.load_kube_config(config_file=path or None, client_configuration=cfg)
            rotated = kubetoken.token_file(pathlib.Path(path)) if path else None
            if rotated is not None:  # a token renewed on disk before it expires
                cfg.refresh_api_key_hook = kubetoken.refresh_hook(rotated)
        return cls(
            client.ApiClient(cfg), audience=audience, controller_audience=controller_audience
        )

    async def close(self) -> None:
        """Close the API client."""
        await self._api.close()

    async def authorize(
        self, token: str, *, verb: str, node: str, subresource: str = ""
    ) -> auth.Identity:
        """Review the token, then ask whether its user may `verb` this node (or subresource)."""
        return await self._review(token, verb=verb, node=node, subresource=subresource)

    async def _token_review(self, token: str, audience: str) -> tuple[Any, str]:
        """The reviewed user, or None and why the token was not accepted for `audience`."""
        authn = client.AuthenticationV1Api(self._api)
        spec = client.V1TokenReviewSpec(token=token, audiences=[audience] if audience else None)
        review = await authn.create_token_review(client.V1TokenReview(spec=spec))
        status = review.status
        if status is None or not status.authenticated:
            return None, (status.error if status is not None else "") or "token not accepted"
        return status.user, ""

    async def _review(self, token: str, *, verb: str, node: str, subresource: str) -> auth.Identity:
        user, problem = await self._token_review(token, self._audience)
        second = self._controller_audience
        if user is None and second and second != self._audience:
            # The controller's token for the on-call calls it makes here: valid for the
            # agents' audience only (a person's token is tried first, as it always was).
            user, _ = await self._token_review(token, second)
        if user is None:
            raise auth.AuthError(401, f"unauthenticated: {problem}")
        identity = auth.Identity(user=user.username or "", groups=tuple(user.groups or ()))
        authz = client.AuthorizationV1Api(self._api)
        sar = await authz.create_subject_access_review(
            client.V1SubjectAccessReview(
                spec=client.V1SubjectAccessReviewSpec(
                    user=identity.user,
                    groups=list(identity.groups),
                    uid=user.uid,
                    extra=user.extra or None,
                    resource_attributes=client.V1ResourceAttributes(
                        verb=verb, resource="nodes", subresource=subresource or None, name=node
                    ),
                )
            )
        )
        if not sar.status.allowed:
            reason = sar.status.reason or "no RBAC rule allows it"
            what = f"nodes/{subresource} {node}" if subresource else f"node {node}"
            raise auth.AuthError(403, f"{identity.user} may not {verb} {what}: {reason}")
        return identity
