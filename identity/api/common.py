"""Small pieces the identity views share."""

from __future__ import annotations

from rest_framework import serializers
from rest_framework.views import APIView

from common.api import validated_query


def query(serializer_class: type[serializers.Serializer], request) -> dict:
    # A plain dict, not the QueryDict: DRF reads a missing boolean of a QueryDict as False.
    return validated_query(serializer_class, request)


def paginated(view: APIView, queryset, serializer_class: type[serializers.Serializer]):
    paginator = view.pagination_class()
    page = paginator.paginate_queryset(queryset, view.request, view=view)
    return paginator.get_paginated_response(serializer_class(page, many=True).data)
