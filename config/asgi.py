"""The ASGI application: a Channels router that sends /a2a/... to the gateway's lean handler
before Django's view and middleware stack, and everything else to Django."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402

from config.edge import limit_body  # noqa: E402
from config.node import lifespan_app  # noqa: E402
from gateway.routing import http_application  # noqa: E402

application = ProtocolTypeRouter(
    {"http": limit_body(http_application(django_asgi_app)), "lifespan": lifespan_app}
)
