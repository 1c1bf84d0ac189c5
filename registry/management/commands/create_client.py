"""python manage.py create_client NAME --scopes register,call[,admin] [--agents id,id]"""

from django.core.management.base import BaseCommand, CommandError

from registry import services


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


class Command(BaseCommand):
    help = "Create an API client and print its token (last line). The token is shown only once."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--scopes", required=True, help="comma-separated: register,call,admin")
        parser.add_argument("--agents", default="", help="comma-separated agent ids (default: any)")

    def handle(self, *args, name: str, scopes: str, agents: str, **options):
        try:
            client, token = services.api_client_create(
                name=name, scopes=_csv(scopes), allowed_agents=_csv(agents)
            )
        except services.InvalidInput as exc:
            raise CommandError(str(exc)) from None
        allowed = ", ".join(client.allowed_agents) or "any"
        self.stderr.write(
            f"Created client {client.client_id!r} with scopes {', '.join(client.scopes)}; "
            f"agents: {allowed}. Keep the token below: it is stored hashed and not shown again."
        )
        self.stdout.write(token)
