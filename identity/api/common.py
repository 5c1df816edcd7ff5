"""Small pieces the identity views share."""

from __future__ import annotations

from rest_framework import exceptions, serializers
from rest_framework.views import APIView

from common.api import DefaultPagination


def validated(serializer_class: type[serializers.Serializer], data) -> dict:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def query(serializer_class: type[serializers.Serializer], request) -> dict:
    # A plain dict, not the QueryDict: DRF reads a missing boolean of a QueryDict as False.
    return validated(serializer_class, request.query_params.dict())


def paginated(view: APIView, queryset, serializer_class: type[serializers.Serializer]):
    paginator = view.pagination_class()
    page = paginator.paginate_queryset(queryset, view.request, view=view)
    return paginator.get_paginated_response(serializer_class(page, many=True).data)


class NeverDeleted:
    """``DELETE`` answers 405 with a pointer to the way out that exists: deactivation."""

    pagination_class = DefaultPagination
    delete_hint = "Nothing is deleted here; deactivate it instead."

    def http_method_not_allowed(self, request, *args, **kwargs):
        if request.method == "DELETE":
            raise exceptions.MethodNotAllowed(request.method, detail=self.delete_hint)
        return super().http_method_not_allowed(request, *args, **kwargs)
