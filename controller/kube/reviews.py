"""TokenReview and SubjectAccessReview against the API server (the `auth.Reviewer` seam)."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from controller import auth


class KubeReviewer:
    """Ask the API server who a token belongs to and what that identity may do."""

    def __init__(self, api: client.ApiClient) -> None:
        self._authn = client.AuthenticationV1Api(api)
        self._authz = client.AuthorizationV1Api(api)

    async def review_token(self, token: str, audiences: tuple[str, ...]) -> auth.Identity | None:
        """Return the identity behind the token, None when it is not accepted."""
        spec: dict[str, Any] = {"token": token}
        if audiences:
            spec["audiences"] = list(audiences)
        try:
            review = await self._authn.create_token_review({"spec": spec})
        except client.ApiException as err:
            msg = f"TokenReview failed: HTTP {err.status}"
            raise auth.ReviewUnavailable(msg) from err
        status = review.status
        if not status or not status.authenticated or not status.user:
            return None
        user = status.user
        extra = tuple(sorted((k, tuple(v)) for k, v in (user.extra or {}).items()))
        return auth.Identity(
            username=user.username or "",
            uid=user.uid or "",
            groups=tuple(user.groups or ()),
            extra=extra,
        )

    async def review_access(self, identity: auth.Identity, access: auth.Access) -> bool:
        """Return whether RBAC lets the identity perform the access."""
        attrs: dict[str, Any] = {
            "verb": access.verb,
            "resource": access.resource,
            "group": access.group,
        }
        if access.namespace:
            attrs["namespace"] = access.namespace
        if access.subresource:
            attrs["subresource"] = access.subresource
        if access.name:
            attrs["name"] = access.name
        body = {
            "spec": {
                "user": identity.username,
                "uid": identity.uid,
                "groups": list(identity.groups),
                "extra": {k: list(v) for k, v in identity.extra},
                "resourceAttributes": attrs,
            }
        }
        try:
            sar = await self._authz.create_subject_access_review(body)
        except client.ApiException as err:
            msg = f"SubjectAccessReview failed: HTTP {err.status}"
            raise auth.ReviewUnavailable(msg) from err
        return bool(sar.status and sar.status.allowed)
