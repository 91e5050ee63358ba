"""Job ids, project names and resource names.

The one place that knows how a job id becomes a resource name: `projects/{project}/jobs/{id}`
when a project is given (Client(project=...), $OOMB_PROJECT), else `jobs/{id}`, the short form
every server version accepts (a server with projects names its jobs `projects/{project}/jobs/{id}`
and takes the short form for a job in any of the caller's projects, a job id being unique across
projects). Everything else treats the names the server returns as opaque strings and passes them
back unchanged.
"""
from __future__ import annotations

import re
from typing import Optional

__all__ = ["job_name", "job_id", "project_name", "project_id", "parent", "ALL_PROJECTS", "is_resource_name"]

# The grammar of proto/spec/resource_names.h, for the job spec's fields that take a resource's
# name as well as a path (FieldRules.resource): such a name is never made a path.
_ID = r"[a-z0-9][a-z0-9-]{0,62}"
_RESOURCE = {
    "dataset": re.compile(rf"(projects/{_ID}/)?datasets/{_ID}"),
    "checkpoint": re.compile(rf"projects/{_ID}/jobs/{_ID}(/checkpoints/([0-9]{{1,18}}|final))?"),
}


def is_resource_name(kind: str, value: str) -> bool:
    """Whether `value` is the name of a resource of `kind` ("dataset", "checkpoint"), not a path."""
    pattern = _RESOURCE.get(kind)
    return bool(pattern is not None and pattern.fullmatch(value))

# ListJobsRequest.parent for every project the caller may act in.
ALL_PROJECTS = "projects/-"


def project_id(project: str) -> str:
    """The project id from an id (`nlp`) or a name (`projects/nlp`); ValueError for anything else."""
    if not isinstance(project, str):
        raise ValueError(f"expected a project id or name, got {project!r}")
    pid = project[len("projects/"):] if project.startswith("projects/") else project
    if not pid or "/" in pid:
        raise ValueError(f"expected a project id (nlp) or name (projects/nlp), got {project!r}")
    return pid


def project_name(project: str) -> str:
    """The resource name of a project, `projects/{project}`, from its id (`nlp`) or its name."""
    return f"projects/{project_id(project)}"


def parent(project: Optional[str], all_projects: bool = False) -> str:
    """A request's `parent`: `projects/{project}`, `projects/-` for all_projects, or "" (none:
    the server's default, the caller's only project or, for ListJobs, every one of them)."""
    if all_projects:
        if project:
            raise ValueError(f"both project={project!r} and all_projects=True")
        return ALL_PROJECTS
    return project_name(project) if project else ""


def job_name(name_or_id: str, project: Optional[str] = None) -> str:
    """The resource name of a job given its id (`austen-1`) or a name (returned unchanged).

    An id becomes `projects/{project}/jobs/{id}` when `project` (an id or `projects/{id}`) is
    given, else `jobs/{id}`. A string holding a `/` is taken to be a name already and returned
    unchanged, whatever the project.
    """
    if not isinstance(name_or_id, str) or not name_or_id:
        raise ValueError(f"expected a job id or name, got {name_or_id!r}")
    if "/" in name_or_id:
        return name_or_id
    if project:
        return f"{project_name(project)}/jobs/{name_or_id}"
    return f"jobs/{name_or_id}"


def job_id(name: str) -> str:
    """The job id: the last component of a resource name (or the id itself)."""
    return name.rsplit("/", 1)[-1]
