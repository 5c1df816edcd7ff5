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
# The code runs from /app, so its bytecode is compiled here, once: PYTHONDONTWRITEBYTECODE
# keeps each process from writing it, and every daemon's start (and restart) would
# otherwise compile the project again.
RUN pip install --no-deps . \
    && python -m compileall -q -j 0 /app \
    && DEBUG=false SECRET_KEY=build-only-not-a-secret \
       WEBHOOK_SECRET_KEYS=YnVpbGQtb25seS1ub3QtYS1zZWNyZXQtMDEyMzQ1Njc= \
       python manage.py collectstatic --no-input \
    && useradd --system --uid 10001 --home /app hubdommed \
    && chown -R hubdommed /app/var

USER hubdommed
ENV DEBUG=false PORT=8000
EXPOSE 8000

# One check for every role: a daemon (LIVENESS_FILE set) is healthy while its loop touches
# the file, the API while /health/ready answers 200. compose.yaml says it per service.
HEALTHCHECK --interval=15s --timeout=12s --start-period=30s \
    CMD ["python", "scripts/healthcheck.py"]

# The API. gunicorn.conf.py sets up the workers' shared metrics (PROMETHEUS_MULTIPROC_DIR,
# emptied at start) and leaves request logging to the application (one line per request,
# with its ids).
CMD ["sh", "-c", "exec gunicorn -c gunicorn.conf.py hubdommed.wsgi:application --bind 0.0.0.0:${PORT} --workers ${WEB_CONCURRENCY:-2}"]
