"""RBAC as kube-apiserver applies it to the tests: Roles bound to service accounts, by token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    """One rule of a Role."""

    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    resource_names: tuple[str, ...] = ()

    def allows(self, verb: str, group: str, resource: str, name: str | None) -> bool:
        if not ({"*", group} & set(self.api_groups)):
            return False
        if not ({"*", resource} & set(self.resources)):
            return False
        if not ({"*", verb} & set(self.verbs)):
            return False
        # resourceNames authorize a list or watch only with a metadata.name field
        # selector naming one of them (as kube-apiserver's RBAC authorizer does).
        return not self.resource_names or name in self.resource_names


class Rbac:
    """Service-account tokens and the Roles bound to them, as kube-apiserver enforces.

    Build it with :meth:`from_manifests` from the decoded ServiceAccount, Role and
    RoleBinding objects (e.g. ``kubectl kustomize`` output).
    """

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}  # token -> user
        self.rules: dict[tuple[str, str], list[Rule]] = {}  # (user, namespace) -> rules

    @classmethod
    def from_manifests(cls, docs: list[dict[str, Any]], tokens: dict[str, str]) -> Rbac:
        """``tokens``: token -> ``namespace/serviceaccount`` it authenticates as."""
        rbac = cls()
        accounts = {
            f"{d['metadata']['namespace']}/{d['metadata']['name']}"
            for d in docs
            if d.get("kind") == "ServiceAccount"
        }
        for token, sa in tokens.items():
            assert sa in accounts, f"no ServiceAccount {sa} in the manifests"
            ns, name = sa.split("/")
            rbac.tokens[token] = f"system:serviceaccount:{ns}:{name}"
        roles = {
            (d["metadata"]["namespace"], d["metadata"]["name"]): [
                Rule(
                    tuple(r.get("apiGroups") or ()),
                    tuple(r.get("resources") or ()),
                    tuple(r.get("verbs") or ()),
                    tuple(r.get("resourceNames") or ()),
                )
                for r in d.get("rules") or ()
            ]
            for d in docs
            if d.get("kind") == "Role"
        }
        for d in docs:
            if d.get("kind") != "RoleBinding":
                continue
            ns = d["metadata"]["namespace"]
            ref = d["roleRef"]
            assert ref["kind"] == "Role", ref
            for subject in d.get("subjects") or ():
                if subject.get("kind") != "ServiceAccount":
                    continue
                user = f"system:serviceaccount:{subject.get('namespace', ns)}:{subject['name']}"
                rbac.rules.setdefault((user, ns), []).extend(roles.get((ns, ref["name"]), []))
        return rbac

    def user(self, token: str) -> str | None:
        return self.tokens.get(token)

    def allows(
        self, user: str, verb: str, group: str, resource: str, ns: str, name: str | None
    ) -> bool:
        return any(r.allows(verb, group, resource, name) for r in self.rules.get((user, ns), ()))
