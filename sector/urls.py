from common.urls import resource
from sector import api

urlpatterns = resource(
    "sectors",
    "sector_id",
    "sector",
    listing=api.SectorListCreateApi,
    member=api.SectorDetailApi,
    actions={"deactivate": api.SectorDeactivateApi},
)
