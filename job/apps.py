from django.apps import AppConfig


class JobConfig(AppConfig):
    name = "job"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from common.ways_forward import register_stranded_check
        from job.stranded import jobs_stranded

        register_stranded_check("jobs", jobs_stranded)
