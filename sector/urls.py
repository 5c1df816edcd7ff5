from django.urls import path

from common.urls import member_actions
from sector import api

urlpatterns = [
    path("sectors", api.SectorListCreateApi.as_view(), name="sectors"),
    path("sectors/<int:sector_id>", api.SectorDetailApi.as_view(), name="sector"),
    *member_actions("sectors/<int:sector_id>", "sector", {"deactivate": api.SectorDeactivateApi}),
]
