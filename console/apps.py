"""The operator console: the admin's dashboard, per-agent traffic statistics and the audit log.

``ConsoleAdminConfig`` replaces ``django.contrib.admin`` in ``INSTALLED_APPS`` so the default
admin site is :class:`console.site.ConsoleAdminSite` (the dashboard is its index).
``ConsoleConfig.ready`` wires the recorder's flush job into the node's lifecycle and subscribes
to the registry's audit hook; it installs the reader of an agent's recent calls that the
API's agent detail shows (``registry.selectors.agent_calls``).
"""

from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class ConsoleAdminConfig(admin_apps.AdminConfig):
    default = False
    default_site = "console.site.ConsoleAdminSite"


class ConsoleConfig(AppConfig):
    default = True
    name = "console"
    verbose_name = "Operations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from console import audit, flusher, schema  # noqa: F401  (schema: auth extension)
        from console import selectors as console_selectors
        from core import lifecycle as node
        from registry import events
        from registry import selectors as registry_selectors

        events.subscribe_audit(audit.on_registry_audit)
        registry_selectors.agent_calls_reader_install(console_selectors.agent_recent_calls)
        node.on_startup(flusher.start)
        node.on_shutdown(flusher.stop)
