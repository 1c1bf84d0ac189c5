"""HTTP routing: /a2a/... to the gateway's lean ASGI handler, the rest to Django."""


def http_application(django_app):
    # Placeholder until the gateway lands: everything goes to Django.
    return django_app
