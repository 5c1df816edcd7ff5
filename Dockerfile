# Hub DomMed: one image for the API and every daemon (the command picks the role).
FROM python:3.11-slim AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, so code changes do not reinstall them.
COPY pyproject.toml ./
RUN mkdir -p hubdommed && touch hubdommed/__init__.py \
    && pip install . \
    && pip uninstall -y hubdommed

COPY . .
RUN pip install --no-deps . \
    && DEBUG=false SECRET_KEY=build-only-not-a-secret python manage.py collectstatic --no-input \
    && useradd --system --uid 10001 --home /app hubdommed \
    && chown -R hubdommed /app/var

USER hubdommed
ENV DEBUG=false PORT=8000
EXPOSE 8000

HEALTHCHECK --interval=15s --timeout=5s --start-period=20s \
    CMD python -c "import urllib.request,os; urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\"PORT\"]}/health/live', timeout=4)"

CMD ["sh", "-c", "exec gunicorn hubdommed.wsgi:application --bind 0.0.0.0:${PORT} --workers ${WEB_CONCURRENCY:-2} --access-logfile -"]
