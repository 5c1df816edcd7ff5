"""How the OpenAPI schema shows a worker's credential (imported by ``automation.urls``,
as ``identity.schema`` is by ``identity.urls``)."""

from identity.schema import BearerScheme


class WorkerCredentialScheme(BearerScheme):
    target_class = "automation.authentication.WorkerAuthentication"
    name = "workerCredential"
    description = "An automation worker's own credential (shown once when created)."
