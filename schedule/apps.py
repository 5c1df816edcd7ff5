from django.apps import AppConfig


class ScheduleConfig(AppConfig):
    name = "schedule"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from common.ways_forward import register_stranded_check
        from schedule.stranded import schedules_stranded

        register_stranded_check("schedules", schedules_stranded)
