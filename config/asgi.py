import os

from django.core.asgi import get_asgi_application

from config.tracing import configure_from_env

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
configure_from_env(os.environ)  # spans over OTLP when an endpoint is set (README)
application = get_asgi_application()
