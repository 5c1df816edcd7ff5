from django.urls import path

from sector import api

urlpatterns = [
    path("sectors", api.SectorListCreateApi.as_view(), name="sectors"),
    path("sectors/<int:sector_id>", api.SectorDetailApi.as_view(), name="sector"),
    path(
        "sectors/<int:sector_id>/deactivate",
        api.SectorDeactivateApi.as_view(),
        name="sector-deactivate",
    ),
]
