FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY config config
COPY tenants tenants
COPY serving serving
COPY metering metering
COPY billing billing
COPY templates templates
COPY static static
COPY manage.py ./
RUN pip install --no-cache-dir .
ENV DJANGO_SETTINGS_MODULE=config.settings.production
RUN DJANGO_SECRET_KEY=build DATABASE_URL=postgres://x@localhost/x python manage.py collectstatic --noinput
EXPOSE 8000
CMD ["uvicorn", "config.asgi:application", "--host", "0.0.0.0", "--port", "8000"]
