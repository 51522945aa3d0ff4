import os

from django.core.wsgi import get_wsgi_application

from config.tracing import configure_from_env

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
configure_from_env(os.environ)  # spans over OTLP when an endpoint is set (README)
application = get_wsgi_application()
