"""How the OpenAPI schema shows the people's credentials.

Imported by ``identity.urls``: the schema is built from the URLconf, so the extensions are
registered wherever it is served, and the daemons, which never build it, do not import
drf-spectacular.
"""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerScheme(OpenApiAuthenticationExtension):
    """How the schema shows a ``BearerAuthentication``: its ``description`` and, where
    the credential has one, its ``bearer_format``. (No ``target_class``: it documents
    nothing itself.)"""

    description: str
    bearer_format: str | None = None

    def get_security_definition(self, auto_schema):
        format_ = {"bearerFormat": self.bearer_format} if self.bearer_format else {}
        return {"type": "http", "scheme": "bearer", **format_, "description": self.description}


class AccessTokenScheme(BearerScheme):
    target_class = "identity.authentication.AccessTokenAuthentication"
    name = "accessToken"
    bearer_format = "JWT"
    description = "A short-lived access token from POST /api/v1/auth/login."
