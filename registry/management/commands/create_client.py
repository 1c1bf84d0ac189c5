"""python manage.py create_client NAME --scopes register,call[,admin] [--agents id,id]
[--tenant SLUG]"""

from django.core.management.base import BaseCommand, CommandError

from registry import services
from registry.ids import DEFAULT_TENANT


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


class Command(BaseCommand):
    help = "Create an API client and print its token (last line). The token is shown only once."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--scopes", required=True, help="comma-separated: register,call,admin")
        parser.add_argument("--agents", default="", help="comma-separated agent ids (default: any)")
        parser.add_argument("--tenant", default=DEFAULT_TENANT,
                            help="the tenant the client belongs to (default: the default "
                            "tenant; docs/tenants.md)")

    def handle(self, *args, name: str, scopes: str, agents: str, tenant: str, **options):
        try:
            client, token = services.api_client_create(
                name=name, scopes=_csv(scopes), allowed_agents=_csv(agents), tenant=tenant
            )
        except services.InvalidInput as exc:
            raise CommandError(str(exc)) from None
        allowed = ", ".join(client.allowed_agents) or "any"
        self.stderr.write(
            f"Created client {client.client_id!r} of tenant {client.tenant_id!r} with scopes "
            f"{', '.join(client.scopes)}; "
            f"agents: {allowed}. Keep the token below: it is stored hashed and not shown again."
        )
        self.stdout.write(token)
