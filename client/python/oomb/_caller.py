"""Caller: who the server takes the client for (GetCaller), shared by Client and AsyncClient."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

from oomb._names import project_id
from oomb.v1 import jobs_pb2

__all__ = ["Caller"]


@dataclass(frozen=True)
class Caller:
    """The caller as the daemon identified it (`client.whoami()`, GetCaller).

    user: the user name ("" when the daemon identifies no one); uid: the token file's uid column;
    groups: as the token file or the client certificate's O entries give them;
    authenticated_by: "token", "certificate" or "none" (no identity configured); admin: in
    `oomb:admins` (or no identity configured): it may act in every project; projects: the
    projects its groups name, as resource names ("projects/nlp"), sorted.
    """

    user: str
    uid: str
    groups: List[str]
    authenticated_by: str
    admin: bool
    projects: List[str]
    proto: jobs_pb2.Caller

    @property
    def project_ids(self) -> List[str]:
        """The projects' ids ("nlp"), in the order of `projects`."""
        return [project_id(p) for p in self.projects]

    @classmethod
    def from_proto(cls, c: jobs_pb2.Caller) -> "Caller":
        return cls(user=c.user, uid=c.uid, groups=list(c.groups), authenticated_by=c.authenticated_by,
                   admin=c.admin, projects=list(c.projects), proto=c)
